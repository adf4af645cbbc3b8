"""Per-visitor state the app keeps between clicks (the step-through's KV caches), bounded three ways.

A visitor's gr.State holds only a key; the values live here: at most `max_count` of them, together at most
`max_bytes` (each counted at its largest, given when it is added), and each freed after `idle_s` seconds without
use. Making room frees the least recently used. A freed value is closed (its `close()`, if it has one); a value
whose `busy` is true is in use and is not freed for idleness. A background thread sweeps idle values while the
store holds any; it exits when the store is empty.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from specviz.config import SpecvizError


@dataclass
class _Entry:
    value: object
    nbytes: int
    used: float  # time.monotonic() of the last use


class SessionStore:
    """Values by random key, bounded by count, bytes and idle time (see the module docstring)."""

    def __init__(self, idle_s: float, max_count: int, max_bytes: int):
        self.idle_s, self.max_count, self.max_bytes = idle_s, max_count, max_bytes
        self._items: OrderedDict[str, _Entry] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()
        self._sweeper: threading.Thread | None = None

    def add(self, value, nbytes: int) -> str:
        """Keep `value` (counted as `nbytes`), freeing the least recently used to make room; its new key."""
        if nbytes > self.max_bytes:
            raise SpecvizError(
                f"This run would hold {nbytes / 2**20:.0f} MB of caches, more than the {self.max_bytes / 2**20:.0f} MB "
                "this server keeps for all step-through visitors together; try a shorter prompt."
            )
        freed = []
        with self._lock:
            while self._items and (len(self._items) >= self.max_count or self.nbytes + nbytes > self.max_bytes):
                freed.append(self._items.popitem(last=False)[1].value)
            key = secrets.token_urlsafe(16)
            self._items[key] = _Entry(value, nbytes, time.monotonic())
            if self._sweeper is None:
                self._sweeper = threading.Thread(target=self._sweep_while_any, name="specviz-sessions", daemon=True)
                self._sweeper.start()
        _close(freed)
        return key

    def get(self, key: str | None):
        """The value for `key` (and it counts as used now), or None if there is none or it was freed."""
        with self._lock:
            entry = self._items.get(key) if isinstance(key, str) else None
            if entry is None:
                return None
            entry.used = time.monotonic()
            self._items.move_to_end(key)
            return entry.value

    def pop(self, key: str | None) -> None:
        """Free the value for `key` now (Reset, a settings change, a closed tab)."""
        with self._lock:
            entry = self._items.pop(key, None) if isinstance(key, str) else None
        _close([entry.value] if entry else [])

    def sweep(self) -> int:
        """Free every value unused for `idle_s` seconds and not busy; how many were freed."""
        cutoff = time.monotonic() - self.idle_s
        with self._lock:
            idle = [k for k, e in self._items.items() if e.used < cutoff and not getattr(e.value, "busy", False)]
            freed = [self._items.pop(k).value for k in idle]
        _close(freed)
        return len(freed)

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self._items.values())

    def __len__(self) -> int:
        return len(self._items)

    def _sweep_while_any(self) -> None:
        every = min(max(self.idle_s / 4, 0.25), 15.0)  # frees a value at most a quarter of idle_s late
        while True:
            time.sleep(every)
            self.sweep()
            with self._lock:
                if not self._items:
                    self._sweeper = None
                    return


def _close(values: list) -> None:
    for v in values:
        close = getattr(v, "close", None)
        if close is not None:
            close()
