"""The glibc allocator settings: applied by `fit` (or `tune_malloc`) when
rk.config's `malloc_tuning` is on, never by `import reckeras`."""

import os
import platform
import subprocess
import sys
import textwrap

import pytest

import reckeras as rk
from reckeras import _allocator
from reckeras._allocator import release_free_memory, tune_malloc

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


@pytest.mark.skipif(not GLIBC, reason="the settings exist only in glibc")
def test_glibc_accepts_every_setting():
    assert tune_malloc() is True


def test_with_the_option_off_the_allocator_is_left_alone(monkeypatch):
    monkeypatch.setattr(_allocator, "_tuned_libc", None)     # as in a fresh process
    rk.config.set(malloc_tuning=False)
    assert tune_malloc() is False
    assert release_free_memory() is False


def _mapped(address):
    """Whether `address` lies in one of this process's mappings."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            low, high = (int(bound, 16) for bound in line.split()[0].split("-"))
            if low <= address < high:
                return True
    return False


def _resident_mb():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(not GLIBC, reason="the settings exist only in glibc")
def test_a_buffer_above_the_mmap_threshold_stays_mapped_when_freed():
    # A step's 65 MB buffers: served by mmap, each is unmapped when freed and
    # the next step faults in its 16k pages again; from the malloc arena, a
    # freed one stays mapped for the next.
    import torch
    assert tune_malloc() is True
    buffer = torch.empty(64 * 2**18)                 # float32: 64 MB
    middle = buffer.data_ptr() + 32 * 2**20
    del buffer
    assert _mapped(middle)


@pytest.mark.skipif(not GLIBC, reason="the settings exist only in glibc")
def test_freed_memory_stays_until_released():
    import torch

    assert tune_malloc() is True
    buffer = torch.empty(512 * 2**18).fill_(1.0)      # 512 MB
    del buffer
    kept = _resident_mb()
    assert release_free_memory() is True
    assert kept - _resident_mb() > 400, (kept, _resident_mb())


# In a fresh process: whether a freed 64 MB buffer stays mapped (tuned) or is
# unmapped (glibc's defaults serve it with mmap) after each stage.
STAGES = textwrap.dedent("""
    import numpy as np
    import torch

    def freed_buffer_stays_mapped():
        buffer = torch.empty(64 * 2**18)
        middle = buffer.data_ptr() + 32 * 2**20
        del buffer
        with open("/proc/self/maps") as maps:
            return any(int(low, 16) <= middle < int(high, 16) for low, high in
                       (line.split()[0].split("-") for line in maps))

    def fit():
        import keras
        columns = rk.layers.FeatureColumns([rk.features.Numeric("x"),
                                            rk.features.Categorical("c", dim=4)])
        inputs = columns.inputs()
        dense, sparse = columns(inputs)
        embedded = rk.layers.ShardedEmbedding(columns, output="concat")(sparse)
        out = keras.layers.Dense(1)(keras.layers.Concatenate()([dense, embedded]))
        model = rk.Model(inputs, out)
        model.compile(optimizer="sgd", loss="mse",
                      embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.05))
        rng = np.random.default_rng(0)
        model.fit({"x": rng.normal(size=64).astype("float32"),
                   "c": rng.integers(0, 9, 64)}, rng.normal(size=64).astype("float32"),
                  batch_size=32, verbose=0)

    import reckeras as rk
    import reckeras.serving, reckeras.layers     # the Keras-free and the Keras side
    print("import", freed_buffer_stays_mapped())
    rk.config.set(malloc_tuning=False)
    fit()
    print("fit, option off", freed_buffer_stays_mapped())
    rk.config.set(malloc_tuning=True)
    fit()
    print("fit, option on", freed_buffer_stays_mapped())
""")


@pytest.mark.skipif(not GLIBC, reason="the settings exist only in glibc")
@pytest.mark.slow
def test_import_leaves_the_allocator_alone_and_fit_tunes_it_when_asked():
    environment = {k: v for k, v in os.environ.items() if k != "RECKERAS_MALLOC_TUNING"}
    result = subprocess.run([sys.executable, "-c", STAGES], capture_output=True, text=True,
                            env=environment, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["import False", "fit, option off False",
                                          "fit, option on True"]
