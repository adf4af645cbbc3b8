"""The Replay tab: recordings shared and played back, and the /record_race endpoint that makes one.

A recording (specviz.recording.record) is played with no model loaded: at the recorded speed (a race on its own recorded
clocks), faster, all at once, or one round per click. A file a visitor uploads is checked by `record.load`
(size, schema) and everything it carries is escaped where it is shown (specviz.recording.export). How a finished run
becomes a recording, and its download buttons, is keep.py's.
"""

from __future__ import annotations

import html
import time
from pathlib import Path

import gradio as gr

from specviz.config import SpecvizError
from specviz.recording import export, record
from specviz.ui.common import UIContext, error_html, gpu, message
from specviz.ui.inputs import PAGE, race_requests
from specviz.ui.keep import downloads, race_recording, step_recording, sweep_recording  # noqa: F401 (the last two: as before)
from specviz.ui.race_run import race_stream

SPEEDS = {"recorded speed": 1.0, "4× faster": 4.0, "all at once": 0.0}
FRAME_S = 0.1  # at most ~10 page updates a second while playing
PLOTS_EVERY_S = 0.5
MAX_FIGS = 4
START_HINT = '<div class="sv-note">Choose a recording, then press <b>Play</b> or <b>Next round</b>.</div>'


def record_race(ctx: UIContext, values: dict) -> str:
    """Run a race to the end and return its recording as JSON text (the /record_race endpoint). values: the race's
    inputs by name (inputs.RACE_INPUTS); those not given take the page's defaults, as on the page."""
    try:
        requests = race_requests(ctx, values)
    except SpecvizError as err:
        raise gr.Error(str(err)) from None
    stream = race_stream(ctx, values["prompt"], requests)
    while True:
        try:
            last = next(stream)
        except StopIteration as stop:
            view = stop.value
            break
    rec = race_recording(ctx, view)
    if rec is None:  # the page's last message says why, in one sentence
        raise gr.Error(_text_of(last[5]) or "The race did not finish.")
    return rec.dumps()


def _text_of(fragment: str) -> str:
    import re

    return html.unescape(re.sub(r"<[^>]+>", "", fragment or "")).strip()


# --- playing ---------------------------------------------------------------------------------------


class Player:
    """One visitor's replay: the recording, the views built so far and the next round to show."""

    def __init__(self, rec: record.Recording):
        self.rec, self.steps = rec, record.rounds_of(rec)
        self.views = export.lane_views(rec)
        self.pos, self.run = 0, 0  # run: which Play owns the replay (a newer Play makes an older one stop)

    def __deepcopy__(self, memo) -> Player:  # gr.State copies its values; this one is shared on purpose
        return self

    def restart(self) -> None:
        self.views, self.pos = export.lane_views(self.rec), 0

    def advance(self) -> list:
        """Show the next round (and the Start/Done events around it); returns what was shown."""
        if self.pos >= len(self.steps):
            return []
        step = self.steps[self.pos]
        for _, lane, ev in step:
            self.views[lane].add(ev)
        self.pos += 1
        return step

    @property
    def finished(self) -> bool:
        return self.pos >= len(self.steps)

    def lanes_html(self) -> str:
        return export.lanes_html(self.rec, self.views)

    def note(self) -> str:
        total = sum(1 for s in self.steps for _, _, ev in s if isinstance(ev, (record.Round, record.Step)))
        shown = sum(1 for s in self.steps[: self.pos] for _, _, ev in s if isinstance(ev, (record.Round, record.Step)))
        state = "Replay finished." if self.finished else "Replaying…" if self.pos else "Ready to play."
        return f'<div class="sv-note" role="status">{state} {shown} of {total} rounds and steps shown.</div>'

    def figures(self) -> list:
        figs = export.figures(self.rec, self.views)[:MAX_FIGS]
        return [gr.Plot(f, visible=True) for f in figs] + [gr.Plot(visible=False)] * (MAX_FIGS - len(figs))


