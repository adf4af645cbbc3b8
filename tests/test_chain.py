"""A lean draft's guesses for a round in one native call (lean_chain.py, csrc/chain.c): the same tokens, cache
and counts as next_greedy (T = 0) or feed and draw (T > 0) called in a loop, in every forward the chain runs on;
greedy speculative output equals plain with it, sampled output follows the target's law (chi-square) and is the
loop's own for a seed; it never runs where the loop must (no cut output layer, a long first call, top-k, top-p, a
confidence threshold)."""

from __future__ import annotations

import itertools
import re

import pytest
import torch
from conftest import blocking_pair
from two_tokens import chi2_z, exact_two_token_law, two_token_counts

from specviz import generate, sampling
from specviz.backends.local import CachedModel
from specviz.config import SamplingConfig, SpecvizError
from specviz.drafters.base import DraftContext, draw
from specviz.drafters.policies import GammaPolicy
from specviz.engine import costs
from specviz.native import chain as lean_chain
from specviz.native import library as native

PROMPTS = ["hello world", "the cat sat on", "one two three four five", "tell me a story"]
BLOCKED = [r for r in range(64) if r % 4]  # 48 of the tiny draft's 64 rows: its output layer is cut to 16
FORWARDS = [("llama.c", "0", "0"), ("llama.c", "1", "0"), ("llama.c, weights in panels", "1", "0")]
FORWARDS += [("llama.c", "0", "1")]  # a float16 draft: its embedding rows read as float16


@pytest.fixture
def chain_calls(monkeypatch):
    """The chains that ran: (tokens fed first, guesses)."""
    calls, real = [], lean_chain.greedy_chain

    def spy(lm, cache, ids, k, mix=None):
        out = real(lm, cache, ids, k, mix)
        calls.append((ids.numel(), k, out is not None))
        return out

    monkeypatch.setattr(lean_chain, "greedy_chain", spy)
    return calls


@pytest.fixture
def sampled_calls(monkeypatch):
    """The sampled chains that ran: (tokens fed first, guesses, whether it ran)."""
    calls, real = [], lean_chain.sampled_chain

    def spy(lm, cache, ids, k, temperature, generator):
        out = real(lm, cache, ids, k, temperature, generator)
        calls.append((ids.numel(), k, out is not None))
        return out

    monkeypatch.setattr(lean_chain, "sampled_chain", spy)
    return calls


def _state(run: CachedModel) -> tuple:
    n = run.cache.length
    return run.length, run.calls, n, run.cache.k[:, :, :n].clone(), run.cache.v[:, :, :n].clone()


@pytest.mark.parametrize("forward,int8,half", FORWARDS)
def test_a_chain_gives_the_tokens_and_cache_of_the_loop(pair_with, tiny_pair, tmp_path, forward, int8, half):
    p, q = pair_with(forward, pair=blocking_pair(tiny_pair, tmp_path / "d64", BLOCKED), int8=int8, half=half)
    assert q.lean.kept is not None and q.lean.lib is not None
    assert q.lean.embed.dtype == (torch.float16 if half == "1" else torch.float32)
    prompt = torch.tensor([5, 9, 12, 30, 7, 8])
    feeds = torch.randint(0, 64, (40,), generator=torch.Generator().manual_seed(1))
    walked = set()
    for first, k in itertools.product((1, 3, native.MAX_ROWS), (1, 2, 5)):
        ids = feeds[:first]
        runs = [CachedModel(q, p.vocab_size) for _ in range(2)]
        for run in runs:
            run.prefill(prompt)
            run.next_greedy(prompt[-1:])  # a cache with a step in it already
        chained = runs[0].greedy_chain(ids, k)
        assert chained is not None and chained.shape == (k,)
        looped, x = [], ids
        for _ in range(k):
            x = runs[1].next_greedy(x)
            looped.append(int(x))
        assert chained.tolist() == looped, (first, k)
        a, b = _state(runs[0]), _state(runs[1])
        assert a[:3] == b[:3] and torch.equal(a[3], b[3]) and torch.equal(a[4], b[4]), (first, k)
        walked |= set(looped)
    assert walked <= set(range(0, 64, 4)) and len(walked) > 2  # real walks over the rows it may propose


