"""A recording -> HTML: the lanes, numbers and charts as the page showed them, with no model loaded.

`LaneView` builds one lane's pane event by event (the Replay tab advances it as the replay plays);
`html_page` writes the whole recording as one self-contained file: the page's own CSS and plotly's JavaScript
inlined, nothing fetched, so it opens offline in any browser. Every string a recording carries (tokens, prompt,
model names, settings, machine) is HTML-escaped: the file may have come from a stranger.
No gradio import.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field

import pandas as pd

from specviz.config import ASSETS
from specviz.engine.tally import Tally
from specviz.events import Done, Event, Round, Start, Step
from specviz.recording.record import RecordedTokenizer, Recording
from specviz.view import metrics, plots, render
from specviz.view.history import history_figure

FIG_CONFIG = {"displaylogo": False, "responsive": True}
LANE_TITLES = {"ar": "Plain decoding (target only)", "spec": "Speculative (draft + target)"}
SETTING_NAMES = (
    ("prompt", "prompt"),
    ("gamma", "gamma"),
    ("temperature", "temperature"),
    ("top_k", "top-k"),
    ("top_p", "top-p"),
    ("max_new_tokens", "max new tokens"),
    ("seed", "seed"),
    ("relaxed_w", "relaxed verification w (1 = exact)"),
)
UNREMARKABLE = {("relaxed_w", 1.0), ("detail", 0), ("raw", False)}  # defaults not worth a row
KIND_TITLES = {
    "race": "Race: plain against speculative decoding",
    "step": "Step-through session",
    "sweep": "Gamma sweep",
    "run": "Run",
}
PAGE_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0 auto; padding: 16px;
  max-width: 1400px; color: #111; background: #fff; }
h1 { font-size: 1.5em; margin: 0 0 6px; }
"""


@dataclass
class LaneView:
    """One lane's pane and numbers, built up event by event (the same HTML as the live page)."""

    name: str
    pieces: render.Pieces
    events: list = field(default_factory=list)
    body: list = field(default_factory=list)
    clock: float = 0.0
    done: Done | None = None
    mode: str = "spec"
    greedy: bool = True
    relaxed_w: float = 1.0  # <1: this run's verification was relaxed (not exact); its numbers say so
    tally: Tally = field(default_factory=Tally)  # the lane's counts so far: its numbers are read from here

    def add(self, ev: Event) -> None:
        self.events.append(ev)
        self.tally.add(ev)
        if isinstance(ev, Start):
            self.mode, self.greedy, self.clock = ev.mode, ev.temperature == 0.0, ev.prefill_s
        elif isinstance(ev, Step):
            self.body.append(render.ar_token_html(self.pieces, ev, self.greedy))
            self.clock = ev.elapsed_s
        elif isinstance(ev, Round):
            self.body.append(render.round_html(self.pieces, ev, self.greedy))
            self.clock = ev.elapsed_s
        elif isinstance(ev, Done):
            self.done = ev
            self.clock = float(ev.stats.get("wall_s", self.clock))

    @property
    def side(self) -> str:
        return "ar" if self.mode == "ar" else "spec"

    def pane(self, waiting: str = "") -> str:
        head = ""
        if self.name not in LANE_TITLES:  # a sweep's lane: say which gamma it is
            head = f'<div class="sv-lane-name"><b>{html.escape(self.name)}</b></div>'
        return head + render.pane_html(self.side, "".join(self.body), self.clock, self.done, waiting)

    def stats(self, plain: LaneView | None = None) -> str:
        """The numbers under the pane, as the Race tab shows them; the speedup against `plain` when given."""
        if self.side == "ar":
            return render.stats_html(render.plain_stat_items(self.tally))
        items = render.spec_stat_items(self.tally)
        if self.relaxed_w < 1 and not self.greedy:  # a lossy run's numbers never appear without the label
            items.append(("not exact", f"relaxed verification, w = {self.relaxed_w:.2f}"))
        if plain is not None:
            items.append(render.speedup_item(self.tally, plain.tally))
        return render.stats_html(items)


def lane_views(rec: Recording) -> dict[str, LaneView]:
    """An empty view per lane, sharing one token table."""
    pieces = render.Pieces(RecordedTokenizer(rec))
    w = rec.settings.get("relaxed_w", 1.0)
    w = float(w) if isinstance(w, (int, float)) and not isinstance(w, bool) else 1.0
    return {name: LaneView(name, pieces, relaxed_w=w) for name in rec.lanes}


def plain_lane(views: dict[str, LaneView]) -> LaneView | None:
    return views.get("ar")


def figures(rec: Recording, views: dict[str, LaneView]) -> list:
    """The charts of this kind of recording, from the events shown so far."""
    if rec.kind == "sweep":
        return [sweep_figure(rec)]
    ar = views["ar"].events if "ar" in views else []
    spec_name = next((n for n, v in views.items() if v.side == "spec"), None)
    spec = views[spec_name].events if spec_name else []
    rounds = plots.rounds_frame(spec)
    setting = rec.settings.get("gamma")
    gamma = next((e.gamma for e in spec if isinstance(e, Start)), setting if isinstance(setting, int) else 1)
    figs = [plots.race_figure(ar, spec)] if ar else []
    trees = metrics.tree_acceptance(spec)  # token trees: kept by depth and rank, in place of kept per round
    figs += [plots.tree_figure(trees) if len(trees) else plots.acceptance_figure(rounds)]
    figs += [plots.tokens_per_round_figure(rounds, max(gamma, 1))]
    if ar:
        figs.append(plots.time_share_figure(ar, spec))
    points = history_points(rec)
    if points:
        figs.append(history_figure(points))
    return figs


