"""The gamma sweep of the Race tab: measured acceptance and speedup per gamma, and the paper's curve.

One plain run is the baseline; then one speculative run per gamma on the same prompt and settings. The theory
uses the per-token acceptance alpha (accepted / proposals the target ruled on) and the cost ratio c
(one draft call / one target call), both measured over the sweep so far.
"""

from __future__ import annotations

import time

import pandas as pd

from specviz.engine.loop import autoregressive_decode, speculative_decode
from specviz.engine.tally import Tally
from specviz.events import Done
from specviz.host import compute
from specviz.recording.record import keep
from specviz.request import RunRequest
from specviz.ui.common import HTML_EVERY_S, UIContext, error_html
from specviz.ui.inputs import note as _note
from specviz.ui.inputs import page_request, prepare
from specviz.view import plots

SWEEP_GAMMAS = (1, 2, 3, 4, 6, 8, 12, 16)  # the first limits.max_sweep of these, up to limits.max_gamma
DEFAULT_SWEEP = 6  # 1, 2, 3, 4, 6, 8 unless the deployment asks for fewer


EMPTY_SWEEP = pd.DataFrame(columns=["gamma", "acceptance", "speedup"])
SWEEP_EMPTY = "Press “Sweep gamma” to race the current prompt at several gamma values: acceptance and speedup per gamma, with the paper's curve, will appear here."


def run_to_done(events, *page):
    """Run `events` to the end and return its Done; meanwhile yield `page` again every HTML_EVERY_S.

    Gradio can stop a generator only where it yields, so these yields let Stop end a sweep within one round.
    """
    done, last = None, time.monotonic()
    for ev in events:
        if isinstance(ev, Done):
            done = ev
        elif time.monotonic() - last >= HTML_EVERY_S:
            last = time.monotonic()
            yield page
    return done


def sweep_numbers(lanes: dict[str, list]) -> tuple[list[dict], float, float]:
    """The sweep's table (acceptance rate and speedup per gamma) and the alpha and c of every speculative lane
    pooled, c against the plain lane's step (tally.py); lanes: "ar" and "gamma = g" -> that run's events."""
    plain = Tally.of(lanes["ar"])
    runs = {int(name.split("= ")[1]): Tally.of(evs) for name, evs in lanes.items() if name != "ar"}
    rows = [
        {"gamma": g, "acceptance": t.acceptance_rate, "speedup": t.tokens_per_s / max(plain.tokens_per_s, 1e-9)}
        for g, t in runs.items()
    ]
    pooled = sum(runs.values(), Tally())
    return rows, pooled.alpha, pooled.c(plain)


def sweep_page(ctx: UIContext, values: dict):
    """The /sweep handler's body: the page's values, by name (inputs.SWEEP_INPUTS), become the sweep's request
    (a constant gamma, set per run); a bad value is one sentence in the page."""
    try:
        req = page_request(ctx, {**values, "gamma": 1, "gamma_policy": "constant"})
    except Exception as err:
        yield plots.sweep_figure(EMPTY_SWEEP), error_html(err)
        return None
    return (yield from sweep_stream(ctx, values.get("prompt"), req))


def sweep_stream(ctx: UIContext, prompt, request: RunRequest):
    """Run `request` at each gamma of SWEEP_GAMMAS (capped) on `prompt`, after one plain run; yield the figure after
    each gamma. Returns the lanes, the table, alpha, c and the request, for the recording."""
    empty, start = plots.sweep_figure(EMPTY_SWEEP), time.monotonic()
    fig = empty
    try:
        gammas = [g for g in SWEEP_GAMMAS if g <= ctx.limits.max_gamma][
            : max(1, min(DEFAULT_SWEEP, ctx.limits.max_sweep))
        ]
        req = request.replace(gamma=1, gamma_policy="constant")
        yield empty, _note("Loading the models…")
        p, q, ids = prepare(ctx, prompt, req.replace(gamma=gammas[-1]))
        note = _note(f"Plain decoding first (the baseline), then gamma = {', '.join(map(str, gammas))}…")
        yield empty, note
        lanes: dict[str, list] = {"ar": []}  # every event, for the recording (ui/keep.py)
        plain = keep(compute.iterate(autoregressive_decode(p, ids, req.spec)), lanes["ar"])  # on the compute thread
        yield from run_to_done(ctx.limits.within_time(plain, start), empty, note)
        for i, g in enumerate(gammas, 1):
            spec = keep(
                compute.iterate(speculative_decode(p, q, ids, req.replace(gamma=g).spec)),
                lanes.setdefault(f"gamma = {g}", []),
            )
            yield from run_to_done(ctx.limits.within_time(spec, start), fig, note)  # past the cap: one SpecvizError
            rows, alpha, c = sweep_numbers(lanes)
            theory = plots.theory_frame(alpha, c, range(1, max(gammas) + 1))
            fig = plots.sweep_figure(pd.DataFrame(rows), theory)
            best = int(theory.loc[theory["speedup"].idxmax(), "gamma"])
            state = "Sweep done." if i == len(gammas) else f"Sweeping: {i} of {len(gammas)} gamma values so far."
            note = _note(
                f"{state} Of the guesses the target checked, {alpha:.0%} were kept (α); guesses after a "
                "rejection are thrown away unchecked, so the share of all guesses kept (left) is lower. One "
                f"draft call costs c ≈ {c:.2f} target calls. The paper's formula (dashed) then peaks at "
                f"gamma = {best}; it assumes checking gamma + 1 tokens costs the target no more than one, "
                "which holds on a GPU; on a CPU it holds only for short blocks, so past them the dots fall below it."
            )
            yield fig, note
        return {"lanes": lanes, "sweep": rows, "alpha": alpha, "c": c, "request": req, "prompt": prompt}  # recorded
    except Exception as err:  # keep what was measured, add the sentence
        yield fig, error_html(err)
    return None
