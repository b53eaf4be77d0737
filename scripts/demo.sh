#!/usr/bin/env bash
# Installs reckeras and trains the quickstart model on the packaged dataset.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
.venv/bin/python examples/quickstart.py
