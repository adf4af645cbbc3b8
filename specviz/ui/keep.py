"""Keeping a finished run: its recording (specviz.recording.record) as a JSON file and a self-contained HTML page.

The Race and Step-through tabs show two download buttons under a finished run (`download_buttons`, `downloads`);
`with_result` lets a page handler hand its finished view to them; `race_recording`, `sweep_recording` and
`step_recording` turn a finished race, gamma sweep or step-through session into a Recording. The Replay tab
(replay.py) plays such files back.
"""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path

import gradio as gr

from specviz.recording import export, record
from specviz.ui.common import UIContext


def _out_dir() -> Path:
    folder = Path(tempfile.gettempdir()) / "specviz-recordings" / uuid.uuid4().hex[:12]
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def files_for(rec: record.Recording, stem: str) -> tuple[str, str]:
    """The recording as JSON and as a self-contained HTML page, in a fresh temporary folder."""
    folder = _out_dir()
    json_path = rec.save(folder / f"{stem}.json")
    html_path = folder / f"{stem}.html"
    export.write_html(rec, html_path)
    return str(json_path), str(html_path)


def downloads(rec: record.Recording | None, stem: str):
    """The two download buttons: shown with the files of `rec`, hidden when there is nothing finished to keep."""
    if rec is None:
        return gr.DownloadButton(visible=False), gr.DownloadButton(visible=False)
    json_path, html_path = files_for(rec, stem)
    return (
        gr.DownloadButton("⬇ Recording (JSON)", value=json_path, visible=True),
        gr.DownloadButton("⬇ Page (HTML, opens offline)", value=html_path, visible=True),
    )


def download_buttons() -> tuple[gr.DownloadButton, gr.DownloadButton]:
    """Two hidden buttons, shown once a run has finished."""
    with gr.Row(elem_classes=["sv-downloads"]):
        j = gr.DownloadButton("⬇ Recording (JSON)", visible=False, size="sm", elem_classes=["sv-dl-json"])
        h = gr.DownloadButton("⬇ Page (HTML, opens offline)", visible=False, size="sm", elem_classes=["sv-dl-html"])
    return j, h


def with_result(stream):
    """Re-yield a handler's page updates with one more output: what the generator returned at the end (its
    finished view), sent once, with the last update again."""
    last = None
    while True:
        try:
            last = next(stream)
        except StopIteration as stop:
            if last is not None:
                yield (*last, stop.value)
            return
        yield (*last, gr.skip())


def race_recording(ctx: UIContext, view, history: list[dict] | None = None) -> record.Recording | None:
    """A finished race (every lane done) as a Recording, or None. Its settings are the ones the race ran with
    (the view keeps the lanes' RunRequests), not the page's inputs now or any defaults of this function's.
    history: the visitor's points so far (ui/history.py), kept as the table extra["history"]."""
    if view is None or view.pieces is None or not all(view.done[k] for k in view.lanes):
        return None
    settings = view.requests["spec"].settings(view.prompt)
    if "spec2" in view.lanes:
        settings |= {"lane3": view.labels["spec2"]}
    lanes = {k: view.events[k] for k in view.lanes}
    p, q = ctx.pair()
    extra = {"history": list(history)} if history else None
    return record.make("race", settings, lanes, view.pieces.tok, record.environment(p, q, settings), extra)


def sweep_recording(ctx: UIContext, result: dict | None) -> record.Recording | None:
    """A finished sweep (sweep_stream's return value) as a Recording, or None: the prompt and the request it ran
    with (not the page's inputs now)."""
    if not result:
        return None
    prompt = result["prompt"]
    p, q = ctx.pair()
    extra = {k: result[k] for k in ("sweep", "alpha", "c")}
    settings = result["request"].settings(prompt) | {"gamma": None}  # each lane names its own gamma
    return record.make("sweep", settings, result["lanes"], p.tokenizer, record.environment(p, q, settings), extra)


def step_recording(ctx: UIContext, session) -> record.Recording | None:
    """A finished step-through session (ui/step.py's Session) as a Recording, or None while it runs."""
    st = getattr(session, "stepper", None)
    if st is None or st.done is None:
        return None
    p, q = ctx.pair()
    lanes = {"spec": [st.start, *st.rounds, st.done]}
    settings = record.settings_of(st.settings.prompt, st.config)
    return record.make("step", settings, lanes, session.pieces.tok, record.environment(p, q, settings))
