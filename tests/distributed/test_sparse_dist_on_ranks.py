"""The sparse-dist stage (next batch's id exchange beside the running step)
changes nothing: pipelined fit, evaluate and predict on several ranks equal
the same stages run one after another, bit for bit (DESIGN invariant 3)."""

import json

import numpy as np
import pytest

from launch import torchrun

pytestmark = pytest.mark.slow  # spawns torchrun processes


def load(path):
    with np.load(path) as f:
        return dict(f)


@pytest.mark.parametrize("nproc, env", [
    (2, {}),
    (4, {"RECKERAS_RANKS_PER_NODE": "2", "RK_TEST_LIFECYCLE": "1"}),  # hierarchical
    (2, {"RK_TEST_CACHE": "lru"}),      # host_cached tables: cache_prefetch runs too
])
def test_pipelined_equals_sequential(tmp_path, nproc, env):
    torchrun("train.py", nproc, tmp_path / "seq.npz", 2, env={**env, "RK_TEST_PIPELINE": "0"})
    torchrun("train.py", nproc, tmp_path / "pipe.npz", 2, env={**env, "RK_TEST_PIPELINE": "1"})
    sequential, pipelined = load(tmp_path / "seq.npz"), load(tmp_path / "pipe.npz")
    assert set(sequential) == set(pipelined)
    for name in sorted(sequential):
        np.testing.assert_array_equal(pipelined[name], sequential[name], err_msg=name)
    with open(tmp_path / "pipe.npz.pipeline.json") as f:
        stats = json.load(f)
    with open(tmp_path / "seq.npz.pipeline.json") as f:
        sequential_stats = json.load(f)
    steps = stats["step"]["items"]
    assert stats["threads"] and steps == sequential_stats["step"]["items"] > 0
    # One planned route per training step, every epoch.
    assert stats["sparse_dist"]["items"] == steps
    assert "sparse_dist" not in sequential_stats
    # predict() (and evaluate(): the metric_* arrays above) agree too.
    assert stats["predictions"] == sequential_stats["predictions"]
    assert len(stats["predictions"]) == 128 // nproc
