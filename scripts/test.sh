#!/usr/bin/env bash
# Set up a fresh machine and run the whole test suite (unit + integration with the real
# embedded models). Pytest's "no tests ran" (exit 5) fails like any other failure.
# Two pytest-xdist workers, one torch thread each (tests/conftest.py): the model-heavy tests
# decode on one core as fast as on two, so two run side by side in about half the time.
# Each module's tests stay on one worker (--dist loadfile) to build its fixtures once;
# --no-loadscope-reorder keeps the order tests/conftest.py gives (the longest modules first).
# Arguments go to pytest after these: `bash scripts/test.sh -n 0` runs in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1
.venv/bin/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder "$@"