@pytest.mark.parametrize("forward,int8,half", FORWARDS)
def test_greedy_speculative_output_with_the_chain_equals_plain_and_the_loops_rounds(
    pair_with, tiny_pair, tmp_path, monkeypatch, chain_calls, forward, int8, half
):
    p, q = pair_with(forward, pair=blocking_pair(tiny_pair, tmp_path / "d64", BLOCKED), int8=int8, half=half)
    for gamma in (1, 4):
        for prompt in PROMPTS:
            ar = generate(prompt, target=p, draft=q, mode="ar", max_new_tokens=32)
            chain_calls.clear()
            sp = generate(prompt, target=p, draft=q, mode="spec", gamma=gamma, max_new_tokens=32, tree="off")
            assert sp.token_ids == ar.token_ids, (gamma, prompt)
            assert chain_calls and all(ran for _, _, ran in chain_calls)  # every round's guesses by the chain
            with monkeypatch.context() as m:
                m.setattr(lean_chain, "greedy_chain", lambda *a: None)  # the loop of next_greedy
                loop = generate(prompt, target=p, draft=q, mode="spec", gamma=gamma, max_new_tokens=32, tree="off")
            keys = ("drafted", "accepted", "target_calls", "draft_calls")
            assert [sp.stats[k] for k in keys] == [loop.stats[k] for k in keys], (gamma, prompt)
            assert sp.token_ids == loop.token_ids


def test_the_chain_steps_aside_where_the_loop_must_run(pair_with, tiny_pair, tmp_path, chain_calls):
    """No chain without a cut output layer, on PyTorch's forward, or for a first call longer than llama.c's; at
    T > 0 the greedy chain never runs (the sampled one does, below), and the target's law holds."""
    p, q = pair_with("llama.c")  # every row proposable: no cut output layer
    assert q.lean.kept is None
    assert CachedModel(q, p.vocab_size).greedy_chain(torch.tensor([3, 4]), 3) is None
    p, q = pair_with("PyTorch ops", pair=blocking_pair(tiny_pair, tmp_path / "a", BLOCKED))
    assert q.lean.kept is not None and CachedModel(q, p.vocab_size).greedy_chain(torch.tensor([3]), 3) is None
    p, q = pair_with("llama.c", pair=blocking_pair(tiny_pair, tmp_path / "b", BLOCKED))
    run = CachedModel(q, p.vocab_size)
    assert run.greedy_chain(torch.arange(native.MAX_ROWS + 1), 2) is None and run.length == run.calls == 0
    chain_calls.clear()
    ids, N = [1, 5, 6], 3000
    counts, _ = two_token_counts(p, q, ids, N, gamma=2)
    assert chain_calls == []  # sampled: never the greedy chain
    assert chi2_z(counts, exact_two_token_law(p, ids), N) < 4.0


