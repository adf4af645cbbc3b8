"""Quantised targets (bitsandbytes NF4 and int8) on the CPU: loading, what the page and the check say, exactness.

Exactness is with respect to the quantised target: both lanes run the same quantised model, so greedy speculative
output must equal its greedy plain output token for token, and sampled output must follow its distribution.
The tiny models here are 64 wide: bitsandbytes' CPU NF4 kernel needs widths in multiples of its 64-weight blocks.
"""

import itertools
import math

import pytest
import torch
from conftest import save_pair

from specviz import SamplingConfig, SpecConfig, SpecvizError, generate, load_model, load_pair
from specviz.engine import speculative_decode

bnb = pytest.importorskip("bitsandbytes")  # requirements.txt installs it; a bare environment skips, not fails

PROMPTS = ["hello world", "the cat sat on the mat", "abc", "what is 2+2?", "once upon a time"]
LAYERS = {"4bit": "Linear4bit", "8bit": "Linear8bitLt"}


@pytest.fixture(scope="module")
def wide_pair(tmp_path_factory):
    """(target_dir, draft_dir): vocabulary 64, 64 wide."""
    return save_pair(tmp_path_factory.mktemp("wide"), 64, hidden=64)


@pytest.fixture(scope="module")
def wide_small_vocab(tmp_path_factory):
    """(target_dir, draft_dir): vocabulary 8, 64 wide, no chat template: small enough to enumerate outcomes."""
    return save_pair(tmp_path_factory.mktemp("wide8"), 8, chat=False, draft_noise=1.0, hidden=64)


@pytest.mark.parametrize("quantize", ["4bit", "8bit"])
def test_a_quantised_target_loads_on_the_cpu_and_says_what_it_is(wide_pair, quantize):
    full = load_model(wide_pair[0], device="cpu")
    p, q = load_pair(*wide_pair, device="cpu", quantize=quantize)
    layers = {type(m).__name__ for m in p.model.modules()}
    assert LAYERS[quantize] in layers and LAYERS[quantize] not in {type(m).__name__ for m in q.model.modules()}
    assert p.quantize == quantize and q.quantize is None  # the draft is never quantised
    assert p.precision == {"4bit": "NF4, bitsandbytes", "8bit": "int8, bitsandbytes"}[quantize]
    assert p.n_params == full.n_params  # a 4-bit layer counts the weights it holds, not its packed bytes
    assert p.memory_bytes < full.memory_bytes  # the scales included (quant_state_bytes)
    assert p.precision in p.describe() and "M parameters" in p.describe()
    from specviz.models import pair_dtypes

    assert pair_dtypes(p, q) == f"{p.precision}; draft {q.precision}"


@pytest.mark.parametrize("quantize", ["4bit", "8bit"])
def test_greedy_speculative_equals_greedy_plain_of_the_same_quantised_target(wide_pair, quantize):
    p, q = load_pair(*wide_pair, device="cpu", quantize=quantize)
    rejections = 0
    for gamma, prompt in itertools.product((1, 3, 6), PROMPTS):
        ar = generate(prompt, target=p, mode="ar", max_new_tokens=32)
        sp = generate(prompt, target=p, draft=q, drafter="model", gamma=gamma, max_new_tokens=32)
        assert sp.token_ids == ar.token_ids, (gamma, prompt)
        rejections += sp.stats["drafted"] - sp.stats["accepted"]
    assert rejections > 0  # the draft disagreed sometimes: the rollback path ran on the quantised target


@pytest.mark.parametrize("quantize", ["4bit", "8bit"])
def test_sampled_speculative_follows_the_quantised_target(wide_small_vocab, quantize):
    """The first token's law at T = 1 (gamma 1: accept, resample and bonus all happen) against p's own softmax."""
    p, q = load_pair(*wide_small_vocab, device="cpu", quantize=quantize)
    ids, V, N = [1, 5, 6], p.vocab_size, 1200
    with torch.inference_mode():
        law = torch.softmax(p.model(torch.tensor([ids])).logits[0, -1].float(), -1)
        q_law = torch.softmax(q.model(torch.tensor([ids])).logits[0, -1].float(), -1)
    counts = torch.zeros(V)
    for seed in range(N):
        cfg = SpecConfig(gamma=1, max_new_tokens=1, seed=seed, sampling=SamplingConfig(1.0), drafter="model")
        counts[list(speculative_decode(p, q, ids, cfg))[-1].token_ids[0]] += 1
    keep = law * N >= 5
    chi2 = float((((counts[keep] - N * law[keep]) ** 2) / (N * law[keep])).sum())
    dof = int(keep.sum()) - 1
    assert (chi2 - dof) / math.sqrt(2 * dof) < 4.0, (chi2, dof)
    tv, tv_q = (0.5 * float((counts / N - x).abs().sum()) for x in (law, q_law))
    assert tv_q > tv + 0.05, (tv, tv_q)  # the draft's own law is clearly another: the test can tell them apart


def test_a_device_bitsandbytes_cannot_serve_gets_one_sentence(wide_pair, monkeypatch):
    monkeypatch.setattr(bnb, "supported_torch_devices", {"cuda"})
    with pytest.raises(SpecvizError, match="cannot run 4-bit or 8-bit layers on cpu; load without --quantize"):
        load_model(wide_pair[0], device="cpu", quantize="4bit")


def test_the_pair_check_and_its_page_name_the_quantisation_and_memory(wide_pair, monkeypatch):
    from specviz.pairs import check_pair

    monkeypatch.setenv("SPECVIZ_CPU_HALF_DRAFT", "0")  # the draft's dtype is a per-CPU choice (kernels.draft_dtype)
    from specviz.ui.pair import report_html

    r = check_pair(*wide_pair, device="cpu", quantize="4bit", max_new_tokens=8, prompts=["hello world"])
    assert r.target_precision == "NF4, bitsandbytes" and r.draft_precision == "float32"
    page, text = report_html(r), r.report()
    for shown in (page, text):
        assert "NF4, bitsandbytes" in shown and "MiB" in shown
    assert r.verdict in ("compatible", "not worth it")  # it measured the pair: a quantised target is a target
