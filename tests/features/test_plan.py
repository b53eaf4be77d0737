"""The fused transforms against per-feature computations, on both routes."""

import collections
import contextlib
import os
import random

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reckeras as rk
from reckeras.backend_kernels import dispatch, transforms
from reckeras.backend_kernels.dispatch import TRITON_AVAILABLE
from reckeras.backend_kernels.hashing import INT64_MAX, mix64, mix64_numpy
from reckeras.features.encode import as_tensors, encode
from reckeras.features.plan import TransformPlan
from reckeras.features.specs import LENGTHS


def with_lengths(plan, inputs, lengths):
    """`inputs` plus LENGTHS: `lengths[name]` for the named features, 1 (a
    Categorical) or `max_len` (a Sequence) for the others."""
    batch = len(next(iter(inputs.values())))
    columns = [torch.as_tensor(lengths[s.name]) if s.name in lengths else
               torch.full((batch,), getattr(s, "max_len", 1)) for s in plan.with_lengths]
    if columns:
        inputs = {**inputs, LENGTHS: torch.stack(columns, dim=1).to(torch.int32)
                  if batch else torch.zeros(0, len(columns), dtype=torch.int32)}
    return inputs


def hash_combine(columns):
    """The cross hash in numpy: `mix64` of the first of the stacked int64
    columns, then `mix64(h * 0xC2B2AE3D27D4EB4F + next)` for each further one."""
    columns = np.asarray(columns, dtype=np.int64).view(np.uint64)
    h = mix64_numpy(columns[0])
    for column in columns[1:]:
        h = mix64_numpy(h.view(np.uint64) * np.uint64(0xC2B2AE3D27D4EB4F) + column)
    return h


def test_mix64_known_values_and_numpy_agree():
    # SplitMix64 of 0 and 1 (first outputs of the reference generator seeded 0
    # and 1 - GOLDEN ... computed independently with Python integers).
    def splitmix(x):
        mask = 2**64 - 1
        z = (x + 0x9E3779B97F4A7C15) & mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        z = z ^ (z >> 31)
        return z - 2**64 if z >= 2**63 else z
    values = [0, 1, -1, 12345, 2**63 - 1, -(2**63)]
    expected = [splitmix(v % 2**64) for v in values]
    assert mix64(torch.tensor(values)).tolist() == expected
    assert mix64_numpy(np.array(values, dtype=np.int64)).tolist() == expected


def test_dense_transforms():
    plan = TransformPlan([
        rk.features.Numeric("a", transform="log1p", default=5.0),
        rk.features.Numeric("b"),
        rk.features.Numeric("c", transform="standardize")])
    inputs = {"a": torch.tensor([0.0, float("nan"), -3.0]),
              "b": torch.tensor([1.0, 2.0, float("nan")]),
              "c": torch.tensor([1.0, 3.0, 5.0])}
    dense = plan.dense(inputs, torch.tensor([0.0, 0.0, 3.0]), torch.tensor([1.0, 1.0, 2.0]))
    expected = np.array([[0.0, 1.0, -1.0],
                         [np.log1p(5.0), 2.0, 0.0],
                         [-np.log1p(3.0), 0.0, 1.0]], dtype=np.float32)
    np.testing.assert_allclose(dense.numpy(), expected, rtol=1e-6)


def numpy_dense(specs, raw, mean, std):
    """The dense block in float64 numpy, from the raw rows: a row is None
    (missing), a number, or for a vector a list of numbers and Nones."""
    columns = []
    for spec in specs:
        for j in range(spec.size):
            column = []
            for row in raw[spec.name]:
                value = row if not spec.shape or row is None else row[j]
                missing = value is None or np.isnan(value)
                column.append(spec.default if missing else float(np.float32(value)))
            columns.append((spec, np.array(column)))
    block = []
    for index, (spec, x) in enumerate(columns):
        if spec.transform == "log1p":
            x = np.sign(x) * np.log1p(np.abs(x))
        elif spec.transform == "standardize":
            x = (x - mean[index]) / std[index]
        block.append(x)
    return np.stack(block, axis=1)