@pytest.mark.parametrize("forward,int8,half,reverse", [(*f, False) for f in FORWARDS] + [("llama.c", "0", "0", True)])
def test_a_sampled_chain_gives_the_draws_probabilities_and_cache_of_the_loop(
    pair_with, tiny_pair, tmp_path, forward, int8, half, reverse
):
    """Chain and loop of feed + draw from the same generator state: the same guesses, the scores bit for bit, the
    probabilities to float32's rounding (expf against PyTorch's exp), the same cache and generator state after;
    reverse: a draft whose rows are not in its target ids' order (the draws walk the ids' order, as draw does)."""
    pair = blocking_pair(tiny_pair, tmp_path / "d64", BLOCKED, reverse)
    p, q = pair_with(forward, pair=pair, int8=int8, half=half)
    prompt = torch.tensor([5, 9, 12, 30, 7, 8])
    feeds = torch.randint(0, 64, (40,), generator=torch.Generator().manual_seed(1))
    ids = q.proposable
    walked = set()
    for (first, k), temperature in itertools.product(itertools.product((1, 3, native.MAX_ROWS), (1, 2, 5)), (0.6, 1.5)):
        runs = [CachedModel(q, p.vocab_size) for _ in range(2)]
        gens = [torch.Generator().manual_seed(first * 10 + k) for _ in range(2)]
        for run in runs:
            run.prefill(prompt)
            run.next_greedy(prompt[-1:])
        drawn = runs[0].sampled_chain(feeds[:first], k, temperature, gens[0])
        assert drawn is not None
        chained, scores, probs = drawn
        assert chained.shape == (k,) and scores.shape == probs.shape == (k, ids.numel())
        ctx = DraftContext(SamplingConfig(temperature), gens[1], p.vocab_size, torch.device("cpu"), GammaPolicy(k), 99)
        x = feeds[:first]
        for i in range(k):
            logits = runs[1].feed(x, last_only=True)[-1]
            x, q_row = draw(logits, ctx, ids)
            assert int(x) == int(chained[i]), (first, k, temperature, i)
            assert torch.equal(scores[i], logits[ids])
            torch.testing.assert_close(probs[i], q_row[ids], rtol=1e-5, atol=1e-7)
            assert torch.equal(q_row[ids] > 0, probs[i] > 0) and float(probs[i].sum()) == pytest.approx(1.0, abs=1e-5)
            walked.add(int(x))
        assert torch.equal(gens[0].get_state(), gens[1].get_state())
        a, b = _state(runs[0]), _state(runs[1])  # the last draw fed by neither
        assert a[:3] == b[:3] and torch.equal(a[3], b[3]) and torch.equal(a[4], b[4]), (first, k, temperature)
    assert walked <= set(ids.tolist()) and len(walked) > 4  # draws over the ids it may propose
    assert (lean_chain.proposal_order(q).tolist() == list(range(15, -1, -1))) is reverse


@pytest.mark.parametrize("forward,int8,half", FORWARDS[::3])
def test_sampled_output_with_the_chain_follows_the_target_and_is_the_loops_for_a_seed(
    pair_with, tiny_pair, tmp_path, monkeypatch, sampled_calls, forward, int8, half
):
    p, q = pair_with(forward, pair=blocking_pair(tiny_pair, tmp_path / "d64", BLOCKED), int8=int8, half=half)
    ids, N = [1, 5, 6], 3000
    counts, _ = two_token_counts(p, q, ids, N, gamma=2)
    assert sampled_calls and all(ran for _, _, ran in sampled_calls)  # every round's guesses by the chain
    assert chi2_z(counts, exact_two_token_law(p, ids), N) < 4.0
    for seed, prompt in enumerate(PROMPTS):
        sp = generate(prompt, target=p, draft=q, temperature=0.9, seed=seed, gamma=3, max_new_tokens=24)
        with monkeypatch.context() as m:
            m.setattr(lean_chain, "sampled_chain", lambda *a: None)  # the loop of feed and draw
            loop = generate(prompt, target=p, draft=q, temperature=0.9, seed=seed, gamma=3, max_new_tokens=24)
        assert sp.token_ids == loop.token_ids, prompt
        keys = ("drafted", "accepted", "target_calls", "draft_calls")
        assert [sp.stats[k] for k in keys] == [loop.stats[k] for k in keys], prompt


def test_the_sampled_chain_steps_aside_for_top_k_top_p_and_a_threshold(pair_with, tiny_pair, tmp_path, sampled_calls):
    p, q = pair_with("llama.c", pair=blocking_pair(tiny_pair, tmp_path / "d64", BLOCKED))
    generate("hello world", target=p, draft=q, temperature=0.9, seed=1, gamma=3, max_new_tokens=12)
    assert sampled_calls and all(ran for _, _, ran in sampled_calls)
    for kw in ({"top_k": 5}, {"top_p": 0.9}, {"gamma_policy": "confidence"}):
        sampled_calls.clear()
        r = generate("hello world", target=p, draft=q, temperature=0.9, seed=1, gamma=3, max_new_tokens=12, **kw)
        assert r.stats["drafted"] > 0 and sampled_calls == [], kw  # guessed, by the loop
    p, q = pair_with("llama.c")  # every row proposable: no cut output layer, nothing to chain over
    run, g = CachedModel(q, p.vocab_size), torch.Generator().manual_seed(3)
    before = g.get_state()
    assert run.sampled_chain(torch.tensor([3, 4]), 3, 1.0, g) is None and torch.equal(g.get_state(), before)
    p, q = pair_with("llama.c", pair=blocking_pair(tiny_pair, tmp_path / "b", BLOCKED))
    run = CachedModel(q, p.vocab_size)
    assert run.sampled_chain(torch.arange(native.MAX_ROWS + 1), 2, 1.0, g) is None  # too long a first call
    assert run.length == run.calls == 0 and torch.equal(g.get_state(), before)  # no uniform taken