HISTORY_NUMBERS = ("gamma", "temperature", "acceptance", "alpha", "c", "speedup")


def history_points(rec: Recording) -> list[dict]:
    """The visitor's history a race recording carries (extra["history"], optional: older recordings have none);
    rows missing a number the chart needs are left out (the file may come from a stranger)."""
    rows = rec.extra.get("history") if isinstance(rec.extra, dict) else None
    out = []
    for row in rows if isinstance(rows, list) else []:
        if not isinstance(row, dict) or not isinstance(row.get("gamma"), int) or isinstance(row.get("gamma"), bool):
            continue
        if all(isinstance(row.get(k), (int, float)) and not isinstance(row.get(k), bool) for k in HISTORY_NUMBERS[1:]):
            out.append({**row, "drafter": str(row.get("drafter", "?")), "label": str(row.get("label", ""))})
    return out


def sweep_figure(rec: Recording):
    """The sweep's chart from its recorded table and the alpha and c it measured."""
    measured = pd.DataFrame(rec.extra.get("sweep") or [], columns=["gamma", "acceptance", "speedup"])
    theory = None
    if (
        len(measured)
        and isinstance(rec.extra.get("alpha"), (int, float))
        and isinstance(rec.extra.get("c"), (int, float))
    ):
        top = int(measured["gamma"].max())
        theory = plots.theory_frame(float(rec.extra["alpha"]), float(rec.extra["c"]), range(1, max(top, 1) + 1))
    return plots.sweep_figure(measured, theory)


def banner_html(rec: Recording, replay: bool = True) -> str:
    """Says what this is: a recording, made where and when, with which models."""
    e = rec.env
    what = "Replay of a recording" if replay else "A recording"
    models = ""
    if e.get("target"):
        models = f" Target p: <b>{html.escape(str(e['target']))}</b>"
        models += f"; draft q: <b>{html.escape(str(e['draft']))}</b>." if e.get("draft") else "."
    device = f" ({html.escape(str(e['device']).upper())})" if e.get("device") else ""
    return (
        f'<div class="sv-replay-banner" role="note"><b>{what}</b>, no model is running: '
        f"{html.escape(KIND_TITLES.get(rec.kind, rec.kind))}, recorded on {html.escape(rec.recorded_on)}{device}"
        f" on {html.escape(str(e.get('recorded_at', 'an unknown date')))}.{models} Times are those measured there"
        f"{_load(e)}.</div>"
    )


def _load(env: dict) -> str:
    """A note on how busy the machine was, when it was recorded (a shared machine runs slower)."""
    try:
        load, cores = float(env["load_avg_1min"]), int(env["cpu_count"])
    except (KeyError, TypeError, ValueError):
        return ""
    busy = " (busy: other work shared it, so times are slower than its best)" if load > cores else ""
    return f", with a load average of {load:.1f} on {cores} cores{html.escape(busy)}"


def settings_html(rec: Recording) -> str:
    s = {k: v for k, v in rec.settings.items() if (k, v) not in UNREMARKABLE}
    rows = [(label, s[key]) for key, label in SETTING_NAMES if key in s and s[key] is not None]
    rows += [(k, v) for k, v in s.items() if k not in dict(SETTING_NAMES)]
    cells = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows)
    note = ""
    if float(s.get("relaxed_w", 1.0) or 1.0) < 1.0:
        note = '<p class="sv-lossy-label">Relaxed verification (not exact): the output does not follow p.</p>'
    return f'<table class="sv-settings">{cells}</table>{note}'


def play_all(rec: Recording) -> dict[str, LaneView]:
    """Every lane's view with all its events in."""
    views = lane_views(rec)
    for name, evs in rec.lanes.items():
        for ev in evs:
            views[name].add(ev)
    return views


def lanes_html(rec: Recording, views: dict[str, LaneView]) -> str:
    plain = plain_lane(views)
    cells = []
    for name, v in views.items():
        stats = v.stats(plain if v is not plain else None)
        cells.append(f'<div class="sv-lane" id="sv-lane-{html.escape(_slug(name))}">{v.pane()}{stats}</div>')
    return f'<div class="sv-lanes">{"".join(cells)}</div>'


def _slug(name: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in name)


def html_page(rec: Recording) -> str:
    """The whole recording as one HTML file that opens offline: tokens with their hover details, numbers,
    charts (plotly inlined), settings, models, machine and date."""
    from plotly.offline import get_plotlyjs

    views = play_all(rec)
    figs = "".join(
        f'<div class="sv-fig">{f.to_html(full_html=False, include_plotlyjs=False, config=FIG_CONFIG)}</div>'
        for f in figures(rec, views)
    )
    css = (ASSETS / "style.css").read_text(encoding="utf-8") + PAGE_CSS
    title = f"specviz · {KIND_TITLES.get(rec.kind, rec.kind)}"
    data = json.dumps({"kind": rec.kind, "recorded_at": rec.env.get("recorded_at")}).replace("<", "\\u003c")
    return (
        "<!doctype html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, '
        f'initial-scale=1"><title>{html.escape(title)}</title><style>{css}</style>'
        f'<script>{get_plotlyjs()}</script><script type="application/json" id="sv-meta">{data}</script></head>'
        f"<body><h1>{html.escape(title)}</h1>{banner_html(rec, replay=False)}{settings_html(rec)}"
        f'{render.legend_html()}{lanes_html(rec, views)}<div class="sv-figs">{figs}</div>'
        '<p class="sv-foot">Made by specviz from a recording; open the JSON recording in the Replay tab to '
        "play it back round by round.</p></body></html>\n"
    )


def write_html(rec: Recording, path) -> None:
    from pathlib import Path

    Path(path).write_text(html_page(rec), encoding="utf-8")