def raw_column(spec, rows, layout):
    """One way a batch can hold the raw rows of a numeric feature."""
    if not spec.shape:
        return pa.array(rows, pa.float64()) if layout != "numpy" else \
            np.array([np.nan if v is None else v for v in rows])
    if layout == "list":
        return pa.array(rows, pa.list_(pa.float64()))
    if layout == "fixed":
        return pa.array(rows, pa.list_(pa.float32(), spec.size))
    return np.array([[np.nan] * spec.size if row is None else
                     [np.nan if v is None else v for v in row] for row in rows])


@st.composite
def numeric_batches(draw):
    count = draw(st.integers(1, 4))
    specs = [rk.features.Numeric(
        f"n{i}", shape=draw(st.sampled_from([(), (1,), (3,), (64,)])),
        transform=draw(st.sampled_from([None, "log1p", "standardize"])),
        default=draw(st.floats(-5, 5))) for i in range(count)]
    batch = draw(st.integers(1, 5))
    number = st.one_of(st.floats(-1e3, 1e3, width=32), st.just(float("nan")), st.none())
    raw, layouts = {}, {}
    for spec in specs:
        layouts[spec.name] = draw(st.sampled_from(["list", "fixed", "numpy"]))
        row = st.lists(number, min_size=spec.size, max_size=spec.size) \
            if spec.shape else number
        if layouts[spec.name] != "numpy" or not spec.shape:
            row = st.one_of(st.none(), row)       # a missing row (or vector)
        raw[spec.name] = draw(st.lists(row, min_size=batch, max_size=batch))
    width = sum(s.size for s in specs)
    mean = draw(st.lists(st.floats(-10, 10), min_size=width, max_size=width))
    std = draw(st.lists(st.floats(0.25, 4), min_size=width, max_size=width))
    return specs, raw, layouts, np.array(mean), np.array(std)


@settings(max_examples=40, deadline=None, print_blob=True)
@given(numeric_batches())
def test_encoded_scalar_and_vector_numerics_equal_numpy(case):
    specs, raw, layouts, mean, std = case
    batch = {s.name: raw_column(s, raw[s.name], layouts[s.name]) for s in specs}
    plan = TransformPlan(specs)
    assert plan.dense_width == sum(s.size for s in specs)
    inputs = as_tensors(encode(specs, batch))
    dense = plan.dense(inputs, torch.tensor(mean, dtype=torch.float32),
                       torch.tensor(std, dtype=torch.float32))
    assert dense.dtype == torch.float32 and dense.shape == (len(raw["n0"]), plan.dense_width)
    np.testing.assert_allclose(dense.numpy(), numpy_dense(specs, raw, mean, std),
                               rtol=1e-5, atol=1e-5)


def test_vector_columns_sit_in_declaration_order():
    plan = TransformPlan([rk.features.Numeric("a", default=-1.0),
                          rk.features.Numeric("v", shape=(2,), transform="log1p", default=3.0),
                          rk.features.Numeric("b", transform="standardize")])
    assert plan.dense_width == 4
    assert plan.numeric_default.tolist() == [-1.0, 3.0, 3.0, 0.0]
    inputs = {"a": torch.tensor([float("nan"), 2.0]),
              "v": torch.tensor([[float("nan"), 1.0], [-1.0, 0.0]]),
              "b": torch.tensor([5.0, 7.0])}
    dense = plan.dense(inputs, torch.tensor([0.0, 0.0, 0.0, 4.0]), torch.full((4,), 2.0))
    log = np.log1p
    np.testing.assert_allclose(dense.numpy(), [[-1.0, log(3.0), log(1.0), 0.5],
                                               [2.0, -log(1.0), 0.0, 1.5]], rtol=1e-6)


def test_numeric_inputs_of_the_wrong_shape_are_refused():
    plan = TransformPlan([rk.features.Numeric("a"), rk.features.Numeric("v", shape=(3,))])
    with pytest.raises(ValueError, match=r"feature 'v': expected \[2, 3\] values, got \[2, 4\]"):
        plan.dense({"a": torch.zeros(2), "v": torch.zeros(2, 4)}, torch.zeros(4), torch.ones(4))
    with pytest.raises(ValueError, match=r"feature 'a': expected \[2\] values, got \[2, 1\]"):
        plan.dense({"a": torch.zeros(2, 1), "v": torch.zeros(2, 3)}, torch.zeros(4),
                   torch.ones(4))


