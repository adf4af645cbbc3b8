"""The installable package: the wheel `pip install .` builds holds the C sources, the app's assets and the `specviz`
command, names its dependencies (torch pinned, as requirements.txt), and runs from its own files alone, outside the
checkout, finding its assets inside itself."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent


def _requirements_txt() -> list[str]:
    lines = (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines()
    return [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)]
    if importlib.util.find_spec("hatchling"):  # scripts/setup.sh --dev installs it: build offline, in place
        cmd.insert(4, "--no-build-isolation")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (built,) = out.glob("specviz-*.whl")
    return built


def test_the_wheel_holds_the_sources_assets_command_and_license(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        info = next(n for n in names if n.endswith(".dist-info/METADATA")).rpartition("/")[0]
        meta = Parser().parsestr(z.read(f"{info}/METADATA").decode())
        entry_points = z.read(f"{info}/entry_points.txt").decode()
    csrc = {p.name for p in (ROOT / "specviz/native/csrc").glob("*.c")}
    assert csrc and {f"specviz/native/csrc/{c}" for c in csrc} <= names
    for asset in ("draft/model.safetensors", "draft/tokenizer.json", "head/head.safetensors", "style.css"):
        assert f"specviz/assets/{asset}" in names
    assert "specviz/assets/recordings/lessons.json" in names
    assert not {n for n in names if "__pycache__" in n or n.startswith(("tests/", "scripts/", "data/"))}
    assert "[console_scripts]\nspecviz = specviz.__main__:main" in entry_points
    requires = sorted(map(str, map(Requirement, meta.get_all("Requires-Dist"))))
    assert requires == sorted(map(str, map(Requirement, _requirements_txt())))  # pyproject's list is this file's
    assert "torch==2.13.0" in requires
    assert meta["License-Expression"] == "Apache-2.0" and f"{info}/licenses/LICENSE" in names


def test_the_unpacked_wheel_runs_outside_the_checkout(wheel, tiny_pair, tmp_path):
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site), "HF_HUB_OFFLINE": "1"}

    def run(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, *argv], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300
        )

    where = run("-c", "import specviz, specviz.config as c; print(specviz.__file__); print(c.ASSETS)")
    assert where.returncode == 0, where.stderr
    module, assets = where.stdout.split()
    assert Path(module).is_relative_to(site) and Path(assets) == site / "specviz" / "assets"
    helped = run("-m", "specviz", "--help")
    assert (
        helped.returncode == 0 and "generate" in helped.stdout and helped.stdout.startswith("usage: python -m specviz")
    )
    as_command = "import sys; sys.argv[0] = '/venv/bin/specviz'; from specviz.__main__ import main; main(['--help'])"
    helped = run("-c", as_command)  # what the installed `specviz` command runs, named as a user typed it
    assert helped.stdout.startswith("usage: specviz "), helped.stdout + helped.stderr
    argv = ["generate", "hello world", "--target", tiny_pair[0], "--draft", tiny_pair[1], "--device", "cpu"]
    made = run("-m", "specviz", *argv, "--max-new-tokens", "8", "--compare")
    assert made.returncode == 0, made.stderr
    assert "identical output: yes" in made.stdout
