"""The draft head's native forward (head_native.py): it computes what the PyTorch head computes, and whatever path
runs the head (PyTorch, llama.c in float32, llama.c with int8 weights, each forced), greedy speculative output
equals plain greedy output and sampled output follows the target (chi-square)."""

from __future__ import annotations

import shutil

import pytest
import torch
from conftest import a_head
from test_drafters import PROMPTS
from two_tokens import chi2_z, exact_two_token_law, two_token_counts

from specviz import generate, load_pair
from specviz.models.head import HeadCache, head_for
from specviz.native import library as native
from specviz.native.head import NativeHead, describe

needs_kernel = pytest.mark.skipif(native.library() is None, reason=f"no native kernel here: {native.why_not()}")

# how the head runs -> the environment that forces it
PATHS = {
    "pytorch": {"SPECVIZ_FORWARD": "transformers"},
    "llama.c": {"SPECVIZ_DRAFT_INT8": "0", "SPECVIZ_KERNEL_LAYOUT": "rows"},
    "llama.c int8": {"SPECVIZ_DRAFT_INT8": "1", "SPECVIZ_KERNEL_LAYOUT": "rows"},
    "llama.c int8 panels": {"SPECVIZ_DRAFT_INT8": "1", "SPECVIZ_KERNEL_LAYOUT": "panels"},
}


def forced(monkeypatch, p, folder, path: str):
    """The head in `folder` loaded for `p` with its path forced (a fresh folder per path: head_for keeps one)."""
    for k, v in PATHS[path].items():
        monkeypatch.setenv(k, v)
    head = head_for(p, folder)
    want = {
        "pytorch": "PyTorch ops",
        "llama.c": "(llama.c)",
        "llama.c int8": "(llama.c, int8 weights)",
        "llama.c int8 panels": "(llama.c, weights in panels, int8 weights)",
    }[path]
    assert describe(head).endswith(want), describe(head)
    return head


@needs_kernel
@pytest.mark.parametrize("first", [9, 40, 90])  # one llama.c call; several (lean.CHUNKED_PREFILL); PyTorch's ops
def test_the_native_head_computes_what_the_head_computes(loaded_pair, tmp_path, monkeypatch, first):
    """Fed in two calls (a prompt's pairs, then three), float32: features and the last pair's logits as PyTorch's."""
    monkeypatch.setenv("SPECVIZ_DRAFT_INT8", "0")
    p, _ = loaded_pair
    head = a_head(p, tmp_path / "h")
    fast = NativeHead(head, p.lean)
    assert not fast.int8
    T, H = first + 3, p.model.config.hidden_size
    tokens, feats = torch.randint(0, p.vocab_size, (T,)), torch.randn(T, H)
    with torch.no_grad():
        ref = head(tokens[None], feats[None], torch.arange(1, T + 1), HeadCache())[0]
        cache = fast.new_cache()
        f1, _ = fast.step(cache, tokens[:first], feats[:first], torch.arange(1, first + 1))
        f2, rows = fast.step(cache, tokens[first:], feats[first:], torch.arange(first + 1, T + 1))
    assert torch.allclose(torch.cat([f1, f2]), ref, atol=1e-4)
    assert torch.allclose(rows, head.logits(ref[-1]), atol=1e-4)
    cache.length = first  # a rollback, then the same pairs again: the same numbers
    f3, _ = fast.step(cache, tokens[first:], feats[first:], torch.arange(first + 1, T + 1))
    assert torch.equal(f3, f2)


@pytest.mark.parametrize("path", list(PATHS))
def test_greedy_output_equals_plain_greedy_on_every_head_path(loaded_pair, tmp_path, monkeypatch, path):
    if path != "pytorch" and native.library() is None:
        pytest.skip(f"no native kernel here: {native.why_not()}")
    p, _ = loaded_pair
    a_head(p, tmp_path / path)
    forced(monkeypatch, p, tmp_path / path, path)
    drafted = accepted = 0
    for prompt in PROMPTS:
        ar = generate(prompt, target=p, mode="ar", max_new_tokens=30)
        for drafter, gamma in (("head", 3), ("lookup+head", "auto")):
            sp = generate(prompt, target=p, drafter=drafter, head=str(tmp_path / path), gamma=gamma, max_new_tokens=30)
            assert sp.token_ids == ar.token_ids, (prompt, drafter, path)
            drafted, accepted = drafted + sp.stats["drafted"], accepted + sp.stats["accepted"]
    assert 0 < accepted < drafted  # guesses were kept and turned down


@pytest.mark.parametrize("path", list(PATHS))
def test_sampled_output_follows_the_target_on_every_head_path(small_vocab_pair, tmp_path, monkeypatch, path):
    """Chi-square of the first two tokens at T = 1; the control: lossy verification of the same counts fails."""
    if path != "pytorch" and native.library() is None:
        pytest.skip(f"no native kernel here: {native.why_not()}")
    p, _ = load_pair(*small_vocab_pair, device="cpu")
    folder = tmp_path / path
    a_head(p, folder, first_row=0)
    forced(monkeypatch, p, folder, path)
    ids, n = [5, 6, 7, 5, 6], 1000
    law = exact_two_token_law(p, ids)
    counts, sources = two_token_counts(p, None, ids, n, gamma=2, drafter="head", head=str(folder))
    assert sources == {"head"}
    z, tv = chi2_z(counts, law, n), 0.5 * float((counts / n - law).abs().sum())
    assert z < 4.0 and tv < 0.1, (z, tv)
    lossy, _ = two_token_counts(p, None, ids, n, gamma=2, drafter="head", head=str(folder), relaxed_w=0.0)
    assert chi2_z(lossy, law, n) > 4.0


@needs_kernel
def test_bench_and_recordings_name_the_heads_path(loaded_pair, tmp_path, monkeypatch):
    from specviz.recording.record import environment

    p, q = loaded_pair
    a_head(p, tmp_path / "h")
    shutil.copytree(tmp_path / "h", tmp_path / "h8")
    forced(monkeypatch, p, tmp_path / "h8", "llama.c int8")
    env = environment(p, q, {"drafter": "lookup+head", "head": str(tmp_path / "h8")})
    assert env["head_backend"] == "specviz forward (llama.c, int8 weights)"
    assert "head_backend" not in environment(p, q, {"drafter": "lookup+model"})


@needs_kernel
def test_the_race_names_the_heads_path_when_a_head_drafted(tiny_pair, tmp_path, monkeypatch):
    from specviz.request import RunRequest
    from specviz.ui.common import UIContext
    from specviz.ui.race_run import race_stream

    ctx = UIContext(device="cpu", default_target=tiny_pair[0], default_draft=tiny_pair[1])
    p, _ = ctx.pair()
    a_head(p, tmp_path / "h")
    forced(monkeypatch, p, tmp_path / "h", "llama.c int8")
    assert ctx.pair()[0] is p  # the race's target, so the head loaded above is the one that drafts
    for drafter, named in (("lookup+head", True), ("lookup+model", False)):
        req = RunRequest(drafter=drafter, head=str(tmp_path / "h"), gamma=3, max_new_tokens=12)
        *_, last = race_stream(ctx, "the cat sat", {"spec": req})
        message = last[5]
        assert "Done." in message and "sv-error" not in message, message
        assert ("The draft head ran on specviz forward (llama.c, int8 weights)." in message) == named, message
