import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from kernel_cases import (INT64_MAX, INT64_MIN, SETTINGS, Launches, assert_same,
                          on_device, requires_triton, triton_route)

from reckeras.backend_kernels import transforms
from reckeras.backend_kernels.hashing import mix64

INF = float("inf")


def random_ids(rng, *shape):
    return torch.tensor([rng.randint(INT64_MIN, INT64_MAX) for _ in range(math.prod(shape))],
                        dtype=torch.int64).view(*shape)


# ---- references against per-feature loops ------------------------------------------

def test_hash_into_buckets_reference_is_a_per_feature_mod():
    ids = torch.arange(-20, 20, dtype=torch.int64).view(4, 10) * (2**58 + 7)
    buckets = torch.tensor([0, 1, 10, 2**40])
    out = transforms.hash_into_buckets(ids, buckets)
    for f in range(4):
        expected = ids[f] if buckets[f] == 0 else mix64(ids[f]) % int(buckets[f])
        assert torch.equal(out[f], expected)
        assert buckets[f] == 0 or ((out[f] >= 0) & (out[f] < buckets[f])).all()
    every = torch.tensor([3, 5, 7, 9])
    assert torch.equal(transforms.hash_into_buckets(ids, every),
                       mix64(ids) % every.unsqueeze(1))


def test_bucketize_reference_is_a_per_feature_searchsorted():
    values = torch.tensor([[-1.0, 0.0, 0.5, 2.0, float("nan"), INF, -INF],
                           [3.0, -7.0, 1.0, 1.5, 0.0, INF, -INF]])
    boundaries = torch.tensor([[0.0, 1.0, INF], [1.0, 1.5, 2.0]])
    out = transforms.bucketize(values, boundaries)
    # +inf is in the last bucket of its own feature, not past the padding;
    # NaN in the missing bucket, one past the last (2 boundaries: bucket 3).
    assert out.tolist() == [[0, 1, 1, 2, 3, 2, 0], [3, 0, 1, 2, 0, 3, 0]]
    assert transforms.bucketize(torch.tensor([[float("nan")], [float("nan")]]),
                                boundaries).tolist() == [[3], [4]]


def splitmix64(x):
    """SplitMix64's finalizer on Python ints (the published constants)."""
    z = (x + 0x9E3779B97F4A7C15) % 2**64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
    return z ^ (z >> 31)


def hash_combine(*columns):
    """The cross hash on Python ints: `mix64` of the first column, then
    `mix64(h * 0xC2B2AE3D27D4EB4F + next)` for each further one."""
    out = []
    for values in zip(*columns):
        h = splitmix64(values[0])
        for value in values[1:]:
            h = splitmix64(h * 0xC2B2AE3D27D4EB4F + value)
        out.append(h - 2**64 if h >= 2**63 else h)
    return out


def test_cross_reference_is_hash_combine_of_members():
    columns = (torch.arange(12, dtype=torch.int64).view(4, 3) - 6) * (2**59 + 1000003)
    members = torch.tensor([[0, 1, -1], [3, 2, 1], [2, 0, -1]])
    out = transforms.cross(columns, members)
    c = columns.tolist()
    assert out[0].tolist() == hash_combine(c[0], c[1])
    assert out[1].tolist() == hash_combine(c[3], c[2], c[1])
    assert out[2].tolist() == hash_combine(c[2], c[0])


def naive_pack(rows_per_feature, lengths_per_feature, buckets, weights_per_feature=None):
    """pack_sequences as Python loops over features, rows and positions."""
    values, lengths, weights = [], [], []
    for f, (rows, row_lengths, bucket) in enumerate(
            zip(rows_per_feature, lengths_per_feature, buckets)):
        for b, (row, length) in enumerate(zip(rows.tolist(), row_lengths.tolist())):
            kept = row[:length]
            if bucket:
                kept = (mix64(torch.tensor(kept, dtype=torch.int64)) % bucket).tolist()
            values += kept
            lengths.append(length)
            if weights_per_feature is not None:
                weights += weights_per_feature[f][b, :length].tolist()
    offsets = [0] + torch.tensor(lengths, dtype=torch.int64).cumsum(0).tolist()
    return values, offsets, weights


def pack_case(rows_per_feature, lengths_per_feature, buckets):
    """The arguments of pack_sequences for `[batch, w_f]` rows of every feature."""
    batch = rows_per_feature[0].shape[0]
    widths = torch.tensor([r.shape[1] for r in rows_per_feature])
    width_offsets = torch.cat([torch.zeros(1, dtype=torch.int64), widths.cumsum(0)])
    flat = torch.cat([r.reshape(-1) for r in rows_per_feature])
    lengths = torch.cat(lengths_per_feature).to(torch.int64)
    return flat, lengths, width_offsets, torch.tensor(buckets, dtype=torch.int64), batch


