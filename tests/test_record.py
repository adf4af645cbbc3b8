"""Recordings: a run kept as data. Round trips, the replay's order, the CLI, and hostile files (one sentence each)."""

import json

import pytest

from specviz import SamplingConfig, load_recording, record_run
from specviz.__main__ import main
from specviz.engine.loop import autoregressive_decode, race, speculative_decode
from specviz.events import Done, Round, Start, Step
from specviz.recording.export import html_page, play_all
from specviz.recording.record import (
    MAX_BYTES,
    Recording,
    RecordingError,
    environment,
    loads,
    make,
    rounds_of,
    timeline,
    to_json,
)
from specviz.request import RunRequest

HOSTILE = "<script>alert(1)</script>"


@pytest.fixture(scope="module")
def raced(loaded_pair):
    """A greedy race on the tiny pair: (the merged (side, event) stream, its recording)."""
    p, q = loaded_pair
    ids = p.tokenizer("the cat sat on the mat")["input_ids"]
    cfg = RunRequest(drafter="model", gamma=4, tree="off", max_new_tokens=40).spec
    merged = list(race(autoregressive_decode(p, ids, cfg), speculative_decode(p, q, ids, cfg)))
    lanes = {side: [e for s, e in merged if s == side] for side in ("ar", "spec")}
    rec = make("race", {"prompt": "the cat sat on the mat", "gamma": 4}, lanes, p.tokenizer, environment(p, q))
    return merged, rec


def test_a_recording_survives_json_and_its_replay_reproduces_the_race(raced):
    merged, rec = raced
    back = loads(rec.dumps())
    assert back.to_dict() == rec.to_dict()
    assert [(lane, to_json(ev)) for _, lane, ev in timeline(back)] == [(s, to_json(e)) for s, e in merged]
    times = [t for t, _, _ in timeline(back)]
    assert all(t > 0 for t in times) and max(times) == pytest.approx(max(d.stats["wall_s"] for d in _dones(back)))
    # round by round: each step shows exactly one Round or Step, and together they are the whole run
    steps = rounds_of(back)
    assert all(sum(isinstance(e, (Round, Step)) for _, _, e in s) == 1 for s in steps)
    assert sum(len(s) for s in steps) == len(merged)
    r = back.result("spec")
    assert r.token_ids == back.done("ar").token_ids and r.text == back.texts["spec"] and r.text


def _dones(rec: Recording):
    return [rec.done(lane) for lane in rec.lanes]


def test_greedy_draws_are_kept_as_nan(raced):
    _, rec = raced
    rd = next(e for e in loads(rec.dumps()).lanes["spec"] if isinstance(e, Round))
    assert all(r != r for r in rd.r)  # NaN: greedy rounds draw nothing; JSON null on the way


def test_the_export_carries_the_tokens_numbers_and_charts_offline(raced):
    _, rec = raced
    page = html_page(rec)
    views = play_all(rec)
    assert views["spec"].pane() in page and views["spec"].stats(views["ar"]) in page
    for cls in ("tok-accepted", "tok-rejected", "tok-resampled", "tok-bonus", "tok-ar"):
        assert f'class="tok {cls}' in page
    assert "speedup (tokens/s vs plain)" in page and page.count('class="plotly-graph-div"') == 4
    assert "<script src" not in page and "<link" not in page  # plotly is inlined (tests/test_browser_replay.py)


def _hostile(rec: Recording) -> Recording:
    data = rec.to_dict()
    first = next(iter(data["tokens"]))
    data["tokens"][first] = HOSTILE
    data["settings"]["prompt"] = "<img src=x onerror=alert(1)>"
    data["env"]["target"] = HOSTILE
    data["texts"]["spec"] = HOSTILE
    data["lanes"]["x<b>y"] = data["lanes"]["spec"]
    return loads(json.dumps(data))


def test_every_string_a_recording_carries_is_escaped(raced):
    page = html_page(_hostile(raced[1]))
    assert HOSTILE not in page and "<img src=x" not in page and "x<b>y" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "&lt;img src=x onerror=alert(1)&gt;" in page


def _mutate(rec: Recording, fn) -> str:
    data = rec.to_dict()
    fn(data)
    return json.dumps(data)


def _round(d):
    return next(e for e in d["lanes"]["spec"] if e["type"] == "Round")


