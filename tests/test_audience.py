"""A public Space under a real audience: a slow load blocks no one else, step-through sessions are bounded and
freed when idle, and a draft whose vocabulary cannot serve the target gets one sentence on every path.

The apps run in this process on 127.0.0.1 (gradio_client), with the tiny test pair.
"""

from __future__ import annotations

import dataclasses
import gc
import html
import json
import threading
import time
from pathlib import Path

import pytest

gr = pytest.importorskip("gradio")
from conftest import make_model, make_tokenizer, save_pair  # noqa: E402
from gradio_client import Client  # noqa: E402
from transformers import DynamicCache  # noqa: E402

import specviz  # noqa: E402
import specviz.models.cache  # noqa: E402
import specviz.models.hub  # noqa: E402
import specviz.models.loaded  # noqa: E402
from specviz.config import SpecvizError  # noqa: E402
from specviz.limits import Limits  # noqa: E402
from specviz.native.forward import LeanCache  # noqa: E402
from specviz.ui import build_demo, serve_locally  # noqa: E402
from specviz.ui.common import UIContext  # noqa: E402
from specviz.ui.sessions import SessionStore  # noqa: E402
from specviz.ui.step import Session  # noqa: E402

MESSAGE = 5  # /race's message output
LIMITS = Limits(max_new_tokens=64, max_prompt_tokens=200, max_gamma=8, max_sweep=3)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """The tiny pair, a second copy of it that loads slowly, and a draft whose vocabulary has a gap."""
    root = tmp_path_factory.mktemp("audience")
    save_pair(root, 64)
    save_pair(root / "slow" / "a", 64)
    save_pair(root / "slow" / "b", 64)
    gap = root / "gap"  # a trimmed draft whose map points at ids 60..69: the target has 64
    make_model(40, seed=0).save_pretrained(gap)
    make_tokenizer(64, chat=True).save_pretrained(gap)
    (gap / "specviz_vocab.json").write_text(json.dumps({"target_ids": [*range(30), *range(60, 70)]}))
    return root


def _serve(root: Path, draft: str = "draft", **limits):
    ctx = UIContext(limits=dataclasses.replace(LIMITS, model_dirs=(str(root),), **limits), device="cpu")
    ctx.default_target, ctx.default_draft = str(root / "target"), str(root / draft)
    demo = build_demo(ctx)
    return demo, serve_locally(demo), ctx


# --- loads ---------------------------------------------------------------------------------------

GATE_S = 60.0  # a gated load gives up waiting after this, so a failing test cannot hang the suite


@pytest.fixture(scope="module")
def slow_app(root):
    """Two requests at once; loading anything under root/slow waits until the test opens the gate (a test double),
    so "the race did not wait for the load" is shown by order, not by a clock."""
    mp = pytest.MonkeyPatch()
    real = specviz.models.hub.read_model
    loads, gate = [], threading.Event()

    def load(name, *args):
        if "/slow/" in name:
            loads.append(name)
            gate.wait(GATE_S)
        return real(name, *args)

    mp.setattr(specviz.models.hub, "read_model", load)
    mp.setattr(specviz.models.loaded, "CACHE", specviz.models.cache.ModelCache(4))
    demo, url, ctx = _serve(root, concurrency=2)
    client = Client(url, verbose=False)
    out = client.predict("warm", 2, 0.0, 0, 1.0, 4, 0, api_name="/race")  # the default pair is loaded
    assert "sv-error" not in out[MESSAGE]
    yield client, ctx, loads, gate
    gate.set()
    demo.close()
    mp.undo()


def _started(loads: list) -> None:
    t0 = time.monotonic()
    while not loads:
        assert time.monotonic() - t0 < 30, "the slow load never started"
        time.sleep(0.02)


