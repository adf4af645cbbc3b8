"""The Race tab's history: every finished race adds a point per speculative lane, kept per visitor until "Clear".

A point is a flat dict (so it goes into a recording's `extra["history"]` table as it is): the race's number, the
lane, its drafter and label, the gamma and temperature it ran with, and what its Tally measured against the plain
lane of the same race (acceptance, alpha, c, speedup; the tally defines them once). The chart is
view/history.py. The history lives in a gr.State, so each visitor (each browser tab, each API session) has its own.
"""

from __future__ import annotations

import gradio as gr

from specviz.engine.tally import Tally
from specviz.request import RunRequest
from specviz.view.history import history_figure

HISTORY_MAX = 100  # points kept per visitor (the oldest go first); a recording's table holds at most 100 rows


def empty() -> dict:
    """A visitor's history before the first race: no points, no race added yet."""
    return {"points": [], "races": 0, "last": None}


def points_of(
    lanes: dict[str, list], requests: dict[str, RunRequest], labels: dict[str, str], race: int = 1
) -> list[dict]:
    """The points of one finished race: one per speculative lane in `requests`, measured against lanes["ar"]."""
    plain = Tally.of(lanes["ar"])
    out = []
    for lane, req in requests.items():
        t = Tally.of(lanes[lane])
        out.append(
            {
                "race": race,
                "lane": lane,
                "drafter": req.drafter,
                "label": labels.get(lane, req.drafter),
                "gamma": req.gamma,
                "gamma_policy": req.gamma_policy,
                "tree": str(req.tree),
                "temperature": float(req.temperature),
                "acceptance": t.acceptance_rate,
                "alpha": t.alpha,
                "c": t.c(plain),
                "speedup": t.speedup(plain),
                "tokens": t.new_tokens,
            }
        )
    return out


def _key(view) -> tuple:
    """Which race a finished view is: its lanes' Done events, alive as long as the view (the page's gr.State)."""
    return tuple(id(view.done[k]) for k in view.lanes)


def add_race(history: dict | None, view) -> dict:
    """`history` with the finished race `view` (race_run.RaceView) added once; unchanged for an unfinished race or
    one already in (the page adds after each race, an API client may ask /history again)."""
    history = history if isinstance(history, dict) and "points" in history else empty()
    if view is None or getattr(view, "pieces", None) is None or not all(view.done[k] for k in view.lanes):
        return history
    key = _key(view)
    if history["last"] == key:
        return history
    race = history["races"] + 1
    spec = {k: view.requests[k] for k in view.lanes if k != "ar"}
    new = points_of({k: view.events[k] for k in view.lanes}, spec, view.labels, race)
    return {"points": (history["points"] + new)[-HISTORY_MAX:], "races": race, "last": key}


def table(history: dict | None) -> list[dict]:
    """The points, for the API and the recording (no internal keys)."""
    return list(history["points"]) if isinstance(history, dict) and "points" in history else []


def build_history(max_gamma: int):
    """The chart, its Clear button and the per-visitor State (called inside the Race tab); returns
    (state, plot, clear button)."""
    gr.Markdown(
        "### Every setting you tried\nEach finished race adds a dot per lane, coloured by drafter (acceptance: the "
        "share of all guesses kept). Dashed: the "
        "paper's expected acceptance and speedup over gamma for the drafter's latest measured α and c; open circles: "
        "the theory at each dot's own α, c and gamma."
    )
    state = gr.State(empty())
    plot = gr.Plot(history_figure([], max_gamma), show_label=False, elem_id="sv-plot-history")
    clear = gr.Button("Clear", size="sm", variant="secondary", elem_id="sv-history-clear")
    return state, plot, clear
