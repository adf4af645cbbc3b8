"""plots.py: the figures of the race page and the gamma sweep (traces, values, the theory curve)."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from specviz.events import Round, Start, Step
from specviz.view import plots


def rnd(index: int, g: int, n: int, elapsed: float) -> Round:
    return Round(
        index=index,
        drafted=tuple(range(g)),
        q=(0.5,) * g,
        p=(0.5,) * g,
        accept_prob=(1.0,) * g,
        r=(0.1,) * g,
        n=n,
        correction=9,
        kind="bonus" if n == g else "resampled",
        tokens=tuple(range(n)) + (9,),
        draft_s=0.02,
        verify_s=0.05,
        elapsed_s=elapsed,
    )


SPEC = [Start("spec", (1, 2), 4, 0.0, 0.1), rnd(0, 4, 4, 0.17), rnd(1, 4, 1, 0.24), rnd(2, 4, 0, 0.31)]
AR = [Start("ar", (1, 2), 0, 0.0, 0.05)] + [Step(i, 5, 1.0, 0.05, 0.05 + 0.05 * (i + 1)) for i in range(7)]


def test_rounds_frame():
    df = plots.rounds_frame(SPEC)
    assert list(df["n"]) == [4, 1, 0] and list(df["emitted"]) == [5, 2, 1] and list(df["gamma"]) == [4, 4, 4]
    assert plots.rounds_frame([]).empty


def test_race_figure_counts_tokens_on_each_clock():
    fig = plots.race_figure(AR, SPEC)
    ar, spec = fig.data
    assert (ar.name, spec.name) == ("plain", "speculative")
    assert list(spec.y) == [0, 0, 5, 7, 8] and list(spec.x) == [0.0, 0.1, 0.17, 0.24, 0.31]
    assert ar.y[-1] == 7 and ar.x[-1] == pytest.approx(0.40)


def test_acceptance_figure():
    fig = plots.acceptance_figure(plots.rounds_frame(SPEC))
    bars, line = fig.data
    assert list(bars.y) == [1.0, 0.25, 0.0]
    assert list(line.y) == pytest.approx([1.0, 5 / 8, 5 / 12])  # accepted so far / proposed so far
    assert len(plots.acceptance_figure(plots.rounds_frame([])).data) == 0


def test_tokens_per_round_histogram_spans_1_to_gamma_plus_1():
    fig = plots.tokens_per_round_figure(plots.rounds_frame(SPEC), gamma=4)
    (bars,) = fig.data
    assert list(bars.x) == [1, 2, 3, 4, 5] and list(bars.y) == [1, 1, 0, 0, 1]
    assert list(plots.tokens_per_round_figure(plots.rounds_frame([]), 2).data[0].y) == [0, 0, 0]


def test_time_share():
    fig = plots.time_share_figure(AR, SPEC)
    by_name = {t.name: list(t.x) for t in fig.data}
    assert by_name["drafting"] == pytest.approx([0.0, 0.06])
    assert by_name["target p"] == pytest.approx([0.35, 0.15])
    assert by_name["prompt"] == pytest.approx([0.05, 0.1])
    assert by_name["other"] == pytest.approx([0.0, 0.0])  # rollback and bookkeeping: none in these events


def test_expected_speedup_matches_the_paper():
    # Leviathan et al. 2023: alpha 0.8, gamma 4, c 0 -> (1 - 0.8**5) / 0.2 tokens per target call
    assert plots.expected_speedup(0.8, 4, 0.0) == pytest.approx((1 - 0.8**5) / 0.2)
    assert plots.expected_speedup(0.0, 3, 0.5) == pytest.approx(1 / 2.5)


def test_sweep_figure_has_measured_and_theory():
    measured = pd.DataFrame({"gamma": [1, 2, 4], "acceptance": [0.8, 0.7, 0.6], "speedup": [1.2, 1.5, 1.4]})
    theory = plots.theory_frame(0.7, 0.2, range(1, 5))
    assert theory["acceptance"].iloc[0] == pytest.approx(0.7)  # gamma 1: E[n] = alpha
    fig = plots.sweep_figure(measured, theory)
    names = [t.name for t in fig.data]
    assert names.count("theory") == 2 and names.count("measured") == 2
    measured_speedup = [t for t in fig.data if t.name == "measured" and t.xaxis == "x2"][0]
    assert list(measured_speedup.y) == [1.2, 1.5, 1.4]
    assert len(plots.sweep_figure(measured.iloc[:0]).data) == 2  # empty before the sweep runs


def test_the_pair_checks_speedup_chart_names_the_break_even_line_in_its_legend_not_on_a_bar():
    from specviz.teach.plots import speedup_figure

    fig = speedup_figure(range(1, 9), [1.27, 1.51, 1.49, 1.44, 1.44, 1.06, 1.07, 0.99], recommended=2)
    bars, line = fig.data
    assert list(bars.text) == ["1.27×", "1.51×", "1.49×", "1.44×", "1.44×", "1.06×", "1.07×", "0.99×"]
    assert line.name == "no gain (1×)" and line.line.dash == "dash"
    assert [s.y0 for s in fig.layout.shapes] == [1.0]  # the 1× line itself
    texts = [a.text for a in fig.layout.annotations]
    assert "recommended: gamma = 2" in texts and not any("no gain" in t for t in texts)


def test_the_gamma_timeline_shows_each_rounds_guesses_under_its_cap_with_whole_ticks_that_fit():
    fig = plots.gamma_timeline_figure({"spec": plots.rounds_frame(SPEC)})
    bars, cap = fig.data
    assert list(bars.y) == [4, 4, 4] and bars.name == "spec: stopped by gamma"
    assert fig.layout.yaxis.dtick == 1  # a cap of 8 or less: every whole number labelled
    tree = [dataclasses.replace(r, planned=16) for r in SPEC[1:]]  # tree auto's cap: up to 16 nodes
    fig = plots.gamma_timeline_figure({"spec": plots.rounds_frame(SPEC[:1] + tree)})
    assert list(fig.data[-1].y) == [16, 16, 16] and fig.layout.yaxis.dtick == 2  # 8 labels, not 16 crammed in
    frame = plots.rounds_frame(SPEC[:1] + tree)
    frame["nodes"] = [9, 5, 2]  # a tree's nodes, not the walked line's gamma, are what its round proposed
    assert list(plots.gamma_timeline_figure({"spec": frame}).data[0].y) == [9, 5, 2]
    assert len(plots.gamma_timeline_figure({"spec": plots.rounds_frame([])}).data) == 0


def test_the_temperature_sweep_draws_a_point_per_temperature_on_the_sweeps_two_panels():
    from specviz.view.temperature import temperature_figure

    rows = [
        {"temperature": 0.0, "acceptance": 0.4, "alpha": 0.6, "speedup": 1.7},
        {"temperature": 1.0, "acceptance": 0.2, "alpha": 0.3, "speedup": 1.2},
    ]
    fig = temperature_figure(rows)
    assert [list(t.x) for t in fig.data] == [[0.0, 1.0]] * 3
    assert [list(t.y) for t in fig.data] == [[0.4, 0.2], [0.6, 0.3], [1.7, 1.2]]
    assert fig.layout.yaxis.tickformat == ".0%" and fig.layout.yaxis2.title.text == "× plain tokens/s"
