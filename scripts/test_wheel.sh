#!/usr/bin/env bash
# Builds reckeras's wheel as `pip wheel .` does for a regular install and
# checks that, installed from it (not editable), reckeras compiles and runs
# its native CPU kernels: the wheel must carry their C sources. The wheel goes
# into a temporary folder put first on PYTHONPATH, so .venv's dependencies
# serve it and the repository's own files are not on the path.
# Prints the examples/s of a short fit from the wheel install.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
bash scripts/setup_env.sh test
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# From a copy of the files git tracks (or would): a stale build/ folder here
# could otherwise lend the wheel a file the package data does not name.
mkdir "$work/src"
git ls-files -z --cached --others --exclude-standard | tar -c --null -T - -f - | tar -x -C "$work/src" -f -
.venv/bin/python -m pip wheel --quiet --no-deps --wheel-dir "$work/dist" "$work/src"
.venv/bin/python -m pip install --quiet --no-deps --target "$work/site" "$work"/dist/reckeras-*.whl
cd "$work"
PYTHONPATH="$work/site" RECKERAS_CACHE_DIR="$work/cache" KERAS_BACKEND=torch \
  "$repo/.venv/bin/python" - "$work/site" <<'PY'
import pathlib
import sys
import warnings

site = pathlib.Path(sys.argv[1])
with warnings.catch_warnings():
    # "native CPU kernels unavailable" is a warning: here it is the failure.
    warnings.simplefilter("error")
    import reckeras as rk
    from reckeras.backend_kernels import cpu_native, native_build

    assert site in pathlib.Path(rk.__file__).parents, f"reckeras imported from {rk.__file__}"
    for source in native_build.SOURCES:
        assert source.is_file(), f"the wheel lacks {source}"
    assert cpu_native.available(), "the native kernels did not load from the wheel install"
built = list(pathlib.Path("cache").rglob("*.so"))
assert built, "no native library was compiled into RECKERAS_CACHE_DIR"

# A short fit of the quickstart model on the packaged data, through the native path.
train = rk.datasets.load("criteo_synth", split="train").to_table().slice(0, 8192)
model = rk.models.dlrm(rk.layers.FeatureColumns(
    [rk.features.Numeric(f"I{i}", transform="log1p") for i in range(1, 14)]
    + [rk.features.Categorical(f"C{i}", dim=16) for i in range(1, 27)]))
model.compile(optimizer="adam", embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.05),
              loss="binary_crossentropy")
history = model.fit(train, batch_size=4096, epochs=1, verbose=0)
assert history.history["loss"][0] > 0
print(f"wheel install: reckeras from {site}, native kernels {built[0].name}, "
      f"fit at {model.pipeline_stats['examples_per_s']:.0f} examples/s")
PY
