"""A real server process for the served-target tests (vllm_server.py, llamacpp_server.py): started on 127.0.0.1
and a free port in its own process group, its output in a log file, waited for with a bound (until /v1/models
lists a model), and stopped with its children (the group, nothing else)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`name` for messages, `ready_s` the bound on waiting, `poll_s` between tries. A subclass picks `self.port`
    (free_port) before building its command, then calls `start`."""

    name = "the server"
    ready_s = 300
    poll_s = 1.0

    def __init__(self, log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.log = log

    def start(self, cmd: list[str], env: dict | None = None) -> None:
        self._out = open(self.log, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.started = time.monotonic()

    def wait(self) -> float:
        """Seconds until /v1/models answered; RuntimeError with the log's tail if it died or took past ready_s."""
        while time.monotonic() - self.started < self.ready_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(self.url + "/models", timeout=5) as r:
                    if json.load(r).get("data"):
                        return time.monotonic() - self.started
            except OSError:
                pass
            time.sleep(self.poll_s)
        self.stop()
        raise RuntimeError(f"{self.name} was not ready within {self.ready_s} s:\n{self.tail()}")

    def tail(self, n: int = 4000) -> str:
        if not self._out.closed:  # stop() closes it; the log on disk is whole by then
            self._out.flush()
        return self.log.read_bytes()[-n:].decode("utf-8", "replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the server and any child of it, which share its group
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._out.close()
