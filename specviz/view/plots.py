"""Events and sweep tables -> plotly Figures for the race page (no gradio import).

Names as in the papers: gamma block size, n accepted count, alpha acceptance rate, c cost ratio
(one draft call / one target call). Colours are the Okabe-Ito palette, safe for colour-blind readers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specviz import theory
from specviz.events import Event, Round, Start, Step
from specviz.theory import expected_speedup
from specviz.view import metrics

BLUE, VERMILLION, ORANGE, PURPLE, SKY, GREEN, GREY = (
    "#0072B2",
    "#D55E00",
    "#E69F00",
    "#CC79A7",
    "#56B4E9",
    "#009E73",
    "#7f7f7f",
)
AR_COLOR, SPEC_COLOR = GREY, BLUE
HEIGHT = 270


def rounds_frame(events: Sequence[Event]) -> pd.DataFrame:
    """The speculative rows of `metrics.rounds_frame`, plus `round` (from 1) and `emitted` (tokens) for the axes."""
    f = metrics.rounds_frame(events)
    f = f[f["kind"] != "step"].reset_index(drop=True)
    return f.assign(round=f["index"] + 1, emitted=f["tokens"])


def _layout(fig: go.Figure, title: str, x: str, y: str) -> go.Figure:
    fig.update_layout(
        title={"text": title, "font": {"size": 14}},
        template="plotly_white",
        height=HEIGHT,
        margin={"l": 50, "r": 15, "t": 45, "b": 40},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "xanchor": "right", "x": 1},
        xaxis_title=x,
        yaxis_title=y,
    )
    return fig


def _curve(events: Sequence[Event]) -> tuple[list[float], list[int]]:
    """(compute seconds, tokens so far) for one run, from 0 through the prompt encoding."""
    t, n = [0.0], [0]
    for ev in events:
        if isinstance(ev, Start):
            t.append(ev.prefill_s)
            n.append(0)
        elif isinstance(ev, Step):
            t.append(ev.elapsed_s)
            n.append(n[-1] + 1)
        elif isinstance(ev, Round):
            t.append(ev.elapsed_s)
            n.append(n[-1] + len(ev.tokens))
    return t, n


SPEC2_COLOR = GREEN  # the second speculative lane


def _lanes(ar, spec, spec2, labels) -> list[tuple[str, Sequence[Event], str]]:
    """(name, events, colour) per lane that is in the race."""
    labels = labels or {}
    out = [(labels.get("ar", "plain"), ar, AR_COLOR), (labels.get("spec", "speculative"), spec, SPEC_COLOR)]
    if spec2 is not None:
        out.append((labels.get("spec2", "speculative 2"), spec2, SPEC2_COLOR))
    return out


def race_figure(ar: Sequence[Event], spec: Sequence[Event], spec2=None, labels: dict | None = None) -> go.Figure:
    """Tokens so far against each run's own compute clock: the steeper line is the faster side."""
    fig = go.Figure()
    for name, evs, color in _lanes(ar, spec, spec2, labels):
        t, n = _curve(evs)
        dash = "dot" if color == AR_COLOR else "solid"
        fig.add_trace(go.Scatter(x=t, y=n, name=name, mode="lines", line={"color": color, "dash": dash, "shape": "hv"}))
    return _layout(fig, "The race: tokens so far", "compute time (s)", "tokens")


STOP_COLORS = {"gamma": BLUE, "budget": GREY, "confidence": ORANGE, "no match": VERMILLION, "match end": SKY}


def gamma_timeline_figure(frames: dict[str, pd.DataFrame]) -> go.Figure:
    """Guesses proposed per round (bars, coloured by why the round stopped there: a chain's tokens, a tree's nodes) and
    the policy's cap (ticks)."""
    fig = go.Figure()
    for lane, (label, f) in enumerate(frames.items()):
        if not len(f):
            continue
        for stop, part in f.groupby("stop"):
            fig.add_trace(
                go.Bar(
                    x=part["round"],
                    y=part["nodes"],  # what the target checked: a chain's gamma, or a tree's nodes
                    name=f"{label}: stopped by {stop or 'gamma'}",
                    marker_color=STOP_COLORS.get(stop, GREY),
                    opacity=1.0 if lane == 0 else 0.55,
                    legendgroup=label,
                )
            )
        fig.add_trace(
            go.Scatter(
                x=f["round"],
                y=f["planned"],
                mode="markers",
                name=f"{label}: most allowed",
                marker={"symbol": "line-ew-open", "size": 12, "color": "#333"},
                legendgroup=label,
            )
        )
    fig = _layout(fig, "Gamma per round: guesses proposed, and why a round stopped", "round", "guesses")
    fig.update_layout(
        barmode="group",
        legend={"orientation": "h", "yanchor": "top", "y": -0.25, "xanchor": "left", "x": 0},
        margin={"b": 90},
        height=HEIGHT + 60,
    )
    top = max((max(f["nodes"].max(), f["planned"].max()) for f in frames.values() if len(f)), default=1)
    fig.update_yaxes(rangemode="tozero", dtick=max(1, math.ceil(top / 8)))  # whole guesses, 8 labels at most
    return fig


