#!/usr/bin/env bash
# Fetches into .whl/ (git-ignored) the wheels that the GPU machine's image
# lacks: Keras and the two packages it needs that the image does not hold
# (namex, optree). The image has Python 3.12, torch, Triton, numpy, absl-py,
# rich, h5py, ml-dtypes, packaging, pyarrow, safetensors, tqdm, pytest and
# hypothesis; nothing can be fetched there. benchmarks/gpu_check.sh installs
# these wheels into a temporary site directory when `import keras` fails.
#
# Keras is pinned to the newest release pyproject.toml admits (the one
# scripts/test.sh tests); optree is a compiled wheel, fetched for CPython 3.12
# on manylinux x86-64.
#
# Usage: scripts/gpu_wheels.sh   (then carry .whl in the device run)
set -euo pipefail
cd "$(dirname "$0")/.."
KERAS_VERSION=${KERAS_VERSION:-3.15.1}
rm -rf .whl
mkdir -p .whl
python3 -m pip download --quiet --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "keras==$KERAS_VERSION" namex optree
# One wheel of each, or pip --target would refuse the set.
for name in keras namex optree; do
  count=$(ls .whl | grep -ci "^$name-" || true)
  [ "$count" = 1 ] || { echo "expected one $name wheel in .whl, found $count" >&2; exit 1; }
done
ls -l .whl
du -sh .whl
