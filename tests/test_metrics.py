"""Events -> frames and summary numbers: the frames add up to what the run reported."""

import pytest
from conftest import engine_config

from specviz import race
from specviz.engine.loop import autoregressive_decode, speculative_decode
from specviz.request import RunRequest
from specviz.view.metrics import COLUMNS, acceptance_by_position, accepted_histogram, rounds_frame, summaries, summary


@pytest.fixture(scope="module")
def runs(loaded_pair):
    p, q = loaded_pair
    ids = p.tokenizer("the cat sat on the mat")["input_ids"]
    cfg = RunRequest(drafter="model", gamma=4, tree="off", max_new_tokens=40, seed=3, temperature=1.0).spec
    return list(speculative_decode(p, q, ids, cfg)), list(autoregressive_decode(p, ids, cfg))


def test_spec_frame_adds_up_to_the_run(runs):
    spec, _ = runs
    done = spec[-1]
    f = rounds_frame(spec)
    assert list(f.columns) == list(COLUMNS)
    assert f["tokens"].sum() == done.stats["new_tokens"] == len(done.token_ids)
    assert tuple(t for ids in f["token_ids"] for t in ids) == done.token_ids
    assert len(f) == done.stats["target_calls"]
    assert f["n"].sum() == done.stats["accepted"] and f["gamma"].sum() == done.stats["drafted"]
    assert set(f["side"]) == {"spec"} and set(f["kind"]) <= {"bonus", "resampled"}
    assert f["elapsed_s"].is_monotonic_increasing
    assert (f["row_s"] + 1e-9 >= f["draft_s"] + f["verify_s"]).all()  # other_s is what is left, never negative


def test_summary_matches_done_stats(runs):
    for events in runs:
        s, stats = summary(events), events[-1].stats
        for key in ("new_tokens", "target_calls", "drafted", "accepted", "prefill_s"):
            assert s[key] == pytest.approx(stats[key]), key
        assert s["acceptance_rate"] == pytest.approx(stats["acceptance_rate"])
        assert s["wall_s"] == pytest.approx(stats["wall_s"])
        assert s["finish_reason"] == events[-1].finish_reason


def test_ar_frame_has_one_row_per_token(runs):
    _, ar = runs
    f = rounds_frame(ar)
    assert len(f) == f["tokens"].sum() == ar[-1].stats["new_tokens"]
    assert set(f["kind"]) == {"step"} and f["draft_s"].sum() == 0


def test_race_pairs_split_by_side(loaded_pair):
    p, q = loaded_pair
    ids = p.tokenizer("hello world")["input_ids"]
    cfg = engine_config(max_new_tokens=20)
    merged = list(race(autoregressive_decode(p, ids, cfg), speculative_decode(p, q, ids, cfg)))
    f = rounds_frame(merged)
    by_side = summaries(merged)
    assert set(by_side) == set(f["side"]) == {"ar", "spec"}
    for side, ev in merged:
        if type(ev).__name__ == "Done":
            assert by_side[side]["new_tokens"] == len(ev.token_ids) == f[f["side"] == side]["tokens"].sum()
    with pytest.raises(ValueError):
        summary(merged)


def test_acceptance_by_position_and_histogram(runs):
    spec, _ = runs
    f = rounds_frame(spec)
    rate = acceptance_by_position(f)
    assert len(rate) <= 4 and ((rate >= 0) & (rate <= 1)).all() and list(rate.index)[0] == 1
    assert rate[1] == pytest.approx((f["n"] > 0).sum() / len(f))  # every round reaches position 1
    # position 2 is reached only by the rounds that accepted position 1: alpha_2 is conditional on that
    reached = f[(f["gamma"] >= 2) & (f["n"] >= 1)]
    if len(reached):
        assert rate[2] == pytest.approx((reached["n"] >= 2).sum() / len(reached))
    hist = accepted_histogram(f)
    assert hist.sum() == len(f) and list(hist.index) == list(range(len(hist))) and len(hist) <= 5