def position_figure(frames: dict[str, pd.DataFrame]) -> go.Figure:
    """Conditional acceptance alpha_k at each draft position k, per speculative lane, with the run's overall alpha.

    Where the bars are not level, the textbook formula (one alpha at every position) mispredicts the tokens
    per target call; the legend gives both predictions next to the measured value."""
    fig = go.Figure()
    for (label, f), color in zip(frames.items(), (BLUE, SPEC2_COLOR)):
        if not len(f):
            continue
        alphas = metrics.acceptance_by_position(f)
        spec = f[f["gamma"] > 0]
        a = theory.alpha(int(spec["n"].sum()), int((spec["kind"] == "resampled").sum()))
        mean_k = max(round(float(spec["gamma"].mean())), 1) if len(spec) else 1
        by_pos = theory.expected_tokens_by_position(list(alphas)[:mean_k])
        textbook = theory.expected_tokens(a, mean_k)
        measured = float(f["tokens"].sum() / len(f))
        name = (
            f"{label}: {measured:.2f} tokens/call measured; per-position α predicts {by_pos:.2f}, "
            f"one α = {a:.2f} predicts {textbook:.2f} (γ≈{mean_k})"
        )
        fig.add_trace(go.Bar(x=list(alphas.index), y=list(alphas.values), name=name, marker_color=color))
    fig = _layout(fig, "Acceptance at each draft position (of the rounds that got there)", "position k", "α_k")
    fig.update_layout(
        legend={"orientation": "h", "yanchor": "top", "y": -0.25, "xanchor": "left", "x": 0},
        margin={"b": 90},
        height=HEIGHT + 60,
    )
    fig.update_yaxes(range=[0, 1.05], tickformat=".0%")
    fig.update_xaxes(dtick=1)
    return fig


def acceptance_figure(rounds: pd.DataFrame) -> go.Figure:
    """Share of each round's proposals accepted (bars) and the running acceptance rate (line)."""
    fig = go.Figure()
    rounds = rounds[rounds["gamma"] > 0] if len(rounds) else rounds  # a round with no guess has no share
    if len(rounds):
        share = rounds["n"] / rounds["gamma"]
        running = rounds["n"].cumsum() / rounds["gamma"].cumsum()
        fig.add_trace(go.Bar(x=rounds["round"], y=share, name="this round", marker_color=SKY))
        fig.add_trace(go.Scatter(x=rounds["round"], y=running, name="so far", line={"color": BLUE, "width": 3}))
    fig = _layout(fig, "Acceptance rate: guesses kept per round", "round", "accepted / proposed")
    fig.update_yaxes(range=[0, 1.05], tickformat=".0%")
    return fig


RANK_STYLES = ((BLUE, ""), (ORANGE, "/"), (PURPLE, "x"))  # 1st, 2nd, 3rd+ choice: a colour and a hatching each


def tree_figure(table: pd.DataFrame) -> go.Figure:
    """Token trees: the share of tested guesses the target kept, by depth, one bar per rank of the guess at its
    branch (the draft's 1st, 2nd, 3rd+ choice). table: `metrics.tree_acceptance`."""
    fig = go.Figure()
    for j, (name, (color, hatch)) in enumerate(zip(metrics.TREE_RANKS, RANK_STYLES)):
        part = table[table["rank"] == j] if len(table) else table
        if not len(part):
            continue
        fig.add_trace(
            go.Bar(
                x=part["depth"],
                y=part["share"],
                name=f"draft's {name} choice",
                marker_color=color,
                marker_pattern_shape=hatch,
                text=[f"{k}/{n}" for k, n in zip(part["kept"], part["tested"])],
                textposition="outside",
                customdata=part[["kept", "tested"]].to_numpy(),
                hovertemplate=f"depth %{{x}}, the draft's {name} choice: kept %{{customdata[0]}} of "
                "%{customdata[1]} tested (%{y:.0%})<extra></extra>",
            )
        )
    fig = _layout(
        fig, "Token trees: guesses kept, by depth and by the draft's choice", "depth in the tree", "kept / tested"
    )
    fig.update_layout(barmode="group")
    fig.update_yaxes(range=[0, 1.15], tickformat=".0%")
    fig.update_xaxes(dtick=1)
    return fig


def tokens_per_round_figure(rounds: pd.DataFrame, gamma: int) -> go.Figure:
    """How many tokens each round produced: 1 (first guess rejected) .. gamma+1 (all accepted + bonus)."""
    gamma = max([gamma, *(rounds["gamma"].tolist() if len(rounds) else [])])  # a varying gamma may go past it
    k = list(range(1, gamma + 2))
    counts = rounds["emitted"].value_counts().reindex(k, fill_value=0) if len(rounds) else pd.Series(0, index=k)
    colors = [BLUE] * gamma + [PURPLE]  # the last bar: every proposal accepted, plus the bonus token
    fig = go.Figure(go.Bar(x=k, y=counts.values, marker_color=colors, name="rounds"))
    fig = _layout(fig, "Tokens per round (per target call)", "tokens produced in the round", "rounds")
    fig.update_xaxes(tickmode="linear", dtick=1)
    return fig


