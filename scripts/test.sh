#!/usr/bin/env bash
# Set up a fresh machine and run the whole test suite (unit + integration with the real
# embedded models). Pytest's "no tests ran" (exit 5) fails like any other failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1
.venv/bin/python -m pytest "$@"
