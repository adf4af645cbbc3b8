"""A lean draft's greedy guesses for a round in one native call (lean_chain.py, csrc/chain.c): the same tokens, cache
and counts as next_greedy called in a loop, in every forward the chain runs on; greedy speculative output equals
plain with it; it never runs where the loop must (sampling, no cut output layer, a long first call)."""

from __future__ import annotations

import itertools

import pytest
import torch
from conftest import blocking_pair
from two_tokens import chi2_z, exact_two_token_law, two_token_counts

from specviz import generate, lean_chain, native, sampling
from specviz.config import SpecvizError
from specviz.runtime import CachedModel

PROMPTS = ["hello world", "the cat sat on", "one two three four five", "tell me a story"]
BLOCKED = [r for r in range(64) if r % 4]  # 48 of the tiny draft's 64 rows: its output layer is cut to 16
FORWARDS = [("llama.c", "0", "0"), ("llama.c", "1", "0"), ("llama.c, weights in panels", "1", "0")]
FORWARDS += [("llama.c", "0", "1")]  # a float16 draft: its embedding rows read as float16


@pytest.fixture
def chain_calls(monkeypatch):
    """The chains that ran: (tokens fed first, guesses)."""
    calls, real = [], lean_chain.greedy_chain

    def spy(lm, cache, ids, k):
        out = real(lm, cache, ids, k)
        calls.append((ids.numel(), k, out is not None))
        return out

    monkeypatch.setattr(lean_chain, "greedy_chain", spy)
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
            sp = generate(prompt, target=p, draft=q, mode="spec", gamma=gamma, max_new_tokens=32)
            assert sp.token_ids == ar.token_ids, (gamma, prompt)
            assert chain_calls and all(ran for _, _, ran in chain_calls)  # every round's guesses by the chain
            with monkeypatch.context() as m:
                m.setattr(lean_chain, "greedy_chain", lambda *a: None)  # the loop of next_greedy
                loop = generate(prompt, target=p, draft=q, mode="spec", gamma=gamma, max_new_tokens=32)
            keys = ("drafted", "accepted", "target_calls", "draft_calls")
            assert [sp.stats[k] for k in keys] == [loop.stats[k] for k in keys], (gamma, prompt)
            assert sp.token_ids == loop.token_ids


def test_the_chain_steps_aside_where_the_loop_must_run(pair_with, tiny_pair, tmp_path, chain_calls):
    """No chain without a cut output layer, on PyTorch's forward, or for a first call longer than llama.c's; at
    T > 0 the drafter samples call by call (no chain), and the target's law holds."""
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
    assert chain_calls == []  # sampled: never a chain
    assert chi2_z(counts, exact_two_token_law(p, ids), N) < 4.0


def test_a_chain_whose_scores_break_raises_greedys_error(pair_with, tiny_pair, tmp_path, monkeypatch):
    p, q = pair_with("llama.c", pair=blocking_pair(tiny_pair, tmp_path / "d64", BLOCKED))
    q.lean.norm.fill_(float("nan"))  # every logit NaN from the first call on
    for chain in (True, False):
        run = CachedModel(q, p.vocab_size)
        run.prefill(torch.tensor([5, 9, 12]))
        if chain:
            with pytest.raises(SpecvizError, match="NaN or infinite"):
                run.greedy_chain(torch.tensor([7]), 3)
        else:
            with pytest.raises(SpecvizError, match="NaN or infinite"):
                run.next_greedy(torch.tensor([7]))
    assert sampling.BROKEN.startswith("The model returned NaN")