def time_share_figure(ar: Sequence[Event], spec: Sequence[Event], spec2=None, labels: dict | None = None) -> go.Figure:
    """Where each side's compute went: prompt encoding, drafting (q), the target (p), and the rest."""
    lanes = _lanes(ar, spec, spec2, labels)
    frames = [metrics.rounds_frame(evs) for _, evs, _ in lanes]
    names = [name for name, _, _ in lanes]
    prefill = [sum(ev.prefill_s for ev in evs if isinstance(ev, Start)) for _, evs, _ in lanes]
    fig = go.Figure()
    for name, vals, color in (
        ("prompt", prefill, GREY),
        ("drafting", [f["draft_s"].sum() for f in frames], SKY),
        ("target p", [f["verify_s"].sum() for f in frames], BLUE),
        ("other", [f["other_s"].sum() for f in frames], ORANGE),
    ):
        fig.add_trace(go.Bar(y=names, x=[float(v) for v in vals], name=name, orientation="h", marker_color=color))
    fig = _layout(fig, "Where the time went", "compute time (s)", "")
    fig.update_layout(barmode="stack")
    return fig


def theory_frame(alpha: float, c: float, gammas: Sequence[int]) -> pd.DataFrame:
    """The paper's expected speedup and acceptance for a given alpha and c, over gamma."""
    rows = []
    for g in gammas:
        tokens = g + 1 if alpha >= 1 else (1 - alpha ** (g + 1)) / (1 - alpha)  # E[tokens per round]
        rows.append({"gamma": g, "speedup": expected_speedup(alpha, g, c), "acceptance": (tokens - 1) / g})
    return pd.DataFrame(rows, columns=["gamma", "speedup", "acceptance"])


def sweep_figure(measured: pd.DataFrame, theory: pd.DataFrame | None = None) -> go.Figure:
    """Measured acceptance and speedup against gamma, with the theoretical curves when given.

    measured: columns gamma, acceptance, speedup.
    """
    fig = make_subplots(
        rows=1, cols=2, subplot_titles=("Acceptance rate (accepted / proposed)", "Speedup over plain decoding")
    )
    if theory is not None and len(theory):
        fig.add_trace(
            go.Scatter(x=theory["gamma"], y=theory["acceptance"], name="theory", line={"color": GREY, "dash": "dash"}),
            row=1,
            col=1,
        )
        fig.add_trace(
            go.Scatter(
                x=theory["gamma"],
                y=theory["speedup"],
                name="theory",
                showlegend=False,
                line={"color": GREY, "dash": "dash"},
            ),
            row=1,
            col=2,
        )
    marker = {"size": 10, "color": BLUE, "symbol": "circle"}
    fig.add_trace(
        go.Scatter(x=measured["gamma"], y=measured["acceptance"], name="measured", mode="markers+lines", marker=marker),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Scatter(
            x=measured["gamma"],
            y=measured["speedup"],
            name="measured",
            mode="markers+lines",
            marker=marker,
            showlegend=False,
        ),
        row=1,
        col=2,
    )
    fig.add_hline(y=1.0, line={"color": VERMILLION, "width": 1}, row=1, col=2)
    if not len(measured):
        fig.add_annotation(
            text="Press “Sweep gamma” to measure", showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper"
        )
        fig.update_xaxes(range=[0.5, 8.5])
    fig.update_xaxes(title_text="gamma (tokens drafted per round)", dtick=1 if len(measured) < 10 else None)
    return acceptance_and_speedup_axes(fig)


def acceptance_and_speedup_axes(fig: go.Figure) -> go.Figure:
    """The two panels of a sweep (acceptance on the left, speedup over plain decoding on the right), styled alike."""
    fig.update_yaxes(tickformat=".0%", range=[0, 1.05], row=1, col=1)
    fig.update_yaxes(title_text="× plain tokens/s", rangemode="tozero", row=1, col=2)
    fig.update_layout(
        template="plotly_white",
        height=320,
        margin={"l": 50, "r": 15, "t": 50, "b": 45},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.08, "xanchor": "right", "x": 1},
    )
    return fig


# What each of the race's charts (RaceView.figures' order) will show, said before the first race instead of empty axes
RACE_EMPTY = (
    "Tokens written over time, plain against speculative, will appear here once a race runs.",
    "How many guesses the target kept, round by round, will appear here.",
    "How many tokens each target call wrote will appear here.",
    "Where each lane's time went (drafting, checking, the rest) will appear here.",
    "How often a guess is kept at each position of a round will appear here.",
    "How many guesses each round made, and why it stopped, will appear here.",
)


def empty_figure(sentence: str, height: int = 140) -> go.Figure:
    """A chart with nothing measured yet: one sentence of what will appear there, no axes."""
    fig = go.Figure()
    fig.add_annotation(
        text=sentence, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper", font={"size": 13, "color": GREY}
    )
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    fig.update_layout(template="plotly_white", height=height, margin={"l": 10, "r": 10, "t": 10, "b": 10})
    return fig
