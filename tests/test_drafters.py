"""The drafter seam: prompt lookup on hand-built sequences, the gamma policies on scripted outcomes, and
exactness (greedy equality, the sampled law) for every drafter and policy; the accounting in theory.py."""

import dataclasses
import functools

import pytest
import torch
from conftest import engine_config
from two_tokens import chi2_z, exact_two_token_law, two_token_counts

from specviz import Done, Round, SamplingConfig, SpecvizError, generate, load_pair
from specviz.drafters.model import Drafter, LookupDrafter, Proposal
from specviz.drafters.policies import Auto, Heuristic
from specviz.engine.loop import autoregressive_decode, speculative_decode
from specviz.request import RunRequest
from specviz.theory import (
    accepted_histogram,
    expected_speedup,
    expected_speedup_measured,
    expected_tokens,
    expected_tokens_by_position,
    position_alphas,
)

PROMPTS = ["hello world", "the cat sat on the mat, the cat sat on the hat", "abc abc abc", "q", "x = (1, 2)"]
CONFIGS = [  # (drafter, gamma policy): every drafter and every policy at least once
    ("model", "constant"),
    ("lookup", "constant"),
    ("lookup+model", "constant"),
    ("model", "heuristic"),
    ("model", "confidence"),
    ("model", "auto"),
    ("lookup", "auto"),
    ("lookup+model", "auto"),
]


# --- prompt lookup on hand-built token sequences -----------------------------------------------------


@pytest.mark.parametrize(
    "seq, k, want",
    [
        ([1, 2, 3, 9, 1, 2, 3], 3, [9, 1, 2]),  # a match of the last 3 tokens: what followed them
        ([1, 2, 3, 4], 5, []),  # no earlier occurrence of any suffix
        ([7, 7, 7, 7], 4, [7]),  # overlapping n-grams: the most recent earlier (7, 7, 7) ends right before the end
        ([1, 2, 1, 2], 4, [1, 2]),  # a match at the very end: its continuation runs up to the last token
        ([1, 2, 5, 1, 2, 6, 1, 2], 5, [6, 1, 2]),  # the most recent earlier occurrence wins
        ([1, 2, 3, 8, 5, 2, 3, 9, 1, 2, 3], 2, [8, 5]),  # the longest suffix first: (1, 2, 3), not (2, 3)
        ([4, 9, 4], 3, [9, 4]),  # down to a 1-gram
        ([4], 3, []),  # nothing before the last token
    ],
)
def test_lookup_on_hand_built_sequences(seq, k, want):
    assert LookupDrafter(prompt_lookup_num_tokens=10, max_matching_ngram_size=3).match(seq, k) == want


@pytest.mark.parametrize(
    "seq, want",
    [
        ([5, 1, 7, 8, 5], []),  # the only earlier 5 is followed by a control token: nothing to copy
        ([5, 6, 1, 9, 5], [6]),  # a continuation ends before its first control token
        ([3, 5, 1, 9, 6, 5, 7, 3, 5], [7, 3, 5]),  # (3, 5) would copy a control token at once: the 1-gram (5) instead
    ],
)
def test_lookup_copies_no_control_token(seq, want):
    assert LookupDrafter(max_matching_ngram_size=2, never=frozenset({1})).match(seq, 3) == want


def test_lookup_never_proposes_the_chat_template_s_tokens(loaded_pair):
    """A race's lookup copied the template's tokens from the prompt (the built-in target's first round proposed
    `<|im_start|>`); it copies none of the target's control tokens but its end of turn, and the output is plain's."""
    from specviz.drafters.lookup import never_copied

    p, _ = loaded_pair
    never = never_copied(p)
    assert never == {0, 1, 3, 4}  # <unk>, <s>, <|user|>, <|assistant|>; not </s>, its end of turn
    ids = p.tokenizer("<|user|>ab<|assistant|>ab<|user|>ab")["input_ids"]
    cfg = RunRequest(drafter="lookup", gamma=4, tree="off", max_new_tokens=16).spec
    events = list(speculative_decode(p, None, ids, cfg))
    assert not {t for e in events if isinstance(e, Round) for t in e.drafted} & never
    assert events[-1].token_ids == list(autoregressive_decode(p, ids, cfg))[-1].token_ids
    unguarded = [e for e in speculative_decode(p, None, ids, cfg, drafter=LookupDrafter()) if isinstance(e, Round)]
    assert unguarded[0].drafted[0] == 4  # without the rule: <|assistant|>, what followed "<|user|>ab" before


