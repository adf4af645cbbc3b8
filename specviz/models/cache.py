"""A bounded cache of loaded models, least recently used evicted, that loads each model once.

It loads without holding its lock, so a slow load never blocks requests for models already loaded; other models'
configs, tokenizers and checks proceed meanwhile, but transformers builds one model at a time (hub._BUILD_LOCK).
models.CACHE is the app's one instance; what it holds and how a model is read are models.py's and hub.py's.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

from specviz.config import SpecvizError


class ModelCache:
    """Loaded models by (name, device, dtype, quantize), least recently used evicted past `capacity`.

    One load per key: a second caller asking for a model that is loading waits for that load. The lock guards
    the two dicts only and is never held while loading, so callers whose models are loaded never wait for
    someone else's load (loads of other models wait only for transformers' model building, `hub._BUILD_LOCK`). With a timeout the load runs in its own thread and outlives
    the caller who gave up: it lands in the cache for the next caller.
    """

    def __init__(self, capacity: int = 4):
        self.capacity = capacity
        self._items: OrderedDict[tuple, object] = OrderedDict()
        self._loading: dict[tuple, Future] = {}
        self._lock = threading.Lock()

    def get(self, key: tuple, make, timeout_s: float | None = None, what: str = "The model"):
        """The cached value for `key`, else `make()`'s (once, however many callers ask at the same time).

        timeout_s: how long this caller waits for a load; past it, one SpecvizError naming `what`.
        """
        future = self._future(key, make, background=timeout_s is not None)
        try:
            return future.result(timeout=timeout_s)
        except FutureTimeout:
            raise SpecvizError(
                f"{what} is still loading and this request reached the server's time limit; "
                "the load goes on, so try again in a minute."
            ) from None

    def start(self, key: tuple, make) -> None:
        """Start loading `key` in the background unless it is loaded or loading (a later `get` waits for it)."""
        self._future(key, make, background=True)

    def _future(self, key: tuple, make, background: bool) -> Future:
        with self._lock:
            future = self._loading.get(key)
            if future is None:
                future, owner = Future(), True
                if key in self._items:
                    self._items.move_to_end(key)
                    future.set_result(self._items[key])
                    return future
                self._loading[key] = future
            else:
                owner = False
        if owner and background:
            threading.Thread(target=self._load, args=(key, make, future), name="specviz-load", daemon=True).start()
        elif owner:
            self._load(key, make, future)
        return future

    def _load(self, key: tuple, make, future: Future) -> None:
        try:
            value = make()
        except BaseException as err:  # a failed load never poisons the cache: the next caller tries again
            with self._lock:
                self._loading.pop(key, None)
            future.set_exception(err)
            return
        with self._lock:
            self._loading.pop(key, None)
            self._items[key] = value
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)
        future.set_result(value)

    def keys(self) -> list[tuple]:
        """The keys loaded or loading."""
        with self._lock:
            return [*self._items, *self._loading]

    def loading(self) -> int:
        """Loads in flight."""
        with self._lock:
            return len(self._loading)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        return len(self._items)
