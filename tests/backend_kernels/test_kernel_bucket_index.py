"""The bucketized index: the torch reference, the native CPU kernel and the
Triton kernels against a Python dict of key -> row.

Batches of keys (duplicates, the int64 extremes, keys sharing their low or
their high bits) go in one after the other, into arrays grown as a table
grows them (`grown`: `room_needed`, then a copy into zero-filled larger
arrays). After each batch the rows must be the dict's (a key keeps its row,
the rows are 0..n-1, the arena holds each row's key), every implementation's
find must agree, absent keys must be -1 and the index must be well formed.
"""

from typing import Callable, NamedTuple

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from kernel_cases import (DEVICE, INT64_MAX, INT64_MIN, SETTINGS, on_cpu, requires_triton,
                          triton_route)

from reckeras.backend_kernels import bucket_index, cpu_native
from reckeras.backend_kernels.bucket_index import SLOTS, load, new_index, room_needed, views
from reckeras.backend_kernels.dispatch import TRITON_AVAILABLE

requires_native = pytest.mark.skipif(not cpu_native.available(),
                                     reason="no C compiler: native kernels unavailable")

NEAR_LIMITS = [INT64_MIN, INT64_MIN + 1, INT64_MAX, INT64_MAX - 1, 0, -1]
ABSENT = [12345, INT64_MAX - 7, -99, INT64_MIN + 3]

keys_ = st.one_of(
    st.integers(-20, 20), st.integers(INT64_MIN, INT64_MAX), st.sampled_from(NEAR_LIMITS),
    st.integers(0, 15).map(lambda k: k << 59),                    # the same low bits
    st.integers(0, 255).map(lambda k: (0x5EED << 48) | k),        # the same high bits
    st.integers(0, 255).map(lambda k: INT64_MIN + k))             # ... and negative
key_batches = st.lists(st.lists(keys_, max_size=60), min_size=1, max_size=4)


# ---- the implementations, as a caller sees them -------------------------------------

def _native_find(index, arena, keys, num_rows):
    return cpu_native.bucket_find_or_insert(*index, arena, keys, num_rows, insert=False)[0]


def _triton_insert(index, arena, keys, num_rows):
    with triton_route():
        return bucket_index.find_or_insert_triton(*index, arena, keys, num_rows)


def _triton_find(index, arena, keys, num_rows):
    with triton_route():
        return bucket_index.find_triton(*index, arena, keys)


class Implementation(NamedTuple):
    insert: Callable        # (index, arena, keys, num_rows) -> (rows, num_rows)
    find: Callable          # (index, arena, keys, num_rows) -> rows
    device: torch.device    # of the index's arrays, the arena and the keys


IMPLEMENTATIONS = {
    "reference": Implementation(
        lambda index, arena, keys, num_rows: bucket_index.find_or_insert_reference(
            *index, arena, keys, num_rows),
        lambda index, arena, keys, num_rows: bucket_index.find_reference(*index, arena, keys),
        torch.device("cpu")),
    "native": Implementation(
        lambda index, arena, keys, num_rows: cpu_native.bucket_find_or_insert(
            *index, arena, keys, num_rows),
        _native_find, torch.device("cpu")),
    "triton": Implementation(_triton_insert, _triton_find, DEVICE),
}
NAMES = ["reference", pytest.param("native", marks=requires_native),
         pytest.param("triton", marks=requires_triton)]
AVAILABLE = ["reference"] + ["native"] * cpu_native.available() + ["triton"] * TRITON_AVAILABLE


def moved(device, index, arena):
    """The index's arrays and the arena on `device` (`shape` stays on the CPU)."""
    return (*(t.to(device) for t in index[:2]), index[2]), arena.to(device)


def grown(index, arena, num_rows, new_keys):
    """Room for `new_keys` more keys, as a table makes it: the capacities of
    `room_needed` (and arena rows for them), each array that falls short
    copied into a zero-filled larger one on its device."""
    capacity, directory_capacity = room_needed(index[2], new_keys)

    def larger(array, size):
        if array.shape[0] >= size:
            return array
        copy = array.new_zeros((size, *array.shape[1:]))
        copy[:array.shape[0]] = array
        return copy

    buckets, directory, shape = index
    return ((larger(buckets, capacity), larger(directory, directory_capacity), shape),
            larger(arena, num_rows + new_keys))


def empty_index(device=torch.device("cpu")):
    return moved(device, new_index(), torch.zeros(0, dtype=torch.int64))


