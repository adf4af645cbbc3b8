"""Debian's chromium for the browser tests: where it is, how it starts here, and what happens without it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from specviz.ui.browser import CHROMIUM, launch


def require_chromium() -> None:
    """Skip the calling test module on a machine without chromium; in CI (CI=1) let it fail instead."""
    in_ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    if not Path(CHROMIUM).exists() and not in_ci:
        pytest.skip(
            f"{CHROMIUM} is missing (apt-get install chromium); in CI this test fails instead", allow_module_level=True
        )


def launched():
    """A chromium browser for a test module, closed after it: `yield from launched()` in a module fixture."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = launch(p)
        yield b
        b.close()
