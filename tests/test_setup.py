"""scripts/setup.sh's choice of torch, alone (sourced: its functions, with a fake `pip` on PATH that records its
arguments, so nothing is installed): the CPU build from PyTorch's CPU index where no GPU is wanted, a quick fallback
to pip's own sources, said in one line, where that index cannot be reached, and the CUDA build where a GPU is found
or asked for."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SETUP = ROOT / "scripts" / "setup.sh"
PIN = next(line.split("#")[0].strip() for line in (ROOT / "requirements.txt").open() if line.startswith("torch=="))
UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing listens, the connection is refused at once


@pytest.fixture
def fake_bin(tmp_path) -> Path:
    """A folder with a `pip` that writes its arguments, one per line, to pip.args and installs nothing."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    pip = bin_dir / "pip"
    pip.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path / "pip.args"}\n')
    pip.chmod(0o755)
    return bin_dir


def choose(fake_bin: Path, **env: str) -> tuple[subprocess.CompletedProcess, list[str] | None]:
    """Source setup.sh and run its torch step with the fake pip; the step's output and pip's arguments."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SPECVIZ_TORCH")}
    environ |= {"PATH": f"{fake_bin}:{os.environ['PATH']}", "PY": sys.executable, **env}
    script = f'source "{SETUP}" && install_torch pip'
    r = subprocess.run(["bash", "-c", script], env=environ, capture_output=True, text=True, timeout=60)
    args = fake_bin.parent / "pip.args"
    return r, args.read_text().splitlines() if args.exists() else None


def test_setup_pins_the_torch_requirements_txt_pins():
    assert f"TORCH_VERSION={PIN.removeprefix('torch==')} " in SETUP.read_text(encoding="utf-8")


def test_an_unreachable_cpu_index_falls_back_to_pips_sources_in_one_line(fake_bin):
    r, args = choose(fake_bin, SPECVIZ_TORCH="cpu", SPECVIZ_TORCH_INDEX=UNREACHABLE)
    assert r.returncode == 0, r.stderr
    assert args == ["install", "-q", PIN]  # no --index-url: wherever pip's configuration finds torch
    assert r.stdout.splitlines() == [
        f"note: {UNREACHABLE} cannot be reached; torch {PIN[7:]} from pip's own sources "
        "(on Linux, PyPI's is the CUDA build, several GB)"
    ]


@pytest.fixture
def cpu_index(tmp_path):
    """A local stand-in for PyTorch's CPU index: a page at /torch/."""
    root = tmp_path / "index"
    (root / "torch").mkdir(parents=True)
    (root / "torch" / "index.html").write_text("<html></html>")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(root), **kw)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_no_gpu_takes_the_cpu_build_from_the_cpu_index(fake_bin, cpu_index):
    smi = fake_bin / "nvidia-smi"  # as where NVIDIA's tool is installed but finds no GPU (it shadows a real one)
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    smi.chmod(0o755)
    r, args = choose(fake_bin, SPECVIZ_TORCH_INDEX=cpu_index)
    assert r.returncode == 0, r.stderr
    assert args == ["install", "-q", "--index-url", cpu_index, PIN]
    assert r.stdout.splitlines() == [f"torch {PIN[7:]}: the CPU build from {cpu_index}"]


def test_a_gpu_found_or_asked_for_takes_the_cuda_build(fake_bin, cpu_index):
    smi = fake_bin / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: a fake'\n")
    smi.chmod(0o755)
    r, args = choose(fake_bin, SPECVIZ_TORCH_INDEX=cpu_index)
    assert r.returncode == 0 and args == ["install", "-q", PIN]
    assert r.stdout.splitlines() == [f"torch {PIN[7:]}: the CUDA build from PyPI (with NVIDIA's libraries, several GB)"]
    r, args = choose(fake_bin, SPECVIZ_TORCH="cpu", SPECVIZ_TORCH_INDEX=cpu_index)  # asked: CPU despite the GPU
    assert args == ["install", "-q", "--index-url", cpu_index, PIN]
    smi.unlink()
    r, args = choose(fake_bin, SPECVIZ_TORCH="cuda", SPECVIZ_TORCH_INDEX=cpu_index)  # asked: CUDA with none found
    assert args == ["install", "-q", PIN] and "CUDA build" in r.stdout


def test_a_bad_choice_is_one_sentence_and_installs_nothing(fake_bin):
    r, args = choose(fake_bin, SPECVIZ_TORCH="rocm")
    assert r.returncode != 0 and args is None
    assert r.stderr.strip() == "error: SPECVIZ_TORCH must be cpu or cuda, not 'rocm'"


def test_setup_refuses_an_unknown_flag():
    r = subprocess.run(["bash", str(SETUP), "--everything"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.strip() == "usage: bash scripts/setup.sh [--dev | --full]"
