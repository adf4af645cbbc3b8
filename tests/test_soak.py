"""The short soak: scripts/soak.py with 4 visitors for a minute against the app (a child process) on the tiny pair.

The full run (8 visitors, 30 minutes, the built-in pair) is in the README's "Deploying publicly" section.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.full  # a minute of visitors against a child app: the full tier

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def soak(tiny_pair, tmp_path_factory):
    out = tmp_path_factory.mktemp("soak")
    target, draft = tiny_pair
    cmd = [sys.executable, str(ROOT / "scripts" / "soak.py"), "--visitors", "4", "--minutes", "1"]
    # A minute is mostly warm-up for the process's memory (allocator arenas of new threads fill up), so the
    # growth bound here is looser than the full run's 10%; a leak of a request's objects would still show.
    cmd += ["--target", target, "--draft", draft, "--out", str(out), "--no-png", "--max-rss-growth", "0.25"]
    env = {**os.environ, "SPECVIZ_TRIM_S": "5"}  # the server's memory line every 5 s, so a minute has several
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    report = json.loads((out / "soak.json").read_text()) if (out / "soak.json").is_file() else {}
    return run, report, out


def test_a_minute_of_mixed_visitors_has_no_traceback_no_error_and_no_cross_talk(soak):
    run, report, out = soak
    assert run.returncode == 0, run.stderr[-2000:] + json.dumps(report.get("problems"))
    assert report["tracebacks"] == 0 and report["cross_talk"] == 0 and not report["problems"]
    assert report["outcomes"].get("error", 0) == 0


def test_every_kind_of_request_was_sent_valid_and_invalid_and_some_were_cancelled(soak):
    _, report, _ = soak
    assert set(report["by_kind"]) == {"race", "sweep", "step", "check", "exactness"}
    assert report["outcomes"]["finished"] >= 20 and report["outcomes"]["refused"] >= 5
    assert report["outcomes"].get("cancelled", 0) >= 1
    assert report["queue_wait_s"]["p50"] is not None and report["first_token_s"]["p95"] is not None


def test_the_server_trims_its_heap_and_reports_python_blocks_which_the_soak_reads(soak):
    _, report, out = soak
    log = (out / "server.log").read_text()
    assert log.count("specviz memory: rss ") >= 5  # the janitor's line, every 5 s over a minute
    blocks = report["python_blocks"]
    assert blocks["after_warmup"] > 100_000 and blocks["end"] > 100_000  # a real count read from those lines
    assert (out / "blocks.csv").read_text().count("\n") >= 3
