"""Debian's chromium as specviz's scripts and tests start it through playwright (`playwright install` cannot
download a browser here: `apt-get install chromium`)."""

from __future__ import annotations

import tempfile
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-quic",
]


def launch(pw, niced: bool = False):
    """A headless chromium from a playwright handle (`sync_playwright()`'s). niced: run it at nice 19, so that on
    a 2-core machine its drawing does not slow the models' calls (a picture); not niced, it competes for the cores
    as a visitor's browser on the same laptop does (a race timed beside it)."""
    path = CHROMIUM
    if niced:
        wrapper = Path(tempfile.mkdtemp()) / "chromium"
        wrapper.write_text(f'#!/bin/sh\nexec nice -n 19 {CHROMIUM} "$@"\n')
        wrapper.chmod(0o755)
        path = str(wrapper)
    return pw.chromium.launch(executable_path=path, args=ARGS)
