"""The recording endpoints through gradio_client: record a race, export a recording as HTML, open and play one."""

from __future__ import annotations

from pathlib import Path

import pytest
from gradio_client import Client, handle_file

from specviz.limits import Limits
from specviz.record import loads, shipped
from specviz.ui import build_demo, serve_locally
from specviz.ui.common import UIContext


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


def test_a_bad_request_gets_one_sentence(client):
    with pytest.raises(Exception, match="capped at 32"):
        client.predict("the cat sat", 3, 0.0, 0, 1.0, 10_000, 0, api_name="/record_race")


@pytest.mark.skipif(not shipped(), reason="no shipped recordings")
def test_a_shipped_recording_opens_with_no_model(client):
    name = next(iter(shipped()))
    banner, settings, lanes, note, *_ = client.predict(name, None, api_name="/replay_open")
    assert "recorded on" in banner and "sv-pane" in lanes and "Choose a recording" in note
