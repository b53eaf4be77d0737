import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from kernel_cases import (INT64_MAX, INT64_MIN, SETTINGS, assert_same, on_device,
                          requires_triton)

from reckeras.backend_kernels import transforms
from reckeras.backend_kernels.hashing import hash_combine, mix64

MISSING = transforms.MISSING_ID


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


def test_bucketize_reference_is_a_per_feature_searchsorted():
    values = torch.tensor([[-1.0, 0.0, 0.5, 2.0, float("nan")],
                           [3.0, -7.0, 1.0, 1.5, 0.0]])
    boundaries = torch.tensor([[0.0, 1.0, float("inf")], [1.0, 1.5, 2.0]])
    out = transforms.bucketize(values, boundaries)
    assert out.tolist() == [[0, 1, 1, 2, MISSING], [3, 0, 1, 2, 0]]


def test_cross_reference_is_hash_combine_of_members():
    columns = torch.arange(12, dtype=torch.int64).view(4, 3) * 1000003
    members = torch.tensor([[0, 1, -1], [3, 2, 1], [2, 0, -1]])
    out = transforms.cross(columns, members)
    assert torch.equal(out[0], hash_combine(columns[[0, 1]]))
    assert torch.equal(out[1], hash_combine(columns[[3, 2, 1]]))
    assert torch.equal(out[2], hash_combine(columns[[2, 0]]))


def test_sequence_references_against_python_lists():
    padded = torch.tensor([[5, 6, -1, -1], [-1, -1, -1, -1], [1, -1, 2, 3], [9, 8, 7, 6]])
    values, offsets = transforms.pack_padded(padded)
    bags = [[5, 6], [], [1, 2, 3], [9, 8, 7, 6]]
    assert values.tolist() == sum(bags, []) and offsets.tolist() == [0, 2, 2, 5, 9]
    # Two features of batch 2: feature 0 keeps 1 id per bag, feature 1 keeps 3.
    cut_values, cut_offsets = transforms.cutoff(values, offsets, torch.tensor([1, 3]), 2)
    assert cut_values.tolist() == [6, 1, 2, 3, 8, 7, 6]
    assert cut_offsets.tolist() == [0, 1, 1, 4, 7]
    assert transforms.pad(values, offsets, 3).tolist() == \
        [[5, 6, -1], [-1, -1, -1], [1, 2, 3], [9, 8, 7]]


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
    rows = torch.full((features, width), float("inf"))
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
    values = torch.tensor([rng.uniform(-15, 15) for _ in range(features * n)]).view(features, n)
    if values.numel():
        values.view(-1)[0] = float("nan")
        values.view(-1)[-1] = 0.25            # on a boundary
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
def test_cross_triton_two_column_members():
    columns = torch.tensor([[INT64_MIN, INT64_MAX, 0], [1, -1, 2**62]])
    members = torch.tensor([[0, 1], [1, 0]])
    assert_same(transforms.cross_triton(*on_device(columns, members)),
                transforms.cross_reference(columns, members))


def _bags(rng, count, longest):
    lengths = [rng.choice([0, 1, rng.randint(0, longest)]) for _ in range(count)]
    values = torch.tensor([rng.randint(0, 99) for _ in range(sum(lengths))],
                          dtype=torch.int64)
    offsets = torch.tensor([0] + lengths).cumsum(0)
    return values, offsets


@requires_triton
@SETTINGS
@given(st.integers(0, 12), st.integers(0, 150), st.randoms(use_true_random=False))
def test_pack_padded_triton(rows, width, rng):
    padded = torch.tensor([rng.choice([MISSING, MISSING, rng.randint(0, 9)])
                           for _ in range(rows * width)], dtype=torch.int64).view(rows, width)
    values, offsets = transforms.pack_padded_triton(on_device(padded))
    expected_values, expected_offsets = transforms.pack_padded_reference(padded)
    assert_same(values, expected_values)
    assert_same(offsets, expected_offsets)


@requires_triton
@SETTINGS
@given(st.integers(1, 3), st.integers(0, 6), st.randoms(use_true_random=False))
def test_cutoff_triton(features, batch, rng):
    values, offsets = _bags(rng, features * batch, 140)
    max_len = torch.tensor([rng.randint(1, 150) for _ in range(features)])
    out = transforms.cutoff_triton(*on_device(values, offsets, max_len), batch)
    expected = transforms.cutoff_reference(values, offsets, max_len, batch)
    assert_same(out[0], expected[0])
    assert_same(out[1], expected[1])


@requires_triton
@SETTINGS
@given(st.integers(0, 8), st.integers(0, 140), st.randoms(use_true_random=False))
def test_pad_triton(bags, width, rng):
    values, offsets = _bags(rng, bags, 140)
    assert_same(transforms.pad_triton(*on_device(values, offsets), width),
                transforms.pad_reference(values, offsets, width))
