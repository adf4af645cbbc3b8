"""Keeping a long-running server's memory flat, and showing the operator that it is.

A public Space runs for days. Gradio serves each request from a pool of worker threads, and glibc's malloc
gives every thread that allocates an arena of its own (up to 8 per core): memory freed in one arena is not
reused by a request that lands in another, and freed pages in the middle of a heap stay resident. The
process's RSS then creeps up although nothing is leaked. Two standard remedies, both glibc-only:

- `limit_arenas(n)`: mallopt(M_ARENA_MAX, n), the in-process form of MALLOC_ARENA_MAX; call it before the
  server starts its threads (arenas already made stay).
- `trim()`: malloc_trim(0), which hands free pages of every arena back to the kernel.

`Janitor` trims every `every_s` seconds in a daemon thread and logs one line for the operator, with RSS and
Python's own count of allocated blocks (`sys.getallocatedblocks`): a Python-level leak shows as growing blocks,
allocator fragmentation as RSS growing while blocks stay flat. `scripts/soak.py` reads these lines.

Nothing here runs at import; elsewhere than glibc (macOS, musl, Windows) the functions return False.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform
import re
import sys
import threading
from functools import cache

log = logging.getLogger("specviz")

M_ARENA_MAX = -8  # from glibc's malloc.h
LINE = re.compile(r"memory: rss (?P<rss>[\d.]+) MiB, python blocks (?P<blocks>\d+)")


@cache
def _libc():
    """glibc, or None where the C library is another one."""
    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def limit_arenas(n: int) -> bool:
    """At most `n` malloc arenas for threads made from now on. True when glibc took it."""
    libc = _libc()
    return bool(libc and libc.mallopt(M_ARENA_MAX, int(n)) == 1)


def trim() -> bool:
    """Return free heap pages to the kernel. True when glibc released some."""
    libc = _libc()
    return bool(libc and libc.malloc_trim(0) == 1)


def rss_mib() -> float:
    """This process's resident set size in MiB (0.0 where /proc is missing)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return 0.0
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def report() -> str:
    """One line, in the form `LINE` parses."""
    return f"memory: rss {rss_mib():.1f} MiB, python blocks {sys.getallocatedblocks()}"


def start(arenas: int, every_s: float) -> Janitor:
    """What a server calls once before it starts its threads: limit the arenas, then trim and log regularly."""
    if not limit_arenas(arenas):
        log.info("memory: this C library takes no arena limit; the heap is not trimmed either")
    return Janitor(every_s).start()


class Janitor:
    """Trims the heap every `every_s` seconds and logs `report()`; `stop()` ends it."""

    def __init__(self, every_s: float):
        self.every_s = every_s
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="specviz-memory", daemon=True)

    def start(self) -> Janitor:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            trim()
            log.info(report())
