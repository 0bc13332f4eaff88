#!/usr/bin/env bash
# Set up a fresh machine: a virtual environment in .venv with the pinned stack.
# Idempotent: a second run only checks what is there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
FRESH=0
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
  FRESH=1
fi
# pip's output goes to a log, not the console: a machine's pip config may name local index
# folders that do not exist, and pip warns about each on every call. A pip call that fails
# prints the log's last lines and stops the script.
LOG=.venv/setup.log
: >"$LOG"
echo "setup: pip's output goes to $LOG"
quiet() {
  if ! "$@" >>"$LOG" 2>&1; then
    echo "setup: failed: $*" >&2
    echo "setup: the last lines of $LOG (without pip's ignored-location warnings):" >&2
    { grep -v "^WARNING: Location .* is ignored" "$LOG" || true; } | tail -n 40 >&2
    exit 1
  fi
}
if [ "$FRESH" = 1 ]; then
  quiet .venv/bin/pip install --upgrade pip
fi
# the test extra, and Ray (the ray extra: tests/integration/test_ray_executor.py runs it)
quiet .venv/bin/pip install -e ".[test,ray,examples]"
quiet .venv/bin/pip install --no-deps -r requirements-nodeps.txt
# llama.cpp, the CPU role engine (heart.runtime.llamacpp), and its converter from peft adapters
# to GGUF LoRA: PyPI ships llama-cpp-python as source only, so the first run compiles it
# (~8 min on 2 cores) and unpacks the converter from the same release. The wheel it builds is
# kept under $HEART_CACHE/wheels, keyed by this CPU's flags (llama.cpp compiles for the CPU it
# is built on), so a new .venv or a fresh clone on this machine installs it without compiling.
LLAMA_CPP_PYTHON=llama-cpp-python==0.3.36
TOOLS=.venv/share/llama.cpp
WHEELS=${HEART_CACHE:-$HOME/.cache/heart}/wheels/$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | sha256sum | cut -c1-12)
# HEART_SKIP_LLAMACPP=1 leaves it out (scripts/gpu_check.sh: a GPU machine serves with vLLM).
if [ "${HEART_SKIP_LLAMACPP:-0}" != 1 ] && \
   { ! .venv/bin/python -c "import llama_cpp" 2>/dev/null || [ ! -f "$TOOLS/convert_lora_to_gguf.py" ]; }; then
  SDIST=$(mktemp -d)
  quiet .venv/bin/pip download --no-deps --no-binary :all: "$LLAMA_CPP_PYTHON" -d "$SDIST"
  if ! .venv/bin/python -c "import llama_cpp" 2>/dev/null; then
    WHEEL=$(ls "$WHEELS"/llama_cpp_python-"${LLAMA_CPP_PYTHON#*==}"-*.whl 2>/dev/null | head -1 || true)
    if [ -z "$WHEEL" ]; then
      echo "setup: building $LLAMA_CPP_PYTHON (llama.cpp, CPU only; the wheel is kept in $WHEELS; the compiler's output goes to $LOG)"
      mkdir -p "$WHEELS"
      quiet env CMAKE_ARGS="-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF" \
        CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" .venv/bin/pip wheel -v --no-deps -w "$WHEELS" "$SDIST"/llama_cpp_python-*.tar.gz
      WHEEL=$(ls "$WHEELS"/llama_cpp_python-"${LLAMA_CPP_PYTHON#*==}"-*.whl | head -1)
    else
      echo "setup: installing the llama.cpp wheel built earlier on this machine ($WHEEL)"
    fi
    quiet .venv/bin/pip install "$WHEEL"
  fi
  mkdir -p "$TOOLS"
  SRC=llama_cpp_python-${LLAMA_CPP_PYTHON#*==}/vendor/llama.cpp
  tar -xzf "$SDIST"/llama_cpp_python-*.tar.gz --strip-components=3 -C "$TOOLS" \
    "$SRC/convert_lora_to_gguf.py" "$SRC/convert_hf_to_gguf.py" "$SRC/conversion" "$SRC/gguf-py" "$SRC/LICENSE"
  rm -rf "$SDIST"
fi
echo "setup: ok ($(.venv/bin/python --version))"
