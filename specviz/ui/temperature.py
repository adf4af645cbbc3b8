"""The temperature sweep of the Race tab: the current prompt at a few temperatures, plain and speculative each.

For each temperature of SWEEP_TEMPERATURES (the first limits.max_sweep of them), one plain run (that temperature's
baseline) and one speculative run, both seeded with the page's seed; acceptance, alpha and the speedup over the
plain run of the same temperature come from each run's Tally. The chart is view/temperature.py.
"""

from __future__ import annotations

import time

from specviz.engine.loop import autoregressive_decode, speculative_decode
from specviz.engine.tally import Tally
from specviz.events import Done
from specviz.host import compute
from specviz.recording.record import keep
from specviz.request import RunRequest
from specviz.ui.common import UIContext, error_html
from specviz.ui.inputs import note as _note
from specviz.ui.inputs import page_request, prepare
from specviz.ui.sweep import run_to_done
from specviz.view.temperature import temperature_figure

SWEEP_TEMPERATURES = (0.0, 0.3, 0.7, 1.0, 1.3)  # greedy, then from little to much randomness
WHY = (
    "At temperature 0 a guess is kept only when it is the target's top choice. Above 0 a guess x is kept with "
    "probability min(1, p(x)/q(x)), and heat flattens the target's and the draft's distributions differently, so "
    "their overlap, and with it acceptance, usually shrinks as the temperature rises."
)


def temperature_rows(lanes: dict[str, list]) -> list[dict]:
    """The sweep's table: per temperature, the speculative run's acceptance and alpha and its speedup over the
    plain run at the same temperature; lanes: "plain, T = t" and "T = t" -> that run's events."""
    rows = []
    for name, evs in lanes.items():
        if name.startswith("plain") or f"plain, {name}" not in lanes:
            continue
        t, plain = Tally.of(evs), Tally.of(lanes[f"plain, {name}"])
        if not any(isinstance(e, Done) for e in evs):
            continue
        rows.append(
            {
                "temperature": float(name.split("= ")[1]),
                "acceptance": t.acceptance_rate,
                "alpha": t.alpha,
                "speedup": t.speedup(plain),
                "tokens": t.new_tokens,
            }
        )
    return rows


def trend(rows: list[dict]) -> str:
    """One sentence on what the sweep measured so far: alpha and the speedup from its first temperature to its last."""
    if len(rows) < 2:
        return ""
    a, b = rows[0], rows[-1]
    return (
        f"From temperature {a['temperature']:g} to {b['temperature']:g}, α (kept of the guesses checked) went from "
        f"{a['alpha']:.0%} to {b['alpha']:.0%} and the speedup from {a['speedup']:.2f}× to {b['speedup']:.2f}×."
    )


def temperature_page(ctx: UIContext, values: dict):
    """The /temperature_sweep handler's body: the page's values, by name (inputs.TEMPERATURE_SWEEP_INPUTS), become
    the sweep's request (temperature set per run); a bad value is one sentence in the page."""
    try:
        req = page_request(ctx, {**values, "temperature": 0.0})
    except Exception as err:
        yield temperature_figure([]), error_html(err), []
        return None
    return (yield from temperature_stream(ctx, values.get("prompt"), req))


def temperature_stream(ctx: UIContext, prompt, request: RunRequest):
    """Run `request` plain and speculative at each temperature on `prompt`; yield (figure, note, table) after each
    temperature. Returns the lanes and the table."""
    start = time.monotonic()
    fig, rows = temperature_figure([]), []
    try:
        temps = SWEEP_TEMPERATURES[: max(1, min(len(SWEEP_TEMPERATURES), ctx.limits.max_sweep))]
        yield fig, _note("Loading the models…"), rows
        p, q, ids = prepare(ctx, prompt, request)
        listed = ", ".join(f"{t:g}" for t in temps)
        note = _note(f"Plain and speculative decoding at temperature {listed}, seed {request.seed} each…")
        yield fig, note, rows
        lanes: dict[str, list] = {}
        for i, temp in enumerate(temps, 1):
            req = request.replace(temperature=temp)
            for name, run in (
                (f"plain, T = {temp:g}", autoregressive_decode(p, ids, req.replace(mode="ar").spec)),
                (f"T = {temp:g}", speculative_decode(p, q, ids, req.spec)),
            ):
                events = keep(compute.iterate(run), lanes.setdefault(name, []))  # on the compute thread
                yield from run_to_done(
                    ctx.limits.within_time(events, start), fig, note, rows
                )  # past the cap: a sentence
            rows = temperature_rows(lanes)
            fig = temperature_figure(rows)
            state = "Temperature sweep done." if i == len(temps) else f"Sweeping: {i} of {len(temps)} temperatures."
            note = _note(f"{state} {trend(rows)}")
            yield fig, note, rows
        return {"lanes": lanes, "rows": rows, "request": request, "prompt": prompt}
    except Exception as err:  # keep what was measured, add the sentence
        yield fig, error_html(err), rows
    return None
