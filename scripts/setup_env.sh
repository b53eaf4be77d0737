#!/usr/bin/env bash
# Creates .venv (if missing) and installs reckeras with the given extras.
# torch==2.13.0 goes first: it is the CPU build this machine kind carries, and
# pyproject's torch range is satisfied by it, so pip downloads no CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
python -m pip install --quiet "torch==2.13.0"
python -m pip install --quiet -e ".${extras:+[$extras]}"
