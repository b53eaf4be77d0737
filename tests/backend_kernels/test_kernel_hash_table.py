import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from kernel_cases import (INT64_MAX, INT64_MIN, SETTINGS, on_cpu, on_device,
                          requires_triton)

from reckeras.backend_kernels import hash_table

EMPTY = hash_table.EMPTY
NEAR_LIMITS = [INT64_MIN, INT64_MIN + 1, INT64_MAX, INT64_MAX - 1, 0, -1]

key_batches = st.lists(
    st.lists(st.one_of(st.integers(-20, 20), st.integers(INT64_MIN, INT64_MAX),
                       st.sampled_from(NEAR_LIMITS),
                       st.integers(0, 15).map(lambda k: k << 59)),   # same low bits
             max_size=60),
    min_size=1, max_size=4)

IMPLEMENTATIONS = {
    "reference": (hash_table.find_or_insert_reference, hash_table.find_reference),
    "triton": (hash_table.find_or_insert_triton, hash_table.find_triton),
}


def stored(key):
    return key + 1 if key == EMPTY else key


def run_batches(find_or_insert, find, batches, device_of):
    """Inserts the batches one after the other, checking the mapping as a set."""
    capacity = hash_table.capacity_for(sum(len(b) for b in batches))
    slot_keys, slot_rows = device_of(*hash_table.new_slots(capacity))
    mapping, num_rows = {}, 0
    for batch in batches:
        keys = device_of(torch.tensor(batch, dtype=torch.int64))
        rows, num_rows = find_or_insert(slot_keys, slot_rows, keys, num_rows)
        for key, row in zip(batch, on_cpu(rows).tolist()):
            assert mapping.setdefault(stored(key), row) == row   # same key, same row
        assert len(set(mapping.values())) == len(mapping)        # distinct keys, rows
        assert sorted(mapping.values()) == list(range(num_rows))  # dense 0..n-1
        assert on_cpu(find(slot_keys, slot_rows, keys)).tolist() == on_cpu(rows).tolist()
    return slot_keys, slot_rows, mapping


@pytest.mark.parametrize("name", ["reference",
                                  pytest.param("triton", marks=requires_triton)])
@SETTINGS
@given(key_batches)
def test_find_or_insert_is_a_consistent_dense_mapping(name, batches):
    find_or_insert, find = IMPLEMENTATIONS[name]
    device_of = on_device if name == "triton" else (lambda *t: t if len(t) > 1 else t[0])
    slot_keys, slot_rows, mapping = run_batches(find_or_insert, find, batches, device_of)
    absent = [k for k in (12345, INT64_MAX - 7, -99) if stored(k) not in mapping]
    if absent:
        rows = find(slot_keys, slot_rows, device_of(torch.tensor(absent)))
        assert on_cpu(rows).tolist() == [-1] * len(absent)


@requires_triton
@SETTINGS
@given(key_batches)
def test_reference_and_triton_read_each_others_maps(batches):
    """One layout: a map built by either side is found by the other, so maps
    can move between CPU and GPU (checkpoints, tests)."""
    keys = torch.tensor(sum(batches, []), dtype=torch.int64)
    capacity = hash_table.capacity_for(keys.numel())
    cpu_keys, cpu_rows = hash_table.new_slots(capacity)
    rows, _ = hash_table.find_or_insert_reference(cpu_keys, cpu_rows, keys, 0)
    assert on_cpu(hash_table.find_triton(*on_device(cpu_keys, cpu_rows, keys))).tolist() \
        == rows.tolist()
    gpu_keys, gpu_rows = on_device(*hash_table.new_slots(capacity))
    rows, _ = hash_table.find_or_insert_triton(gpu_keys, gpu_rows, on_device(keys), 0)
    assert hash_table.find_reference(on_cpu(gpu_keys), on_cpu(gpu_rows), keys).tolist() \
        == on_cpu(rows).tolist()


def test_reference_is_deterministic_and_numbers_frequent_keys_first():
    keys = torch.tensor([5, 9, 9, 7, 9, 7, 11])
    results = []
    for _ in range(2):
        slot_keys, slot_rows = hash_table.new_slots(32)
        results.append(hash_table.find_or_insert_reference(slot_keys, slot_rows, keys, 10)[0])
    assert torch.equal(results[0], results[1])
    assert results[0].tolist() == [12, 10, 10, 11, 10, 11, 13]


@pytest.mark.parametrize("name", ["reference",
                                  pytest.param("triton", marks=requires_triton)])
def test_rehash_keeps_every_pair(name):
    device_of = on_device if name == "triton" else (lambda *t: t if len(t) > 1 else t[0])
    find = IMPLEMENTATIONS[name][1]
    keys = torch.tensor(NEAR_LIMITS[1:] + list(range(-20 << 58, 20 << 58, 1 << 58)))
    slot_keys, slot_rows = device_of(*hash_table.new_slots(128))
    rows, count = IMPLEMENTATIONS[name][0](slot_keys, slot_rows, device_of(keys), 0)
    new_keys, new_rows = hash_table.rehash(slot_keys, slot_rows, 256)
    assert new_keys.numel() == 256 and count == len(set(keys.tolist()))
    assert on_cpu(find(new_keys, new_rows, device_of(keys))).tolist() == \
        on_cpu(rows).tolist()


def test_capacity_for_and_new_slots():
    assert hash_table.capacity_for(0) == 16 and hash_table.capacity_for(9) == 32
    with pytest.raises(ValueError, match="power of two"):
        hash_table.new_slots(24)
    slot_keys, slot_rows = hash_table.new_slots(16)
    assert (slot_keys == EMPTY).all() and (slot_rows == -1).all()