def test_packed_sparse_layout_and_transforms():
    specs = [rk.features.Categorical("a", dim=4),
             rk.features.Sequence("s", dim=4, max_len=3, combiner="mean"),
             rk.features.Categorical("h", dim=4, hash_buckets=7),
             rk.features.Categorical("b", dim=4, boundaries=[0.0, 10.0]),
             rk.features.Cross(["a", "h"], dim=4, hash_buckets=11)]
    plan = TransformPlan(specs)
    assert [s.name for s in plan.slots] == ["a", "h", "b", "a_x_h", "s"]
    a = torch.tensor([3, -1])
    h = torch.tensor([2**62, 5])
    b = torch.tensor([-1.0, float("nan")])
    s = torch.tensor([[4, -1, 9], [0, 0, 0]])
    packed = plan.packed_sparse(with_lengths(plan, {"a": a, "h": h, "b": b, "s": s},
                                             {"s": [2, 0]}))
    h_bucket = (mix64(h) % 7)
    # Crosses combine the members' raw ids, before their own hash_buckets.
    expected_cross = mix64(torch.from_numpy(hash_combine(torch.stack([a, h])))) % 11
    # -1 is an id like any other; NaN is in b's missing bucket (3).
    expected_ids = torch.cat([a, h_bucket, torch.tensor([0, 3]),
                              expected_cross, torch.tensor([4, -1])])
    assert packed["ids"].tolist() == expected_ids.tolist()
    # 4 single-valued slots x 2 examples, then sequence bags of 2 and 0 ids.
    assert packed["offsets"].tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 10]
    assert (h_bucket >= 0).all() and (expected_cross >= 0).all()


def test_a_missing_categorical_and_its_crosses_have_empty_bags():
    specs = [rk.features.Categorical("a", dim=4), rk.features.Categorical("c", dim=4),
             rk.features.Categorical("b", dim=4, boundaries=[0.0]),
             rk.features.Cross(["a", "b"], dim=4, hash_buckets=50),
             rk.features.Cross(["c", "b"], dim=4, hash_buckets=50),
             rk.features.Sequence("s", dim=4, max_len=2)]
    plan = TransformPlan(specs)
    a, c = torch.tensor([5, 6, 7]), torch.tensor([-8, -9, 0])
    b = torch.tensor([1.0, -1.0, float("nan")])
    s = torch.tensor([[1, 2], [3, 4], [5, 6]])
    packed = plan.packed_sparse(with_lengths(plan, {"a": a, "c": c, "b": b, "s": s},
                                             {"a": [1, 0, 1], "s": [1, 0, 2]}))
    lengths = packed["offsets"].diff().view(len(plan.slots), 3).tolist()
    # Slots a, c, b, a_x_b, c_x_b, s: a's second example is missing, and so
    # is the cross of it; c_x_b and the bucketized b stay.
    assert lengths == [[1, 0, 1], [1, 1, 1], [1, 1, 1], [1, 0, 1], [1, 1, 1], [1, 0, 2]]
    ids = packed["ids"].tolist()
    assert ids[:8] == [5, 7, -8, -9, 0, 1, 0, 2]
    assert ids[-3:] == [1, 5, 6]


def test_lengths_out_of_range_are_refused_and_absent_lengths_mean_full():
    plan = TransformPlan([rk.features.Categorical("a", dim=4),
                          rk.features.Sequence("s", dim=4, max_len=2)])
    inputs = {"a": torch.tensor([1, 2]), "s": torch.zeros(2, 2, dtype=torch.int64)}
    with pytest.raises(ValueError, match="feature 's': its lengths must lie in \\[0, 2\\]"):
        plan.packed_sparse(with_lengths(plan, inputs, {"s": [3, 0]}))
    with pytest.raises(ValueError, match="feature 'a': its lengths must lie in \\[0, 1\\]"):
        plan.packed_sparse(with_lengths(plan, inputs, {"a": [1, -1]}))
    # Without LENGTHS every Categorical has its id and every row is full.
    full = plan.packed_sparse({"a": torch.tensor([1, 2]), "s": torch.tensor([[3, 4], [5, 6]])})
    assert full["ids"].tolist() == [1, 2, 3, 4, 5, 6]
    assert full["offsets"].tolist() == [0, 1, 2, 4, 6]