def test_lookup_index_grows_with_the_text():
    d = LookupDrafter(max_matching_ngram_size=2)
    assert d.match([5, 6, 7], 3) == []
    assert d.match([5, 6, 7, 5, 6], 3) == [7, 5, 6]  # the same drafter, the text grown by two tokens
    assert d.match([5, 6, 7, 5, 6, 8, 5, 6], 3) == [8, 5, 6]  # and again: the newer occurrence wins


def test_lookup_respects_prompt_lookup_num_tokens(loaded_pair):
    p, _ = loaded_pair
    ids = p.tokenizer("abcdefgh abcdefgh abcdefgh")["input_ids"]
    cfg = RunRequest(drafter="lookup", gamma=8, tree="off", max_new_tokens=24, prompt_lookup_num_tokens=2).spec
    rounds = [e for e in speculative_decode(p, None, ids, cfg) if isinstance(e, Round)]
    assert max(len(r.drafted) for r in rounds) <= 2
    assert any(r.drafted for r in rounds) and all(set(r.sources) <= {"lookup"} for r in rounds)


# --- the gamma policies on scripted acceptance patterns -----------------------------------------------


def test_heuristic_grows_by_two_on_a_clean_round_and_shrinks_by_one_otherwise():
    h = Heuristic(3)
    seen = []
    for proposed, n in [(3, 3), (5, 5), (7, 2), (6, 0), (5, 0), (4, 0), (3, 0), (2, 0), (1, 0), (1, 1)]:
        assert h.k("model") == proposed
        h.update("model", proposed, n, 0.0, 0.0)
        seen.append(h.k("model"))
    assert seen == [5, 7, 6, 5, 4, 3, 2, 1, 1, 3]
    h.update("model", 0, 0, 0.0, 0.0)  # an empty round says nothing
    assert h.k("model") == 3


def test_auto_follows_acceptance_and_verify_cost():
    flat = [0.04] * 9  # a verify of 1..9 tokens costs the same
    good, bad = Auto(8, flat, 0.004), Auto(8, flat, 0.004)
    for _ in range(30):
        good.update("model", good.k("model"), good.k("model"), 0.004 * good.k("model"), 0.04)  # all accepted
        bad.update("model", bad.k("model"), 0, 0.004 * bad.k("model"), 0.04)  # nothing accepted
    assert good.k("model") == 8 and bad.k("model") == 1
    # alpha 0.8 at every position, and each extra verified token costs 0.15 of a step: the rate
    # E(k) / (0.04 + 0.01 k) peaks at k = 3-4 (36, 40.7, 42.2, 42.0, 41.0 tokens/s for k = 1..5)
    steep = Auto(8, [0.04 * (1 + 0.15 * i) for i in range(9)], 0.004)
    rng = torch.Generator().manual_seed(0)
    for _ in range(300):
        k = steep.k("model")
        kept = (torch.rand(k, generator=rng) < 0.8).tolist() + [False]
        steep.update("model", k, kept.index(False), 0.004 * k, 0.04 * (1 + 0.15 * k))
    assert 2 <= steep.k("model") <= 5
    lookup = Auto(8, flat, 0.004)  # separate estimates per source: lookup failing does not hurt the model's
    for _ in range(30):
        lookup.update("lookup", lookup.k("lookup"), 0, 0.0, 0.04)
        k = lookup.k("model")
        lookup.update("model", k, k, 0.004 * k, 0.04)
    assert lookup.alphas("lookup")[0] < 0.1 and lookup.alphas("model")[0] > 0.9 and lookup.k("model") == 8