def test_a_slow_load_does_not_hold_up_a_request_for_a_loaded_model(slow_app, root):
    client, _, loads, gate = slow_app
    loads.clear()
    gate.clear()
    target, draft = str(root / "slow" / "a" / "target"), str(root / "slow" / "a" / "draft")
    check = client.submit(target, draft, 8, api_name="/check")
    try:
        _started(loads)
        # the load is held until the race is over: a race that waited for it would never finish here
        out = client.submit("hello world", 3, 0.0, 0, 1.0, 8, 0, api_name="/race").result(timeout=GATE_S / 2)
        assert "sv-error" not in out[MESSAGE] and 'data-state="done"' in out[2]
        assert not check.done()  # the check is still loading
    finally:
        gate.set()
    verdict, _, numbers = check.result(timeout=GATE_S)
    assert "sv-error" not in verdict and numbers
    assert sorted(loads) == sorted([target, draft])  # once each


def test_a_load_past_the_time_limit_ends_the_request_and_the_next_visitor_gets_the_model(slow_app, root):
    client, ctx, loads, gate = slow_app
    old, ctx.limits = ctx.limits, dataclasses.replace(ctx.limits, request_timeout_s=1)
    loads.clear()
    gate.clear()
    target, draft = str(root / "slow" / "b" / "target"), str(root / "slow" / "b" / "draft")
    try:
        # the load is held past the 1-second limit: a request that waited for it would not answer before the gate
        verdict, _, numbers = client.submit(target, draft, 8, api_name="/check").result(timeout=GATE_S / 2)
        assert "sv-error" in verdict and "still loading" in verdict and numbers is None
    finally:
        ctx.limits = old
        gate.set()
    verdict, _, numbers = client.predict(target, draft, 8, api_name="/check")  # the loads go on in the background
    assert "sv-error" not in verdict and numbers, verdict
    assert sorted(loads) == sorted([target, draft])  # the second visitor did not load them again


# --- step-through sessions -----------------------------------------------------------------------


def _held() -> tuple[int, int]:
    """(step-through sessions alive, bytes in all live KV caches) in this process."""
    gc.collect()
    sessions = kv = 0
    for obj in gc.get_objects():
        if isinstance(obj, Session):
            sessions += 1
        elif isinstance(obj, DynamicCache):
            kv += sum(t.numel() * t.element_size() for x in obj.layers for t in (x.keys, x.values) if t is not None)
        elif isinstance(obj, LeanCache):  # the lean forward's (specviz/native/forward.py)
            kv += obj.k.numel() * obj.k.element_size() + obj.v.numel() * obj.v.element_size()
    return sessions, kv


IDLE_S = 3


@pytest.mark.full  # waits out the idle limit: the full tier
def test_sixty_abandoned_step_sessions_are_freed_after_the_idle_limit(root):
    """A class opens the tab, clicks once and leaves (one click takes ~0.2 s here, so the earliest runs are already
    freed while the last are opened): the sessions pile up, then all are freed, and a returning visitor is told."""
    demo, url, ctx = _serve(root, session_idle_s=IDLE_S)
    try:
        first = Client(url, verbose=False)
        baseline = _held()
        say, *_ = first.predict("hello world", 3, 0.0, 0, api_name="/step")
        assert "Round 1." in say
        others = Client(url, verbose=False)
        peak = (0, 0)
        for i in range(59):
            others.reset_session()  # a new visitor
            say, *_ = others.predict(f"student {i}", 1 + i % 4, [0.0, 1.0][i % 2], i, api_name="/step")
            assert "Round 1." in say, say
            if i % 10 == 9:
                peak = max(peak, _held())
        last = time.monotonic()
        assert peak[0] >= 6 and peak[1] > baseline[1], (peak, baseline)  # they pile up
        time.sleep(max(0.0, IDLE_S * 1.25 + 0.5 - (time.monotonic() - last)))  # the limit, plus the sweep's lag
        after = _held()
        print(f"step sessions: at most {peak[0]} alive, {peak[1] / 1e3:.0f} kB of KV caches; after: {after}")
        # every session freed, the first one too (it was idle as well); relative to the baseline, because another
        # test module's app may still hold a session of its own in this process
        assert after == baseline, (after, baseline)
        say, text, *_ = first.predict("hello world", 3, 0.0, 0, api_name="/step")  # the first visitor returns
        assert "sv-error" not in say and "Round 1." in say and "Your earlier run was freed" in say
        say, *_ = first.predict("hello world", 3, 0.0, 0, api_name="/step")
        assert "Round 2." in say and "freed" not in say
    finally:
        demo.close()


