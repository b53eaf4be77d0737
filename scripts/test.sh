#!/usr/bin/env bash
# Installs reckeras with its test extra and runs the whole test suite.
# Arguments go to pytest: `bash scripts/test.sh -m "not slow"` is the inner
# loop (about 70 s on 2 cores; the tests marked slow spawn torchrun, run the
# benchmarks and examples or train for long). CI runs everything.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh test
.venv/bin/python -m pytest tests "$@"