def test_pack_sequences_reference_against_python_lists():
    # Feature 0: width 4, no hashing; feature 1: width 2, hashed into 5
    # buckets. Every value is an id (-1 and 0 included): lengths end rows.
    first = torch.tensor([[5, -1, 0, 0], [0, 0, 0, 0], [1, 0, 2, -3]])
    second = torch.tensor([[-7, 8], [-1, -1], [9, 4]])
    lengths = [torch.tensor([2, 0, 4]), torch.tensor([2, 1, 1])]
    case = pack_case([first, second], lengths, [0, 5])
    values, offsets, weights = transforms.pack_sequences(*case)
    expected_values, expected_offsets, _ = naive_pack([first, second], lengths, [0, 5])
    assert values.tolist() == expected_values and offsets.tolist() == expected_offsets
    assert weights is None
    assert values[:6].tolist() == [5, -1, 1, 0, 2, -3]
    assert offsets.tolist()[:4] == [0, 2, 2, 6]


def test_pack_sequences_reference_packs_weights_with_the_ids():
    rows = [torch.tensor([[3, 4, 9], [5, 0, 0]]), torch.tensor([[6], [7]])]
    lengths = [torch.tensor([3, 1]), torch.tensor([0, 1])]
    weights = torch.tensor([0.5, 2.0, -1.0, 4.0, 9.0, 9.0, 9.0, 3.0])
    values, offsets, packed = transforms.pack_sequences(*pack_case(rows, lengths, [0, 0]),
                                                        weights)
    assert values.tolist() == [3, 4, 9, 5, 7]
    assert packed.tolist() == [0.5, 2.0, -1.0, 4.0, 3.0]


def test_pack_sequences_reference_of_an_empty_batch():
    case = pack_case([torch.zeros(0, 3, dtype=torch.int64),
                      torch.zeros(0, 1, dtype=torch.int64)],
                     [torch.zeros(0, dtype=torch.int64)] * 2, [0, 7])
    values, offsets, _ = transforms.pack_sequences(*case)
    assert values.tolist() == [] and offsets.tolist() == [0]


# ---- Triton kernels against the references ---------------------------------------

@requires_triton
@SETTINGS
@given(st.integers(1, 6), st.integers(0, 40), st.randoms(use_true_random=False))
def test_hash_into_buckets_triton(features, n, rng):
    ids = random_ids(rng, features, n)
    buckets = torch.tensor([rng.choice([0, 1, 3, 1000, 2**62]) for _ in range(features)])
    assert_same(transforms.hash_into_buckets_triton(*on_device(ids, buckets)),
                transforms.hash_into_buckets_reference(ids, buckets))


@requires_triton
@pytest.mark.parametrize("features,n", [(1, 1), (1000, 3), (3, 0)])
def test_hash_into_buckets_triton_feature_counts(features, n):
    ids = torch.arange(features * n, dtype=torch.int64).view(features, n) * (2**50 + 1)
    buckets = torch.arange(features, dtype=torch.int64) * 7
    assert_same(transforms.hash_into_buckets_triton(*on_device(ids, buckets)),
                transforms.hash_into_buckets_reference(ids, buckets))


def _boundaries(rng, features, width):
    rows = torch.full((features, width), INF)
    for f in range(features):
        count = rng.randint(1, width)
        rows[f, :count] = torch.tensor(sorted(rng.sample(range(-50, 50), count)),
                                       dtype=torch.float32) / 4
    return rows


@requires_triton
@SETTINGS
@given(st.integers(1, 5), st.integers(0, 30), st.integers(1, 40),
       st.randoms(use_true_random=False))
def test_bucketize_triton(features, n, width, rng):
    special = [float("nan"), INF, -INF, 0.25]          # 0.25: on a boundary
    values = torch.tensor([rng.choice(special) if rng.random() < 0.2
                           else rng.uniform(-15, 15)
                           for _ in range(features * n)]).view(features, n)
    boundaries = _boundaries(rng, features, width)
    assert_same(transforms.bucketize_triton(*on_device(values, boundaries)),
                transforms.bucketize_reference(values, boundaries))


@requires_triton
def test_bucketize_triton_1000_features():
    values = torch.linspace(-3, 3, 2000).view(1000, 2)
    boundaries = torch.tensor([[-1.0, 0.0, 1.0]]).repeat(1000, 1)
    assert_same(transforms.bucketize_triton(*on_device(values, boundaries)),
                transforms.bucketize_reference(values, boundaries))


