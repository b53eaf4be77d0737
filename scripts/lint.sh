#!/usr/bin/env bash
# Installs reckeras with its lint extra and checks the package: ruff (the rules
# in pyproject.toml's [tool.ruff]) and mypy ([tool.mypy]). Arguments go to
# both, e.g. a path: `bash scripts/lint.sh reckeras/features`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh lint
paths=("${@:-reckeras}")
.venv/bin/ruff check "${paths[@]}"
.venv/bin/mypy "${paths[@]}"
