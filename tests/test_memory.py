"""specviz.host.memory: the allocator housekeeping a long-running server does (arena limit, heap trim, a log line)."""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from specviz.host import memory

GLIBC = sys.platform == "linux" and platform.libc_ver()[0] == "glibc"


FRAGMENT = """
import json
from specviz.host import memory
assert memory.limit_arenas(8)  # 8 x cores is glibc's own default on 64-bit, so harmless here
# Fragment the heap: 64 KiB blocks (malloc, below the mmap threshold) each followed by a 1 KiB block that
# stays, so free() alone cannot give the big ones back (the heap's top stays in use).
big, pins = [], []
for _ in range(3000):
    big.append(bytearray(64 * 1024))
    pins.append(bytearray(1024))
held = memory.rss_mib()
del big
freed = memory.rss_mib()
trimmed_ok = memory.trim()
print(json.dumps(dict(held=held, freed=freed, trimmed=memory.rss_mib(), ok=trimmed_ok)))
"""


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt and malloc_trim")
def test_glibc_takes_the_arena_limit_and_trim_returns_fragmented_free_memory():
    # In a fresh interpreter: in this one, earlier tests leave holes that the pins fill, the big blocks then
    # end up side by side at the heap's top and free() hands them back by itself (seen on CI: -103 MiB).
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run([sys.executable, "-c", FRAGMENT], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["ok"] is True
    assert r["freed"] > r["held"] - 60  # free() kept most of the ~190 MiB resident
    assert r["trimmed"] < r["freed"] - 100  # malloc_trim handed it back


def test_the_report_line_is_what_the_soak_parses_and_rss_is_real():
    line = memory.report()
    m = memory.LINE.search(line)
    assert m is not None, line
    assert 10 < float(m["rss"]) < 100_000
    assert int(m["blocks"]) > 10_000  # Python itself holds more than this many blocks once pytest runs


def test_the_janitor_logs_its_line_until_stopped(caplog):
    caplog.set_level(logging.INFO, logger="specviz")
    janitor = memory.Janitor(every_s=0.05).start()
    janitor.thread.join(0.5)
    janitor.stop()
    janitor.thread.join(2)
    assert not janitor.thread.is_alive()
    lines = [r.getMessage() for r in caplog.records if memory.LINE.search(r.getMessage())]
    assert len(lines) >= 2
