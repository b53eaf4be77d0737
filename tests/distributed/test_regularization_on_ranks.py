"""Embedding regularization on several ranks: N ranks at batch b give the
losses, weights and tables of 1 rank at batch N*b (DESIGN invariant 2), for
both ways of counting the penalty: "distinct" (counted once per row over all
ranks, by the rows' owners) and "occurrence" (per lookup, over the batch)."""

import json

import numpy as np
import pytest

from launch import torchrun

pytestmark = pytest.mark.slow  # spawns torchrun processes


def run(tmp_path, nproc, regularize):
    path = tmp_path / f"{regularize}_n{nproc}.npz"
    torchrun("regularization.py", nproc, path, 2, env={"RK_TEST_REGULARIZE": regularize})
    with np.load(path) as saved:
        arrays = dict(saved)
    with open(f"{path}.losses.json") as f:
        return arrays, json.load(f)


@pytest.mark.parametrize("regularize", ["distinct", "occurrence"])
def test_regularized_training_is_world_size_invariant(tmp_path, regularize):
    single, single_losses = run(tmp_path, 1, regularize)
    multi, multi_losses = run(tmp_path, 2, regularize)
    # fit's loss (the mean over the ranks) counts the penalty once, as on one rank.
    np.testing.assert_allclose(multi_losses, single_losses, rtol=2e-4)
    assert set(multi) == set(single)
    for name in sorted(single):
        if name.startswith("keys"):
            np.testing.assert_array_equal(multi[name], single[name], err_msg=name)
        else:
            np.testing.assert_allclose(multi[name], single[name], rtol=2e-4, atol=2e-5,
                                       err_msg=name)