def test_weighted_sequences_pack_their_weights_and_ones_elsewhere():
    specs = [rk.features.Categorical("a", dim=4),
             rk.features.Sequence("s", dim=4, max_len=3, weights="sw"),
             rk.features.Sequence("t", dim=4, max_len=2)]
    plan = TransformPlan(specs)
    inputs = {"a": torch.tensor([1, 2]), "s": torch.tensor([[4, 5, 6], [7, 8, 9]]),
              "sw": torch.tensor([[0.5, -2.0, 9.0], [3.0, 9.0, 9.0]]),
              "t": torch.tensor([[1, 2], [3, 4]])}
    packed = plan.packed_sparse(with_lengths(plan, inputs, {"s": [2, 1], "t": [0, 2]}))
    assert packed["ids"].tolist() == [1, 2, 4, 5, 7, 3, 4]
    assert packed["weights"].tolist() == [1.0, 1.0, 0.5, -2.0, 3.0, 1.0, 1.0]
    assert "weights" not in TransformPlan(specs[:1]).packed_sparse(
        with_lengths(TransformPlan(specs[:1]), {"a": torch.tensor([1])}, {}))


def test_bucketize_boundaries_per_feature():
    plan = TransformPlan([rk.features.Categorical("x", dim=2, boundaries=[1, 2, 3]),
                          rk.features.Categorical("y", dim=2, boundaries=[0])])
    x = torch.tensor([0.5, 1.0, 2.5, 100.0])
    y = torch.tensor([-5.0, 0.0, 0.1, float("nan")])
    ids = plan.packed_sparse({"x": x, "y": y})["ids"]
    expected_x = np.searchsorted([1, 2, 3], x.numpy(), side="right")
    assert ids[:4].tolist() == expected_x.tolist()
    assert ids[4:].tolist() == [0, 1, 1, 2]          # NaN: y's missing bucket


def test_hash_buckets_stay_in_range_for_extreme_ids():
    plan = TransformPlan([rk.features.Categorical("x", dim=2, hash_buckets=3)])
    ids = torch.tensor([0, INT64_MAX, -(2**63), -1])
    out = plan.packed_sparse(with_lengths(plan, {"x": ids}, {}))["ids"]
    assert ((out >= 0) & (out < 3)).all()


# ---- the Triton route equals the CPU route -------------------------------------------
#
# On CUDA inputs (RECKERAS_TEST_DEVICE=cuda) the plan runs the Triton kernels
# compiled; on CPU inputs `dispatch.triton_on_cpu()` sends them there, in
# Triton's interpreter. Either way every kernel launch is counted, so these
# tests fail if the plan stops calling the kernels.

