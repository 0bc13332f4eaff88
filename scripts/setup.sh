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
.venv/bin/pip install -q -e ".[test]"
.venv/bin/pip install -q --no-deps -r requirements-nodeps.txt
# llama.cpp, the CPU role engine (heart.runtime.llamacpp), and its converter from peft adapters
# to GGUF LoRA: PyPI ships llama-cpp-python as source only, so the first run compiles it
# (~8 min on 2 cores) and unpacks the converter from the same release.
LLAMA_CPP_PYTHON=llama-cpp-python==0.3.36
TOOLS=.venv/share/llama.cpp
if ! .venv/bin/python -c "import llama_cpp" 2>/dev/null || [ ! -f "$TOOLS/convert_lora_to_gguf.py" ]; then
  SDIST=$(mktemp -d)
  .venv/bin/pip download -q --no-deps --no-binary :all: "$LLAMA_CPP_PYTHON" -d "$SDIST" 2>&1 | grep -v "is ignored" || true
  if ! .venv/bin/python -c "import llama_cpp" 2>/dev/null; then
    echo "setup: building $LLAMA_CPP_PYTHON (llama.cpp, CPU only)"
    CMAKE_ARGS="-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF" \
      CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" .venv/bin/pip install -q "$SDIST"/llama_cpp_python-*.tar.gz
  fi
  mkdir -p "$TOOLS"
  SRC=llama_cpp_python-${LLAMA_CPP_PYTHON#*==}/vendor/llama.cpp
  tar -xzf "$SDIST"/llama_cpp_python-*.tar.gz --strip-components=3 -C "$TOOLS" \
    "$SRC/convert_lora_to_gguf.py" "$SRC/convert_hf_to_gguf.py" "$SRC/conversion" "$SRC/gguf-py" "$SRC/LICENSE"
  rm -rf "$SDIST"
fi
echo "setup: ok ($(.venv/bin/python --version))"