def test_auto_is_calibrated_with_a_monotone_verify_curve(loaded_pair, monkeypatch):
    from specviz.engine import costs

    # a dip is noise, pooled with the spike before it (least squares); an honest rise is kept
    dips = [30.2, 30.5, 30.4, 31.2, 34.6, 32.1, 30.7, 31.5, 41.6]
    want = [30.2, 30.45, 30.45, 31.2, 32.225, 32.225, 32.225, 32.225, 41.6]
    assert costs.monotone(dips) == pytest.approx(want)
    assert costs.monotone([1.0, 2.0, 3.0]) == [1.0, 2.0, 3.0] and costs.monotone([3.0, 2.0, 1.0]) == [2.0] * 3
    p, _ = loaded_pair
    asked = []
    monkeypatch.setattr(costs, "_MEMO", type(costs._MEMO)())  # nothing known yet
    # each size against the one-token call of the same repetition: a repetition twice as slow changes nothing
    samples = [[t, 2 * t, t] for t in dips]
    monkeypatch.setattr(costs, "forward_samples", lambda lm, ids, n, reps, vocab: asked.append(reps) or samples[:n])
    times, _ = costs.calibration(p, [1, 2, 3], 9)
    assert times == pytest.approx(want) and asked == [costs.CALIBRATION_REPS]
    assert costs.relative_times([[1.0, 2.0, 1.0], [1.1, 2.0, 1.2]]) == pytest.approx([1.0, 1.1])


def test_auto_times_a_draft_step_the_way_a_round_pays_it(loaded_pair, monkeypatch):
    """Each timed draft step comes right after a one-token target call (a verify has just streamed the target's
    weights through the caches); measured once per pair, and it is the step cost auto is given."""
    from specviz.backends.local import CachedModel
    from specviz.engine import costs
    from specviz.engine import setup as run_setup

    p, q = loaded_pair
    calls, feed = [], CachedModel.feed

    def spy(self, ids, last_only=False, hidden=False):
        calls.append("p" if self.lm is p else "q")
        return feed(self, ids, last_only, hidden)

    monkeypatch.setattr(CachedModel, "feed", spy)
    monkeypatch.setattr(costs, "_COLD_MEMO", type(costs._COLD_MEMO)())
    (first, then), spent = costs.draft_step_calibration(p, q, [1, 2, 3], [1, 2, 3], p.vocab_size)
    assert first > 0 and then > 0 and spent > 0
    assert calls == ["p", "q", "q"] * (costs.CALIBRATION_REPS + 1)  # a target call, then the draft's first and next
    assert costs.draft_step_calibration(p, q, [1, 2, 3], [1, 2, 3], p.vocab_size) == ([first, then], 0.0)
    # a greedy round's steps: next_greedy (or a lean draft's chain), never the V-wide feed; timed and kept apart
    greedy, chained = CachedModel.next_greedy, CachedModel.greedy_chain
    monkeypatch.setattr(CachedModel, "next_greedy", lambda self, ids: calls.append("q greedy") or greedy(self, ids))
    monkeypatch.setattr(
        CachedModel, "greedy_chain", lambda self, ids, k: calls.append("chain") or chained(self, ids, k)
    )
    calls.clear()
    timed = costs.draft_step_calibration(p, q, [1, 2, 3], [1, 2, 3], p.vocab_size, True)
    assert calls == ["p", "chain", "q greedy", "chain", "q greedy"] * (costs.CALIBRATION_REPS + 1)
    assert timed[1] > 0 and costs.draft_step_calibration(p, q, [1, 2, 3], [1, 2, 3], p.vocab_size) == (
        [first, then],
        0.0,
    )
    asked = []
    monkeypatch.setattr(
        run_setup, "draft_step_calibration", lambda *a: asked.append(a[:2] + a[5:]) or ([0.123, 0.05], 0.0)
    )
    _, policy, _, _ = run_setup.make_run(
        p, q, [1, 2, 3], RunRequest(drafter="lookup+model", gamma="auto", tree="off").spec, None
    )
    assert asked == [(p, q, True)] and policy.step_s == {"model": 0.123} and policy.next_s == {"model": 0.05}
    sampled = RunRequest(drafter="lookup+model", gamma="auto", tree="off", temperature=1.0).spec
    run_setup.make_run(p, q, [1, 2, 3], sampled, None)
    assert asked[1:] == [(p, q, False)]  # a sampled round's steps: this draft has no cut output layer, so feed


