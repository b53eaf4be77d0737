#!/usr/bin/env bash
# Installs reckeras with its test extra and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh test
.venv/bin/python -m pytest tests "$@"
