"""The decoding loops with tiny real models: greedy exactness, the sampled law, caches, EOS, determinism."""

import dataclasses
import itertools
import math

import pytest
import torch
from conftest import engine_config

from specviz import Done, Round, Start, Step, generate, race
from specviz.engine.loop import autoregressive_decode, eos_ids, speculative_decode
from specviz.request import RunRequest

PROMPTS = ["hello world", "the cat sat on the mat", "abc", "q", "what is 2+2?", "once upon a time", "x = (1, 2)"]


def run(p, q, ids, **kw):
    cfg = engine_config(**kw)
    events = list(speculative_decode(p, q, ids, cfg) if q is not None else autoregressive_decode(p, ids, cfg))
    return events


@pytest.mark.parametrize("gamma", range(1, 9))
def test_greedy_spec_equals_greedy_ar_token_for_token(loaded_pair, gamma):
    p, q = loaded_pair
    rejections = 0
    for prompt in PROMPTS:
        ar = generate(prompt, target=p, draft=q, mode="ar", max_new_tokens=48)
        sp = generate(prompt, target=p, draft=q, mode="spec", gamma=gamma, max_new_tokens=48)
        assert sp.token_ids == ar.token_ids, prompt
        rejections += sp.stats["drafted"] - sp.stats["accepted"]
    assert rejections > 0  # the draft disagrees sometimes: rollback paths were exercised


def test_greedy_ar_equals_transformers_generate(loaded_pair):
    p, q = loaded_pair
    for prompt in PROMPTS:
        ours = generate(prompt, target=p, mode="ar", max_new_tokens=40)
        ids = p.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        x = p.tokenizer(ids, add_special_tokens=False, return_tensors="pt")
        ref = p.model.generate(**x, do_sample=False, max_new_tokens=40, pad_token_id=0)[0, x["input_ids"].shape[1] :]
        assert list(ours.token_ids) == ref.tolist()[: len(ours.token_ids)]
        assert len(ours.token_ids) == len(ref)  # both stopped at the same EOS or at the budget


def test_each_round_yields_between_1_and_gamma_plus_1_and_counts_add_up(loaded_pair):
    p, q = loaded_pair
    ids = p.tokenizer("the cat sat")["input_ids"]
    events = run(p, q, ids, gamma=4, max_new_tokens=60, temperature=1.0, seed=3)
    rounds = [e for e in events if isinstance(e, Round)]
    done = events[-1]
    assert isinstance(done, Done)
    assert all(1 <= len(r.tokens) <= 5 for r in rounds)
    assert sum(len(r.tokens) for r in rounds) == len(done.token_ids) == done.stats["new_tokens"]
    assert done.stats["target_calls"] == len(rounds)
    assert done.stats["accepted"] == sum(r.n for r in rounds)
    kinds = {r.kind for r in rounds}
    assert kinds == {"resampled", "bonus"}
    for r in rounds:
        assert r.tokens[: r.n] == r.drafted[: r.n]
        if r.kind == "resampled":
            assert r.rejected == r.drafted[r.n] and r.r[r.n] >= r.accept_prob[r.n]
        assert all(r.r[i] < r.accept_prob[i] for i in range(r.n))


def test_kv_cache_rollback_matches_a_fresh_encoding(loaded_pair):
    """Feed, feed wrong tokens, roll them back, feed on: the logits equal an uncached pass of the true sequence."""
    from specviz.backends.local import CachedModel

    p, q = loaded_pair
    seq = p.tokenizer("once upon a time")["input_ids"] + list(range(10, 30))
    with torch.no_grad():
        ref = p.model(torch.tensor([seq])).logits[0, -1]
    for lm in (p, q):
        r = CachedModel(lm, p.vocab_size)
        r.feed(torch.tensor(seq[:10]))
        r.feed(torch.tensor(seq[10:15] + [7, 8, 9]))  # three wrong tokens ...
        r.rollback(r.length - 3)  # ... rolled back
        assert r.length == r.cache.get_seq_length() == 15
        last = r.feed(torch.tensor(seq[15:]))[-1]
        if lm is p:
            assert torch.allclose(last, ref, atol=1e-4)


def test_eos_mid_block_stops_right_after_eos(loaded_pair):
    p, q = loaded_pair
    eos = eos_ids(p)
    found = False
    for prompt, gamma in itertools.product(PROMPTS, [3, 6]):
        ar = generate(prompt, target=p, draft=q, mode="ar", max_new_tokens=64)
        sp = generate(prompt, target=p, draft=q, mode="spec", gamma=gamma, max_new_tokens=64)
        if ar.finish_reason == "eos":
            found = True
            assert sp.finish_reason == "eos" and sp.token_ids[-1] in eos
            assert not any(t in eos for t in sp.token_ids[:-1])
    assert found  # at least one prompt ends with EOS before the budget


@pytest.mark.parametrize("max_new", [1, 2, 5, 7, 13])
def test_max_new_tokens_is_exact_even_mid_block(loaded_pair, max_new):
    p, q = loaded_pair
    sp = generate("hello world", target=p, draft=q, gamma=4, max_new_tokens=max_new, temperature=1.0, seed=5)
    ar = generate("hello world", target=p, draft=q, mode="ar", max_new_tokens=max_new, temperature=1.0, seed=5)
    for r in (sp, ar):
        assert len(r.token_ids) == max_new or r.finish_reason == "eos"


def test_same_seed_same_output_and_other_seed_differs(loaded_pair):
    p, q = loaded_pair
    kw = dict(target=p, draft=q, gamma=3, max_new_tokens=40, temperature=1.0, top_k=20, top_p=0.95)
    a = generate("hello world", seed=11, **kw)
    b = generate("hello world", seed=11, **kw)
    c = generate("hello world", seed=12, **kw)
    assert a.token_ids == b.token_ids and a.stats["accepted"] == b.stats["accepted"]
    assert a.token_ids != c.token_ids


