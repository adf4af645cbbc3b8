"""The Race tab's history (ui/history.py, view/history.py): points from scripted event streams, counted by hand."""

from __future__ import annotations

import math

import pytest

from specviz.engine.tally import Tally
from specviz.events import Done, Round, Start, Step
from specviz.recording import export, record
from specviz.request import RunRequest
from specviz.theory import expected_speedup
from specviz.ui.history import HISTORY_MAX, add_race, empty, points_of, table
from specviz.ui.race_run import RaceView
from specviz.view import render
from specviz.view.history import EMPTY_HISTORY, history_figure


class Tok:
    """Enough of a tokenizer for render.Pieces and record.make: token i reads "t{i}"."""

    all_special_ids: list[int] = []

    def decode(self, ids, skip_special_tokens=False) -> str:
        return "".join(f"t{i} " for i in ids)


def plain_lane(tokens: int, step_s: float, temperature: float) -> list:
    """A plain run: prefill 0.1 s, then one step of `step_s` per token."""
    evs = [Start(mode="ar", prompt_ids=(1, 2), gamma=1, temperature=temperature, prefill_s=0.1)]
    for i in range(tokens):
        evs.append(Step(index=i, token=10 + i, p=1.0, forward_s=step_s, elapsed_s=0.1 + step_s * (i + 1)))
    return [*evs, Done(tuple(10 + i for i in range(tokens)), "length", Tally.of(evs).stats())]


def spec_lane(rounds: list[tuple[int, int]], temperature: float, draft_s: float = 0.01, verify_s: float = 0.1) -> list:
    """A speculative run of chain rounds (gamma proposed, n accepted), one draft call per proposal."""
    evs = [Start(mode="spec", prompt_ids=(1, 2), gamma=4, temperature=temperature, prefill_s=0.1, drafter="model")]
    clock, out = 0.1, []
    for i, (k, n) in enumerate(rounds):
        clock += draft_s * k + verify_s
        drafted = tuple(20 + j for j in range(k))
        toks = drafted[:n] + (30 + i,)
        out += toks
        evs.append(
            Round(
                index=i,
                drafted=drafted,
                q=(0.5,) * k,
                p=(0.5,) * k,
                accept_prob=(1.0,) * k,
                r=(0.2,) * k,
                n=n,
                correction=30 + i,
                kind="bonus" if n == k else "resampled",
                tokens=toks,
                draft_s=draft_s * k,
                verify_s=verify_s,
                elapsed_s=clock,
                draft_calls=k,
            )
        )
    return [*evs, Done(tuple(out), "length", Tally.of(evs).stats())]


ROUNDS = [(4, 4), (4, 1), (4, 0), (4, 3)]  # drafted 16, accepted 8, judged 8 + 3 rejections = 11; 12 tokens


def finished_view(temperature: float, gamma: int = 4, third: bool = False) -> RaceView:
    """A RaceView fed a scripted race, event by event, as race_stream feeds it."""
    req = RunRequest(drafter="model", gamma=gamma, gamma_policy="constant", tree="off", temperature=temperature)
    requests = {"spec": req}
    if third:
        requests["spec2"] = req.replace(drafter="lookup")
    view = RaceView("hello", requests)
    view.pieces = render.Pieces(Tok())
    for ev in plain_lane(12, 0.1, temperature):
        view.add("ar", ev)
    for lane in requests:
        for ev in spec_lane(ROUNDS, temperature):
            view.add(lane, ev)
    return view


def test_a_race_becomes_one_point_per_lane_with_the_numbers_counted_by_hand():
    view = finished_view(0.7, third=True)
    hist = add_race(empty(), view)
    points = table(hist)
    assert [p["lane"] for p in points] == ["spec", "spec2"]
    assert [p["drafter"] for p in points] == ["model", "lookup"]
    p = points[0]
    assert (p["gamma"], p["temperature"], p["race"]) == (4, 0.7, 1)
    assert p["acceptance"] == pytest.approx(8 / 16)  # accepted / drafted
    assert p["alpha"] == pytest.approx(8 / 11)  # accepted / judged
    assert p["c"] == pytest.approx(0.01 / 0.1)  # one draft call over one plain step
    # plain: 12 tokens in 0.1 + 1.2 s; speculative: 12 tokens in 0.1 + 16 * 0.01 + 4 * 0.1 s
    assert p["speedup"] == pytest.approx((12 / 0.66) / (12 / 1.3))


