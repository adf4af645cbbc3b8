"""The app as a client sees it: launched on 127.0.0.1 with the tiny pair, driven through gradio_client."""

from __future__ import annotations

import re

import httpx
import pytest
from conftest import served_app

gr = pytest.importorskip("gradio")
from gradio_client import Client  # noqa: E402

from specviz.limits import Limits  # noqa: E402
from specviz.ui import build_demo  # noqa: E402
from specviz.ui.common import UIContext  # noqa: E402

# (prompt, gamma, temperature, top_k, top_p, max_new_tokens, seed): with the tiny pair this run has
# accepted, rejected, resampled and bonus tokens all at once
RICH = ("hello world", 4, 1.0, 0, 1.0, 64, 1)
KINDS = ("tok-accepted", "tok-rejected", "tok-resampled", "tok-bonus")
# outputs of /race, in order
ECHO, AR, SPEC, AR_STATS, SPEC_STATS, MESSAGE = range(6)


@pytest.fixture(scope="module")
def app_url(tiny_pair):
    yield from served_app(tiny_pair, Limits(max_prompt_tokens=40, max_new_tokens=64))


@pytest.fixture(scope="module")
def client(app_url):
    return Client(app_url, verbose=False)


def _race(client, *args):
    job = client.submit(*args, api_name="/race")
    final = job.result(timeout=120)
    return job.outputs(), final


def _spans(html: str, cls: str) -> int:
    return len(re.findall(rf'class="tok {cls}[ "]', html))


def test_race_streams_both_sides_and_numbers_add_up(client):
    updates, final = _race(client, *RICH)
    assert len(updates) > 1, "the race should stream several updates, not one answer at the end"
    ar, spec = final[AR], final[SPEC]
    assert 'data-state="done"' in ar and 'data-state="done"' in spec
    for cls in KINDS:
        assert _spans(spec, cls) > 0, f"no {cls} token in the speculative pane"
    assert _spans(ar, "tok-ar") > 0 and _spans(spec, "tok-ar") == 0
    # every output token is accepted, resampled or bonus; rejected proposals are shown but are not output
    generated = int(re.search(r"<b>(\d+)</b><span>tokens</span>", final[SPEC_STATS]).group(1))
    assert _spans(spec, "tok-accepted") + _spans(spec, "tok-resampled") + _spans(spec, "tok-bonus") == generated
    assert _spans(spec, "tok-rejected") == _spans(spec, "tok-resampled")  # each rejection is replaced
    calls = int(re.search(r"<b>(\d+)</b><span>target calls</span>", final[SPEC_STATS]).group(1))
    assert spec.count('class="sv-round ') == calls  # one round per target call
    ar_tokens = int(re.search(r"<b>(\d+)</b><span>tokens</span>", final[AR_STATS]).group(1))
    assert _spans(ar, "tok-ar") == ar_tokens
    assert "speedup" in final[SPEC_STATS] and "Done." in final[MESSAGE]
    assert "sv-error" not in final[MESSAGE]


def test_greedy_sides_agree(client):
    """At temperature 0 both sides must write the same text: speculative decoding changes only the speed."""
    _, final = _race(client, "the cat", 3, 0.0, 0, 1.0, 24, 0)
    words = re.findall(r'class="tok tok-ar[^>]*>(.*?)</span>', final[AR])
    spec_words = re.findall(r'class="tok tok-(?:accepted|resampled|bonus)[^>]*>(.*?)</span>', final[SPEC])
    assert words and words == spec_words
    assert "greedy: accepted because it equals the target&#x27;s top token" in final[SPEC]


@pytest.mark.parametrize(
    "args, expected",
    [
        (("", 4, 0.0, 0, 1.0, 16, 0), "The prompt is empty"),
        (("word " * 200, 4, 0.0, 0, 1.0, 16, 0), "The prompt is too long"),
        # temperature 0 does not excuse top-p 0: it would keep no token at all, so it is refused in every mode
        (("hello", 4, 0.0, 0, 0.0, 16, 0), "top_p must be above 0"),
        (("hello", 99, 0.0, 0, 1.0, 16, 0), "gamma must be a whole number from 1 to 16"),
        (("hello", "abc", 0.0, 0, 1.0, 16, 0), "gamma must be a whole number from 1 to 16 or"),
        (("hello", 4, 5.0, 0, 1.0, 16, 0), "temperature must be between 0 and 2"),
        (("hello", 4, 0.0, 0, 1.0, 1000, 0), "max new tokens is capped at 64"),
        (("hello", 4, 0.0, 0, 1.0, 16, None), "seed must be a number"),
        ((5, 4, 0.0, 0, 1.0, 16, 0), "The prompt must be text"),
    ],
)
def test_bad_input_gives_one_sentence_and_the_app_keeps_serving(client, args, expected):
    _, final = _race(client, *args)
    assert "sv-error" in final[MESSAGE] and expected in final[MESSAGE]
    assert "Traceback" not in final[MESSAGE]
    _, ok = _race(client, "hi", 2, 0.0, 0, 1.0, 8, 0)
    assert 'data-state="done"' in ok[SPEC] and "sv-error" not in ok[MESSAGE]


