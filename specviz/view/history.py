"""The history chart: every race a visitor ran, a point per speculative lane, against gamma and temperature.

A point (a flat dict, see ui/history.py) holds the lane's settings (gamma, temperature, drafter) and what its Tally
measured: acceptance (accepted / drafted), alpha (accepted / judged), c (one draft call / one plain step) and the
speedup over the plain lane of the same race. The dashed curves are the theory's (specviz.theory, through
plots.theory_frame) for a drafter's latest measured alpha and c; the open markers are the theory's value at each
point's own alpha, c and gamma. No gradio import.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specviz.view.plots import BLUE, GREEN, ORANGE, PURPLE, SKY, VERMILLION, empty_figure, theory_frame

DRAFTER_COLORS = (BLUE, ORANGE, GREEN, PURPLE, SKY, VERMILLION)
EMPTY_HISTORY = (
    "Each race you run (press Run race, or let go of a slider) adds a dot per lane here: acceptance and speedup "
    "against gamma and against temperature."
)
PANELS = (("gamma", "acceptance"), ("gamma", "speedup"), ("temperature", "acceptance"), ("temperature", "speedup"))


def _finite(*xs) -> bool:
    return all(isinstance(x, (int, float)) and math.isfinite(x) for x in xs)


def theory_point(point: dict) -> tuple[float, float] | None:
    """The theory's (acceptance, speedup) at a point's own alpha, c and gamma; None where c is unknown."""
    a, c, g = point.get("alpha"), point.get("c"), point.get("gamma")
    if not (_finite(a, c) and isinstance(g, int) and g >= 1 and 0 <= a <= 1 and c >= 0):
        return None
    row = theory_frame(a, c, [g]).iloc[0]
    return float(row["acceptance"]), float(row["speedup"])


def history_figure(points: Sequence[dict], max_gamma: int = 8) -> go.Figure:
    """Acceptance and speedup against gamma (top) and temperature (bottom), a colour per drafter."""
    if not points:
        return empty_figure(EMPTY_HISTORY)
    fig = make_subplots(
        rows=2,
        cols=2,
        vertical_spacing=0.2,
        horizontal_spacing=0.12,
        subplot_titles=("Acceptance", "Speedup over plain", "", ""),
    )
    drafters = list(dict.fromkeys(p["drafter"] for p in points))
    for i, drafter in enumerate(drafters):
        color = DRAFTER_COLORS[i % len(DRAFTER_COLORS)]
        mine = [p for p in points if p["drafter"] == drafter]
        hover = [f"{p['label']}<br>gamma {p['gamma']}, temperature {p['temperature']:g}" for p in mine]
        for k, (x, y) in enumerate(PANELS):
            fig.add_trace(
                go.Scatter(
                    x=[p[x] for p in mine],
                    y=[p[y] for p in mine],
                    mode="markers",
                    name=drafter,
                    legendgroup=drafter,
                    showlegend=k == 0,
                    marker={"size": 10, "color": color},
                    text=hover,
                    hovertemplate="%{text}<br>%{y:.2f}<extra></extra>",
                ),
                row=k // 2 + 1,
                col=k % 2 + 1,
            )
        _theory(fig, mine, drafter, color, max_gamma)
    fig.add_hline(y=1.0, line={"color": VERMILLION, "width": 1}, row=1, col=2)
    fig.add_hline(y=1.0, line={"color": VERMILLION, "width": 1}, row=2, col=2)
    top = max(max_gamma, max(p["gamma"] for p in points))
    fig.update_xaxes(title_text="gamma", dtick=1 if top <= 8 else 2, row=1)
    fig.update_xaxes(
        title_text="temperature", range=[-0.05, max(1.35, max(p["temperature"] for p in points) + 0.05)], row=2
    )
    fig.update_yaxes(tickformat=".0%", range=[0, 1.05], col=1)
    fig.update_yaxes(title_text="× plain", rangemode="tozero", col=2)
    fig.update_annotations(font_size=13)  # the panels' titles: short enough for a phone's half width
    fig.update_layout(
        template="plotly_white",
        height=520,
        margin={"l": 50, "r": 15, "t": 60, "b": 45},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.06, "xanchor": "right", "x": 1},
    )
    return fig


def _theory(fig: go.Figure, mine: list[dict], drafter: str, color: str, max_gamma: int) -> None:
    """The theory's curve over gamma for this drafter's latest measured alpha and c, and its value at each point."""
    latest = mine[-1]
    a, c = latest.get("alpha"), latest.get("c")
    if _finite(a, c) and 0 <= a <= 1 and c >= 0:
        frame = theory_frame(a, c, range(1, max(max_gamma, max(p["gamma"] for p in mine)) + 1))
        name = f"theory, α {a:.2f}, c {c:.2f}"
        for col, y in ((1, "acceptance"), (2, "speedup")):
            fig.add_trace(
                go.Scatter(
                    x=frame["gamma"],
                    y=frame[y],
                    mode="lines",
                    name=name,
                    legendgroup=drafter,
                    showlegend=col == 1,
                    line={"color": color, "dash": "dash", "width": 1},
                    hoverinfo="skip",
                ),
                row=1,
                col=col,
            )
    at = [(p, theory_point(p)) for p in mine]
    at = [(p, t) for p, t in at if t is not None]
    for col, j in ((1, 0), (2, 1)):
        fig.add_trace(
            go.Scatter(
                x=[p["temperature"] for p, _ in at],
                y=[t[j] for _, t in at],
                mode="markers",
                name="theory at each point's α and c",
                legendgroup=drafter,
                showlegend=False,
                marker={"size": 9, "color": color, "symbol": "circle-open"},
                hovertemplate="theory %{y:.2f}<extra></extra>",
            ),
            row=2,
            col=col,
        )
