"""Plotly figures for the step-through and pair-check tabs (no gradio).

Colours are Okabe-Ito (safe for colour-blind viewers) and every series has a second cue: the target p is
solid blue, the draft q hatched orange, the residual max(0, p - q) dotted green, samples black diamonds.
Fonts are large: teachers project these in class. Token text is HTML-escaped (plotly renders some tags).
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specviz.events import Round
from specviz.teach.compute import SampleCheck

BLUE, ORANGE, GREEN, VERMILLION, SKY, PURPLE, BLACK = (
    "#0072B2",
    "#E69F00",
    "#009E73",
    "#D55E00",
    "#56B4E9",
    "#CC79A7",
    "#000000",
)
FONT = dict(size=17, family="system-ui, -apple-system, Segoe UI, Roboto, sans-serif")
P_NAME, Q_NAME, RES_NAME = "target p", "draft q", "leftover max(0, p − q), rescaled"


def _layout(fig: go.Figure, height: int, title: str = "") -> go.Figure:
    """Large fonts, white background, legend on top. `title` is plotly markup written here, never model text."""
    fig.update_layout(
        height=height,
        font=FONT,
        title=dict(text=title, font=dict(size=20)) if title else None,
        margin=dict(l=10, r=20, t=90 if title else 50, b=50),
        legend=dict(orientation="h", yanchor="bottom", y=1.02, x=0, font=dict(size=16)),
        barmode="group",
        bargap=0.25,
        plot_bgcolor="white",
        paper_bgcolor="white",
    )
    fig.update_xaxes(gridcolor="#dddddd", zerolinecolor="#999999")
    return fig


def _esc(text: str) -> str:
    """Escape for plotly's pseudo-HTML: it decodes &lt; &gt; &amp; but would show &quot; literally."""
    return html.escape(text, quote=False)


def _bar(name: str, y: Sequence[str], x: Sequence[float], color: str, shape: str, show: bool) -> go.Bar:
    return go.Bar(
        name=name,
        y=list(y),
        x=list(x),
        orientation="h",
        marker=dict(color=color, line=dict(color=BLACK, width=1), pattern=dict(shape=shape, fgcolor=BLACK, size=6)),
        legendgroup=name,
        showlegend=show,
        hovertemplate="%{y}: %{x:.3f}<extra>" + name + "</extra>",
    )


def _unique(labels: list[str]) -> list[str]:
    """Category labels must differ, or plotly merges the bars of two tokens that print alike."""
    seen: dict[str, int] = {}
    out = []
    for s in labels:
        seen[s] = seen.get(s, 0) + 1
        out.append(s if seen[s] == 1 else f"{s} ({seen[s]})")
    return out


def _siblings_turned_down(rd: Round) -> int:
    """How many guesses the walk turned down where it stopped (1 for a chain's rejected guess)."""
    t = rd.tree
    if t is None:
        return 1
    stop = t.path[-1] if t.path else -1
    return sum(st == "rejected" for st, par in zip(t.status, t.parents) if par == stop)


def candidates_figure(rd: Round, name: Callable[[int], str], greedy_mode: bool, top: int = 6) -> go.Figure:
    """For each checked position of a round: p and q over its top candidates (and the residual where it rejected).

    name(token_id) gives the visible text of a token. Positions after a rejection were never examined
    and are left out; the bonus position appears when every guess was kept.
    """
    g, n = len(rd.drafted), rd.n
    shown = list(range(min(n + 1, g + 1)))  # the kept guesses, then the rejected one or the bonus position
    cols = min(2, len(shown))
    rows = math.ceil(len(shown) / cols)
    titles = []
    for i in shown:
        if i == g:
            titles.append(f"Bonus: “{name(rd.correction)}” ★")
        elif i < n:
            titles.append(f"Guess {i + 1}: “{name(rd.drafted[i])}” ✓ kept")
        else:
            more = _siblings_turned_down(rd) - 1  # a tree: the other guesses at the branch where the walk stopped
            verdict = f"✗ +{more} more" if more > 0 else "✗ rejected"  # short: a subplot title is half the width
            titles.append(f"Guess {i + 1}: “{name(rd.drafted[i])}” {verdict} → ↻ “{name(rd.correction)}”")
    fig = make_subplots(
        rows=rows,
        cols=cols,
        subplot_titles=[_esc(t) for t in titles],
        horizontal_spacing=0.22,
        vertical_spacing=0.22 / rows,
    )
    for k, i in enumerate(shown):
        c = rd.candidates[i]
        vals = {t: (pv, qv, rv) for t, pv, qv, rv in zip(c.token_ids, c.p, c.q, c.residual)}
        ranked = sorted(vals, key=lambda t: -max(vals[t][0], vals[t][1], vals[t][2] if i == n else 0.0))[:top]
        marked = {}
        if i < g:
            marked[rd.drafted[i]] = "▶ "
            if rd.drafted[i] not in vals and not greedy_mode:  # a long shot outside both top lists
                vals[rd.drafted[i]] = (rd.p[i], rd.q[i], 0.0)  # rejected only where p(x) < q(x): leftover 0
        if i == n:
            marked[rd.correction] = "★ " if i == g else "↻ "
        ids = ranked + [t for t in marked if t in vals and t not in ranked]
        ids.sort(key=lambda t: -vals[t][0])
        y = _unique([_esc(f"{marked.get(t, '')}“{name(t)}”") for t in ids])
        r, col = k // cols + 1, k % cols + 1
        first = k == 0
        fig.add_trace(_bar(P_NAME, y, [vals[t][0] for t in ids], BLUE, "", first), r, col)
        if i < g:
            fig.add_trace(_bar(Q_NAME, y, [vals[t][1] for t in ids], ORANGE, "/", first), r, col)
        if i == n < g and not greedy_mode:
            fig.add_trace(_bar(RES_NAME, y, [vals[t][2] for t in ids], GREEN, ".", True), r, col)
        fig.update_yaxes(autorange="reversed", row=r, col=col)
    title = "What p and q said at each checked guess"
    if greedy_mode:
        title += "<br><sub>temperature 0 decides by the top choice; bars show the models at temperature 1</sub>"
    _layout(fig, 160 + 300 * rows, title)
    fig.update_layout(
        legend=dict(yref="container", y=0.0, yanchor="bottom", x=0),
        margin=dict(t=130 if greedy_mode else 100, b=70 if rows == 1 else 60),
    )
    return fig


