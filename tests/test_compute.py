"""specviz.host.compute: the app's model calls all run on one long-lived thread (see the module for why)."""

from __future__ import annotations

import threading

import pytest
from gradio_client import Client

from specviz.backends.local import CachedModel
from specviz.host import compute
from specviz.limits import Limits
from specviz.ui import build_demo, serve_locally
from specviz.ui.common import UIContext


def test_call_runs_on_one_thread_raises_its_errors_and_runs_inline_when_nested():
    names = {compute.call(lambda: threading.current_thread().name) for _ in range(5)}
    assert len(names) == 1 and next(iter(names)).startswith(compute.NAME)
    assert threading.current_thread().name not in names
    with pytest.raises(ValueError, match="boom"):
        compute.call(lambda: (_ for _ in ()).throw(ValueError("boom")))
    assert compute.call(lambda: compute.call(lambda: compute.on_compute_thread())) is True  # no deadlock


def test_iterate_yields_from_the_compute_thread_keeps_the_return_value_and_closes():
    closed = []

    def gen():
        try:
            for i in range(3):
                yield i, threading.current_thread().name
            return "done"
        finally:
            closed.append(threading.current_thread().name)

    def drive():
        return (yield from compute.iterate(gen()))

    outer = drive()
    items = []
    try:
        while True:
            items.append(next(outer))
    except StopIteration as stop:
        assert stop.value == "done"
    assert [i for i, _ in items] == [0, 1, 2]
    assert {name for _, name in items} == {compute.call(lambda: threading.current_thread().name)}
    assert closed and closed[0].startswith(compute.NAME)

    early = compute.iterate(gen())  # a visitor who cancels: closing the wrapper closes the run, there
    next(early)
    early.close()
    assert len(closed) == 2 and closed[1].startswith(compute.NAME)


def test_every_model_call_of_the_app_runs_on_the_compute_thread(tiny_pair, monkeypatch):
    """Race, sweep, step-through, exactness, forward times and the pair check, through the page's API: each model
    forward call is made on the one compute thread, none on the server's worker threads."""
    threads: set[str] = set()
    feed, prefill = CachedModel.feed, CachedModel.prefill

    def feed_here(self, *a, **kw):
        threads.add(threading.current_thread().name)
        return feed(self, *a, **kw)

    def prefill_here(self, *a, **kw):
        threads.add(threading.current_thread().name)
        return prefill(self, *a, **kw)

    monkeypatch.setattr(CachedModel, "feed", feed_here)
    monkeypatch.setattr(CachedModel, "prefill", prefill_here)
    ctx = UIContext(limits=Limits(max_new_tokens=16), device="cpu")
    ctx.default_target, ctx.default_draft = tiny_pair
    demo = build_demo(ctx)
    try:
        c = Client(serve_locally(demo), verbose=False)
        prompt = "Tell me about gravity."
        c.predict(prompt, 2, 0.0, 0, 1.0, 8, 0, api_name="/race")
        c.predict(prompt, 0.0, 0, 1.0, 8, 0, api_name="/sweep")
        c.predict(prompt, 2, 0.0, 0, api_name="/step")
        c.predict(prompt, 2, 0.0, 0, api_name="/step")
        c.predict(prompt, 2, 1.0, 0, 300, 1, api_name="/exactness")
        c.predict(prompt, 2, api_name="/forward_times")
        html, _, numbers = c.predict("", "", 8, api_name="/check")
        assert numbers["acceptance"] is not None, html
    finally:
        demo.close()
    assert len(threads) == 1 and next(iter(threads)).startswith(compute.NAME), threads
