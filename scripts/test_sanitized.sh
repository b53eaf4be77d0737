#!/usr/bin/env bash
# Runs the native kernels' tests (tests/backend_kernels/test_cpu_native.py,
# test_kernel_arrow_columns.py and the boundary fuzzers, test_native_boundary.py)
# against cpu_native.c and arrow_columns.c built with AddressSanitizer and
# UndefinedBehaviorSanitizer: RECKERAS_NATIVE_SANITIZE=1
# makes reckeras/backend_kernels/cpu_native.py build that library (a cache file
# of its own) and raise if it cannot. Python is not instrumented, so the ASan
# runtime is preloaded; leak checking is off (CPython keeps objects alive at
# exit by design). Any out-of-bounds access or undefined behaviour aborts the
# run with the sanitizer's report. A compiler without the runtime fails the
# run: it does not skip.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  bash scripts/setup_env.sh test
fi
compiler="${CC:-cc}"
runtime=$("$compiler" -print-file-name=libasan.so 2>/dev/null || true)
if [ ! -f "$runtime" ]; then
  echo "test_sanitized.sh: '$compiler' has no AddressSanitizer runtime" \
       "(-print-file-name=libasan.so gave '$runtime'); on Debian: apt-get install gcc libasan8" >&2
  exit 1
fi
export RECKERAS_NATIVE_SANITIZE=1 ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1
export LD_PRELOAD="$runtime"
# The tests skip without native kernels: make sure they are the sanitized ones.
.venv/bin/python -c "
from reckeras.backend_kernels import cpu_native
name = cpu_native.library()._name
assert 'sanitized' in name, name
print('sanitized native kernels:', name)"
# --capture=sys: pytest's default capture of fd 2 would take a sanitizer's
# report down with the process it aborts.
.venv/bin/python -m pytest -p no:cacheprovider -q --capture=sys \
  tests/backend_kernels/test_cpu_native.py tests/backend_kernels/test_native_boundary.py \
  tests/backend_kernels/test_kernel_arrow_columns.py "$@"
