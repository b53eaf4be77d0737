#!/usr/bin/env bash
# Every GPU check of the sparse front end, in under 5 minutes on one GPU:
#   1. the kernel tests with the real (compiled) Triton kernels on CUDA
#      tensors, against the torch references on CPU;
#   2. fit on the GPU with the pipeline's h2d stage against inline stages;
#   3. benchmarks/kernels.py on the GPU: kernel bandwidth against the device
#      peak for float32, float16 and bfloat16 table rows, and the fused step
#      against the per-feature loop on the same GPU.
# The kernel tests include the half-precision rows (test_half_rows.py: the
# compiled update kernel's stochastic rounding bit for bit as the reference,
# the pooled lookup of half rows, the fused aggregation + update).
# Usage: benchmarks/gpu_check.sh   (PYTHON=... to pick the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
export TRITON_INTERPRET=0 RECKERAS_TEST_DEVICE=cuda
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader || true
"$PYTHON" -c "import torch, triton; assert torch.cuda.is_available(), 'no CUDA device'; \
print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
start=$SECONDS
timeout 200 "$PYTHON" -m pytest -q -p no:cacheprovider -x tests/backend_kernels \
    tests/test_optimizers.py
echo "kernel tests: $((SECONDS - start)) s"
# fit on the GPU: the h2d stage (pinned memory, copy stream) against inline.
timeout 120 "$PYTHON" -m pytest -q -p no:cacheprovider -x tests/pipeline/test_device_copy.py
echo "pipeline tests: $((SECONDS - start)) s"
timeout 120 "$PYTHON" benchmarks/kernels.py --device cuda --steps 20 --warmup 4 \
    --row-dtypes float32,float16,bfloat16
echo "gpu_check: $((SECONDS - start)) s"
