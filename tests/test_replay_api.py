"""The recording endpoints through gradio_client: record a race, export a recording as HTML, open and play one."""

from __future__ import annotations

from pathlib import Path

import pytest
from gradio_client import Client, handle_file

from specviz.config import DEFAULT_DRAFTER
from specviz.events import Start
from specviz.limits import Limits
from specviz.recording.record import loads, shipped
from specviz.ui import build_demo, serve_locally
from specviz.ui.common import UIContext
from specviz.ui.inputs import PAGE
from specviz.ui.race_run import race_page
from specviz.ui.replay import race_recording


@pytest.fixture(scope="module")
def client(tiny_pair):
    ctx = UIContext(limits=Limits(max_new_tokens=32), device="cpu")
    ctx.default_target, ctx.default_draft = tiny_pair
    demo = build_demo(ctx)
    yield Client(serve_locally(demo), verbose=False)
    demo.close()


def test_record_a_race_then_export_and_open_it(client, tmp_path):
    text = client.predict("the cat sat", 3, 0.0, 0, 1.0, 20, 0, api_name="/record_race")
    rec = loads(text)
    assert rec.kind == "race" and rec.done("ar").token_ids == rec.done("spec").token_ids
    path = tmp_path / "race.json"
    path.write_text(text)
    button, note = client.predict(None, handle_file(str(path)), api_name="/replay_html")
    page = Path(button["value"] if isinstance(button, dict) else button).read_text()
    assert page.startswith("<!doctype html>") and "Plotly" in page and note == ""
    banner = client.predict(None, handle_file(str(path)), api_name="/replay_open")[0]
    assert "Replay of a recording" in banner


def _spec_start(rec):
    return next(ev for ev in rec.lanes["spec"] if isinstance(ev, Start))


def test_a_recorded_race_names_the_settings_that_ran(client):
    """/record_race runs with the page's defaults (lookup+model, gamma and tree auto) for what it is not given: the file's
    settings are the request that ran, whole (RunRequest.settings), not SpecConfig's defaults (model, constant)."""
    rec = loads(client.predict("the cat sat on the mat", 3, 0.0, 0, 1.0, 16, 0, api_name="/record_race"))
    start = _spec_start(rec)
    assert (start.drafter, start.gamma_policy, start.gamma, start.tree) == (DEFAULT_DRAFTER, "auto", 3, "auto")
    assert rec.settings == PAGE.replace(gamma=3, max_new_tokens=16).settings("the cat sat on the mat")
    s = rec.settings  # and what the engine says it ran agrees with the file, field by field
    assert (s["drafter"], s["gamma_policy"], s["gamma"], s["temperature"]) == (
        start.drafter,
        start.gamma_policy,
        start.gamma,
        start.temperature,
    )
    assert (s["tree"], s["max_new_tokens"], s["seed"]) == ("auto", 16, 0)
    assert len(rec.done("spec").token_ids) <= 16 and rec.done("spec").token_ids == rec.done("ar").token_ids


def test_a_page_race_records_each_lane_as_it_ran(tiny_pair):
    ctx = UIContext(limits=Limits(max_new_tokens=32), device="cpu")
    ctx.default_target, ctx.default_draft = tiny_pair
    values = dict(
        prompt="the cat sat",
        gamma=4,
        max_new_tokens=12,
        drafter="lookup",
        gamma_policy="heuristic",
        drafter2="model",
        policy2="constant",
    )
    stream = race_page(ctx, values)
    while True:
        try:
            next(stream)
        except StopIteration as stop:
            view = stop.value
            break
    rec = race_recording(ctx, view)
    start = _spec_start(rec)
    assert (start.drafter, start.gamma_policy, start.gamma) == ("lookup", "heuristic", 4)
    s = rec.settings
    assert (s["drafter"], s["gamma_policy"], s["gamma"], s["max_new_tokens"]) == ("lookup", "heuristic", 4, 12)
    lane3 = next(ev for ev in rec.lanes["spec2"] if isinstance(ev, Start))
    assert (lane3.drafter, lane3.gamma_policy) == ("model", "constant") and s["lane3"] == view.labels["spec2"]


def test_a_bad_request_gets_one_sentence(client):
    with pytest.raises(Exception, match="capped at 32"):
        client.predict("the cat sat", 3, 0.0, 0, 1.0, 10_000, 0, api_name="/record_race")


@pytest.mark.skipif(not shipped(), reason="no shipped recordings")
def test_a_shipped_recording_opens_with_no_model(client):
    name = next(iter(shipped()))
    banner, settings, lanes, note, *_ = client.predict(name, None, api_name="/replay_open")
    assert "recorded on" in banner and "sv-pane" in lanes and "Choose a recording" in note
