"""The pair check's prediction on fake timings: a round of each gamma priced from the rounds the acceptance runs
paid (pairs_measure.RoundCosts), against the plain steps beside them; and the measured speedup beside it.

The fake: ten rounds of four guesses in 0.1 s of decoding (10 ms a round), 50 ms of it drafting (10 ms of that
re-tokenising), 30 ms verifying; 20 plain steps in 40 ms (2 ms a step); a verify of 5 tokens timed alone 1.5 ms,
so the loop pays twice the isolated call. Per round: 4 guesses at 1 ms, the verify 3 ms, and 3 ms paid once a round
(the 1 ms of re-tokenising and the loop's own 2 ms). Every expected number below is worked out by hand from these.
"""

import pytest

import specviz.pairs.check as pairs
from specviz import check_pair
from specviz.engine.tally import Tally
from specviz.pairs.measure import Acceptance, RoundCosts, TreeTrial

MS = 1e-3
TIMES = [1.0 * MS, 1.1 * MS, 1.2 * MS, 1.3 * MS, 1.5 * MS, 1.6 * MS, 1.7 * MS, 1.8 * MS, 1.9 * MS]  # 1 .. 9 tokens


def fake_runs(translate_s: float = 10 * MS) -> tuple[Acceptance, Tally]:
    spec = Tally(runs=2, rounds=10, drafted=40, accepted=10, rejected=10, new_tokens=20, draft_calls=40,
                 prefill_s=10 * MS, draft_s=50 * MS, verify_s=30 * MS, elapsed_s=110 * MS)  # fmt: skip
    plain = Tally(runs=4, steps=20, new_tokens=20, prefill_s=4 * MS, verify_s=36 * MS, elapsed_s=44 * MS)
    return Acceptance.of(spec, (0, 0, 0, 0, 10), translate_s), plain


def test_a_round_is_priced_from_the_measured_one():
    acc, plain = fake_runs()
    rc = RoundCosts.of(acc, plain, TIMES)
    assert (rc.round_s, rc.guesses, rc.guess_s, rc.verify_s, rc.isolated_s, rc.plain_s) == pytest.approx(
        (10 * MS, 4.0, 1 * MS, 3 * MS, 1.5 * MS, 2 * MS)
    )
    assert rc.rest_s == pytest.approx(3 * MS)
    # at the measured gamma the priced round is the measured round
    assert rc.round_at(4, TIMES[4]) == pytest.approx(10 * MS)
    # gamma 1: one guess (1 ms), a verify of 2 tokens the loop pays twice 1.1 ms, 3 ms once a round
    assert rc.round_at(1, TIMES[1]) == pytest.approx(6.2 * MS)
    assert rc.round_at(8, TIMES[8]) == pytest.approx((8 + 3.8 + 3) * MS)


def test_re_tokenising_is_paid_once_a_round_not_once_a_guess():
    """The same rounds with no re-tokenising: equal at the measured gamma, cheaper below it by 3/4 of the 1 ms."""
    with_text, plain = fake_runs(translate_s=10 * MS)
    same_tokens, _ = fake_runs(translate_s=0.0)
    a, b = RoundCosts.of(with_text, plain, TIMES), RoundCosts.of(same_tokens, plain, TIMES)
    assert b.guess_s == pytest.approx(1.25 * MS) and b.rest_s == pytest.approx(2 * MS)
    assert a.round_at(4, TIMES[4]) == pytest.approx(b.round_at(4, TIMES[4]))
    assert a.round_at(1, TIMES[1]) - b.round_at(1, TIMES[1]) == pytest.approx(0.75 * MS)


def test_the_check_predicts_and_measures_from_its_runs(tiny_pair, monkeypatch):
    acc, plain = fake_runs()
    tree = TreeTrial(budget=4, tokens_per_call=1.2, nodes_per_call=4.0, draft_cost=4.0, verify_cost=3.0,
                     overhead=3.0, speedup=0.2)  # fmt: skip
    monkeypatch.setattr(pairs, "forward_times", lambda *a, **k: list(TIMES))
    monkeypatch.setattr(pairs, "acceptance_by_kind", lambda *a, **k: (acc, plain))
    monkeypatch.setattr(pairs, "measure_trees", lambda *a, **k: (tree,))
    rep = check_pair(*tiny_pair, device="cpu", max_new_tokens=8)
    assert rep.a == 0.5
    # tokens per round 1 + a + ... + a^g, times a plain step (2 ms), over the priced round (ms)
    by_hand = [1.5 * 2 / 6.2, 1.75 * 2 / 7.4, 1.875 * 2 / 8.6, 1.9375 * 2 / 10.0]
    assert rep.speedups_measured[:4] == pytest.approx(by_hand)
    assert rep.best_gamma == 1 and rep.best_speedup == pytest.approx(3 / 6.2)
    assert rep.verdict == "not worth it"
    # in target steps (a call over one token alone: 1 ms)
    assert (rep.draft_cost, rep.round_overhead, rep.plain_cost) == pytest.approx((1.0, 3.0, 2.0))
    assert rep.verify_costs[:2] == pytest.approx((2.2, 2.4))
    # measured: 20 tokens in 0.1 s of decoding against 20 plain steps in 40 ms
    assert rep.measured_speedup == pytest.approx(0.4)
    assert "measured    at gamma 4 the acceptance runs decoded 0.40x" in rep.report()
    assert "(expected 0.39x)" in rep.report()
    assert rep.to_dict()["measured_speedup"] == pytest.approx(0.4)
    # with the prefills counted, for a run of the speculative runs' 10 tokens: a plain run's prefill 1 ms (4 ms over 4
    # runs) and 10 steps of 2 ms against a speculative run's 5 ms (10 over 2) and 20 ms / best_speedup
    assert rep.prefill_speedup == pytest.approx(21 / (5 + 20 / (3 / 6.2)))
    assert f"with prefill {rep.prefill_speedup:.2f}x at gamma 1" in rep.report()
