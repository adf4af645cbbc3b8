"""One long-lived thread for all of the app's model compute.

Why: on the CPU, torch runs its matrix products through MKL on GNU OpenMP (libgomp). Every thread that runs a
parallel region keeps a team of OpenMP worker threads for as long as it lives, and once the live teams hold more
threads than the machine has CPUs, libgomp stops letting idle workers spin: each small product then pays for
waking them. A web server answers from a pool of threads, so without this module every model call of the app
ran in that slow state: a small product costs about twice as much once a second live thread has used torch, and
a verify call of the built-in target enough more to turn a speedup into a slowdown. A thread that has ended frees its team, so short-lived threads (model loads) are
harmless; the pool's threads live on.

So the app runs every model call on one thread: `call(fn, ...)` runs fn there and returns its result;
`iterate(gen)` advances a generator there one item at a time, so two visitors' runs interleave event by event
(as two runs on one 2-core machine would share it anyway) and a request's own time limit is checked between
events. Called from that thread itself, both run inline. The library API (`generate`, `stream`, ...) and the
CLI run on their caller's thread and do not use this.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
NAME = "specviz-compute"

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_thread: threading.Thread | None = None


def _executor() -> ThreadPoolExecutor:
    """The one worker (made on first use: nothing starts at import)."""
    global _pool, _thread
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(1, thread_name_prefix=NAME)
            _thread = _pool.submit(threading.current_thread).result()
        return _pool


def on_compute_thread() -> bool:
    return _thread is not None and threading.current_thread() is _thread


def call(fn: Callable[..., T], *args, **kwargs) -> T:
    """fn(*args, **kwargs) on the compute thread; its exceptions are raised here."""
    pool = _executor()
    if on_compute_thread():
        return fn(*args, **kwargs)
    return pool.submit(fn, *args, **kwargs).result()


_DONE = object()


def _next(items: Iterator[T]):
    """next(items), or (_DONE, its return value) when it is exhausted (StopIteration cannot cross a Future)."""
    try:
        return next(items)
    except StopIteration as stop:
        return _DONE, stop.value


def iterate(items: Iterator[T]) -> Generator[T, None, object]:
    """The items of `items`, each produced on the compute thread; returns what `items` returned. Closing this
    generator closes `items` there too."""
    try:
        while True:
            item = call(_next, items)
            if type(item) is tuple and len(item) == 2 and item[0] is _DONE:
                return item[1]
            yield item
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            call(close)
