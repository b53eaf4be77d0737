import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st
from kernel_cases import (INT64_MAX, INT64_MIN, SETTINGS, assert_same, on_device,
                          requires_triton)

from reckeras.backend_kernels import hashing

int64s = st.integers(INT64_MIN, INT64_MAX)
EDGES = [0, 1, -1, INT64_MIN, INT64_MIN + 1, INT64_MAX, INT64_MAX - 1, 2**32, -2**32]


def splitmix64(x):
    """SplitMix64's finalizer on Python ints (the published constants)."""
    z = (x + 0x9E3779B97F4A7C15) % 2**64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
    z ^= z >> 31
    return z - 2**64 if z >= 2**63 else z


def fnv1a(data: bytes):
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) % 2**64
    return (splitmix64(h - 2**64 if h >= 2**63 else h)) & INT64_MAX


def test_mix64_is_splitmix64_on_edge_values():
    x = torch.tensor(EDGES, dtype=torch.int64)
    assert hashing.mix64(x).tolist() == [splitmix64(v) for v in EDGES]
    assert hashing.mix64_numpy(x.numpy()).tolist() == [splitmix64(v) for v in EDGES]


@SETTINGS
@given(st.lists(int64s, max_size=40))
def test_mix64_reference_matches_python_and_numpy(values):
    x = torch.tensor(values, dtype=torch.int64)
    expected = [splitmix64(v) for v in values]
    assert hashing.mix64_reference(x).tolist() == expected
    assert hashing.mix64_numpy(x.numpy()).tolist() == expected


def test_hash_combine_reference_is_a_fold_of_mix64():
    a, b, c = (torch.tensor(EDGES, dtype=torch.int64).roll(k) for k in range(3))
    k = hashing.COMBINE
    two = [splitmix64(((splitmix64(x) * k + y + 2**63) % 2**64) - 2**63)
           for x, y in zip(a.tolist(), b.tolist())]
    assert hashing.hash_combine_reference(torch.stack([a, b])).tolist() == two
    three = [splitmix64(((h * k + z + 2**63) % 2**64) - 2**63)
             for h, z in zip(two, c.tolist())]
    assert hashing.hash_combine_reference(torch.stack([a, b, c])).tolist() == three


STRINGS = ["", "a", "abc", "C1_8f3a", "héllo wörld", "x" * 70, "日本語", "\x00"]


def _packed(strings):
    encoded = [s.encode("utf-8") for s in strings]
    data = np.frombuffer(b"".join(encoded), dtype=np.uint8).copy()
    offsets = np.cumsum([0] + [len(e) for e in encoded]).astype(np.int64)
    return data, offsets


def test_hash_strings_is_fnv1a_then_mix64_and_non_negative():
    data, offsets = _packed(STRINGS)
    ids = hashing.hash_strings(data, offsets)
    assert ids.tolist() == [fnv1a(s.encode("utf-8")) for s in STRINGS]
    assert (ids >= 0).all()


@requires_triton
@SETTINGS
@given(st.lists(int64s, max_size=300))
def test_mix64_triton_matches_reference(values):
    x = torch.tensor(values + EDGES, dtype=torch.int64)
    assert_same(hashing.mix64_triton(on_device(x)), hashing.mix64_reference(x))


@requires_triton
def test_mix64_triton_keeps_shape_and_handles_empty():
    x = torch.arange(-6, 6, dtype=torch.int64).view(3, 4) * (2**60)
    assert_same(hashing.mix64_triton(on_device(x)), hashing.mix64_reference(x))
    empty = torch.zeros(0, dtype=torch.int64)
    assert_same(hashing.mix64_triton(on_device(empty)), empty)
