"""Smoke test of the throughput baselines and their dense-only floors: each
configuration runs 2 steps on small models, from memory and from parquet
files with nulls; the floors' values are checked against each other and
against plain torch, the files' nulls against the rates asked for."""

import dataclasses
import math

import keras
import numpy as np
import pytest
import torch

import baselines
import pyarrow.parquet as pq
from feeds import MemoryFeed, ParquetFeed
from workloads import NUM_DENSE, WORKLOADS, make_batches, null_rates, to_arrow, write_parquet

pytestmark = pytest.mark.slow  # runs the benchmarks' workloads


@pytest.fixture
def parquet_dir(small_workload, tmp_path):
    batches = make_batches(small_workload, batch_size=32, num_batches=3)
    write_parquet(batches, small_workload, str(tmp_path), warmup=1)
    return str(tmp_path)


@pytest.mark.parametrize("floor", [False, True], ids=["model", "floor"])
@pytest.mark.parametrize("system", sorted(baselines.BASELINES))
def test_two_steps_give_throughput_and_finite_loss(system, small_workload, floor):
    feed = MemoryFeed(make_batches(small_workload, batch_size=32, num_batches=2), warmup=1)
    measurement = baselines.BASELINES[system](small_workload, feed, floor=floor)
    if measurement is None:
        pytest.skip(f"{system} is not installed (scripts/install_bench.sh)")
    assert measurement.examples_per_s > 0
    assert math.isfinite(measurement.loss)


@pytest.mark.parametrize("system", sorted(baselines.BASELINES))
def test_every_baseline_trains_from_parquet_files_with_nulls(system, small_workload,
                                                             parquet_dir):
    feed = ParquetFeed(parquet_dir, small_workload, batch_size=32)
    measurement = baselines.BASELINES[system](small_workload, feed)
    if measurement is None:
        pytest.skip(f"{system} is not installed (scripts/install_bench.sh)")
    assert measurement.examples_per_s > 0
    assert math.isfinite(measurement.loss)


def test_parquet_feed_fills_nulls_as_the_baselines_users_must(small_workload, tmp_path):
    workload = small_workload
    batches = make_batches(workload, batch_size=64, num_batches=3)
    write_parquet(batches, workload, str(tmp_path), warmup=1)
    feed = ParquetFeed(str(tmp_path), workload, batch_size=64)
    assert feed.warmup_steps == 1
    read = list(feed.warmup()) + list(feed.timed())
    assert len(read) == 3
    table = pq.read_table(tmp_path / "timed")          # the timed batches 1 and 2
    for (dense, ids, labels), (want_dense, want_ids, want_labels) in zip(read, batches):
        np.testing.assert_array_equal(labels, want_labels)
        assert ids.shape == (workload.num_fields, 64) and dense.shape == (64, NUM_DENSE)
        # A value is either the generated one or its null's fill.
        vocabs = np.asarray(workload.vocabs)[:, None]
        assert ((ids == want_ids.T) | (ids == vocabs)).all()
        assert ((dense == want_dense) | (dense == 0)).all()
    dense, ids, _ = read[2]
    i1_null = table.column("I1").is_null().to_numpy(zero_copy_only=False)[64:]
    np.testing.assert_array_equal(dense[:, 0] == 0, i1_null)
    c22_null = table.column("C22").is_null().to_numpy(zero_copy_only=False)[64:] \
        if workload.num_fields >= 22 else None
    if c22_null is not None:
        np.testing.assert_array_equal(ids[21] == workload.vocabs[21], c22_null)


def test_files_have_criteo_null_rates_cycled_past_c26(tmp_path):
    workload = dataclasses.replace(WORKLOADS["wide"], name="wide_nulls",
                                   vocabs=(50,) * 30)
    numeric, categorical = null_rates(workload)
    assert numeric[0] == 0.45 and numeric[11] == 0.77 and numeric[1] == 0.0
    assert categorical[21] == 0.76 and categorical[26:] == categorical[:4]
    batches = make_batches(workload, batch_size=1000, num_batches=5)
    write_parquet(batches, workload, str(tmp_path), warmup=1)
    table = pq.read_table(tmp_path / "timed")
    assert table.num_rows == 4000
    for name, rate in [("I1", 0.45), ("I2", 0.0), ("I12", 0.77), ("C22", 0.76),
                       ("C19", 0.44), ("C1", 0.0), ("C29", 0.03)]:
        assert abs(table.column(name).null_count / 4000 - rate) < 0.03, name


