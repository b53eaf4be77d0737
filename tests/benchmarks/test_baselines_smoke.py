"""Smoke test of the throughput baselines: each runs 2 steps on small models."""

import dataclasses
import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import baselines  # noqa: E402
from workloads import NUM_DENSE, WORKLOADS, make_batches, to_arrow  # noqa: E402

# The two workloads' structure (interaction, MLP depth) at a size that builds
# in well under a second; dims stay multiples of 4, as fbgemm's kernels need.
SMALL = {
    "dlrm": dataclasses.replace(WORKLOADS["dlrm"], name="dlrm_small",
                                vocabs=(1000,) * 4 + (10,) * 2, dim=4,
                                bottom=(16, 8, 4), top=(16, 8, 1)),
    "wide": dataclasses.replace(WORKLOADS["wide"], name="wide_small",
                                vocabs=(500,) * 10 + (10,) * 10, dim=4,
                                bottom=(8, 4), top=(8, 1)),
}


@pytest.mark.parametrize("system", sorted(baselines.BASELINES))
@pytest.mark.parametrize("workload", sorted(SMALL))
def test_two_steps_give_throughput_and_finite_loss(system, workload):
    batches = make_batches(SMALL[workload], batch_size=32, num_batches=2)
    measurement = baselines.BASELINES[system](SMALL[workload], batches, warmup=1)
    if measurement is None:
        pytest.skip(f"{system} is not installed (bench extra)")
    assert measurement.examples_per_s > 0
    assert math.isfinite(measurement.loss)


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_workload_batches_and_table(name):
    workload = WORKLOADS[name]
    batches = make_batches(workload, batch_size=16, num_batches=3)
    dense, ids, labels = batches[1]
    assert dense.shape == (16, NUM_DENSE) and dense.dtype == np.float32
    assert ids.shape == (16, workload.num_fields) and ids.dtype == np.int64
    assert labels.shape == (16,) and set(np.unique(labels)) <= {0.0, 1.0}
    assert ((ids >= 0) & (ids < np.asarray(workload.vocabs))).all()
    again = make_batches(workload, batch_size=16, num_batches=2)
    assert all((a == b).all() for a, b in zip(batches[1], again[1]))

    table = to_arrow(batches, workload)
    assert table.num_rows == 48
    assert table.column_names == ([f"I{i}" for i in range(1, NUM_DENSE + 1)]
                                  + [f"C{f}" for f in range(1, workload.num_fields + 1)]
                                  + ["label"])
    assert str(table.schema.field("C1").type) == "int64"
    np.testing.assert_array_equal(table.column(f"C{workload.num_fields}").to_numpy()[16:32],
                                  ids[:, -1])