def test_a_float16_draft_changes_only_the_guesses(tiny_pair, monkeypatch):
    """Where the CPU runs float16 faster the draft loads so (kernels.draft_dtype); greedy output stays p's."""
    from specviz import load_pair

    monkeypatch.setenv("SPECVIZ_CPU_HALF_DRAFT", "1")
    p, q = load_pair(*tiny_pair, device="cpu")
    assert (p.dtype, q.dtype) == (torch.float32, torch.float16)
    assert load_pair(*tiny_pair, device="cpu", dtype="float32")[1].dtype == torch.float32  # an explicit dtype wins
    rejections = 0
    for gamma, prompt in itertools.product((1, 3, 6), PROMPTS):
        ar = generate(prompt, target=p, draft=q, mode="ar", max_new_tokens=32)
        sp = generate(prompt, target=p, draft=q, mode="spec", gamma=gamma, max_new_tokens=32)
        assert sp.token_ids == ar.token_ids, (gamma, prompt)
        rejections += sp.stats["drafted"] - sp.stats["accepted"]
    assert rejections > 0


@pytest.mark.parametrize("half", ["0", "1"], ids=["float32 draft", "float16 draft"])
def test_sampled_spec_follows_target_distribution_over_two_tokens(small_vocab_pair, monkeypatch, half):
    """With vocabulary 8, the joint law of the first two tokens has 64 outcomes: compute p exactly,
    draw speculative samples (gamma 1: accept, resample and bonus all happen), compare."""
    from specviz import load_pair

    monkeypatch.setenv("SPECVIZ_CPU_HALF_DRAFT", half)
    p, q = load_pair(*small_vocab_pair, device="cpu")
    assert q.dtype == (torch.float16 if half == "1" else torch.float32)
    ids = [1, 5, 6]
    V = p.vocab_size
    with torch.no_grad():
        p1 = torch.softmax(p.model(torch.tensor([ids])).logits[0, -1].float(), -1)
        nxt = torch.tensor([ids + [a] for a in range(V)])
        p2 = torch.softmax(p.model(nxt).logits[:, -1].float(), -1)  # (V, V)
        q1 = torch.softmax(q.model(torch.tensor([ids])).logits[0, -1].float(), -1)
        q2 = torch.softmax(q.model(nxt).logits[:, -1].float(), -1)
    eos = eos_ids(p)
    exact = (p1[:, None] * p2).flatten()
    for a in eos:  # after EOS nothing follows: its mass sits on (eos, -)
        exact.view(V, V)[a] = 0
    N = 3000
    counts = torch.zeros(V * V + V)
    g = RunRequest(drafter="model", gamma=1, tree="off", max_new_tokens=2, temperature=1.0).spec
    for seed in range(N):
        cfg = RunRequest(
            drafter="model",
            gamma=g.gamma,
            tree="off",
            max_new_tokens=g.max_new_tokens,
            seed=seed,
            **dataclasses.asdict(g.sampling),
        ).spec
        done = list(speculative_decode(p, q, ids, cfg))[-1]
        t = done.token_ids
        counts[V * V + t[0] if len(t) == 1 else t[0] * V + t[1]] += 1
    law = torch.cat([exact, torch.tensor([float(p1[a]) if a in eos else 0.0 for a in range(V)])])
    emp = counts / N
    tv = 0.5 * float((emp - law).abs().sum())
    draft_law = torch.cat([(q1[:, None] * q2).flatten(), torch.zeros(V)])
    for a in eos:
        draft_law[V * V + a] = q1[a]
        draft_law.view(-1)[a * V : a * V + V] = 0
    tv_q = 0.5 * float((emp - draft_law).abs().sum())
    # chi-square goodness of fit on outcomes with enough expected mass
    keep = law * N >= 5
    chi2 = float((((counts[keep] - N * law[keep]) ** 2) / (N * law[keep])).sum())
    dof = int(keep.sum()) - 1
    z = (chi2 - dof) / math.sqrt(2 * dof)  # normal approximation
    assert z < 4.0, (chi2, dof)
    assert tv < 0.08 and tv_q > tv + 0.05, (tv, tv_q)


def test_race_orders_events_by_each_side_s_own_clock(loaded_pair):
    p, q = loaded_pair
    ids = p.tokenizer("hello world")["input_ids"]
    cfg = engine_config(max_new_tokens=20)
    merged = list(race(autoregressive_decode(p, ids, cfg), speculative_decode(p, q, ids, cfg)))
    sides = {s for s, _ in merged}
    assert sides == {"ar", "spec"}
    ar_steps = [e for s, e in merged if isinstance(e, Step)]
    assert [e.index for e in ar_steps] == list(range(len(ar_steps)))
    clock = {"ar": 0.0, "spec": 0.0}
    finished = set()
    for side, ev in merged:  # each event comes from the side that was behind (or the only one left)
        other = "spec" if side == "ar" else "ar"
        assert other in finished or clock[side] <= clock[other]
        if isinstance(ev, Start):  # a side's clock: its prompt encoding, then each event's own compute total
            clock[side] = ev.prefill_s
        clock[side] = getattr(ev, "elapsed_s", clock[side])
        if isinstance(ev, Done):
            finished.add(side)
    ar_done = [e for s, e in merged if s == "ar" and isinstance(e, Done)][0]
    sp_done = [e for s, e in merged if s == "spec" and isinstance(e, Done)][0]
    assert ar_done.token_ids == sp_done.token_ids
