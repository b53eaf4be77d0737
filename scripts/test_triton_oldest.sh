#!/usr/bin/env bash
# Runs the Triton kernel tests (interpreter mode, CPU tensors) on the oldest
# Triton that pyproject.toml admits: the GPU machine's image carries that
# release (3.6), while scripts/test.sh installs the newest. Not part of CI:
# the Triton wheel is ~190 MB.
#
# The release is installed with `pip --target` into .triton-oldest/, which
# goes ahead of .venv's site-packages on PYTHONPATH, beside .venv's CPU torch
# (run scripts/setup_env.sh test first, or scripts/test.sh).
#
# numpy < 2.4 goes with it: Triton 3.6's interpreter keeps a scalar as a
# one-element array and converts it with int(), which numpy 2.4 refuses
# ("only 0-dimensional arrays can be converted to Python scalars", in any
# kernel whose loop is bounded by a loaded or reduced value). Triton fixed
# its interpreter after 3.6 (triton-lang/triton#9171, #9172); compiled
# kernels are not affected.
#
# Usage: scripts/test_triton_oldest.sh [pytest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
oldest=$(python3 - <<'PY'
import re, tomllib
with open("pyproject.toml", "rb") as f:
    dependencies = tomllib.load(f)["project"]["dependencies"]
triton = next(d for d in dependencies if re.match(r"triton\b", d))
print(re.search(r">=\s*([0-9.]+)", triton).group(1))
PY
)
[ -x .venv/bin/python ] || bash scripts/setup_env.sh test
site=.triton-oldest
if ! PYTHONPATH=$site .venv/bin/python -c "
import triton, numpy
from packaging.version import Version
assert Version(triton.__version__) == Version('$oldest')
assert Version(numpy.__version__) < Version('2.4')" 2>/dev/null; then
  rm -rf "$site"
  .venv/bin/python -m pip install --quiet --no-deps --target "$site" \
      "triton==$oldest" "numpy>=1.24,<2.4"
fi
# The repository itself too: subprocesses (the sm_90 compile) must import this
# checkout, not another copy of reckeras.
export PYTHONPATH="$PWD/$site:$PWD"
.venv/bin/python -c "import triton, numpy; print('triton', triton.__version__, 'numpy', numpy.__version__)"
.venv/bin/python -m pytest tests/backend_kernels tests/features/test_plan.py \
    tests/test_optimizers.py "$@"