BAD = {
    "not json": lambda rec: "{not json",
    "not an object": lambda rec: "[1, 2, 3]",
    "another format": lambda rec: _mutate(rec, lambda d: d.update(format="something-else")),
    "a newer version": lambda rec: _mutate(rec, lambda d: d.update(version=99)),
    "no lanes": lambda rec: _mutate(rec, lambda d: d.pop("lanes")),
    "unknown kind": lambda rec: _mutate(rec, lambda d: d.update(kind="<script>")),
    "a string for a list": lambda rec: _mutate(rec, lambda d: _round(d).update(drafted="1,2,3")),
    "a float for a token": lambda rec: _mutate(rec, lambda d: _round(d).update(correction=1.5)),
    "a bool for a number": lambda rec: _mutate(rec, lambda d: _round(d).update(n=True)),
    "an unknown event": lambda rec: _mutate(rec, lambda d: d["lanes"]["spec"].insert(1, {"type": "Exec"})),
    "an extra field": lambda rec: _mutate(rec, lambda d: _round(d).update(onload="alert(1)")),
    "a missing field": lambda rec: _mutate(rec, lambda d: _round(d).pop("kind")),
    "a bad literal": lambda rec: _mutate(rec, lambda d: _round(d).update(kind="<img>")),
    "a token key that is no id": lambda rec: _mutate(rec, lambda d: d["tokens"].update({"<b>": "x"})),
    "a lane without Done": lambda rec: _mutate(rec, lambda d: d["lanes"]["spec"].pop()),
    "NaN as a bare constant": lambda rec: rec.dumps().replace('"gamma":', '"gamma":NaN,"x":', 1),
    "a nested object in settings": lambda rec: _mutate(rec, lambda d: d["settings"].update(x={"a": 1})),
    "deep nesting": lambda rec: "[" * 100_000 + "]" * 100_000,
    "too large": lambda rec: " " * (MAX_BYTES + 1),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_malformed_recording_gets_one_sentence(raced, case):
    with pytest.raises(RecordingError) as err:
        loads(BAD[case](raced[1]))
    text = str(err.value)
    assert text.endswith(".") and "\n" not in text and len(text) < 200 and "Traceback" not in text
    assert "<" not in text or "recording" in text  # the sentence is ours, and the page escapes it anyway


def test_record_run_and_the_cli_record_then_replay(tiny_pair, tmp_path, capsys):
    t, d = tiny_pair
    rec = record_run("hello", ("spec",), target=t, draft=d, device="cpu", max_new_tokens=8, temperature=1.0, seed=3)
    assert rec.kind == "run" and list(rec.lanes) == ["spec"] and rec.settings["temperature"] == 1.0
    assert isinstance(rec.lanes["spec"][0], Start) and isinstance(rec.lanes["spec"][-1], Done)
    path, page = tmp_path / "run.json", tmp_path / "run.html"
    argv = ["generate", "hello world", "--target", t, "--draft", d, "--device", "cpu", "--max-new-tokens", "12"]
    assert main([*argv, "--compare", "--record", str(path)]) == 0
    shown = capsys.readouterr().out
    rec = load_recording(path)
    assert rec.kind == "race" and set(rec.lanes) == {"ar", "spec"} and rec.texts["spec"] in shown
    assert main(["replay", str(path), "--html", str(page), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["lanes"]["spec"]["text"] == rec.texts["spec"] and out["kind"] == "race"
    assert page.read_text().count('<div class="sv-pane sv-pane-') == 2
    (tmp_path / "bad.json").write_text('{"format": "specviz-recording"}')
    assert main(["replay", str(tmp_path / "bad.json")]) == 2
    assert capsys.readouterr().err.startswith("error: This is not a valid specviz recording")


def test_recording_a_lossy_run_needs_allow_lossy(tiny_pair):
    from specviz import SpecvizError

    with pytest.raises(SpecvizError, match="allow_lossy"):
        record_run("hi", ("spec",), target=tiny_pair[0], draft=tiny_pair[1], device="cpu", relaxed_w=0.5)


def test_sampling_settings_are_recorded(tiny_pair):
    rec = record_run("hi", ("ar",), target=tiny_pair[0], draft=tiny_pair[1], device="cpu", max_new_tokens=4)
    assert rec.settings | {"prompt": "hi"} == rec.settings and rec.settings["max_new_tokens"] == 4
    assert SamplingConfig().temperature == rec.settings["temperature"]


def test_a_step_session_and_a_sweep_are_recorded_and_export(tiny_pair):
    from specviz.limits import Limits
    from specviz.request import RunRequest
    from specviz.teach.compute import Stepper, StepSettings
    from specviz.ui.common import UIContext
    from specviz.ui.replay import step_recording, sweep_recording
    from specviz.ui.step import Session
    from specviz.ui.sweep import sweep_stream
    from specviz.view.render import Pieces

    ctx = UIContext(limits=Limits(max_new_tokens=16, max_sweep=3), device="cpu")
    ctx.default_target, ctx.default_draft = tiny_pair
    p, q = ctx.pair()
    st = Stepper(p, q, p.tokenizer("the cat")["input_ids"], StepSettings("the cat", 3, 1.0, 2, 12, relaxed_w=0.5))
    session = Session(st, Pieces(p.tokenizer))
    assert step_recording(ctx, session) is None  # not finished yet
    while st.advance() is not None:
        pass
    rec = loads(step_recording(ctx, session).dumps())
    assert rec.kind == "step" and rec.settings["relaxed_w"] == 0.5 and rec.lanes["spec"][1].candidates
    assert "Relaxed verification (not exact)" in html_page(rec)  # a lossy run is labelled wherever it is shown
    gen = sweep_stream(ctx, "the cat", RunRequest(drafter="model", max_new_tokens=12))
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            result = stop.value
            break
    rec = loads(sweep_recording(ctx, result).dumps())
    assert rec.settings == result["request"].settings("the cat") | {"gamma": None}
    assert list(rec.lanes) == ["ar", "gamma = 1", "gamma = 2", "gamma = 3"] and len(rec.extra["sweep"]) == 3
    page = html_page(rec)
    assert page.count('class="plotly-graph-div"') == 1 and page.count('<div class="sv-pane sv-pane-spec"') == 3