def _with_ids(batches, ids_of):
    return [(dense, ids_of(ids), labels) for dense, ids, labels in batches]


def test_torch_floor_trains_the_dense_network_on_constant_embeddings(small_workload):
    """The plain PyTorch floor's timed loss equals a hand-written loop over the
    dense network on the constant embeddings, and does not depend on the ids."""
    workload = small_workload
    batches = make_batches(workload, batch_size=32, num_batches=3)
    floor = baselines.plain_pytorch(workload, MemoryFeed(batches, 1), floor=True)
    other_ids = baselines.plain_pytorch(
        workload, MemoryFeed(_with_ids(batches, np.zeros_like), 1), floor=True)
    assert floor.loss == other_ids.loss

    torch.manual_seed(0)        # the floor draws the constant, then the layers
    constant = torch.empty(workload.num_fields, workload.dim).uniform_(-0.05, 0.05)
    dense_arch = baselines.DenseArch(workload)
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


def test_dense_arch_takes_the_signed_log1p_of_the_numeric_features(small_wide):
    workload = small_wide                           # concat: the top MLP reads it all
    torch.manual_seed(0)
    arch = baselines.DenseArch(workload)
    dense = torch.tensor([[-3.0, 0.0, 2.5] + [1.0] * (NUM_DENSE - 3)])
    embeddings = torch.rand(1, workload.num_fields, workload.dim)
    logged = torch.tensor([[-math.log(4.0), 0.0, math.log(3.5)]
                           + [math.log(2.0)] * (NUM_DENSE - 3)])
    with torch.no_grad():
        expected = arch.top(torch.cat([arch.bottom(logged), embeddings.flatten(1)], dim=1))
        np.testing.assert_allclose(arch(dense, embeddings).numpy(),
                                   expected.squeeze(1).numpy(), rtol=1e-6)


@pytest.mark.parametrize("source", ["memory", "parquet"])
def test_torchrec_in_backward_equals_plain_pytorch_per_field(small_workload, parquet_dir,
                                                             source):
    """The same tables (one per field, the same initial rows), the same exact
    Adagrad: TorchRec's plain collection with the optimizer in backward trains
    the per-field model's losses, so the two systems train one model."""
    workload = small_workload
    if source == "memory":
        feed = MemoryFeed(make_batches(workload, batch_size=32, num_batches=3), warmup=1)
    else:
        feed = ParquetFeed(parquet_dir, workload, batch_size=32)
    torchrec = baselines.BASELINES["torchrec_ebc_in_backward"](workload, feed)
    if torchrec is None:
        pytest.skip("torchrec is not installed (scripts/install_bench.sh)")
    plain = baselines.plain_pytorch(workload, feed)
    assert torchrec.loss == pytest.approx(plain.loss, rel=1e-5)


@pytest.mark.parametrize("configuration", ["torchrec_tw_fused", "torchrec_ebc_fused"])
def test_torchrec_floor_equals_the_plain_pytorch_floor(small_workload, configuration):
    """Same dense network, initial weights and Adagrad: DDP on one rank
    must not change the floor's losses."""
    workload = small_workload
    feed = MemoryFeed(make_batches(workload, batch_size=32, num_batches=3), warmup=1)
    torchrec = baselines.BASELINES[configuration](workload, feed, floor=True)
    if torchrec is None:
        pytest.skip("torchrec is not installed (scripts/install_bench.sh)")
    plain = baselines.plain_pytorch(workload, feed, floor=True)
    assert torchrec.loss == pytest.approx(plain.loss, rel=1e-6)


def test_families_cover_every_baseline_configuration():
    configurations = [system for family in baselines.FAMILIES.values() for system in family]
    assert sorted(configurations) == sorted(baselines.BASELINES)
    assert {"torchrec_dmp_default", "torchrec_tw_fused", "torchrec_dp",
            "torchrec_ebc_fused"} <= set(baselines.FAMILIES["torchrec"])
    assert baselines.FAMILIES["plain_pytorch"] == ["plain_pytorch_per_field",
                                                   "plain_pytorch_concat"]


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