def test_auto_prices_a_rounds_first_guess_cold_and_the_next_ones_warm():
    """alpha 0.5 at every position and a verify of any length at 10 ms: with every guess at the first one's 1 ms
    a chain of 2 pays best (E(k) / (k + 10): 0.136, 0.146, 0.144 for k = 1..3), with the next ones at 0.3 ms one of
    4 (E(k) / (0.7 + 0.3 k + 10): 0.136, 0.155, 0.162, 0.163, 0.161 for k = 1..5)."""
    flat = [0.010] * 9
    alike, warm = Auto(8, flat, 0.001), Auto(8, flat, 0.001, next_step_s=0.0003)
    for policy in (alike, warm):
        policy.alphas = lambda source: [0.5] * 8
    assert alike.k("model") == 2 and warm.k("model") == 4
    assert warm.rate("model", 3) == pytest.approx(1.875 / (0.001 + 2 * 0.0003 + 0.010))


def test_confidence_stops_drafting_when_the_draft_is_unsure(loaded_pair):
    p, q = loaded_pair
    ids = p.tokenizer("the cat sat on the mat")["input_ids"]
    sure = RunRequest(
        drafter="model", gamma=6, tree="off", max_new_tokens=30, gamma_policy="confidence", confidence=0.0
    ).spec
    unsure = RunRequest(
        drafter="model", gamma=6, tree="off", max_new_tokens=30, gamma_policy="confidence", confidence=0.999
    ).spec
    r_sure = [e for e in speculative_decode(p, q, ids, sure) if isinstance(e, Round)]
    r_unsure = [e for e in speculative_decode(p, q, ids, unsure) if isinstance(e, Round)]
    assert all(r.stop in ("gamma", "budget") for r in r_sure)
    assert all(r.stop == "confidence" and not r.drafted for r in r_unsure)  # nothing is ever that sure
    assert [e.kind for e in r_unsure] == ["plain"] * len(r_unsure)


# --- exactness for every drafter and policy -------------------------------------------------------------


@pytest.mark.parametrize("drafter, policy", CONFIGS)
@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_greedy_output_equals_plain_greedy_for_every_drafter_and_policy(loaded_pair, drafter, policy, gamma):
    p, q = loaded_pair
    rejected = drafted = 0
    for prompt in PROMPTS:
        ar = generate(prompt, target=p, mode="ar", max_new_tokens=40)
        extra = {"confidence": 0.1} if policy == "confidence" else {}  # the tiny draft is rarely surer than 0.4
        sp = generate(
            prompt, target=p, draft=q, drafter=drafter, gamma_policy=policy, gamma=gamma, max_new_tokens=40, **extra
        )
        assert sp.token_ids == ar.token_ids, (prompt, drafter, policy, gamma)
        rejected += sp.stats["resampled"]
        drafted += sp.stats["drafted"]
    assert drafted > 0 and rejected > 0  # guesses were made and some were turned down: rollback was exercised


def test_lookup_and_model_take_turns_and_the_model_catches_up(loaded_pair):
    p, q = loaded_pair
    prompt = "the cat sat on the mat, the cat sat on the hat, the cat"
    sp = list(generate_events(p, q, prompt, drafter="lookup+model", gamma=4))
    sources = {s for e in sp if isinstance(e, Round) for s in e.sources}
    assert sources == {"lookup", "model"}
    ar = generate(prompt, target=p, mode="ar", max_new_tokens=60)
    assert sp[-1].token_ids == ar.token_ids


def generate_events(p, q, prompt, **kw):
    from specviz.api import encode_prompt

    cfg = engine_config(max_new_tokens=60, **kw)
    return speculative_decode(p, q, encode_prompt(p, prompt), cfg)


