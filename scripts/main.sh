#!/usr/bin/env bash
# The main job on a fresh machine: set up, prepare the embedded SmolLM2-135M, and run HEART
# on a few BFCL v4 multi-turn tasks, printing the account of every role call and the scores.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1
.venv/bin/heart models prepare smollm2-135m
.venv/bin/heart demo --trace runs/demo/trace.jsonl "$@"
