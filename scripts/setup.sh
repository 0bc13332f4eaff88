#!/usr/bin/env bash
# Set up a fresh machine: a virtual environment in .venv with the pinned stack.
# Idempotent: a second run only checks what is there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
  .venv/bin/pip install -q --upgrade pip
fi
# the test extra, and Ray (the ray extra: tests/integration/test_ray_executor.py runs it)
.venv/bin/pip install -q -e ".[test,ray]"
.venv/bin/pip install -q --no-deps -r requirements-nodeps.txt
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
  .venv/bin/pip download -q --no-deps --no-binary :all: "$LLAMA_CPP_PYTHON" -d "$SDIST" 2>&1 | grep -v "is ignored" || true
  if ! .venv/bin/python -c "import llama_cpp" 2>/dev/null; then
    WHEEL=$(ls "$WHEELS"/llama_cpp_python-"${LLAMA_CPP_PYTHON#*==}"-*.whl 2>/dev/null | head -1 || true)
    if [ -z "$WHEEL" ]; then
      echo "setup: building $LLAMA_CPP_PYTHON (llama.cpp, CPU only; the wheel is kept in $WHEELS)"
      mkdir -p "$WHEELS"
      CMAKE_ARGS="-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF" \
        CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" .venv/bin/pip wheel -q --no-deps -w "$WHEELS" "$SDIST"/llama_cpp_python-*.tar.gz
      WHEEL=$(ls "$WHEELS"/llama_cpp_python-"${LLAMA_CPP_PYTHON#*==}"-*.whl | head -1)
    else
      echo "setup: installing the llama.cpp wheel built earlier on this machine ($WHEEL)"
    fi
    .venv/bin/pip install -q "$WHEEL"
  fi
  mkdir -p "$TOOLS"
  SRC=llama_cpp_python-${LLAMA_CPP_PYTHON#*==}/vendor/llama.cpp
  tar -xzf "$SDIST"/llama_cpp_python-*.tar.gz --strip-components=3 -C "$TOOLS" \
    "$SRC/convert_lora_to_gguf.py" "$SRC/convert_hf_to_gguf.py" "$SRC/conversion" "$SRC/gguf-py" "$SRC/LICENSE"
  rm -rf "$SDIST"
fi
echo "setup: ok ($(.venv/bin/python --version))"
