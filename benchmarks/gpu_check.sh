#!/usr/bin/env bash
# The GPU check: runs on the bare GPU machine's image (Python 3.12, torch,
# Triton, pytest, hypothesis, pyarrow, ...; no Keras) from the plain working
# tree, with no install of reckeras. It needs the wheels of
# scripts/gpu_wheels.sh in .whl/ (carried beside the tree) only when
# `import keras` fails there. Four stages, each with its own time limit, so
# that one failing stage does not hide the others (about 6 minutes at most):
#   1. every kernel test with the compiled Triton kernels on CUDA tensors,
#      against the torch references (half-precision rows included), and the
#      TransformPlan's Triton route;
#   2. pipelined fit on the GPU (the h2d stage) against inline stages;
#   3. kernel bandwidth (lookup, backward aggregation, fused update, hash find
#      and find-or-insert) at the `wide` and `huge` shapes, float32, float16
#      and bfloat16 rows, against the H200's 4.8 TB/s (benchmarks/kernels.py);
#   4. fit of the dlrm, wide and huge workloads against plain PyTorch on the
#      same GPU (benchmarks/gpu_fit.py).
# Every figure is a `name=value` line; they are collected in
# $RESULTS_DIR/gpu_check_results.txt, beside the whole log (gpu_check.log)
# and the kernel tests' JUnit report. RESULTS_DIR defaults to $OUT (the
# device tool's output folder), else /tmp/reckeras_gpu_check.
#
# Exits 1 when a stage failed (the others still ran).
# Usage: docs/kernels.md gives the device tool's command. By hand, on a GPU
# host: bash benchmarks/gpu_check.sh   (PYTHON=... picks the interpreter)
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
WHEELS=${WHEELS:-.whl}     # the folder of scripts/gpu_wheels.sh
RESULTS_DIR=${RESULTS_DIR:-${OUT:-/tmp/reckeras_gpu_check}}
mkdir -p "$RESULTS_DIR"
log="$RESULTS_DIR/gpu_check.log"
results="$RESULTS_DIR/gpu_check_results.txt"
: > "$log"
start=$SECONDS
failed_stages=()

stage() {   # stage NAME LIMIT_S COMMAND...: runs it, logs it, records its status
  local name=$1 limit=$2
  shift 2
  echo "=== $name (limit ${limit}s)" | tee -a "$log"
  local began=$SECONDS
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$log"
  local status=${PIPESTATUS[0]}
  echo "stage_${name}_status=$status" | tee -a "$log"
  [ "$status" = 0 ] || failed_stages+=("$name")
  echo "stage_${name}_s=$((SECONDS - began))" | tee -a "$log"
}

# Keras's default backend is TensorFlow, which the image lacks: without this
# even an installed Keras fails to import.
export KERAS_BACKEND=torch
# Keras (and namex, optree) from the carried wheels, into a temporary site
# directory, when the interpreter has none.
if ! "$PYTHON" -c "import keras" 2>/dev/null; then
  if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    echo "Keras is missing and $WHEELS/ holds no wheels: run scripts/gpu_wheels.sh" \
         "and carry .whl" | tee -a "$log"
    exit 2
  fi
  site=$(mktemp -d)
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --target "$site" "$WHEELS"/*.whl 2>&1 | tee -a "$log"
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
# reckeras from this working tree, not an installed copy.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export RECKERAS_TEST_DEVICE=cuda PYTHONUNBUFFERED=1
unset TRITON_INTERPRET

"$PYTHON" - <<'PY' 2>&1 | tee -a "$log"
import reckeras
import keras, numpy, torch, triton
print(f"python_torch={torch.__version__}\npython_triton={triton.__version__}")
print(f"python_keras={keras.__version__}\npython_numpy={numpy.__version__}")
print(f"cuda_available={torch.cuda.is_available()}")
if torch.cuda.is_available():
    print(f"gpu_name={torch.cuda.get_device_name()}")
    print(f"gpu_memory_gib={torch.cuda.get_device_properties(0).total_memory / 2**30:.0f}")
print(f"reckeras_from={reckeras.__file__}")
PY

timeout_plugin=()
"$PYTHON" -c "import pytest_timeout" 2>/dev/null && timeout_plugin=(--timeout=90)
# -v: every test's name and outcome as it ends, so a run cut off by its time
# limit still names what failed (the JUnit report is written only at the end).
stage kernel_tests 200 "$PYTHON" -m pytest -v --tb=short -o addopts="" -p no:cacheprovider -rfE \
    "${timeout_plugin[@]}" --junitxml="$RESULTS_DIR/kernel_tests.xml" \
    tests/backend_kernels tests/test_optimizers.py tests/features/test_plan.py
"$PYTHON" - "$RESULTS_DIR/kernel_tests.xml" <<'PY' 2>&1 | tee -a "$log"
import sys, xml.etree.ElementTree as ET
try:
    suite = ET.parse(sys.argv[1]).getroot()
except (OSError, ET.ParseError) as error:
    print(f"kernel_tests_report=missing ({error.__class__.__name__})")
    raise SystemExit
suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
total, failed = int(suite.get("tests")), int(suite.get("failures")) + int(suite.get("errors"))
skipped = int(suite.get("skipped"))
print(f"kernel_tests_passed={total - failed - skipped}\nkernel_tests_failed={failed}")
print(f"kernel_tests_skipped={skipped}")
PY
stage pipeline_fit 45 "$PYTHON" -m pytest -q -o addopts="" -p no:cacheprovider -rfE \
    tests/pipeline/test_device_copy.py
stage bandwidth 40 "$PYTHON" benchmarks/kernels.py --device cuda --no-compare \
    --bandwidth-shapes wide,huge --row-dtypes float32,float16,bfloat16
stage fit 80 "$PYTHON" benchmarks/gpu_fit.py --repeats 2

echo "gpu_check_s=$((SECONDS - start))" | tee -a "$log"
grep -E '^[A-Za-z0-9_]+=' "$log" > "$results"
echo "results: $results"
if [ ${#failed_stages[@]} -gt 0 ]; then
  echo "failed stages: ${failed_stages[*]}"
  exit 1
fi
