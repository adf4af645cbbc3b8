"""Quantised targets (bitsandbytes NF4 and int8) on the CPU: loading, what the page and the check say, exactness.

Exactness is with respect to the quantised target: both lanes run the same quantised model, so greedy speculative
output must equal its greedy plain output token for token, and sampled output must follow its distribution, on
every forward that can run it: transformers' and the lean forward's two (llama.c reading the int8 rows and
scales, or the NF4 nibbles and block absmax, as bitsandbytes stores them; and PyTorch ops), each forced in turn.
The tiny models here are 64 wide: bitsandbytes' CPU NF4 kernel needs widths in multiples of its 64-weight blocks.
"""

import itertools
import math

import pytest
import torch
from conftest import PREFILLS, feed_in_calls, long_prefill, save_pair

from specviz import SpecvizError, generate, load_model, load_pair
from specviz.backends.local import CachedModel
from specviz.engine.loop import speculative_decode
from specviz.models.loaded import CACHE, backend
from specviz.native import forward as lean
from specviz.native import library as native
from specviz.request import RunRequest

bnb = pytest.importorskip("bitsandbytes")  # requirements.txt installs it; a bare environment skips, not fails

PROMPTS = ["hello world", "the cat sat on the mat", "abc", "what is 2+2?", "once upon a time"]
LAYERS = {"4bit": "Linear4bit", "8bit": "Linear8bitLt"}
# (quantisation, forward): every forward that can run each kind of quantised target
RUNS = [(quantize, forward) for quantize in ("4bit", "8bit") for forward in ("llama.c", "PyTorch ops", "transformers")]
RUNS.append(("8bit", "llama.c, weights in panels"))  # int8 rows and scales packed in panels (NF4 stays by rows)
KINDS = {"4bit": "NF4", "8bit": "int8"}


@pytest.fixture
def quantised(monkeypatch):
    """load_pair(..., quantize=...) with one forward forced, loaded afresh (the model cache does not key on it)."""

    def load(pair, quantize: str, forward: str):
        if forward.startswith("llama.c") and native.library() is None:
            pytest.skip("no C compiler or no AVX2 here")
        monkeypatch.setenv("SPECVIZ_FORWARD", "transformers" if forward == "transformers" else "auto")
        monkeypatch.setenv("SPECVIZ_CPU_GEMM", "kernel" if forward.startswith("llama.c") else "torch")
        monkeypatch.setenv("SPECVIZ_KERNEL_LAYOUT", "panels" if "panels" in forward else "rows")
        monkeypatch.setenv("SPECVIZ_CPU_HALF_DRAFT", "0")
        CACHE.clear()
        p, q = load_pair(*pair, device="cpu", quantize=quantize)
        engine = p.lean.engine if p.lean is not None else "transformers"
        assert engine == (
            forward if forward == "transformers" else f"{forward}, {KINDS[quantize]} weights from bitsandbytes"
        )
        assert (forward if forward != "transformers" else "transformers forward") in backend(p)
        return p, q

    yield load
    CACHE.clear()


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
    from specviz.models.loaded import pair_dtypes

    assert pair_dtypes(p, q) == f"{p.precision}; draft {q.precision}"


@pytest.mark.parametrize("quantize,forward", RUNS)
def test_greedy_speculative_equals_greedy_plain_of_the_same_quantised_target(wide_pair, quantised, quantize, forward):
    p, q = quantised(wide_pair, quantize, forward)
    rejections = 0
    for gamma, prompt in itertools.product((1, 3, 6), PROMPTS):
        ar = generate(prompt, target=p, mode="ar", max_new_tokens=32)
        sp = generate(prompt, target=p, draft=q, drafter="model", gamma=gamma, max_new_tokens=32)
        assert sp.token_ids == ar.token_ids, (gamma, prompt)
        rejections += sp.stats["drafted"] - sp.stats["accepted"]
    assert rejections > 0  # the draft disagreed sometimes: the rollback path ran on the quantised target