DEVICE = torch.device(os.environ.get("RECKERAS_TEST_DEVICE", "cpu"))
# The triton_route fixture is safe to share between examples: every run
# clears its launch counts.
SETTINGS = settings(max_examples=12, deadline=None, print_blob=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
INF = float("inf")


class CountedKernel:
    def __init__(self, fn, name, counts):
        self.fn, self.name, self.counts = fn, name, counts

    def __getitem__(self, grid):
        self.counts[self.name] += 1
        return self.fn[grid]


@pytest.fixture
def triton_route(monkeypatch):
    """Yields a run of the plan on its Triton route: ``run(plan, inputs)``
    returns the packed batch (on CPU) and the launches of the transform
    kernels by name."""
    if not TRITON_AVAILABLE:
        pytest.skip("triton not installed")
    counts = collections.Counter()
    for name, fn in list(vars(transforms).items()):
        if isinstance(fn, dispatch.Kernel) and name.endswith("_kernel"):
            monkeypatch.setattr(transforms, name, CountedKernel(fn, name, counts))

    def run(plan, inputs):
        counts.clear()
        cpu = DEVICE.type == "cpu"
        with dispatch.triton_on_cpu() if cpu else contextlib.nullcontext():
            packed = plan.packed_sparse({k: v.to(DEVICE) for k, v in inputs.items()})
        assert packed["ids"].device.type == DEVICE.type
        return {k: v.cpu() for k, v in packed.items()}, dict(counts)

    return run


def expected_launches(plan, batch, offsets):
    """One launch per transform kind present (none for an empty batch; no
    packing without a sequence id)."""
    sequence_ids = int(offsets[-1] - offsets[len(plan.single_slots) * batch])
    kinds = {"_bucketize_kernel": plan.bucketized, "_cross_kernel": plan.crosses,
             "_hash_into_buckets_kernel": any(s.hash_buckets for s in plan.single_slots),
             "_pack_sequences_kernel": plan.sequences and sequence_ids > 0}
    return {name: 1 for name, present in kinds.items() if present and batch}


def naive_packed(plan, inputs, batch):
    """The packed batch by per-feature, per-example Python loops."""
    by_name = {s.name: s for s in plan.slots}
    column = {s.name: j for j, s in enumerate(plan.with_lengths)}

    def length(spec):
        if spec.name not in column:             # bucketized: always one id
            return [1] * batch
        return inputs[LENGTHS][:, column[spec.name]].tolist()

    def categorical(spec):
        if spec.boundaries is None:
            return inputs[spec.name].long()
        values = inputs[spec.name].float().numpy()
        buckets = np.searchsorted(np.array(spec.boundaries, dtype=np.float32), values,
                                  side="right")
        missing = len(spec.boundaries) + 1
        return torch.from_numpy(np.where(np.isnan(values), missing, buckets)
                                .astype(np.int64))

    bags = []
    for spec in plan.slots:
        if isinstance(spec, rk.features.Sequence):
            rows = [row[:n] for row, n in zip(inputs[spec.name].tolist(), length(spec))]
        elif isinstance(spec, rk.features.Cross):
            members = torch.stack([categorical(by_name[m]) for m in spec.names])
            present = np.all([length(by_name[m]) for m in spec.names], axis=0)
            rows = [[i] if p else [] for i, p in
                    zip(hash_combine(members).tolist(), present.reshape(-1).tolist())]
        else:
            rows = [[i] if n else [] for i, n in
                    zip(categorical(spec).tolist(), length(spec))]
        if spec.hash_buckets:
            rows = [(mix64(torch.tensor(r, dtype=torch.int64)) % spec.hash_buckets).tolist()
                    for r in rows]
        bags += rows
    lengths = torch.tensor([0] + [len(b) for b in bags], dtype=torch.int64)
    return {"ids": torch.tensor(sum(bags, []), dtype=torch.int64),
            "offsets": lengths.cumsum(0)}


def random_specs(rng):
    dims = [1, 3, 4, 6]
    specs = [rk.features.Categorical(f"c{i}", dim=rng.choice(dims),
                                     hash_buckets=rng.choice([None, None, 1, 7, 2**40]))
             for i in range(rng.randint(0, 3))]
    specs += [rk.features.Categorical(
        f"b{i}", dim=rng.choice(dims),
        boundaries=[v / 4 for v in sorted(rng.sample(range(-40, 40), rng.randint(1, 9)))])
        for i in range(rng.randint(0, 2))]
    names = [s.name for s in specs]
    if len(names) >= 2:
        specs += [rk.features.Cross(rng.sample(names, rng.choice([2, 3][:len(names) - 1])),
                                    dim=rng.choice(dims),
                                    hash_buckets=rng.choice([5, 1000, 2**50]),
                                    name=f"x{i}")
                  for i in range(rng.randint(0, 2))]
    specs += [rk.features.Sequence(f"s{i}", dim=rng.choice(dims),
                                   max_len=rng.choice([1, 3, 5, 37, 130]),
                                   hash_buckets=rng.choice([None, 13, 2**33]),
                                   combiner=rng.choice(["sum", None]))
              for i in range(rng.randint(0 if specs else 1, 2))]
    specs.append(rk.features.Numeric("n"))        # ignored by packed_sparse
    rng.shuffle(specs)
    return specs


def random_inputs(rng, specs, batch):
    """Random inputs of the specs, LENGTHS included: rows hold random ids
    past their lengths too (they must not be read), some Categoricals miss."""
    inputs, lengths = {}, {}
    for spec in specs:
        if isinstance(spec, rk.features.Sequence):
            inputs[spec.name] = torch.tensor(
                [[rng.choice([rng.randint(-5, 50), rng.randint(-2**63, 2**63 - 1)])
                  for _ in range(spec.max_len)] for _ in range(batch)],
                dtype=torch.int64).view(batch, spec.max_len)
            lengths[spec.name] = [rng.choice([0, spec.max_len, rng.randint(0, spec.max_len)])
                                  for _ in range(batch)]
        elif isinstance(spec, rk.features.Categorical) and spec.boundaries is not None:
            inputs[spec.name] = torch.tensor(
                [rng.choice([float("nan"), INF, -INF, spec.boundaries[0],
                             rng.uniform(-12, 12), rng.uniform(-12, 12)])
                 for _ in range(batch)], dtype=torch.float32)
        elif isinstance(spec, rk.features.Categorical):
            inputs[spec.name] = torch.tensor(
                [rng.choice([-1, rng.randint(0, 20), rng.randint(-2**63, 2**63 - 1)])
                 for _ in range(batch)], dtype=torch.int64)
            if rng.random() < 0.5:
                lengths[spec.name] = [int(rng.random() < 0.7) for _ in range(batch)]
        elif isinstance(spec, rk.features.Numeric):
            inputs[spec.name] = torch.rand(batch)
    batch_lengths = [torch.tensor(lengths[s.name]) if s.name in lengths else
                     torch.full((batch,), getattr(s, "max_len", 1))
                     for s in TransformPlan(specs).with_lengths]
    if batch_lengths:
        inputs[LENGTHS] = torch.stack(batch_lengths, dim=1).to(torch.int32).view(
            batch, len(batch_lengths))
    return inputs


@SETTINGS
@given(st.randoms(use_true_random=False), st.integers(0, 4))
def test_triton_route_equals_the_cpu_route_on_random_specs(triton_route, rng, batch):
    plan = TransformPlan(random_specs(rng))
    inputs = random_inputs(rng, plan.specs, batch)
    cpu = plan.packed_sparse(inputs)
    expected = naive_packed(plan, inputs, batch)
    assert torch.equal(cpu["ids"], expected["ids"])
    assert torch.equal(cpu["offsets"], expected["offsets"])
    packed, launches = triton_route(plan, inputs)
    assert torch.equal(packed["ids"], cpu["ids"])
    assert torch.equal(packed["offsets"], cpu["offsets"])
    assert launches == expected_launches(plan, batch, cpu["offsets"])


EDGE_SPECS = [rk.features.Categorical("a", dim=3),
              rk.features.Categorical("h", dim=3, hash_buckets=7),
              rk.features.Categorical("b", dim=5, boundaries=[0.0, 10.0]),
              rk.features.Categorical("w", dim=5, boundaries=[-1.0, 0.0, 1.0, 2.0, 3.0]),
              rk.features.Cross(["a", "h"], dim=3, hash_buckets=11),
              rk.features.Cross(["b", "a", "w"], dim=3, hash_buckets=2**45),
              rk.features.Sequence("s", dim=3, max_len=3, combiner="mean"),
              rk.features.Sequence("t", dim=6, max_len=130, hash_buckets=13,
                                   combiner=None)]


def edge_inputs(batch, sequence_lengths):
    g = torch.Generator().manual_seed(batch)
    t = torch.randint(-2**62, 2**62, (batch, 130), generator=g)
    s = torch.arange(3).repeat(batch, 1) + 10 * torch.arange(batch)[:, None]
    edge_ids = torch.tensor([-1, 0, INT64_MAX, -(2**63), -5, 3])
    edge_values = torch.tensor([float("nan"), INF, -INF, 0.0, 10.0, -1e30])
    inputs = {"a": edge_ids[:batch], "h": edge_ids.flip(0)[:batch],
              "b": edge_values[:batch], "w": edge_values.flip(0)[:batch], "s": s, "t": t}
    return with_lengths(TransformPlan(EDGE_SPECS), inputs, {
        "a": [1, 0, 1, 1, 0, 1][:batch], "s": [min(n, 3) for n in sequence_lengths],
        "t": sequence_lengths})


@pytest.mark.parametrize("batch,sequence_lengths", [
    (0, []),                         # empty batch
    (3, [0, 0, 0]),                  # length-0 sequences only
    (6, [130, 0, 1, 129, 3, 64]),    # full, empty, longer than a kernel block
])
def test_triton_route_edge_cases(triton_route, batch, sequence_lengths):
    plan = TransformPlan(EDGE_SPECS)
    inputs = edge_inputs(batch, sequence_lengths)
    cpu = plan.packed_sparse(inputs)
    expected = naive_packed(plan, inputs, batch)
    assert torch.equal(cpu["ids"], expected["ids"])
    assert torch.equal(cpu["offsets"], expected["offsets"])
    packed, launches = triton_route(plan, inputs)
    assert torch.equal(packed["ids"], cpu["ids"])
    assert torch.equal(packed["offsets"], cpu["offsets"])
    assert launches == expected_launches(plan, batch, cpu["offsets"])
    assert cpu["offsets"].numel() == len(plan.slots) * batch + 1


@pytest.mark.parametrize("features", [1, 40])
def test_one_launch_per_kind_whatever_the_number_of_features(triton_route, features):
    specs = [rk.features.Categorical(f"c{i}", dim=2, hash_buckets=i + 2)
             for i in range(features)]
    specs += [rk.features.Categorical(f"b{i}", dim=2, boundaries=list(range(i + 1)))
              for i in range(features)]
    specs += [rk.features.Cross([f"c{i}", f"b{i}"], dim=2, hash_buckets=97, name=f"x{i}")
              for i in range(features)]
    specs += [rk.features.Sequence(f"s{i}", dim=2, max_len=i % 5 + 1)
              for i in range(features)]
    plan = TransformPlan(specs)
    inputs = random_inputs(random.Random(features), specs, 2)
    packed, launches = triton_route(plan, inputs)
    cpu = plan.packed_sparse(inputs)
    assert torch.equal(packed["ids"], cpu["ids"])
    assert torch.equal(packed["offsets"], cpu["offsets"])
    assert launches == expected_launches(plan, 2, cpu["offsets"])


def test_infinite_values_fall_in_the_last_bucket_of_their_own_feature():
    plan = TransformPlan([rk.features.Categorical("x", dim=2, boundaries=[0.0]),
                          rk.features.Categorical("y", dim=2, boundaries=[1, 2, 3, 4])])
    inf = torch.tensor([INF, -INF])
    assert plan.packed_sparse({"x": inf, "y": inf})["ids"].tolist() == [1, 0, 4, 0]
    nan = torch.tensor([float("nan")])
    assert plan.packed_sparse({"x": nan, "y": nan})["ids"].tolist() == [2, 5]


def test_sequences_of_the_wrong_width_are_refused():
    plan = TransformPlan([rk.features.Sequence("s", dim=2, max_len=3)])
    with pytest.raises(ValueError, match=r"feature 's': expected \[2, 3\]"):
        plan.packed_sparse(with_lengths(plan, {"s": torch.full((2, 4), 5)}, {"s": [1, 1]}))


def test_planned_tensors_are_copied_to_a_device_once():
    plan = TransformPlan(EDGE_SPECS)
    assert plan._on(torch.device("cpu")) is plan._on(torch.device("cpu"))
    if DEVICE.type == "cuda":
        on_device = plan._on(DEVICE)
        assert on_device is plan._on(DEVICE)
        assert all(t.device.type == "cuda" for t in on_device.values())