@requires_triton
@SETTINGS
@given(st.integers(2, 6), st.integers(1, 5), st.integers(0, 30),
       st.randoms(use_true_random=False))
def test_cross_triton(columns_count, crosses, n, rng):
    columns = random_ids(rng, columns_count, n)
    arities = [3 if columns_count > 2 and rng.random() < 0.5 else 2 for _ in range(crosses)]
    members = torch.tensor([(rng.sample(range(columns_count), k) + [-1])[:3]
                            for k in arities])
    assert_same(transforms.cross_triton(*on_device(columns, members)),
                transforms.cross_reference(columns, members))


@requires_triton
def test_cross_triton_ids_at_the_int64_limits():
    columns = torch.tensor([[INT64_MIN, INT64_MAX, 0], [1, -1, 2**62]])
    members = torch.tensor([[0, 1, -1], [1, 0, -1], [1, 1, 0]])
    assert_same(transforms.cross_triton(*on_device(columns, members)),
                transforms.cross_reference(columns, members))


def _rows_and_lengths(rng, batch, width):
    """Rows of random ids (any int64) and their lengths (some 0 or full)."""
    rows = random_ids(rng, batch, width) if rng.random() < 0.3 else \
        torch.tensor([[rng.randint(-3, 99) for _ in range(width)] for _ in range(batch)],
                     dtype=torch.int64).view(batch, width)
    lengths = torch.tensor([rng.choice([0, width, rng.randint(0, width)])
                            for _ in range(batch)], dtype=torch.int64)
    return rows, lengths


@requires_triton
@SETTINGS
@given(st.lists(st.sampled_from([1, 2, 3, 7, 37, 130]), min_size=1, max_size=3),
       st.integers(0, 5), st.booleans(), st.randoms(use_true_random=False))
def test_pack_sequences_triton(widths, batch, weighted, rng):
    rows, lengths = zip(*[_rows_and_lengths(rng, batch, width) for width in widths])
    buckets = [rng.choice([0, 0, 1, 7, 2**62]) for _ in widths]
    flat, lengths_, width_offsets, buckets, batch = pack_case(rows, lengths, buckets)
    weights = torch.randn(flat.numel()) if weighted else None
    moved = on_device(flat, lengths_, width_offsets, buckets,
                      *([] if weights is None else [weights]))
    values, offsets, packed = transforms.pack_sequences_triton(
        *moved[:4], batch, moved[4] if weighted else None)
    expected = transforms.pack_sequences_reference(flat, lengths_, width_offsets,
                                                   buckets, batch, weights)
    assert_same(values, expected[0])
    assert_same(offsets, expected[1])
    if weighted:
        assert_same(packed, expected[2])
    per_feature = None if weights is None else [
        chunk.view(batch, w) for chunk, w in zip(torch.split(
            weights, [batch * w for w in widths]), widths)]
    assert (expected[0].tolist(), expected[1].tolist(),
            [] if weights is None else expected[2].tolist()) == naive_pack(
        rows, lengths, buckets.tolist(), per_feature)


# ---- the entry points dispatch to the kernels ---------------------------------------

@requires_triton
def test_entry_points_launch_one_kernel_each_on_the_triton_route(monkeypatch):
    ids = torch.arange(12, dtype=torch.int64).view(4, 3) - 2
    buckets = torch.tensor([0, 5, 0, 9])
    values = torch.tensor([[0.5, float("nan"), INF]])
    boundaries = torch.tensor([[0.0, 1.0, INF, INF]])
    members = torch.tensor([[0, 1, -1], [3, 2, 1]])
    pack = pack_case([torch.tensor([[4, -1], [0, 0], [-2, 3]]),
                      torch.tensor([[7], [0], [8]])],
                     [torch.tensor([2, 0, 2]), torch.tensor([1, 0, 1])], [11, 0])
    expected = [transforms.hash_into_buckets(ids, buckets),
                transforms.bucketize(values, boundaries),
                transforms.cross(ids, members),
                *transforms.pack_sequences(*pack)[:2]]
    launches = Launches(monkeypatch, transforms)
    with triton_route():
        out = [transforms.hash_into_buckets(*on_device(ids, buckets)),
               transforms.bucketize(*on_device(values, boundaries)),
               transforms.cross(*on_device(ids, members)),
               *transforms.pack_sequences(*on_device(*pack[:4]), pack[4])[:2]]
    for actual, reference in zip(out, expected):
        assert_same(actual, reference)
    assert launches.counts == {"_hash_into_buckets_kernel": 1, "_bucketize_kernel": 1,
                               "_cross_kernel": 1, "_pack_sequences_kernel": 1}
