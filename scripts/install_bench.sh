#!/usr/bin/env bash
# Installs the benchmark baselines (TorchRec on CPU) into .venv.
# torchrec 1.8.0 declares a dependency on the CUDA build of fbgemm-gpu; on CPU
# hosts it must use fbgemm-gpu-cpu instead, so both go in without their
# dependencies and the few pure-Python ones are added by hand.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
.venv/bin/python -m pip install --quiet --no-deps "torchrec==1.8.0" "fbgemm-gpu-cpu==1.8.0"
.venv/bin/python -m pip install --quiet tensordict "torchmetrics==1.0.3" pyre-extensions
.venv/bin/python -c "import torchrec, torch; print('torchrec', torchrec.__version__, 'torch', torch.__version__)"