def _open(choice, upload) -> record.Recording:
    if upload:
        path = upload if isinstance(upload, str) else getattr(upload, "name", None) or upload.get("path")
        return record.load(path)
    shipped = record.shipped()
    if choice in shipped:
        return record.load(shipped[choice])
    raise SpecvizError("Choose a shipped recording or open a recording file (.json).")


def _page(pl: Player, note: str | None = None) -> tuple:
    return (
        pl,
        export.banner_html(pl.rec),
        export.settings_html(pl.rec),
        pl.lanes_html(),
        note or pl.note(),
        *pl.figures(),
    )


def _failed(err: Exception) -> tuple:
    return (None, "", "", "", error_html(err), *[gr.Plot(visible=False)] * MAX_FIGS)


def on_open(choice, upload):
    """Load (and check) a recording; show its banner, settings and empty panes."""
    try:
        pl = Player(_open(choice, upload))
        return _page(pl, START_HINT)
    except Exception as err:  # one sentence; a malformed file never gets further than record.load
        return _failed(err)


def _player(pl: Player | None, choice, upload) -> Player:
    return pl if pl is not None else Player(_open(choice, upload))


def on_play(pl: Player | None, speed, choice=None, upload=None):
    """Play from where the replay stands to the end, at the chosen speed (Stop ends it)."""
    try:
        pl = _player(pl, choice, upload)
    except Exception as err:
        yield _failed(err)
        return
    pl.run += 1
    run = pl.run
    try:
        if pl.finished:
            pl.restart()
        yield _page(pl)  # the banner and settings first (a recording opened by this click has none shown yet)
        factor = SPEEDS.get(speed, 1.0)
        t0 = pl.steps[pl.pos][0][0] if pl.pos < len(pl.steps) else 0.0
        wall0, last_html, last_plots = time.monotonic(), 0.0, 0.0
        while not pl.finished and pl.run == run:
            t_event = pl.steps[pl.pos][-1][0]
            deadline = wall0 + (t_event - t0) / factor if factor > 0 else 0.0  # this round's recorded moment
            while (left := deadline - time.monotonic()) > 0 and pl.run == run:
                time.sleep(min(left, 0.25))  # short naps: Stop or another click ends the wait at once
            if pl.run != run:
                break
            pl.advance()
            now = time.monotonic()
            if factor > 0 and now - last_html >= FRAME_S:
                with_plots = now - last_plots >= PLOTS_EVERY_S
                last_html, last_plots = now, now if with_plots else last_plots
                figs = pl.figures() if with_plots else [gr.skip()] * MAX_FIGS
                yield (pl, gr.skip(), gr.skip(), pl.lanes_html(), pl.note(), *figs)
        yield _page(pl)
    except Exception as err:
        yield (pl, gr.skip(), gr.skip(), gr.skip(), error_html(message(err)), *[gr.skip()] * MAX_FIGS)


def _stop(pl: Player | None) -> None:
    if pl is not None:
        pl.run += 1  # the playing loop sees it and ends


def on_next(pl: Player | None, choice=None, upload=None):
    """One more round."""
    try:
        pl = _player(pl, choice, upload)
    except Exception as err:
        return _failed(err)
    pl.run += 1  # a Play in progress stops here
    if pl.finished:
        pl.restart()
    pl.advance()
    return _page(pl)


def on_export(choice, upload):
    """The chosen recording as a self-contained HTML page (also the /replay_html endpoint)."""
    try:
        rec = _open(choice, upload)
        name = Path(choice or "recording").stem if not upload else "recording"
        return downloads(rec, name)[1], ""
    except Exception as err:
        return gr.DownloadButton(visible=False), error_html(err)