class Run:
    def __init__(self):
        self.closed, self.busy = 0, False

    def close(self):
        self.closed += 1


def test_the_session_store_is_bounded_by_count_and_bytes_least_recently_used_first():
    store = SessionStore(idle_s=60, max_count=3, max_bytes=100)
    runs = [Run() for _ in range(5)]
    keys = [store.add(runs[i], 10) for i in range(3)]
    assert store.get(keys[0]) is runs[0]  # used: now the most recent
    k3 = store.add(runs[3], 10)  # count: frees the least recently used, runs[1]
    assert runs[1].closed == 1 and store.get(keys[1]) is None and len(store) == 3
    store.add(runs[4], 81)  # count frees runs[2]; then bytes, 20 + 81 > 100, free runs[0]
    assert runs[2].closed == runs[0].closed == 1 and store.get(k3) is runs[3] and store.nbytes == 91
    with pytest.raises(SpecvizError, match="more than the 0 MB this server keeps"):
        store.add(Run(), 101)
    store.pop(k3)
    store.pop(k3)  # twice, or an unknown key, or None: nothing happens
    store.pop(None)
    assert runs[3].closed == 1 and len(store) == 1


def test_idle_sessions_are_freed_unless_busy_and_the_sweeper_stops_when_empty():
    store = SessionStore(idle_s=0.4, max_count=10, max_bytes=10**6)
    idle, busy, used = Run(), Run(), Run()
    busy.busy = True
    k_idle, k_busy, k_used = (store.add(r, 1) for r in (idle, busy, used))
    for _ in range(6):
        time.sleep(0.1)
        assert store.get(k_used) is used  # clicked again and again
    assert idle.closed == 1 and store.get(k_idle) is None  # freed by the background sweep
    assert busy.closed == 0 and used.closed == 0
    busy.busy = False
    store.pop(k_used)
    time.sleep(1.0)
    assert busy.closed == 1 and len(store) == 0 and store._sweeper is None


# --- a draft that cannot serve the target --------------------------------------------------------


def test_a_vocabulary_gap_gives_the_same_sentence_on_every_path(root):
    target, gap = str(root / "target"), str(root / "gap")
    sentence = (
        f"The draft {gap} cannot serve the target {target}: "
        "its trimmed vocabulary includes token id 69 and the target has only 64 token ids."
    )
    with pytest.raises(SpecvizError) as e:  # the Python API
        specviz.generate("hello", target=target, draft=gap, device="cpu")
    assert str(e.value) == sentence
    with pytest.raises(SpecvizError) as e:
        specviz.check_pair(target, gap, device="cpu")
    assert str(e.value) == sentence
    demo, url, _ = _serve(root, draft="gap")
    try:
        c = Client(url, verbose=False)
        pages = {
            "race": c.predict("hello", 3, 1.0, 0, 1.0, 8, 0, api_name="/race")[MESSAGE],
            "sweep": c.predict("hello", 0.0, 0, 1.0, 8, 0, api_name="/sweep")[1],
            "step": c.predict("hello", 3, 0.0, 0, api_name="/step")[0],
            "exactness": c.predict("hello", 3, 1.0, 0, 300, 1, api_name="/exactness")[0],
            "forward times": c.predict("hello", 3, api_name="/forward_times")[0],
            "check": c.predict("", "", 8, api_name="/check")[0],
        }
    finally:
        demo.close()
    for path, page in pages.items():
        assert 'class="sv-error"' in page and html.escape(sentence) in page, (path, page)