@pytest.mark.parametrize("quantize,forward", RUNS)
def test_sampled_speculative_follows_the_quantised_target(wide_small_vocab, quantised, quantize, forward):
    """The first token's law at T = 1 (gamma 1: accept, resample and bonus all happen) against p's own softmax."""
    p, q = quantised(wide_small_vocab, quantize, forward)
    ids, V, N = [1, 5, 6], p.vocab_size, 1200
    with torch.inference_mode():
        law = torch.softmax(p.model(torch.tensor([ids])).logits[0, -1].float(), -1)
        q_law = torch.softmax(q.model(torch.tensor([ids])).logits[0, -1].float(), -1)
    counts = torch.zeros(V)
    for seed in range(N):
        cfg = RunRequest(drafter="model", gamma=1, tree="off", max_new_tokens=1, seed=seed, temperature=1.0).spec
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
    from specviz.pairs.check import check_pair

    monkeypatch.setenv("SPECVIZ_CPU_HALF_DRAFT", "0")  # the draft's dtype is a per-CPU choice (kernels.draft_dtype)
    from specviz.ui.pair import report_html

    r = check_pair(*wide_pair, device="cpu", quantize="4bit", max_new_tokens=8, prompts=["hello world"])
    assert r.target_precision == "NF4, bitsandbytes" and r.draft_precision == "float32"
    page, text = report_html(r), r.report()
    for shown in (page, text):
        assert "NF4, bitsandbytes" in shown and "MiB" in shown
    assert r.verdict in ("compatible", "not worth it")  # it measured the pair: a quantised target is a target


@pytest.mark.parametrize(
    "quantize,forward,prefill",
    [(q, f, how) for q in ("4bit", "8bit") for f, how in PREFILLS]
    + [("8bit", "llama.c, weights in panels", "llama.c calls")],
)
def test_a_quantised_target_on_the_lean_forward_computes_its_layers_numbers(
    wide_pair, quantised, monkeypatch, quantize, forward, prefill
):
    """The lean forward reads bitsandbytes' int8 rows and scales, or NF4 nibbles and absmax, as stored: its logits
    through a prefill and calls of 1-16 tokens are those of the same model under transformers' forward (quant.py's
    float32 products), which still runs after the lean forward fused its layers (against one loaded without it)."""
    p, _ = quantised(wide_pair, quantize, forward)
    ids = list(range(3, 63)) + [5, 9, 12, 30] * 20  # 140 tokens
    with torch.inference_mode():
        fused = p.model(torch.tensor([ids])).logits[0].float()
    plain, _ = quantised(wide_pair, quantize, "transformers")
    with torch.inference_mode():
        ref = plain.model(torch.tensor([ids])).logits[0].float()
    torch.testing.assert_close(fused, ref, atol=1e-5, rtol=1e-5)
    assert p.lean.layers[0][1].dtype == {"4bit": torch.uint8, "8bit": torch.int8}[quantize]
    assert p.lean.head.dtype == torch.float32  # the output layer stays as bitsandbytes left it
    assert p.lean.int8() is p.lean  # a quantised model is never quantised again (a draft's int8 choice)
    long_prefill(monkeypatch, prefill)
    run = CachedModel(p, p.vocab_size)
    run.prefill(torch.tensor(ids[:40]))  # 39 rows by the prefill path forced; then calls of 1-16 tokens
    got, at = feed_in_calls(run, ids, 39)
    torch.testing.assert_close(got, ref[39:at], atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "quantize,forward", [("4bit", "llama.c"), ("8bit", "llama.c"), ("8bit", "llama.c, weights in panels")]
)
def test_on_llama_c_a_quantised_targets_token_has_the_same_bits_alone_or_inside_a_verify(
    wide_pair, quantised, quantize, forward
):
    p, _ = quantised(wide_pair, quantize, forward)
    ids = [3, 17, 40, 8, 22, 9, 51, 30]
    run = CachedModel(p, p.vocab_size)
    run.prefill(torch.tensor(ids[:3]))  # caches all but the last token, which the next call feeds
    base = run.length
    block = run.feed(torch.tensor(ids[2:8]))  # a verify of 6
    run.rollback(base)
    alone = torch.cat([run.feed(torch.tensor([t])) for t in ids[2:8]])  # six steps
    assert block.shape == alone.shape == (6, p.vocab_size) and torch.equal(block, alone)