def test_nan_through_the_http_api(app_url):
    """gradio_client cannot send NaN (strict JSON), but a raw HTTP caller can."""
    url = app_url + "gradio_api/call/race"
    body = '{"data": ["hello", NaN, 0.0, 0, 1.0, 16, 0, "model", "constant", "none", "auto", "off", "off"]}'
    event = httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=30).json()
    stream = httpx.get(f"{url}/{event['event_id']}", timeout=120).text
    assert "gamma must be a finite number" in stream


def test_xss_prompt_is_escaped(client):
    _, final = _race(client, "<img src=x onerror=alert(1)>", 2, 0.0, 0, 1.0, 4, 0)
    assert "&lt;img src=x onerror=alert(1)&gt;" in final[ECHO]
    assert "<img" not in "".join(str(x) for x in final[:6])


def test_sweep_returns_a_plot(client):
    fig, note = client.predict("hello world", 1.0, 0, 1.0, 16, 1, api_name="/sweep")
    assert fig and "plotly" in str(fig).lower()
    assert "measured" in str(fig) and "theory" in str(fig)
    assert "Sweep done." in note and "were kept (α)" in note and "sv-error" not in note


def test_model_load_failure_and_oom_are_one_sentence(tiny_pair, monkeypatch):
    """Handler level (no server): a missing default draft, then the server running out of memory."""
    import torch

    from specviz.request import RunRequest
    from specviz.ui.race_run import race_page
    from specviz.ui.sweep import sweep_stream

    ctx = UIContext(device="cpu")
    ctx.default_target, ctx.default_draft = tiny_pair[0], tiny_pair[0] + "-missing"
    final = list(race_page(ctx, {"prompt": "hello", "gamma": 2, "max_new_tokens": 8}))[-1]
    assert "sv-error" in final[MESSAGE] and "does not exist" in final[MESSAGE]

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    ctx.default_draft = tiny_pair[1]
    monkeypatch.setattr(ctx, "pair", oom)
    final = list(race_page(ctx, {"prompt": "hello", "gamma": 2, "max_new_tokens": 8}))[-1]
    assert "ran out of memory" in final[MESSAGE] and "GiB" not in final[MESSAGE]
    _, note = list(sweep_stream(ctx, "hello", RunRequest(drafter="model", max_new_tokens=8)))[-1]
    assert "ran out of memory" in note


SPEC2, SPEC2_STATS = 10, 11  # the third lane's pane and stats, after the four original figures


def test_three_lanes_race_on_one_clock_with_lookup_marks(client):
    """Plain, lookup+model with auto gamma, and lookup alone: three panes, each with its own numbers."""
    prompt = "hello world"  # the tiny target then repeats itself: prompt lookup has matches to propose
    _, final = _race(client, prompt, 4, 0.0, 0, 1.0, 40, 0, "lookup+model", "auto", "lookup", "constant")
    assert "Done." in final[MESSAGE] and "sv-error" not in final[MESSAGE]
    spec, spec2 = final[SPEC], final[SPEC2]
    assert "Speculative (lookup+model, auto" in spec and "Speculative (lookup, gamma 4, tree auto)" in spec2
    assert 'data-state="done"' in spec2 and "speedup" in final[SPEC2_STATS]
    assert 'src-lookup"' in spec and 'src-lookup"' in spec2  # free guesses are marked where they were used
    assert "proposed by prompt lookup" in spec2
    words = re.findall(r'class="tok tok-ar[^>]*>(.*?)</span>', final[AR])
    for pane in (spec, spec2):  # greedy: every lane writes the same text
        kept = re.findall(r'class="tok tok-(?:accepted|resampled|bonus|plain)[^>]*>(.*?)</span>', pane)
        assert kept == words
    _, two = _race(client, prompt, 3, 0.0, 0, 1.0, 16, 0)  # the old seven inputs: two lanes, no third pane
    assert two[SPEC2] == "" and "Done." in two[MESSAGE]


@pytest.mark.parametrize(
    "extra, expected",
    [
        (("magic", "constant"), "drafter must be one of"),
        (("model", "sometimes"), "gamma policy must be one of"),
        (("model", "constant", "psychic", "auto"), "the third lane&#x27;s drafter must be one of"),
    ],
)
def test_bad_drafter_or_policy_is_one_sentence(client, extra, expected):
    _, final = _race(client, "hello", 3, 0.0, 0, 1.0, 8, 0, *extra)
    assert "sv-error" in final[MESSAGE] and expected in final[MESSAGE]