def test_a_chain_whose_scores_break_raises_greedys_error(pair_with, tiny_pair, tmp_path, monkeypatch):
    p, q = pair_with("llama.c", pair=blocking_pair(tiny_pair, tmp_path / "d64", BLOCKED))
    q.lean.norm.fill_(float("nan"))  # every logit NaN from the first call on
    for chain in ("greedy", "sampled", "loop"):
        run = CachedModel(q, p.vocab_size)
        run.prefill(torch.tensor([5, 9, 12]))
        with pytest.raises(SpecvizError, match="NaN or infinite"):
            if chain == "greedy":
                run.greedy_chain(torch.tensor([7]), 3)
            elif chain == "sampled":
                run.sampled_chain(torch.tensor([7]), 3, 0.8, torch.Generator().manual_seed(0))
            else:
                run.next_greedy(torch.tensor([7]))
    assert sampling.BROKEN.startswith("The model returned NaN")


def test_auto_prices_a_sampled_rounds_draft_steps_by_the_sampled_chain(
    pair_with, tiny_pair, tmp_path, monkeypatch, sampled_calls
):
    p, q = pair_with("llama.c", pair=blocking_pair(tiny_pair, tmp_path / "d64", BLOCKED))
    monkeypatch.setattr(costs, "_COLD_MEMO", type(costs._COLD_MEMO)())
    steps, spent = costs.draft_step_calibration(p, q, [1, 2, 3], [1, 2, 3], p.vocab_size, False)
    assert sampled_calls == [(1, 1, True)] * 2 * (costs.CALIBRATION_REPS + 1) and min(steps) > 0 and spent > 0


def test_a_call_without_memory_for_its_buffers_fails_in_one_sentence_and_the_models_keep_working(
    pair_with, tiny_pair, tmp_path
):
    """llama.c's own buffers not allocated (llama_refuse_buffers fakes malloc's failure): the target's forward, the
    draft's chain and its tree read each raise the out-of-memory sentence, not 'refused its arguments' and not stale
    numbers, and the next call gives the same bits as before."""
    from specviz.drafters.model import TREE_CHILDREN

    p, q = pair_with("llama.c", pair=blocking_pair(tiny_pair, tmp_path / "d64", BLOCKED), int8="0", half="0")
    prompt, lib = torch.tensor([5, 9, 12, 30, 7, 8]), native.library()

    def fresh(m):
        run = CachedModel(m, p.vocab_size)
        run.prefill(prompt)
        return run

    calls = {  # each: a setup (prefills run before the refusal), then the call the refusal meets
        "forward": (lambda: p.lean.new_cache(), lambda c: p.lean.forward(c, prompt)[0]),
        "chain": (lambda: fresh(q), lambda run: run.greedy_chain(prompt[-2:], 3)),
        "tree read": (lambda: fresh(q), lambda run: run.tree_read(prompt[-1:], None, TREE_CHILDREN)),
    }
    for name, (setup, call) in calls.items():
        before = call(setup())
        assert before is not None, name
        ready = setup()
        lib.llama_refuse_buffers(1)
        try:
            with pytest.raises(SpecvizError, match=f"^{re.escape(native.OUT_OF_MEMORY)}$"):
                call(ready)
        finally:
            lib.llama_refuse_buffers(0)
        after = call(setup())
        same = torch.equal(after, before) if isinstance(before, torch.Tensor) else after == before
        assert same, name