def assert_well_formed(index, arena, num_rows):
    """The layout every implementation writes: each row in one slot, its
    digest set, the bytes past the depth zero, the directory pointing each
    bucket from one aligned range of 2**(global - local depth) entries,
    nothing past the buckets in use."""
    (buckets, directory), shape = on_cpu(*index[:2]), index[2]
    digests, slots, depths = views(buckets)
    count, depth = shape.tolist()
    assert 1 <= count <= buckets.shape[0] and 2 ** depth <= directory.shape[0]
    assert digests.shape == slots.shape == (buckets.shape[0], SLOTS)
    used = slots[:count] != 0
    assert torch.equal(digests[:count] != 0, used)
    assert not buckets[count:].any()
    assert not buckets.view(torch.uint8)[:, 26:28].any()
    assert sorted((slots[:count][used].long() - 1).tolist()) == list(range(num_rows))
    local = depths[:count].long()
    assert bool((local <= depth).all())
    entries = directory[:2 ** depth].long()
    assert bool((entries >= 0).all()) and bool((entries < count).all())
    assert torch.equal(torch.bincount(entries, minlength=count), 2 ** (depth - local))
    span = 2 ** (depth - local.index_select(0, entries))
    position = torch.arange(entries.numel())
    assert torch.equal(entries.index_select(0, position - position % span), entries)
    assert len(set(on_cpu(arena)[:num_rows].tolist())) == num_rows


def insert_batch(name, index, arena, num_rows, mapping, batch):
    """Inserts `batch` with implementation `name` into the index grown for
    it, checks the rows against `mapping` (updated) and returns the index,
    the arena and the row count."""
    impl = IMPLEMENTATIONS[name]
    index, arena = moved(impl.device, *grown(index, arena, num_rows, len(batch)))
    keys = torch.tensor(batch, dtype=torch.int64, device=impl.device)
    rows, count = impl.insert(index, arena, keys, num_rows)
    rows = on_cpu(rows)
    for key, row in zip(batch, rows.tolist()):
        assert mapping.setdefault(key, row) == row                # same key, same row
    assert count == len(mapping)
    assert sorted(mapping.values()) == list(range(count))         # dense 0..n-1
    stored = on_cpu(arena)
    assert all(stored[row] == key for key, row in mapping.items())
    return index, arena, count


@pytest.mark.parametrize("name", NAMES)
@SETTINGS
@given(key_batches)
def test_find_or_insert_is_a_consistent_dense_mapping(name, batches):
    impl = IMPLEMENTATIONS[name]
    index, arena = empty_index(impl.device)
    mapping, num_rows = {}, 0
    for batch in batches:
        index, arena, num_rows = insert_batch(name, index, arena, num_rows, mapping, batch)
        keys = torch.tensor(batch, dtype=torch.int64, device=impl.device)
        expected = [mapping[key] for key in batch]
        assert on_cpu(impl.find(index, arena, keys, num_rows)).tolist() == expected
        # Found again: the same rows, nothing written.
        before = [t.clone() for t in (*index, arena)]
        rows, count = impl.insert(index, arena, keys, num_rows)
        assert on_cpu(rows).tolist() == expected and count == num_rows
        assert all(torch.equal(t, b) for t, b in zip((*index, arena), before))
        assert_well_formed(index, arena, num_rows)
    absent = torch.tensor([k for k in ABSENT if k not in mapping], dtype=torch.int64)
    assert on_cpu(impl.find(index, arena, absent.to(impl.device), num_rows)).tolist() == \
        [-1] * absent.numel()
    assert load(index[2], num_rows) == num_rows / (int(index[2][0]) * SLOTS)


@SETTINGS
@given(key_batches, st.data())
def test_implementations_share_one_index(batches, data):
    """One layout: each batch is inserted by one implementation and read by
    another, so an index moves between the CPU kernels and the GPU ones
    (checkpoints, tests) and any of them can go on inserting into it."""
    index, arena = empty_index()
    mapping, num_rows = {}, 0
    for batch in batches:
        writer = data.draw(st.sampled_from(AVAILABLE), label="writer")
        index, arena, num_rows = insert_batch(writer, index, arena, num_rows, mapping, batch)
        index, arena = moved(torch.device("cpu"), index, arena)
        assert_well_formed(index, arena, num_rows)
        everything = torch.tensor([*mapping, *(k for k in ABSENT if k not in mapping)],
                                  dtype=torch.int64)
        expected = [*mapping.values()] + [-1] * (everything.numel() - len(mapping))
        for reader in AVAILABLE:
            impl = IMPLEMENTATIONS[reader]
            on_reader, reader_arena = moved(impl.device, index, arena)
            found = impl.find(on_reader, reader_arena, everything.to(impl.device), num_rows)
            assert on_cpu(found).tolist() == expected, (writer, reader)


