"""The fused transforms against per-feature numpy computations."""

import numpy as np
import torch

import reckeras as rk
from reckeras.backend_kernels.hashing import INT64_MAX, hash_combine, mix64, mix64_numpy
from reckeras.features.plan import TransformPlan


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
    s = torch.tensor([[4, 5, -1], [-1, -1, -1]])
    packed = plan.packed_sparse({"a": a, "h": h, "b": b, "s": s})
    h_bucket = (mix64(h) % 7)
    # Crosses combine the members' raw ids, before their own hash_buckets.
    expected_cross = mix64(hash_combine(torch.stack([a, h]))) % 11
    expected_ids = torch.cat([a, h_bucket, torch.tensor([0, -1]),
                              expected_cross, torch.tensor([4, 5])])
    assert packed["ids"].tolist() == expected_ids.tolist()
    # 4 single-valued slots x 2 examples, then sequence bags of 2 and 0 ids.
    assert packed["offsets"].tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 10]
    assert (h_bucket >= 0).all() and (expected_cross >= 0).all()


def test_bucketize_boundaries_per_feature():
    plan = TransformPlan([rk.features.Categorical("x", dim=2, boundaries=[1, 2, 3]),
                          rk.features.Categorical("y", dim=2, boundaries=[0])])
    x = torch.tensor([0.5, 1.0, 2.5, 100.0])
    y = torch.tensor([-5.0, 0.0, 0.1, float("nan")])
    ids = plan.packed_sparse({"x": x, "y": y})["ids"]
    expected_x = np.searchsorted([1, 2, 3], x.numpy(), side="right")
    assert ids[:4].tolist() == expected_x.tolist()
    assert ids[4:].tolist() == [0, 1, 1, -1]


def test_hash_buckets_stay_in_range_for_extreme_ids():
    plan = TransformPlan([rk.features.Categorical("x", dim=2, hash_buckets=3)])
    ids = torch.tensor([0, INT64_MAX, -(2**63), -1])
    out = plan.packed_sparse({"x": ids})["ids"]
    assert ((out >= 0) & (out < 3)).all()