@pytest.mark.parametrize(
    "drafter, policy",
    [("lookup", "constant"), ("lookup+model", "auto"), ("model", "heuristic"), ("model", "confidence")],
)  # (model, constant) is in test_engine; greedy equality above covers every pair
def test_sampled_output_follows_the_target_for_every_drafter_and_policy(small_vocab_pair, drafter, policy):
    p, q = load_pair(*small_vocab_pair, device="cpu")
    ids = [5, 6, 7, 5, 6]  # lookup finds (5, 6) and proposes 7, 5: point-mass drafts are accepted and rejected
    n = 1000
    counts, sources = two_token_counts(p, q, ids, n, gamma=2, drafter=drafter, gamma_policy=policy, confidence=0.2)
    assert sources & set(drafter.split("+"))  # the drafter under test did propose
    law = exact_two_token_law(p, ids)
    z, tv = chi2_z(counts, law, n), 0.5 * float((counts / n - law).abs().sum())
    assert z < 4.0 and tv < 0.1, (drafter, policy, z, tv)
    assert chi2_z(counts, exact_two_token_law(q, ids), n) > 4.0  # the control: the draft's law is rejected


# --- the seam: empty proposals, hidden states only for those who ask -------------------------------------


class Silent(Drafter):
    """Never guesses: every round is a plain target step."""

    name = "silent"

    def propose(self, seq, ctx):
        k, _ = ctx.k_for(self.name)
        return Proposal(torch.empty(0, dtype=torch.long, device=ctx.device), None, (), k, "no match")


class Listener(Silent):
    """Asks for the target's hidden states and keeps their shapes."""

    wants_hidden = True

    def __init__(self):
        self.shapes = []

    def update(self, n, correction, hidden=None):
        self.shapes.append((n, tuple(hidden.shape)))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_an_empty_proposal_is_a_plain_target_step(loaded_pair, temperature):
    p, q = loaded_pair
    ids = p.tokenizer("hello world")["input_ids"]
    cfg = engine_config(max_new_tokens=20, seed=4, temperature=temperature)
    sp = list(speculative_decode(p, q, ids, cfg, drafter=Silent()))
    ar = list(autoregressive_decode(p, ids, cfg))
    rounds = [e for e in sp if isinstance(e, Round)]
    assert all(r.kind == "plain" and r.n == 0 and len(r.tokens) == 1 for r in rounds)
    if temperature == 0.0:
        assert sp[-1].token_ids == ar[-1].token_ids
    assert sp[-1].stats["drafted"] == 0 and sp[-1].stats["target_calls"] == len(rounds)


def test_hidden_states_reach_only_drafters_that_ask(loaded_pair, monkeypatch):
    p, q = loaded_pair
    p = dataclasses.replace(p, lean=None)  # transformers' forward, where hidden states cost extra (lean.py's are free)
    ids = p.tokenizer("hello world")["input_ids"]
    asked = []
    forward = type(p.model).forward

    @functools.wraps(forward)  # its signature stays the forward's: runtime reads the cache keyword from it, once
    def spy(self, *a, **kw):
        asked.append(bool(kw.get("output_hidden_states")))
        return forward(self, *a, **kw)

    monkeypatch.setattr(type(p.model), "forward", spy)
    cfg = engine_config(max_new_tokens=12)
    list(speculative_decode(p, q, ids, cfg))
    assert asked and not any(asked)  # the model drafter did not ask: nobody paid for hidden states
    asked.clear()
    listener = Listener()
    list(speculative_decode(p, None, ids, cfg, drafter=listener))
    hidden = p.model.config.hidden_size
    assert listener.shapes and all(shape == (n + 1, hidden) for n, shape in listener.shapes)


def test_bad_drafter_and_policy_values_are_one_sentence():
    for kw, match in [
        ({"drafter": "magic"}, "Unknown drafter 'magic'"),
        ({"gamma_policy": "fast"}, "Unknown gamma policy 'fast'"),
        ({"gamma": "lots"}, "or 'auto'"),
        ({"confidence": 1.5}, "confidence must be from 0"),
        ({"prompt_lookup_num_tokens": 0}, "prompt_lookup_num_tokens must be from 1"),
    ]:
        with pytest.raises(SpecvizError, match=match):
            generate("hi", target="/nonexistent/model", **kw)
    assert RunRequest(drafter="model", gamma="auto", tree="off").spec.gamma_policy == "auto"


