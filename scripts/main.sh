#!/usr/bin/env bash
# The main job on a fresh machine: set up, prepare the embedded SmolLM2-135M, and run the whole
# distillation (heart pipeline): gold-teacher collection on BFCL + AgentDojo → role datasets →
# four LoRA adapters → base vs distilled per role and end to end → report in runs/smollm2-pipeline.
# Every stage is content-addressed: a rerun skips what is up to date. Extra arguments go to
# `heart pipeline` (e.g. `--until train`, `--stage eval_roles`, `--force`).
# `heart demo` still shows the loop on a few BFCL tasks.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1
.venv/bin/heart models prepare smollm2-135m >/dev/null  # its stdout is the folder; what it does goes to stderr
.venv/bin/heart pipeline --recipe recipes/smollm2-135m/pipeline.yaml "$@"
