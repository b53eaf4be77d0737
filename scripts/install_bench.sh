#!/usr/bin/env bash
# Installs reckeras and the benchmark baselines (TorchRec on CPU) into .venv:
# the one command for them (README, "Install extras").
# torchrec 1.8.0 declares a dependency on fbgemm-gpu, the CUDA build, which
# shares its fbgemm_gpu module folder with the CPU build fbgemm-gpu-cpu: pip
# would install both and `import torchrec` then fails on a CPU host. So the
# `bench` extra carries fbgemm-gpu-cpu and torchrec's other dependencies, and
# torchrec goes in without its own.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh bench
python=.venv/bin/python
# A .venv that got the CUDA build (an earlier `pip install ".[bench]"` that
# still listed torchrec) is repaired: removing it deletes the shared files,
# so the CPU build is put back over them.
if "$python" -m pip show --quiet fbgemm-gpu >/dev/null 2>&1; then
  "$python" -m pip uninstall --quiet --yes fbgemm-gpu
  "$python" -m pip install --quiet --force-reinstall --no-deps "fbgemm-gpu-cpu==1.8.0"
fi
"$python" -m pip install --quiet --no-deps "torchrec==1.8.0"
"$python" -c "import torch, torchrec, fbgemm_gpu; print('torchrec', torchrec.__version__, 'torch', torch.__version__)"