# --- the accounting ---------------------------------------------------------------------------------------


def test_position_alphas_count_only_rounds_that_reached_the_position():
    rounds = [(3, 3), (3, 1), (3, 0), (2, 2), (0, 0)]
    # position 1: ruled on in 4 rounds, kept in 3; position 2: reached by (3,3), (3,1), (2,2), kept in 2;
    # position 3: reached by (3,3) only (and kept)
    assert position_alphas(rounds) == [3 / 4, 2 / 3, 1.0]
    assert accepted_histogram(rounds) == [1, 1, 1, 1][:4] and accepted_histogram([(2, 2)]) == [0, 0, 1]


def test_acceptance_past_the_measured_positions_is_the_rate_given_a_kept_predecessor():
    from specviz.theory import alphas_at, kept_shares, position_counts

    rounds = [(3, 3), (3, 1), (3, 0), (2, 2), (0, 0)]
    kept, reached = position_counts(rounds)
    assert (kept, reached) == ([3, 2, 1], [4, 3, 1])
    # positions 1-3 as measured; 4 and 5 at the pooled rate of positions 2 and 3: (2 + 1) / (3 + 1)
    assert alphas_at(kept, reached, 5, a=0.1) == [3 / 4, 2 / 3, 1.0, 3 / 4, 3 / 4]
    assert alphas_at(kept, reached, 2, a=0.1) == [3 / 4, 2 / 3]
    assert alphas_at([2], [4], 3, a=0.5) == [0.5, 0.5, 0.5]  # nothing past the first measured: the one alpha
    assert alphas_at([], [], 2, a=0.3) == [0.3, 0.3]
    assert kept_shares([0.5, 0.5, 1.0]) == [0.5, 0.25, 0.25]  # of all rounds: each position with the ones before


def test_expected_tokens_by_position_generalises_the_equal_alpha_formula():
    for a in (0.0, 0.3, 0.8, 1.0):
        for g in (1, 4):
            assert expected_tokens_by_position([a] * g) == pytest.approx(expected_tokens(a, g))
            assert expected_speedup_measured([a] * g, 0.1, 1.0) == pytest.approx(expected_speedup(a, g, 0.1))
    assert expected_tokens_by_position([0.5, 1.0, 0.0]) == pytest.approx(1 + 0.5 + 0.5)


def test_done_stats_carry_alpha_from_one_definition(loaded_pair):
    p, q = loaded_pair
    r = generate("the cat sat", target=p, draft=q, gamma=4, max_new_tokens=40)
    s = r.stats
    assert s["alpha"] == pytest.approx(s["accepted"] / (s["accepted"] + s["rejected"]))  # tally.py: a cut-off
    assert s["resampled"] <= s["rejected"]  # correction still counts its rejection; only emitted ones are resampled
    assert isinstance(list(generate_events(p, q, "hi"))[-1], Done)


def test_under_auto_lookup_and_model_compete_for_each_round():
    """lookup+model with auto: a match goes to lookup only while lookup is expected to pay more than the model,
    and one match in EXPLORE_EVERY still goes to lookup, so its estimate keeps learning."""
    from specviz.config import SamplingConfig
    from specviz.drafters.model import DraftContext, LookupModelDrafter

    policy = Auto(4, [0.04] * 5, 0.004)
    for _ in range(30):  # guesses of 2-token matches are never kept, the model's always are
        policy.update("lookup:2", 2, 0, 0.0, 0.04)
        policy.update("model", 4, 4, 0.016, 0.04)
    ctx = DraftContext(SamplingConfig(), torch.Generator(), 64, torch.device("cpu"), policy, budget=50)
    assert not ctx.prefers("lookup:2", "model") and ctx.prefers("model", "lookup:2")

    class Counted(LookupModelDrafter):
        def __init__(self):  # no draft model: record which drafter a round would go to
            from specviz.drafters.model import LookupDrafter

            self.lookup, self.model, self.matches, self.used = LookupDrafter(), None, 0, []

    d = Counted()
    d.model = type("Model", (), {"name": "model", "propose": lambda self, seq, c: d.used.append("model")})()
    seq = [5, 6, 7, 5, 6]  # (5, 6) matches: lookup always has something to propose here
    for _ in range(16):
        out = d.propose(seq, ctx)
        if out is not None:
            d.used.append("lookup")
    assert d.used.count("lookup") == 16 // LookupModelDrafter.EXPLORE_EVERY and d.used.count("model") == 14