def test_three_races_at_three_temperatures_leave_three_points_per_lane_and_clear_empties_it():
    hist = empty()
    for t in (0.0, 0.5, 1.0):
        hist = add_race(hist, finished_view(t, third=True))
        hist = add_race(hist, None)  # a cancelled race leaves no view: nothing added
    points = table(hist)
    for lane in ("spec", "spec2"):
        assert [p["temperature"] for p in points if p["lane"] == lane] == [0.0, 0.5, 1.0]
    assert [p["race"] for p in points] == [1, 1, 2, 2, 3, 3]
    fig = history_figure(points)
    measured = [tr for tr in fig.data if tr.mode == "markers" and tr.name in ("model", "lookup")]
    by_temp = [tr for tr in measured if tr.xaxis == "x3"]  # the acceptance-by-temperature panel
    assert sorted(tuple(tr.x) for tr in by_temp) == [(0.0, 0.5, 1.0)] * 2
    assert table(empty()) == [] and EMPTY_HISTORY in str(history_figure([]).layout.annotations[0].text)


def test_the_same_race_is_added_once_and_an_unfinished_one_not_at_all():
    view = finished_view(0.0)
    hist = add_race(add_race(empty(), view), view)  # the page adds it, then an API client asks /history again
    assert len(table(hist)) == 1
    running = finished_view(0.0)
    running.done["spec"] = None
    assert table(add_race(empty(), running)) == []


def test_the_history_keeps_the_last_points_only():
    hist = empty()
    for _ in range(HISTORY_MAX // 2 + 3):
        hist = add_race(hist, finished_view(0.3, third=True))
    points = table(hist)
    assert len(points) == HISTORY_MAX and points[-1]["race"] == HISTORY_MAX // 2 + 3


def test_the_theory_curve_is_the_theorys_for_the_latest_alpha_and_c():
    points = points_of(
        {"ar": plain_lane(12, 0.1, 0.0), "spec": spec_lane(ROUNDS, 0.0)},
        {"spec": RunRequest(drafter="model", gamma=4, gamma_policy="constant", temperature=0.0)},
        {},
    )
    fig = history_figure(points, max_gamma=8)
    curve = next(tr for tr in fig.data if tr.mode == "lines" and tr.xaxis == "x2")  # speedup by gamma
    assert list(curve.x) == list(range(1, 9))
    assert curve.y[3] == pytest.approx(expected_speedup(8 / 11, 4, 0.1))


def test_the_history_goes_into_the_recording_and_its_page_and_old_recordings_still_load(tmp_path):
    view = finished_view(1.0)
    points = table(add_race(empty(), view))
    lanes = {k: view.events[k] for k in view.lanes}
    rec = record.make("race", {"prompt": "hello"}, lanes, Tok(), {"target": "t"}, {"history": points})
    back = record.loads(rec.dumps())
    assert back.extra["history"][0]["temperature"] == 1.0
    assert back.extra["history"][0]["speedup"] == pytest.approx(points[0]["speedup"])
    page = export.html_page(back)
    assert page.count('class="sv-fig"') == 5  # the race's four charts and the history
    old = record.loads(record.make("race", {"prompt": "hello"}, lanes, Tok(), {"target": "t"}).dumps())
    assert export.history_points(old) == [] and export.html_page(old).count('class="sv-fig"') == 4
    # a stranger's rows with a missing or wrong number are left out, not drawn
    bad = record.make("race", {}, lanes, Tok(), {}, {"history": [{**points[0], "speedup": "x"}]})
    assert export.history_points(record.loads(bad.dumps())) == []
    assert math.isfinite(points[0]["c"])
