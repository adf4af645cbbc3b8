"""The chat template's opening, encoded once per process and model (runtime.keep_opening): a prefill that starts
with it copies its rows and computes the same numbers as one that encodes everything; greedy and sampled output
stay the target's."""

import dataclasses
import math

import pytest
import torch

from specviz import generate, load_pair
from specviz.api import encode_prompt
from specviz.backends.local import _OPENINGS, CachedModel, _forward_key, forget_openings, keep_opening, template_opening
from specviz.engine.loop import eos_ids, speculative_decode
from specviz.request import RunRequest


def fresh_prefill(lm, ids: list[int], monkeypatch, hidden: bool = False):
    """A prefill of ids encoding every token (SPECVIZ_KEEP_OPENING=0 meanwhile): (the run, its hidden states)."""
    monkeypatch.setenv("SPECVIZ_KEEP_OPENING", "0")
    forget_openings()
    try:
        assert template_opening(lm) == []
        run = CachedModel(lm, lm.vocab_size)
        return run, run.prefill(torch.tensor(ids), hidden=hidden)
    finally:
        monkeypatch.setenv("SPECVIZ_KEEP_OPENING", "1")
        forget_openings()


@pytest.mark.parametrize("forward", ["lean", "transformers"])
def test_a_prefill_that_starts_with_the_opening_copies_its_rows_and_computes_the_same(
    loaded_pair, forward, monkeypatch
):
    p, q = loaded_pair
    for lm in (p, q):
        lm = dataclasses.replace(lm, lean=None) if forward == "transformers" else lm
        opening = template_opening(lm)
        ids = encode_prompt(lm, "once upon a time there was a cat")
        assert 0 < len(opening) < len(ids) - 1 and ids[: len(opening)] == opening
        keep_opening(lm, lm.vocab_size)
        assert keep_opening(lm, lm.vocab_size) == 0.0  # once per process and forward
        reused, fed = CachedModel(lm, lm.vocab_size), []
        encode = reused._forward  # (not named `forward`: that is the parameter the next model's loop reads)
        reused._forward = lambda x, *a, fed=fed, encode=encode, **k: fed.append(x.numel()) or encode(x, *a, **k)
        h = reused.prefill(torch.tensor(ids), hidden=True)
        assert fed == [len(ids) - 1 - len(opening)]  # only what follows the opening was encoded
        del reused._forward
        assert reused.length == reused.cache.get_seq_length() == len(ids) - 1 and reused.calls == 0
        fresh, h_ref = fresh_prefill(lm, ids, monkeypatch, hidden=True)
        assert h.shape == h_ref.shape == (len(ids) - 1, lm.model.config.hidden_size)
        a = reused.feed(torch.tensor(ids[-1:] + [5, 6, 7]))
        b = fresh.feed(torch.tensor(ids[-1:] + [5, 6, 7]))
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)  # the same numbers, up to the rounding of another split
        torch.testing.assert_close(h, h_ref, rtol=0, atol=1e-5)  # of the prompt into calls


def test_a_prompt_without_the_opening_is_encoded_whole(loaded_pair, monkeypatch):
    p, _ = loaded_pair
    keep_opening(p, p.vocab_size)
    opening = _OPENINGS[_forward_key(p)].ids
    raw = p.tokenizer("once upon a time")["input_ids"]  # no chat template: does not start with the opening
    assert raw[: len(opening)] != opening
    run = CachedModel(p, p.vocab_size)
    run.prefill(torch.tensor(raw))
    fresh, _ = fresh_prefill(p, raw, monkeypatch)
    assert torch.equal(run.feed(torch.tensor(raw[-1:])), fresh.feed(torch.tensor(raw[-1:])))
    short = CachedModel(p, p.vocab_size)  # the opening and one token: its rows copied, nothing left to encode
    short.prefill(torch.tensor(opening + [5]))
    assert short.length == len(opening)


@pytest.mark.parametrize("drafter", ["model", "lookup+model"])
def test_greedy_races_over_the_kept_opening_equal_plain_decoding(loaded_pair, drafter):
    p, q = loaded_pair
    for prompt in ["hello world", "the cat sat on the mat", "what is 2+2?"]:
        ar = generate(prompt, target=p, draft=q, mode="ar", max_new_tokens=40)
        sp = generate(prompt, target=p, draft=q, drafter=drafter, gamma=3, max_new_tokens=40)
        assert sp.token_ids == ar.token_ids, prompt
    assert _OPENINGS[_forward_key(p)].ids and _OPENINGS[_forward_key(q)].ids  # both models' openings were kept


def test_sampled_output_over_a_kept_opening_follows_the_target(small_vocab_pair, monkeypatch):
    """The chi-square of test_engine's two-token law, with the prompt's first two tokens standing for a template's
    opening: both models copy those rows in every run."""
    from specviz.backends import local as runtime

    p, q = load_pair(*small_vocab_pair, device="cpu")
    ids = [1, 5, 6]
    monkeypatch.setattr(runtime, "template_opening", lambda lm: ids[:2])
    V = p.vocab_size
    with torch.no_grad():
        p1 = torch.softmax(p.model(torch.tensor([ids])).logits[0, -1].float(), -1)
        p2 = torch.softmax(p.model(torch.tensor([ids + [a] for a in range(V)])).logits[:, -1].float(), -1)
    exact = (p1[:, None] * p2).flatten()
    for a in eos_ids(p):  # after EOS nothing follows: its mass sits on (eos, -)
        exact.view(V, V)[a] = 0
    law = torch.cat([exact, torch.tensor([float(p1[a]) if a in eos_ids(p) else 0.0 for a in range(V)])])
    N = 3000
    counts = torch.zeros(V * V + V)
    for seed in range(N):
        t = list(
            speculative_decode(
                p,
                q,
                ids,
                RunRequest(drafter="model", gamma=1, tree="off", max_new_tokens=2, seed=seed, temperature=1.0).spec,
            )
        )[-1].token_ids
        counts[V * V + t[0] if len(t) == 1 else t[0] * V + t[1]] += 1
    assert _OPENINGS[_forward_key(p)].ids == ids[:2] and _OPENINGS[_forward_key(q)].ids == ids[:2]
    keep = law * N >= 5
    chi2 = float((((counts[keep] - N * law[keep]) ** 2) / (N * law[keep])).sum())
    dof = int(keep.sum()) - 1
    assert (chi2 - dof) / math.sqrt(2 * dof) < 4.0, (chi2, dof)


def test_a_recording_and_the_bench_say_how_the_prompt_was_encoded(loaded_pair, monkeypatch):
    from specviz import record_run
    from specviz.backends.local import opening_note

    p, q = loaded_pair
    rec = record_run("hello world", target=p, draft=q, gamma=2, max_new_tokens=4)
    n = len(template_opening(p))
    assert rec.env["prompt_encoding"] == opening_note(
        p
    ) and f"first {n} tokens encoded once per process" in opening_note(p)
    monkeypatch.setenv("SPECVIZ_KEEP_OPENING", "0")
    assert opening_note(p) == "every prompt token encoded (SPECVIZ_KEEP_OPENING=0)"
