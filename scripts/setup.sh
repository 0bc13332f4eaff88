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
echo "setup: ok ($(.venv/bin/python --version))"