def test_a_race_with_token_trees_keeps_the_text_and_marks_branches(client):
    _, final = _race(client, "once upon a time", 3, 0.0, 0, 1.0, 40, 0, "model", "constant", "none", "auto", "8", "off")
    ar, spec = final[AR], final[SPEC]

    def words(pane: str) -> str:
        return "".join(
            re.findall(r'class="tok (?:tok-ar|tok-accepted|tok-resampled|tok-bonus)[^"]*"[^>]*>([^<]*)<', pane)
        )

    assert words(spec) == words(ar)  # greedy: the same text, token for token
    assert "tree 8" in spec and "tok-branch" in spec  # the lane names its tree; kept runner-ups are marked
    _, final = _race(client, "hi", 3, 0.0, 0, 1.0, 8, 0, "head", "constant", "none", "auto", "8", "off")
    assert "grow from the draft model or prompt lookup" in final[MESSAGE]


def test_the_queue_polls_every_50_ms_not_every_millisecond(tiny_pair):
    """gradio's queue, off Windows, looks for an event every 1 ms when none waits and for progress every 10 ms; the
    app's polls at QUEUE_POLL_S and PROGRESS_POLL_S (on two cores each wake-up takes a core from a model call's
    threads). Slower polling is left as it is, and a demo without a queue is left alone; the races above stream
    through this queue."""
    from specviz.ui import PROGRESS_POLL_S, QUEUE_POLL_S, calm_queue

    target, draft = tiny_pair
    ctx = UIContext(limits=Limits(max_prompt_tokens=40, max_new_tokens=64), device="cpu")
    ctx.default_target, ctx.default_draft = target, draft
    demo = build_demo(ctx)
    assert (demo._queue.sleep_when_free, demo._queue.progress_update_sleep_when_free) == (QUEUE_POLL_S, PROGRESS_POLL_S)
    assert demo.preloader.wait(120) == "ready"
    with gr.Blocks() as other:
        gr.Markdown("x")
    calm_queue(other)  # no queue: nothing to change
    other.queue()
    other._queue.sleep_when_free, other._queue.progress_update_sleep_when_free = 0.001, 0.5
    calm_queue(other)
    assert (other._queue.sleep_when_free, other._queue.progress_update_sleep_when_free) == (QUEUE_POLL_S, 0.5)


def test_history_endpoint_adds_each_finished_race_once_per_session(app_url):
    """/race, then /history: the race's point per lane at its gamma and temperature; asking again adds nothing;
    /clear_history empties it; another client (another visitor) has its own."""
    c = Client(app_url, verbose=False)
    c.predict(api_name="/clear_history")
    for t in (0.0, 1.0):
        _race(c, "the cat", 3, t, 0, 1.0, 8, 0, "model", "constant")
        _, points = c.predict(api_name="/history")
    _, again = c.predict(api_name="/history")
    assert again == points and [(p["lane"], p["gamma"], p["temperature"]) for p in points] == [
        ("spec", 3, 0.0),
        ("spec", 3, 1.0),
    ]
    assert all(0 <= p["acceptance"] <= 1 and p["speedup"] > 0 for p in points)
    assert Client(app_url, verbose=False).predict(api_name="/history")[1] == []
    assert c.predict(api_name="/clear_history")[1] == []


def test_temperature_sweep_returns_a_point_per_temperature_for_both_lanes(client):
    """/temperature_sweep: plain and speculative at each temperature; the table has one row per temperature and its
    note says why acceptance falls. (prompt, gamma, top_k, top_p, max_new_tokens, seed, drafter, policy, tree)"""
    from specviz.ui.temperature import SWEEP_TEMPERATURES

    job = client.submit("hello world", 3, 0, 1.0, 12, 1, "model", "constant", "off", api_name="/temperature_sweep")
    fig, note, rows = job.result(timeout=180)
    assert "sv-error" not in note and "done" in note and f"to {SWEEP_TEMPERATURES[-1]:g}, α" in note
    assert [r["temperature"] for r in rows] == list(SWEEP_TEMPERATURES)
    assert all(0 <= r["acceptance"] <= 1 and r["speedup"] > 0 and r["tokens"] > 0 for r in rows)
    traces = fig["plot"] if isinstance(fig, dict) and "plot" in fig else str(fig)
    assert "Speedup over plain decoding" in str(traces)
    bad = client.submit("hello world", 3, 0, 1.0, 12, 1, "nonsense", api_name="/temperature_sweep").result(timeout=60)
    assert "sv-error" in bad[1] and "drafter must be one of" in bad[1]