def test_auto_learns_lookup_matches_by_their_length():
    """A 3-token match is kept far more often than a 1-token one, so lookup+model under auto keeps one estimate
    per match length: here 1-token matches always fail and 3-token ones always hold, and after a while the
    rounds with a 1-token match go to the model while those with a 3-token match stay with lookup."""
    from specviz.config import SamplingConfig
    from specviz.drafters.model import DraftContext, LookupModelDrafter

    policy = Auto(4, [0.04] * 5, 0.004)
    ctx = DraftContext(SamplingConfig(), torch.Generator(), 64, torch.device("cpu"), policy, budget=50)
    d = LookupModelDrafter.__new__(LookupModelDrafter)  # no draft model: a stand-in that proposes nothing
    d.model = type("Model", (), {"name": "model", "propose": lambda self, seq, c: None})()
    short = [9, 5, 3, 4, 5]  # only the 1-token suffix (5) occurred before
    long = [1, 2, 3, 4, 1, 2, 3]  # the 3-token suffix (1, 2, 3) occurred before
    assert LookupDrafter().find(short, 4)[0] == 1 and LookupDrafter().find(long, 4)[0] == 3
    for _ in range(20):
        policy.update(LookupDrafter().propose(short, ctx).key, 2, 0, 0.0, 0.04)  # nothing kept
        got = LookupDrafter().propose(long, ctx)
        policy.update(got.key, got.tokens.numel(), got.tokens.numel(), 0.0, 0.04)  # all kept
        policy.update("model", 2, 1, 0.008, 0.04)  # the model: half its guesses
    assert policy.alphas("lookup:1")[0] < 0.2 and policy.alphas("lookup:3")[0] > 0.8
    used = []
    for seq in (short, long) * 3:
        d.lookup, d.matches = LookupDrafter(), 0  # a fresh text; no exploration round: the policy alone decides
        got = d.propose(seq, ctx)
        used.append("model" if got is None else got.key)
    assert used == ["model", "lookup:3"] * 3


@pytest.mark.parametrize("cfg", [SamplingConfig(0.7), SamplingConfig(1.0, top_k=3), SamplingConfig(1.3, top_p=0.8)])
def test_a_guess_drawn_over_the_ids_a_draft_can_propose_has_the_full_rows_law(cfg):
    """drafters_base.draw with a trimmed draft's ids (LoadedModel.proposable): q is the V-wide row to_probs gives,
    zero off the ids, and the draws follow it."""
    from specviz.drafters.base import DraftContext, draw
    from specviz.sampling import scatter_rows, to_probs

    V, ids = 12, torch.tensor([1, 4, 5, 9, 11])
    logits = scatter_rows(torch.tensor([[0.3, -1.2, 1.5, 0.8, 0.1]]), ids, V)[0]
    ctx = DraftContext(cfg, torch.Generator().manual_seed(3), V, torch.device("cpu"), Heuristic(2), budget=9)
    want = to_probs(logits, cfg)
    counts, N = torch.zeros(V), 4000
    for _ in range(N):
        x, q = draw(logits, ctx, ids)
        counts[int(x)] += 1
    assert torch.allclose(q, want, atol=1e-6) and q.sum() == pytest.approx(1.0, abs=1e-6)
    assert bool((q[[i for i in range(V) if i not in ids.tolist()]] == 0).all())
    assert chi2_z(counts, want, N) < 4.0
    x, q = draw(logits, dataclasses.replace(ctx, sampling=SamplingConfig(0.0)), ids)
    assert x.tolist() == [5] and q is None  # greedy: the argmax, its point mass built by the caller