def build_replay_tab(ctx: UIContext) -> None:
    """The components and handlers of the Replay tab (called inside `with gr.Tab("Replay")`)."""
    gr.Markdown(
        "Play back a recorded race, step-through session or gamma sweep, **with no model loaded**: at the speed it "
        "was recorded, faster, or one round at a time. Recordings come from the **⬇ Recording (JSON)** button under "
        "a finished run, from `python -m specviz generate ... --record run.json`, or from Python with "
        "`specviz.record_run(...)`. **Make an HTML page** turns one into a file that opens offline in any browser."
    )
    shipped = list(record.shipped())
    with gr.Row(equal_height=True):
        choice = gr.Dropdown(
            shipped, value=shipped[0] if shipped else None, label="Recordings that come with specviz", scale=2
        )
        upload = gr.File(
            label="…or open a recording file (.json)",
            file_types=[".json"],
            type="filepath",
            scale=2,
            elem_id="sv-replay-upload",
        )
    with gr.Row(equal_height=True):
        speed = gr.Radio(list(SPEEDS), value="recorded speed", label="Speed", scale=2)
        play = gr.Button("Play ▶", variant="primary", elem_classes=["sv-key-run"], scale=1)
        nxt = gr.Button("Next round ▶|", elem_classes=["sv-key-next"], scale=1)
        stop = gr.Button("Stop", variant="stop", elem_classes=["sv-key-stop"], scale=1)
        html_dl = gr.DownloadButton("⬇ Page (HTML, opens offline)", visible=False, size="sm")
    export_btn = gr.Button("Make an HTML page of this recording", size="sm")
    banner = gr.HTML(elem_id="sv-replay-banner", js_on_load=None)
    settings = gr.HTML(js_on_load=None)
    note = gr.HTML(START_HINT, elem_id="sv-replay-note", js_on_load=None)
    lanes = gr.HTML(elem_id="sv-replay-lanes", js_on_load=None)
    with gr.Row():
        figs = [gr.Plot(show_label=False, visible=False, elem_id=f"sv-replay-plot-{i}") for i in range(2)]
    with gr.Row():
        figs += [gr.Plot(show_label=False, visible=False, elem_id=f"sv-replay-plot-{i}") for i in range(2, MAX_FIGS)]
    player = gr.State(None, time_to_live=3600)

    outs = [player, banner, settings, lanes, note, *figs]
    opened = [
        choice.change(on_open, [choice, upload], outs, api_name="replay_open", concurrency_limit=4),
        upload.change(on_open, [choice, upload], outs, api_visibility="private", concurrency_limit=4),
    ]
    play_ev = play.click(
        on_play,
        [player, speed, choice, upload],
        outs,
        api_visibility="private",
        concurrency_limit=8,
        show_progress="hidden",  # the note says how far it got
    )
    nxt.click(on_next, [player, choice, upload], outs, api_visibility="private", concurrency_limit=8)
    stop.click(_stop, [player], None, cancels=[play_ev], api_visibility="private", queue=False)
    export_btn.click(on_export, [choice, upload], [html_dl, note], api_name="replay_html", concurrency_limit=2)

    @gpu
    def api_record_race(
        prompt: str,
        gamma: int = min(PAGE.gamma, ctx.limits.max_gamma),
        temperature: float = PAGE.temperature,
        top_k: int = PAGE.top_k,
        top_p: float = PAGE.top_p,
        max_new_tokens: int = min(PAGE.max_new_tokens, ctx.limits.max_new_tokens),
        seed: int = PAGE.seed,
    ) -> str:
        """Race plain against speculative decoding on the server's pair, at the page's defaults for what is not
        given (drafter, gamma policy, tree); returns the JSON recording as text."""
        values = dict(
            prompt=prompt,
            gamma=gamma,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            max_new_tokens=max_new_tokens,
            seed=seed,
        )
        return record_race(ctx, values)

    gr.api(api_record_race, api_name="record_race", concurrency_id="models")
    for ev in opened:  # a new recording: the old page is gone
        ev.then(lambda: gr.DownloadButton(visible=False), None, [html_dl], api_visibility="private")
