"""The temperature sweep's chart: measured acceptance and speedup against temperature (no gradio import).

rows: dicts with temperature, acceptance (accepted / drafted), alpha (accepted / judged) and speedup (over the plain
run at the same temperature), as ui/temperature.py measures them.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specviz.view.plots import BLUE, GREY, VERMILLION, acceptance_and_speedup_axes, empty_figure

EMPTY_TEMPERATURE = (
    "Press “Sweep temperature” to race the current prompt at temperatures from 0 to 1.3: "
    "acceptance and speedup per temperature will appear here."
)


def temperature_figure(rows: Sequence[dict]) -> go.Figure:
    """Acceptance (and alpha) and speedup against temperature; a sentence instead of axes when nothing is measured."""
    if not rows:
        return empty_figure(EMPTY_TEMPERATURE)
    x = [r["temperature"] for r in rows]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Acceptance by temperature", "Speedup over plain decoding"))
    marker = {"size": 10, "color": BLUE}
    fig.add_trace(
        go.Scatter(
            x=x, y=[r["acceptance"] for r in rows], name="accepted / drafted", mode="markers+lines", marker=marker
        ),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=[r["alpha"] for r in rows],
            name="α: kept of those checked",
            mode="markers+lines",
            marker={"size": 8, "color": GREY, "symbol": "diamond"},
            line={"dash": "dot"},
        ),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Scatter(x=x, y=[r["speedup"] for r in rows], name="speedup", mode="markers+lines", marker=marker),
        row=1,
        col=2,
    )
    fig.add_hline(y=1.0, line={"color": VERMILLION, "width": 1}, row=1, col=2)
    fig.update_xaxes(title_text="temperature (0 = greedy)", range=[-0.05, max(1.35, max(x) + 0.05)])
    return acceptance_and_speedup_axes(fig)
