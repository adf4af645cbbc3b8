"""Debian's chromium for the browser tests: where it is, and what happens without it (conftest's `browser` starts it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from specviz.ui.browser import CHROMIUM


def require_chromium() -> None:
    """Skip the calling test module on a machine without chromium; in CI (CI=1) let it fail instead."""
    in_ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    if not Path(CHROMIUM).exists() and not in_ci:
        pytest.skip(
            f"{CHROMIUM} is missing (apt-get install chromium); in CI this test fails instead", allow_module_level=True
        )