@pytest.mark.parametrize("name", NAMES)
def test_many_keys_into_a_one_bucket_index(name):
    # 5500 keys (1375 in Triton's interpreter, a program at a time) from one
    # bucket and a depth of 0: splits on splits, the directory doubling again
    # and again inside one call.
    part = 4 if name == "triton" else 1
    generator = torch.Generator().manual_seed(5)
    keys = torch.cat([torch.randint(INT64_MIN, INT64_MAX, (3000 // part,), generator=generator),
                      torch.arange(-1000 // part, 1000 // part),
                      (0x5EED << 48) | torch.arange(500 // part)])
    keys = keys[torch.randperm(keys.numel(), generator=generator)]
    mapping = {}
    index, arena = empty_index()
    index, arena, num_rows = insert_batch(name, index, arena, 0, mapping, keys.tolist())
    count, depth = index[2].tolist()
    assert num_rows == len(set(keys.tolist())) and count > keys.numel() // SLOTS
    assert depth >= (6 if part > 1 else 8)
    assert 0.5 < load(index[2], num_rows) <= 1
    assert_well_formed(index, arena, num_rows)
    impl = IMPLEMENTATIONS[name]
    found = impl.find(index, arena, keys.to(impl.device), num_rows)
    assert on_cpu(found).tolist() == [mapping[k] for k in keys.tolist()]


def assert_partial(rows, count, keys, num_rows):
    """Rows of a call that ran out of room: the keys placed have distinct
    rows num_rows..count-1, every copy of a key the same result."""
    result = {}
    for key, row in zip(keys.tolist(), rows.tolist()):
        assert result.setdefault(key, row) == row
    placed = sorted(row for row in result.values() if row >= 0)
    assert placed == list(range(num_rows, count))
    return result


@pytest.mark.parametrize("name", NAMES)
def test_no_room_leaves_keys_out_and_the_next_call_places_them(name):
    # One bucket and a directory of one entry: 25 keys fit, the bucket
    # cannot split, the other 75 resolve to -1 and nothing of them is kept.
    impl = IMPLEMENTATIONS[name]
    keys = torch.arange(100) * 7919 - 500
    index, arena = moved(impl.device, new_index(1, 1), torch.zeros(100, dtype=torch.int64))
    rows, count = impl.insert(index, arena, keys.to(impl.device), 0)
    rows = on_cpu(rows)
    assert count == SLOTS and int((rows < 0).sum()) == 100 - SLOTS
    assert_partial(rows, count, keys, 0)
    assert index[2].tolist() == [1, 0]
    assert torch.equal(on_cpu(arena)[rows[rows >= 0]], keys[rows >= 0])
    assert on_cpu(impl.find(index, arena, keys.to(impl.device), count)).tolist() == \
        rows.tolist()
    assert_well_formed(index, arena, count)
    # Grown as room_needed says, the same call places the rest.
    index, arena = grown(index, arena, count, 100 - SLOTS)
    again, total = impl.insert(index, arena, keys.to(impl.device), count)
    again = on_cpu(again)
    assert total == 100 and torch.equal(again[rows >= 0], rows[rows >= 0])
    assert sorted(again[rows < 0].tolist()) == list(range(SLOTS, 100))
    assert torch.equal(on_cpu(arena)[again], keys)
    assert_well_formed(index, arena, total)


@pytest.mark.parametrize("name", NAMES)
@SETTINGS
@given(st.integers(1, 4), st.integers(0, 3), st.lists(keys_, min_size=40, max_size=150),
       st.integers(0, 150))
def test_too_small_arrays_keep_what_fits(name, capacity, directory_bits, keys, arena_rows):
    """Arrays of a few buckets and a small directory, an arena of a few rows:
    what fits is placed, consistently, and after growing them as
    `room_needed` says a second call places the rest."""
    impl = IMPLEMENTATIONS[name]
    keys = torch.tensor(keys, dtype=torch.int64)
    index, arena = moved(impl.device, new_index(2 ** directory_bits, capacity),
                         torch.zeros(arena_rows, dtype=torch.int64))
    rows, count = impl.insert(index, arena, keys.to(impl.device), 0)
    rows = on_cpu(rows)
    result = assert_partial(rows, count, keys, 0)
    distinct = len(result)
    assert count <= min(arena_rows, capacity * SLOTS, distinct)
    if distinct > capacity * SLOTS or distinct > arena_rows:
        assert bool((rows < 0).any())
    assert on_cpu(impl.find(index, arena, keys.to(impl.device), count)).tolist() == \
        rows.tolist()
    assert_well_formed(index, arena, count)
    index, arena = grown(index, arena, count, distinct - count)
    again, total = impl.insert(index, arena, keys.to(impl.device), count)
    again = on_cpu(again)
    assert total == distinct and torch.equal(again[rows >= 0], rows[rows >= 0])
    assert_partial(again, total, keys, 0)
    assert torch.equal(on_cpu(arena)[again], keys)
    assert_well_formed(index, arena, total)


def test_the_reference_numbers_a_round_in_key_order():
    # Eight keys in one bucket: no split, one round, numbered smallest first
    # after the rows already there; a key already there keeps its row.
    index, arena = new_index(4, 2), torch.zeros(16, dtype=torch.int64)
    rows, count = bucket_index.find_or_insert_reference(*index, arena, torch.tensor([100, -100]),
                                                        0)
    assert rows.tolist() == [1, 0] and count == 2
    keys = torch.tensor([9, INT64_MIN, 4, 9, -1, -100, INT64_MAX, 0, 4])
    rows, count = bucket_index.find_or_insert_reference(*index, arena, keys, count)
    assert rows.tolist() == [6, 2, 5, 6, 3, 0, 7, 4, 5] and count == 8
    assert arena[:8].tolist() == [-100, 100, INT64_MIN, -1, 0, 4, 9, INT64_MAX]
    assert index[2].tolist() == [1, 0]


def test_the_reference_is_deterministic():
    generator = torch.Generator().manual_seed(3)
    batches = [torch.randint(-500, 500, (n,), generator=generator) * 2**40
               for n in (300, 40, 700)]
    results = []
    for _ in range(2):
        index, arena, num_rows, rows = *empty_index(), 0, []
        for keys in batches:
            index, arena = grown(index, arena, num_rows, keys.numel())
            found, num_rows = bucket_index.find_or_insert_reference(*index, arena, keys,
                                                                    num_rows)
            rows.append(found)
        results.append((*rows, *index, arena))
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_load_and_room_needed():
    # room_needed: the buckets in use, one more for every 6 new keys and 8; the directory
    # 2** (the depth of that many buckets, or the global depth if larger, + 2).
    assert room_needed(new_index()[2], 0) == (9, 64)
    assert room_needed(new_index()[2], 5) == (9, 64)
    assert room_needed(new_index()[2], 1000) == (175, 1024)
    assert room_needed(torch.tensor([5, 3]), 10) == (14, 64)
    assert room_needed(torch.tensor([5, 9]), 10) == (14, 2**11)
    assert room_needed(torch.tensor([3, 31]), 1) == (11, 2**32)          # at most 32 bits
    assert load(new_index()[2], 5) == 0.2
    assert load(torch.tensor([4, 2]), 75) == 0.75
    assert load(torch.tensor([10, 5]), 0) == 0.0


def test_new_index_is_one_empty_bucket_and_views_write_through():
    buckets, directory, shape = new_index(8, 3)
    assert (buckets.shape, buckets.dtype) == ((3, 32), torch.int32)
    assert (directory.shape, directory.dtype) == ((8,), torch.int32)
    assert shape.tolist() == [1, 0] and shape.dtype == torch.int64 and shape.is_cpu
    assert not buckets.any() and not directory.any()
    assert bucket_index.find_reference(buckets, directory, shape,
                                       torch.zeros(0, dtype=torch.int64),
                                       torch.tensor(NEAR_LIMITS)).tolist() == [-1] * 6
    # One 128-byte bucket a row: digests at bytes 0-24, the depth at 25, rows at words 7-31.
    digests, rows, depths = views(buckets)
    digests[1, 24], depths[1], rows[1, 0], rows[2, 24] = 7, 3, -5, 9
    raw = buckets.view(torch.uint8)
    assert (raw[1, 24], raw[1, 25]) == (7, 3)
    assert (buckets[1, 7], buckets[2, 31]) == (-5, 9)
    assert int((buckets != 0).sum()) == 3          # the last digest and the depth: word 6


def test_most_keys_sit_in_their_first_bucket():
    """Placement prefers a key's first bucket, so a lookup reads one line
    for most keys."""
    generator = torch.Generator().manual_seed(11)
    keys = torch.randint(INT64_MIN, INT64_MAX, (4000,), generator=generator)
    index, arena = grown(*empty_index(), 0, keys.numel())
    rows, _ = bucket_index.find_or_insert_reference(*index, arena, keys, 0)
    buckets, directory, shape = index
    first, _, digest = bucket_index._hashes(keys)
    home = bucket_index._buckets(directory, first, int(shape[1]))
    in_first = (views(buckets)[1].index_select(0, home) == (rows + 1)[:, None].int()).any(1)
    assert float(in_first.float().mean()) > 0.6
