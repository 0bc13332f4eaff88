#!/usr/bin/env bash
# The prepared GPU check, one command on a bare GPU machine with this repository (docs/scaling.md):
#
#   bash scripts/gpu_check.sh               # setup, then bench/gpu_check.py → bench/results/gpu_check.json
#   bash scripts/gpu_check.sh --cpu-smoke   # the same steps with the tiny Qwen3 on CPU (CUDA steps named, skipped)
#
# Setup (idempotent; the first run downloads the CUDA builds of torch and vLLM, a few minutes):
# .venv through scripts/setup.sh without llama.cpp (the CPU engine: nothing here uses it), and
# .venv-vllm with upstream vLLM through scripts/setup_vllm.sh. Then, on a Qwen3-8B-shaped model
# (published config, random weights): a Planner adapter trained for 24 steps with the
# single-GPU and the FSDP accelerate configs, vLLM serving the base with four role adapters
# under mixed-role load against the base alone, and heart check parity peft vs vLLM. Sized,
# not yet timed, for one H200 in under 10 minutes (model ~1, train 2 x ~1-2, vLLM start-up
# and two load phases ~2-3, parity ~1-2); GPU_CHECK_TIMEOUT (seconds, default 600) bounds it.
# Arguments go to bench/gpu_check.py (e.g. --steps 48, --requests 128).
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT=${GPU_CHECK_OUT:-bench/results/gpu_check.json}
if [ "${1:-}" = "--cpu-smoke" ]; then
  OUT=${GPU_CHECK_OUT:-runs/bench/gpu_check_smoke.json}
  bash scripts/setup.sh
else
  if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_check: no NVIDIA GPU here (nvidia-smi finds none); run with --cpu-smoke to check the steps on CPU" >&2
    exit 2
  fi
  HEART_SKIP_LLAMACPP=1 bash scripts/setup.sh
  VLLM_PACKAGE=${VLLM_PACKAGE:-vllm} bash scripts/setup_vllm.sh
  nvidia-smi -L
fi
timeout "${GPU_CHECK_TIMEOUT:-600}" .venv/bin/python bench/gpu_check.py --out "$OUT" "$@"