def exactness_figure(sc: SampleCheck, name: Callable[[int], str], top: int = 12) -> go.Figure:
    """The output of speculative sampling (diamonds) over the most likely tokens, against p (blue) and q (orange)."""
    score = sc.p.maximum(sc.q).maximum(sc.freq)  # (V,)
    ids = score.topk(min(top, score.numel())).indices.tolist()
    ids.sort(key=lambda t: -float(sc.p[t]))
    y = _unique([_esc(f"“{name(t)}”") for t in ids])
    fig = go.Figure()
    fig.add_trace(_bar(P_NAME, y, [float(sc.p[t]) for t in ids], BLUE, "", True))
    fig.add_trace(_bar(Q_NAME, y, [float(sc.q[t]) for t in ids], ORANGE, "/", True))
    fig.add_trace(
        go.Scatter(
            name=f"speculative output ({sc.draws} draws)",
            y=y,
            x=[float(sc.freq[t]) for t in ids],
            mode="markers",
            marker=dict(symbol="diamond", size=16, color=BLACK, line=dict(color="white", width=1.5)),
            hovertemplate="%{y}: %{x:.3f}<extra>speculative output</extra>",
        )
    )
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(title_text="probability / share of draws")
    title = "The output follows the target p, not the draft q"
    if sc.relaxed_w < 1:
        title = f"Relaxed, not exact (w = {sc.relaxed_w:.2f}): the output drifts toward q"
    _layout(fig, 200 + 38 * len(ids), title)
    fig.update_layout(legend=dict(yref="container", y=0.0, yanchor="bottom", x=0), margin=dict(b=120))
    return fig


def forward_time_figure(times: Sequence[float]) -> go.Figure:
    """The target's time for one pass over k tokens, against k one-token passes."""
    k = list(range(1, len(times) + 1))
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            name="one pass over k tokens (what verifying costs)",
            x=k,
            y=[t * 1e3 for t in times],
            mode="lines+markers",
            line=dict(color=BLUE, width=4),
            marker=dict(symbol="circle", size=12),
        )
    )
    fig.add_trace(
        go.Scatter(
            name="k passes of one token (plain decoding)",
            x=k,
            y=[i * times[0] * 1e3 for i in k],
            mode="lines+markers",
            line=dict(color=VERMILLION, width=3, dash="dash"),
            marker=dict(symbol="square", size=10),
        )
    )
    fig.update_xaxes(title_text="tokens scored by the target (k)", dtick=1)
    fig.update_yaxes(title_text="milliseconds", rangemode="tozero", gridcolor="#dddddd")
    fig = _layout(fig, 420, "Target forward time on this machine")
    fig.update_layout(legend=dict(orientation="v", y=1.0, yanchor="top", x=0.02, bgcolor="rgba(255,255,255,0.8)"))
    return fig


def speedup_figure(gammas: Sequence[int], speedups: Sequence[float], recommended: int | None) -> go.Figure:
    """Expected speedup per gamma, the recommended gamma hatched and labelled, 1× drawn as the break-even line."""
    colors = [VERMILLION if g == recommended else SKY for g in gammas]
    shapes = ["x" if g == recommended else "" for g in gammas]
    fig = go.Figure(
        go.Bar(
            x=list(gammas),
            y=list(speedups),
            marker=dict(color=colors, line=dict(color=BLACK, width=1), pattern=dict(shape=shapes, fgcolor=BLACK)),
            text=[f"{s:.2f}×" for s in speedups],
            textposition="outside",
            hovertemplate="gamma %{x}: %{y:.2f}×<extra></extra>",
            showlegend=False,
        )
    )
    no_gain = dict(color=BLACK, dash="dash", width=2)
    fig.add_hline(y=1.0, line=no_gain)  # named in the legend: a label on the line collided with a bar's near 1×
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", line=no_gain, name="no gain (1×)"))
    if recommended in gammas:
        top = max(speedups)
        fig.add_annotation(
            x=recommended, y=top * 1.18, text=f"recommended: gamma = {recommended}", showarrow=False, font=dict(size=17)
        )
    fig.update_xaxes(title_text="gamma (tokens the draft guesses per round)", dtick=1)
    fig.update_yaxes(title_text="expected speedup", rangemode="tozero", range=[0, max([1.2, *speedups]) * 1.3])
    fig = _layout(fig, 420, "Expected speedup per gamma")
    fig.update_layout(legend=dict(orientation="h", x=1.0, xanchor="right", y=1.02, yanchor="bottom"))
    return fig