def test_a_quantised_target_keeps_its_rows_where_panels_would_be_timed_faster(wide_pair, monkeypatch):
    """With the layout left to timing, an 8-bit target reads its int8 rows as bitsandbytes stores them, never a panel
    copy (its memory would double), where the float draft beside it takes the panels the same timing favours;
    forced by SPECVIZ_KERNEL_LAYOUT=panels it still takes them."""
    from specviz.native import panels as lean_panels

    if native.library() is None:
        pytest.skip("no C compiler or no AVX2 here")
    for name, value in (("SPECVIZ_FORWARD", "auto"), ("SPECVIZ_CPU_GEMM", "kernel"), ("SPECVIZ_DRAFT_INT8", "0")):
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(
        lean_panels, "time_layouts", lambda mats, rows=(1, 4): ((1.0, 1.0), (0.5, 0.5))
    )  # panels 2x faster
    sizes = {}
    for layout in ("auto", "panels"):
        monkeypatch.setenv("SPECVIZ_KERNEL_LAYOUT", layout)
        CACHE.clear()
        p, q = load_pair(*wide_pair, device="cpu", quantize="8bit")
        assert p.lean.quantised and not q.lean.quantised and q.lean.packed  # the draft: panels
        assert bool(p.lean.packed) is (layout == "panels"), layout
        assert ("weights in panels" in p.lean.engine) is (layout == "panels")
        sizes[layout] = p.memory_bytes
    assert sizes["panels"] - sizes["auto"] == p.lean.weight_bytes  # the copy a timed choice no longer makes
    CACHE.clear()


def test_the_lean_forward_says_which_quantised_layers_it_cannot_read(wide_pair, quantised):
    p, _ = quantised(wide_pair, "4bit", "transformers")
    assert lean.why_not(p.model) is None
    p.model.model.layers[0].mlp.up_proj.weight.quant_state.dtype = torch.bfloat16  # its weights rounded to bfloat16
    assert "does not read" in lean.why_not(p.model) and "NF4" in lean.why_not(p.model)
    q, _ = quantised(wide_pair, "8bit", "transformers")
    assert lean.why_not(q.model) is None
    head = q.model.lm_head
    q.model.lm_head = bnb.nn.Linear8bitLt(64, head.out_features, bias=False, has_fp16_weights=False)
    assert lean.why_not(q.model) == "its output layer is quantised"  # llama.c would read it without its scales
    q.model.lm_head = head
    q.model.model.layers[0].mlp.down_proj = torch.nn.Linear(q.model.config.intermediate_size, 64, bias=False)
    assert lean.why_not(q.model) == "its layers mix weight types"


def test_nf4_weights_read_with_nested_absmax_are_bitsandbytes_own():
    """Double quantisation (absmax stored in 8 bits with scales of their own) is expanded as bitsandbytes does."""
    from types import SimpleNamespace

    from bitsandbytes.functional import dequantize_4bit, quantize_4bit

    from specviz.quant import nf4_absmax, nf4_dense

    w = torch.randn(96, 256, generator=torch.Generator().manual_seed(0))
    for nested in (False, True):
        packed, state = quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=nested)
        assert state.nested is nested
        absmax = nf4_absmax(SimpleNamespace(weight=SimpleNamespace(quant_state=state)))
        dense = nf4_dense(packed.view(96, -1), torch.cat([state.code.float(), absmax]))
        assert torch.equal(dense, dequantize_4bit(packed, state))
