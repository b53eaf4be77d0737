#!/usr/bin/env bash
# Runs the test suite on the oldest Keras that pyproject.toml admits, in a
# venv of its own (.venv-keras-oldest): the compatibility module
# (reckeras/_keras_compat.py) must hold at both ends of the range, and
# scripts/test.sh covers the newest release.
set -euo pipefail
cd "$(dirname "$0")/.."
oldest=$(python3 - <<'PY'
import re, tomllib
with open("pyproject.toml", "rb") as f:
    dependencies = tomllib.load(f)["project"]["dependencies"]
keras = next(d for d in dependencies if re.match(r"keras\b", d))
print(re.search(r">=\s*([0-9.]+)", keras).group(1))
PY
)
venv=.venv-keras-oldest
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet "torch==2.13.0"
"$venv/bin/python" -m pip install --quiet -e ".[test]" "keras==$oldest"
"$venv/bin/python" -c "
import reckeras, keras
from packaging.version import Version   # a dependency of keras
print('keras', keras.__version__)
assert Version(keras.__version__) == Version('$oldest'), keras.__version__"
"$venv/bin/python" -m pytest tests "$@"
