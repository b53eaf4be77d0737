"""Smoke test of the throughput baselines and their dense-only floors: each
runs 2 steps on small models; the floors' values are checked against each
other and against plain torch."""

import math

import keras
import numpy as np
import pytest
import torch

import baselines
from workloads import NUM_DENSE, WORKLOADS, make_batches, to_arrow

pytestmark = pytest.mark.slow  # runs the benchmarks' workloads


@pytest.mark.parametrize("floor", [False, True], ids=["model", "floor"])
@pytest.mark.parametrize("system", sorted(baselines.BASELINES))
def test_two_steps_give_throughput_and_finite_loss(system, small_workload, floor):
    batches = make_batches(small_workload, batch_size=32, num_batches=2)
    measurement = baselines.BASELINES[system](small_workload, batches, warmup=1,
                                              floor=floor)
    if measurement is None:
        pytest.skip(f"{system} is not installed (scripts/install_bench.sh)")
    assert measurement.examples_per_s > 0
    assert math.isfinite(measurement.loss)


def _with_ids(batches, ids_of):
    return [(dense, ids_of(ids), labels) for dense, ids, labels in batches]


def test_torch_floor_trains_the_dense_network_on_constant_embeddings(small_workload):
    """The plain PyTorch floor's timed loss equals a hand-written loop over the
    dense network on the constant embeddings, and does not depend on the ids."""
    workload = small_workload
    batches = make_batches(workload, batch_size=32, num_batches=3)
    floor = baselines.plain_pytorch(workload, batches, warmup=1, floor=True)
    other_ids = baselines.plain_pytorch(
        workload, _with_ids(batches, lambda ids: np.zeros_like(ids)), warmup=1, floor=True)
    assert floor.loss == other_ids.loss

    torch.manual_seed(0)        # the floor draws the constant, then the layers
    constant = torch.empty(workload.num_fields, workload.dim).uniform_(-0.05, 0.05)
    dense_arch = baselines._DenseArch(workload)
    optimizer = torch.optim.Adagrad(dense_arch.parameters(), lr=baselines.LEARNING_RATE)
    losses = []
    for dense, _, labels in batches:
        embeddings = constant.unsqueeze(0).repeat(len(dense), 1, 1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            dense_arch(torch.from_numpy(dense), embeddings), torch.from_numpy(labels))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert floor.loss == pytest.approx(np.mean(losses[1:]), rel=1e-6)


def test_torchrec_floor_equals_the_plain_pytorch_floor(small_workload):
    """Same dense network, initial weights and Adagrad: DDP on one rank
    must not change the floor's losses."""
    workload = small_workload
    batches = make_batches(workload, batch_size=32, num_batches=3)
    torchrec = baselines.torchrec(workload, batches, warmup=1, floor=True)
    if torchrec is None:
        pytest.skip("torchrec is not installed (scripts/install_bench.sh)")
    plain = baselines.plain_pytorch(workload, batches, warmup=1, floor=True)
    assert torchrec.loss == pytest.approx(plain.loss, rel=1e-6)


@pytest.mark.parametrize("flatten", [False, True])
def test_constant_embeddings_repeat_one_block_for_every_row(flatten):
    layer = baselines.ConstantEmbeddings(fields=5, dim=4, flatten=flatten)
    first = keras.ops.convert_to_numpy(layer(np.zeros((3, 13), np.float32)))
    again = keras.ops.convert_to_numpy(layer(np.ones((7, 2), np.float32)))
    block = keras.ops.convert_to_numpy(layer.constant)
    assert block.shape == (5, 4) and np.abs(block).max() <= 0.05 and np.ptp(block) > 0
    expected = np.broadcast_to(block, (3, 5, 4))
    np.testing.assert_array_equal(first, expected.reshape(3, 20) if flatten else expected)
    assert again.shape == ((7, 20) if flatten else (7, 5, 4))
    assert layer.trainable_weights == []
    assert layer.compute_output_shape((None, 13)) == ((None, 20) if flatten else (None, 5, 4))


def test_huge_workload_has_the_shape_of_the_issue():
    huge = WORKLOADS["huge"]
    assert huge.vocabs == (50_000,) * 150 + (5_000,) * 350 + (100,) * 500
    assert (huge.dim, huge.bottom, huge.top, huge.interaction) == (8, (64, 8), (64, 1),
                                                                   "concat")
    assert huge.top_input_width == 8 + 1000 * 8


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
