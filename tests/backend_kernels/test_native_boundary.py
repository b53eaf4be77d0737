"""The Python boundary of the native CPU kernels, fuzzed (issue 17, item 4).

Every wrapper of `cpu_native` is called with hypothesis-generated valid
arguments (empty tensors, ids at the int64 extremes, duplicates), and then
once for every way of breaking one of them: a wrong dtype, not a tensor, a
meta tensor, a dim too many or too few, a non-contiguous view, a length off
by one, an index out of range (negative, at the bound, far past it, the
int64 extremes), a scalar negative, fractional, a string or past int64. The
valid call must return what the torch reference of its kernel family
returns; each broken one must raise the predicted `TypeError` or
`ValueError`, naming the broken argument, and leave what the caller passed
unchanged. No call may crash the process: a segfault would
kill pytest itself, and under scripts/test_sanitized.sh (AddressSanitizer
and UBSan) any read or write out of bounds aborts it.
"""

import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reckeras.backend_kernels import bucket_index, cpu_native, hash_table, sparse_optimizers
from reckeras.backend_kernels.aggregation import aggregate_row_grads_reference
from reckeras.backend_kernels.hashing import initial_rows_reference, mix64_reference
from reckeras.backend_kernels.pooling import pooled_lookup_reference
from reckeras.backend_kernels.ragged_layout import bag_of_ids_reference, compact_present_reference

pytestmark = pytest.mark.skipif(not cpu_native.available(),
                                reason="no C compiler: native kernels unavailable")

INT64_MIN, INT64_MAX = -2**63, 2**63 - 1
# Each example makes the valid call and every broken one (~40): few examples suffice.
FUZZ = settings(max_examples=25, deadline=None, print_blob=True)

int64s = st.integers(INT64_MIN, INT64_MAX)
WRONG_DTYPES = {torch.int64: [torch.int32, torch.float64, torch.bool, torch.float32],
                torch.float32: [torch.float64, torch.int64, torch.bool, torch.float16]}
# Table rows may also be float16 or bfloat16.
WRONG_ROW_DTYPES = [torch.float64, torch.int64, torch.bool, torch.int16]


# ---- breaking one argument -----------------------------------------------------------

def _strided(tensor):
    """The same values in a non-contiguous view (contiguous when too small to differ)."""
    if tensor.dim() == 1:
        return tensor.repeat_interleave(2)[::2]
    return tensor.t().contiguous().t()


def tensor_breaks(tensor, wrong_dtypes=None):
    """(how, error, broken value) for the ways any tensor argument can be wrong."""
    breaks = [(f"as {dtype}", TypeError, tensor.to(dtype))
              for dtype in wrong_dtypes or WRONG_DTYPES[tensor.dtype]]
    breaks += [("a list", TypeError, tensor.tolist()),
               ("a numpy array", TypeError, tensor.numpy()),
               ("on the meta device", ValueError,
                torch.empty(tensor.shape, dtype=tensor.dtype, device="meta")),
               ("with a dim more", ValueError, tensor.unsqueeze(0)),
               ("with a dim less", ValueError,
                # (sum keeps the dtype: uint8 and int32 sum to int64)
                tensor.reshape(-1) if tensor.dim() == 2 else tensor.sum().to(tensor.dtype))]
    view = _strided(tensor)
    if not view.is_contiguous():
        breaks.append(("a non-contiguous view", ValueError, view))
    return breaks


def length_breaks(tensor):
    """A per-id tensor one entry too short or too long."""
    longer = torch.cat([tensor, tensor.new_zeros((1,) + tuple(tensor.shape[1:]))])
    breaks = [("one entry longer", ValueError, longer)]
    if tensor.shape[0]:
        breaks.append(("one entry shorter", ValueError, tensor[:-1].clone()))
    return breaks


def index_breaks(draw, tensor, bound):
    """An index tensor with one entry outside [0, bound)."""
    if not tensor.numel():
        return []
    breaks = []
    for value in (-1, bound, bound + draw(st.integers(1, 2**40)), INT64_MAX, INT64_MIN):
        broken = tensor.clone()
        broken[draw(st.integers(0, tensor.numel() - 1))] = value
        breaks.append((f"holding {value} (bound {bound})", ValueError, broken))
    return breaks


def count_breaks(minimum=0):
    """A count that is negative, fractional, a string or past int64."""
    return [(f"{value!r}", error, value) for value, error in
            ((minimum - 1, ValueError), (2**63, ValueError), (1.5, TypeError),
             ("3", TypeError), (None, TypeError))]


def assert_all_refused(kernel, args, breaks, *must_stay):
    """Every way in `breaks` ({name: [(how, error, value)]}) to break one argument
    of the valid call `args` raises its error, naming the argument, and leaves
    the tensors `must_stay` unchanged."""
    before = [t.clone() for t in must_stay]
    for name, ways in breaks.items():
        for how, error, value in ways:
            what = f"{name} {how}: expected {error.__name__}"
            try:
                kernel(**{**args, name: value})
            except error as raised:
                assert name in str(raised), (what, str(raised))
            else:
                pytest.fail(f"{what}, but the call returned")
            for tensor, original in zip(must_stay, before):
                assert torch.equal(tensor, original), what


def int64_tensor(draw, values, size):
    return torch.tensor(draw(st.lists(values, min_size=size, max_size=size)), dtype=torch.int64)


# ---- table_keys ----------------------------------------------------------------------

@FUZZ
@given(st.data())
def test_table_keys(data):
    draw = data.draw
    counts = torch.tensor(draw(st.lists(st.integers(0, 12), max_size=6)), dtype=torch.int64)
    total = int(counts.sum())
    args = {"ids": int64_tensor(draw, int64s, total),
            "salt": int64_tensor(draw, int64s, counts.numel()),
            "slot_counts": counts}
    count_values = []
    if counts.numel():
        for how, edit in (("summing to one more", lambda c: c.__setitem__(0, c[0] + 1)),
                          ("with a negative count", lambda c: c.__setitem__(-1, -1)),
                          ("with an int64 maximum", lambda c: c.__setitem__(0, INT64_MAX))):
            broken = counts.clone()
            edit(broken)
            count_values.append((how, ValueError, broken))
    if counts.numel() >= 2:     # the same sum, one count negative
        broken = counts.clone()
        broken[0] += broken[1] + 1
        broken[1] = -1
        count_values.append(("a negative count, the same sum", ValueError, broken))
    assert_all_refused(cpu_native.table_keys, args, {
        "ids": tensor_breaks(args["ids"]),
        "salt": tensor_breaks(args["salt"]) + length_breaks(args["salt"]),
        "slot_counts": tensor_breaks(counts) + count_values})
    expected = mix64_reference(args["ids"]) ^ args["salt"].repeat_interleave(counts)
    assert torch.equal(cpu_native.table_keys(**args), expected)


# ---- initial_rows --------------------------------------------------------------------

@FUZZ
@given(st.data())
def test_initial_rows(data):
    draw = data.draw
    args = {"keys": int64_tensor(draw, int64s, draw(st.integers(0, 40))),
            "dim": draw(st.integers(0, 20)), "scale": draw(st.floats(1e-4, 10.0)),
            "seed": draw(int64s)}
    assert_all_refused(cpu_native.initial_rows, args, {
        "keys": tensor_breaks(args["keys"]),
        "dim": count_breaks(),
        "seed": [("past int64", ValueError, 2**63), ("below int64", ValueError, -2**63 - 1),
                 ("a float", TypeError, 7.0), ("a string", TypeError, "7")],
        "scale": [("a string", TypeError, "0.5"), ("None", TypeError, None),
                  ("complex", TypeError, 1j), ("a tensor", TypeError, torch.ones(2))]})
    assert torch.equal(cpu_native.initial_rows(**args), initial_rows_reference(**args))


# ---- find_or_insert ------------------------------------------------------------------

def _hash_map(draw):
    """A map holding some keys, as the torch reference builds it."""
    stored = int64_tensor(draw, int64s, draw(st.integers(0, 20)))
    slot_keys, slot_rows = hash_table.new_slots(hash_table.capacity_for(stored.numel() + 40))
    _, num_rows = hash_table.find_or_insert_reference(slot_keys, slot_rows, stored, 0)
    return slot_keys, slot_rows, stored, num_rows


@FUZZ
@given(st.data())
def test_find_or_insert(data):
    draw = data.draw
    slot_keys, slot_rows, stored, num_rows = _hash_map(draw)
    # Keys already stored, new ones, duplicates, EMPTY itself and its neighbour.
    keys = torch.cat([int64_tensor(draw, int64s, draw(st.integers(0, 30))), stored[:5],
                      torch.tensor(draw(st.lists(st.sampled_from(
                          [INT64_MIN, INT64_MIN + 1, INT64_MAX, 0, -1]), max_size=4)),
                          dtype=torch.int64)])
    insert = draw(st.booleans())
    args = {"slot_keys": slot_keys, "slot_rows": slot_rows, "keys": keys,
            "num_rows": num_rows, "insert": insert}
    num_rows_breaks = count_breaks()
    if keys.numel():
        num_rows_breaks.append(("so large new rows overflow int64", ValueError, INT64_MAX))
    assert_all_refused(cpu_native.find_or_insert, args, {
        "slot_keys": tensor_breaks(slot_keys) + length_breaks(slot_keys),
        "slot_rows": tensor_breaks(slot_rows) + length_breaks(slot_rows),
        "keys": tensor_breaks(keys), "num_rows": num_rows_breaks}, slot_keys, slot_rows)
    found_before = hash_table.find_reference(slot_keys, slot_rows, keys)
    rows, count = cpu_native.find_or_insert(**args)
    if not insert:
        assert torch.equal(rows, found_before) and count == num_rows
        return
    # Stored keys keep their rows; the new distinct keys get num_rows.. count-1.
    present = found_before >= 0
    assert torch.equal(rows[present], found_before[present])
    new_keys = torch.where(keys == INT64_MIN, INT64_MIN + 1, keys)[~present]
    assert count == num_rows + torch.unique(new_keys).numel()
    row_of = {}
    for key, row in zip(new_keys.tolist(), rows[~present].tolist()):
        assert row_of.setdefault(key, row) == row
    assert sorted(row_of.values()) == list(range(num_rows, count))
    # The reference reads the map the kernel wrote.
    assert torch.equal(hash_table.find_reference(slot_keys, slot_rows, keys), rows)


@FUZZ
@given(st.data())
def test_rehash(data):
    draw = data.draw
    slot_keys, slot_rows, stored, _ = _hash_map(draw)
    smallest = hash_table.capacity_for(stored.numel())
    capacity = draw(st.sampled_from([smallest, 2 * smallest, 8 * slot_keys.numel()]))
    args = {"slot_keys": slot_keys, "slot_rows": slot_rows, "capacity": capacity}
    capacity_breaks = count_breaks(minimum=1) + [
        ("not a power of two", ValueError, 3 * smallest)]
    distinct = int((slot_keys != hash_table.EMPTY).sum())
    if distinct > 1:     # the largest power of two below the key count
        too_small = 1 << (distinct - 1).bit_length() - 1
        capacity_breaks.append(("too small for the keys", ValueError, too_small))
    assert_all_refused(cpu_native.rehash, args, {
        "slot_keys": tensor_breaks(slot_keys) + length_breaks(slot_keys),
        "slot_rows": tensor_breaks(slot_rows) + length_breaks(slot_rows),
        "capacity": capacity_breaks}, slot_keys, slot_rows)
    new_keys, new_rows = cpu_native.rehash(**args)
    assert new_keys.numel() == capacity
    assert int((new_keys != hash_table.EMPTY).sum()) == int((slot_keys != hash_table.EMPTY).sum())
    # The reference finds every key at its row in the new map.
    assert torch.equal(hash_table.find_reference(new_keys, new_rows, stored),
                       hash_table.find_reference(slot_keys, slot_rows, stored))


@pytest.mark.parametrize("capacity", [0, 12])
def test_the_capacity_must_be_a_power_of_two(capacity):
    # The C code masks slots with capacity - 1: any other capacity reads past the map.
    slot_keys = torch.full((capacity,), hash_table.EMPTY)
    with pytest.raises(ValueError, match="power of two"):
        cpu_native.find_or_insert(slot_keys, torch.full((capacity,), -1), torch.arange(3), 0)


# ---- bucket_find_or_insert ------------------------------------------------------------

# Wrong dtypes of the index's arrays.
WRONG_INT32S = [torch.int64, torch.int16, torch.uint8, torch.float32]


def _bucket_index(draw):
    """An index holding some keys (as the torch reference builds it, from
    one bucket: past 25 keys it has split), its arrays sized by
    `room_needed` for 40 more keys, and an arena of a few rows more than it
    holds (perhaps too few for the new keys)."""
    stored = int64_tensor(draw, int64s, draw(st.integers(0, 80)))
    capacity, directory_capacity = bucket_index.room_needed(bucket_index.new_index()[2],
                                                            stored.numel() + 40)
    index = bucket_index.new_index(directory_capacity, capacity)
    arena = torch.zeros(stored.numel() + draw(st.integers(0, 45)), dtype=torch.int64)
    _, num_rows = bucket_index.find_or_insert_reference(*index, arena, stored, 0)
    return index, arena, stored, num_rows


def expected_rows(keys, arena, num_rows, insert):
    """What the native kernel returns, from a dict of the arena's keys: a
    key found keeps its row, a new one takes the next row in the order of
    its first position, while the arena has rows left; the others get -1."""
    row_of = {key: row for row, key in enumerate(arena[:num_rows].tolist())}
    rows = []
    for key in keys.tolist():
        if key not in row_of and insert and num_rows < arena.numel():
            row_of[key], num_rows = num_rows, num_rows + 1
        rows.append(row_of.get(key, -1))
    return rows, num_rows


@FUZZ
@given(st.data())
def test_bucket_find_or_insert(data):
    draw = data.draw
    index, arena, stored, num_rows = _bucket_index(draw)
    buckets, directory, shape = index
    count, depth = shape.tolist()
    # Keys already stored, new ones, duplicates, the extremes (ordinary keys).
    keys = torch.cat([int64_tensor(draw, int64s, draw(st.integers(0, 30))), stored[:5],
                      torch.tensor(draw(st.lists(st.sampled_from(
                          [INT64_MIN, INT64_MIN + 1, INT64_MAX, 0, -1]), max_size=4)),
                          dtype=torch.int64)])
    insert = draw(st.booleans())
    args = {"buckets": buckets, "directory": directory, "shape": shape, "arena": arena, "keys": keys, "num_rows": num_rows,
            "insert": insert}
    too_shallow = directory[:2 ** depth // 2].clone()     # shorter than the depth reads
    shape_breaks = [
        ("of 3 values", ValueError, torch.tensor([count, depth, 0])),
        ("of 1 value", ValueError, torch.tensor([count])),
        ("with more buckets than the arrays", ValueError,
         torch.tensor([buckets.shape[0] + 1, depth])),
        ("with no bucket", ValueError, torch.tensor([0, depth])),
        ("with a negative depth", ValueError, torch.tensor([count, -1])),
        ("with a depth past 32 bits", ValueError, torch.tensor([count, 33])),
        ("with a depth past the directory", ValueError,
         torch.tensor([count, directory.shape[0].bit_length()])),
        ("with an int64 extreme", ValueError, torch.tensor([INT64_MIN, INT64_MAX]))]
    assert_all_refused(cpu_native.bucket_find_or_insert, args, {
        "buckets": tensor_breaks(buckets, WRONG_INT32S) + [
            ("of 31 words a bucket", ValueError, buckets[:, :31].clone()),
            ("fewer than the buckets in use", ValueError, buckets[:count - 1].clone())],
        "directory": tensor_breaks(directory, WRONG_INT32S) + [
            ("shorter than 2**depth", ValueError, too_shallow)],
        "shape": tensor_breaks(shape) + shape_breaks,
        "arena": tensor_breaks(arena),
        "keys": tensor_breaks(keys),
        "num_rows": count_breaks() + [
            ("past the arena", ValueError, arena.numel() + 1),
            ("past int32 rows", ValueError, 2**31)]},
        buckets, directory, shape, arena)
    expected, expected_count = expected_rows(keys, arena, num_rows, insert)
    before = [t.clone() for t in (*index, arena)]
    rows, count = cpu_native.bucket_find_or_insert(**args)
    assert rows.tolist() == expected and count == expected_count
    if not insert:
        assert all(torch.equal(t, b) for t, b in zip((*index, arena), before))
        return
    # The reference reads the index the kernel wrote, the arena its keys.
    assert torch.equal(bucket_index.find_reference(*index, arena, keys), rows)
    assert torch.equal(arena[rows[rows >= 0]], keys[rows >= 0])


def test_buckets_must_be_128_bytes():
    # The kernel reads 128-byte buckets: narrower ones would be read past
    # their end, wider ones misread.
    buckets, directory, shape = bucket_index.new_index(4, 2)
    for width in (16, 64):
        with pytest.raises(ValueError, match=r"\[capacity, 32\]"):
            cpu_native.bucket_find_or_insert(torch.zeros(2, width, dtype=torch.int32),
                                             directory, shape,
                                             torch.zeros(8, dtype=torch.int64),
                                             torch.arange(3), 0)


def _indexed(keys, capacity=64):
    """An index of `keys` (rows 0..), room to spare, and its arena."""
    index = bucket_index.new_index(256, capacity)
    arena = torch.zeros(keys.numel() + 16, dtype=torch.int64)
    rows, num_rows = bucket_index.find_or_insert_reference(*index, arena, keys, 0)
    return index, arena, rows, num_rows


# Every key of a 4-entry directory (and any other) looks at least one entry up.
LOOKED_UP = torch.arange(2000) * 7919


@pytest.mark.parametrize("insert", [False, True])
@pytest.mark.parametrize("value", ["buckets in use", "capacity", 2**31 - 1, -1])
def test_a_directory_entry_past_the_buckets_is_corrupt(value, insert):
    index, arena, _, num_rows = _indexed(torch.arange(100) * 31)
    buckets, directory, shape = index
    count, depth = shape.tolist()
    assert count > 4 and depth >= 2
    directory[2 ** depth - 1] = {"buckets in use": count,
                                 "capacity": buckets.shape[0]}.get(value, value)
    with pytest.raises(ValueError, match="corrupt"):
        cpu_native.bucket_find_or_insert(*index, arena, LOOKED_UP, num_rows, insert=insert)


@pytest.mark.parametrize("insert", [False, True])
@pytest.mark.parametrize("row", ["num_rows", "arena rows", 2**31 - 2, -1, "free"])
def test_a_slot_past_the_rows_is_corrupt(row, insert):
    keys = torch.arange(100) * 31
    index, arena, rows, num_rows = _indexed(keys)
    slots = bucket_index.views(index[0])[1]
    # The slot of key 62's row now says a row the arena does not hold (its
    # digest still matches the key's: a lookup of the key reads it).
    cell = (slots == int(rows[2]) + 1).nonzero()[0]
    value = {"num_rows": num_rows, "arena rows": arena.numel(), "free": -1}.get(row, row)
    slots[cell[0], cell[1]] = value + 1
    with pytest.raises(ValueError, match="corrupt"):
        cpu_native.bucket_find_or_insert(*index, arena, keys[:5], num_rows, insert=insert)


def test_a_slot_past_the_rows_is_corrupt_when_its_bucket_splits():
    # No key looked up matches the bad slot's digest: the split that the new
    # keys need reads every member's key, and meets it.
    index, arena, _, num_rows = _indexed(torch.arange(25), capacity=4)
    slots = bucket_index.views(index[0])[1]
    assert index[2].tolist() == [1, 0] and bool((slots[0] != 0).all())   # one full bucket
    slots[0, 0] = num_rows + 1
    fresh = torch.arange(10**9, 10**9 + 8)
    found, count = cpu_native.bucket_find_or_insert(*index, arena, fresh, num_rows,
                                                    insert=False)
    assert found.eq(-1).all() and count == num_rows       # the lookups never read it
    with pytest.raises(ValueError, match="corrupt"):
        cpu_native.bucket_find_or_insert(*index, arena, fresh, num_rows)


@pytest.mark.slow
def test_a_local_depth_past_the_global_depth_is_corrupt():
    # A bucket deeper than its directory: a split would address a directory
    # range of 2**(global - local) entries, a negative shift in C. Run in a
    # fresh interpreter: a crash must not take pytest down with it.
    result = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import torch
        from reckeras.backend_kernels import bucket_index, cpu_native
        index = bucket_index.new_index(8, 4)
        arena = torch.zeros(64, dtype=torch.int64)
        _, num_rows = cpu_native.bucket_find_or_insert(*index, arena, torch.arange(25), 0)
        bucket_index.views(index[0])[2][0] = 40   # the one bucket (full): depth past 0
        try:
            cpu_native.bucket_find_or_insert(*index, arena, torch.arange(25, 33), num_rows)
        except ValueError as error:
            print(error)
        """)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "corrupt" in result.stdout


def _returns_within(fn, seconds):
    """fn()'s result, or a failure if it is still running after `seconds`."""
    outcome = {}

    def run():
        try:
            outcome["value"] = fn()
        except Exception as error:       # noqa: BLE001 - handed to the test
            outcome["error"] = error

    worker = threading.Thread(target=run, daemon=True)  # a stuck C loop cannot be joined
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), "the kernel is still probing a full map or index"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def test_a_full_map_is_an_error_not_a_hang():
    slot_keys, slot_rows = hash_table.new_slots(8)
    rows, count = cpu_native.find_or_insert(slot_keys, slot_rows, torch.arange(8), 0)
    assert count == 8 and sorted(rows.tolist()) == list(range(8))
    absent = torch.tensor([100, 3])
    found, _ = _returns_within(
        lambda: cpu_native.find_or_insert(slot_keys, slot_rows, absent, 8, insert=False), 30)
    assert found.tolist() == [-1, int(rows[3])]
    with pytest.raises(ValueError, match="full"):
        _returns_within(lambda: cpu_native.find_or_insert(slot_keys, slot_rows, absent, 8), 30)


def test_a_full_index_leaves_keys_out_without_hanging():
    # One bucket that cannot split (no room for a second one, a directory of
    # one entry): 25 keys fit, then 50,000 new ones each find both their
    # buckets full and no split possible, and resolve to -1.
    index = bucket_index.new_index(1, 1)
    arena = torch.zeros(100_000, dtype=torch.int64)
    rows, count = cpu_native.bucket_find_or_insert(*index, arena, torch.arange(25), 0)
    assert count == 25 and sorted(rows.tolist()) == list(range(25))
    before = [t.clone() for t in index]
    absent = torch.cat([torch.arange(10**6, 10**6 + 50_000), torch.tensor([3])])
    found, count = _returns_within(
        lambda: cpu_native.bucket_find_or_insert(*index, arena, absent, 25), 30)
    assert count == 25 and found[:-1].eq(-1).all() and int(found[-1]) == int(rows[3])
    assert all(torch.equal(t, b) for t, b in zip(index, before))


# ---- pool_forward and aggregate -------------------------------------------------------

def forward_index(draw, num_unique, num_slots):
    """A forward index of n ids into num_unique rows and num_slots slots, and
    every way to break one of its three tensors."""
    n = draw(st.integers(0, 40)) if num_unique and num_slots else 0
    unique_index = int64_tensor(draw, st.integers(0, max(num_unique - 1, 0)), n)
    destination = int64_tensor(draw, st.integers(0, max(num_slots - 1, 0)), n)
    id_weight = torch.tensor(draw(st.lists(st.floats(-2.0, 2.0, width=32), min_size=n,
                                           max_size=n)), dtype=torch.float32)
    index = {"unique_index": unique_index, "destination": destination, "id_weight": id_weight}
    breaks = {name: tensor_breaks(tensor) + length_breaks(tensor)
              for name, tensor in index.items()}
    breaks["unique_index"] += index_breaks(draw, unique_index, num_unique)
    breaks["destination"] += index_breaks(draw, destination, num_slots)
    return index, breaks


@FUZZ
@given(st.data())
def test_pool_forward(data):
    draw = data.draw
    num_rows, dim = draw(st.integers(1, 20)), draw(st.integers(1, 9))
    weights = torch.randn(num_rows, dim, generator=torch.Generator().manual_seed(num_rows))
    unique_rows = int64_tensor(draw, st.integers(0, num_rows - 1), draw(st.integers(0, 12)))
    num_slots = draw(st.integers(0, 16))
    index, index_ways = forward_index(draw, unique_rows.numel(), num_slots)
    args = {"weights": weights, "unique_rows": unique_rows, **index, "num_slots": num_slots}
    assert_all_refused(cpu_native.pool_forward, args, {
        "weights": tensor_breaks(weights, WRONG_ROW_DTYPES),
        "unique_rows": tensor_breaks(unique_rows) + index_breaks(draw, unique_rows, num_rows),
        **index_ways, "num_slots": count_breaks()})
    torch.testing.assert_close(cpu_native.pool_forward(**args), pooled_lookup_reference(**args),
                               rtol=1e-5, atol=1e-5)


@FUZZ
@given(st.data())
def test_aggregate(data):
    draw = data.draw
    num_slots, dim = draw(st.integers(0, 16)), draw(st.integers(1, 9))
    grad_out = torch.randn(num_slots, dim, generator=torch.Generator().manual_seed(num_slots))
    num_unique = draw(st.integers(0, 12))
    index, index_ways = forward_index(draw, num_unique, num_slots)
    args = {"grad_out": grad_out, **index, "num_unique": num_unique}
    assert_all_refused(cpu_native.aggregate, args, {
        "grad_out": tensor_breaks(grad_out), **index_ways, "num_unique": count_breaks()})
    torch.testing.assert_close(cpu_native.aggregate(**args),
                               aggregate_row_grads_reference(**args), rtol=1e-5, atol=1e-5)


def test_out_of_range_destination_on_many_threads():
    # Large enough to split over threads: each thread skips the other
    # threads' destinations, and every thread must still see the bad one.
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        n = 4 * 16384
        weights, unique_rows = torch.randn(10, 4), torch.arange(10)
        unique_index = torch.randint(0, 10, (n,))
        destination = torch.randint(0, n, (n,))
        destination[n // 2] = n
        with pytest.raises(ValueError, match="destination"):
            cpu_native.pool_forward(weights, unique_rows, unique_index, destination,
                                    torch.ones(n), n)
        unique_index[-1] = -1
        with pytest.raises(ValueError, match="unique_index"):
            cpu_native.aggregate(torch.randn(n + 1, 4), unique_index, destination.clamp(max=n - 1),
                                 torch.ones(n), 10)
    finally:
        torch.set_num_threads(before)


# ---- unique_rows ---------------------------------------------------------------------

@FUZZ
@given(st.data())
def test_unique_rows(data):
    draw = data.draw
    num_rows = draw(st.integers(0, 60))
    rows = int64_tensor(draw, st.integers(0, max(num_rows - 1, 0)),
                   draw(st.integers(0, 50)) if num_rows else 0)
    args = {"rows": rows, "num_rows": num_rows}
    assert_all_refused(cpu_native.unique_rows, args, {
        "rows": tensor_breaks(rows) + index_breaks(draw, rows, num_rows),
        "num_rows": count_breaks() + ([("smaller than a row", ValueError, int(rows.max()))]
                                      if rows.numel() else [])})
    # The refused calls left the per-thread position buffer clean: this one is right.
    unique, unique_index = cpu_native.unique_rows(**args)
    assert unique.tolist() == list(dict.fromkeys(rows.tolist()))      # first appearance
    assert torch.equal(unique[unique_index], rows)


# ---- compact_present and bag_of_ids ---------------------------------------------------

@FUZZ
@given(st.data())
def test_compact_present(data):
    draw = data.draw
    n = draw(st.integers(0, 40))
    values = int64_tensor(draw, int64s, n)
    present = torch.tensor(draw(st.lists(st.booleans(), min_size=n, max_size=n)),
                           dtype=torch.bool)
    args = {"values": values, "present": present}
    # A bool tensor's sum is int64: its dim less is `any` (0-dim bool).
    present_breaks = [(how, error, present.any() if how == "with a dim less" else value)
                      for how, error, value in tensor_breaks(
                          present, [torch.int64, torch.uint8, torch.float32])]
    assert_all_refused(cpu_native.compact_present, args, {
        "values": tensor_breaks(values) + length_breaks(values),
        "present": present_breaks + length_breaks(present)}, values, present)
    ids, offsets = cpu_native.compact_present(**args)
    expected_ids, expected_offsets = compact_present_reference(values, present)
    assert torch.equal(ids, expected_ids) and torch.equal(offsets, expected_offsets)


@FUZZ
@given(st.data())
def test_bag_of_ids(data):
    draw = data.draw
    lengths = draw(st.lists(st.integers(0, 4), max_size=20))
    offsets = torch.tensor([0, *np.cumsum(lengths, dtype=np.int64)], dtype=torch.int64)
    num_ids = sum(lengths)
    offset_breaks = [("starting at 1", ValueError, offsets + 1),
                     ("empty", ValueError, offsets[:0].clone())]
    for value in (-1, INT64_MIN, INT64_MAX):       # decreasing somewhere, or past the end
        broken = offsets.clone()
        broken[draw(st.integers(1, len(lengths))) if lengths else 0] = value
        offset_breaks.append((f"holding {value}", ValueError, broken))
    args = {"offsets": offsets, "num_ids": num_ids}
    assert_all_refused(cpu_native.bag_of_ids, args, {
        "offsets": tensor_breaks(offsets) + offset_breaks,
        "num_ids": count_breaks() + [("one more", ValueError, num_ids + 1)]}, offsets)
    assert torch.equal(cpu_native.bag_of_ids(**args), bag_of_ids_reference(offsets, num_ids))


# ---- apply_update --------------------------------------------------------------------

KINDS = {"sgd": sparse_optimizers.SGD, "adagrad": sparse_optimizers.ADAGRAD,
         "rowwise_adagrad": sparse_optimizers.ROWWISE_ADAGRAD}


@FUZZ
@given(st.data())
def test_apply_update(data):
    draw = data.draw
    kind = draw(st.sampled_from(sorted(KINDS)))
    num_rows, dim = draw(st.integers(1, 12)), draw(st.integers(1, 8))
    generator = torch.Generator().manual_seed(num_rows * 10 + dim)
    weights = torch.randn(num_rows, dim, generator=generator)
    width = sparse_optimizers.state_width(KINDS[kind], dim)
    state = torch.rand(num_rows, width, generator=generator)
    rows = torch.randperm(num_rows, generator=generator)[:draw(st.integers(0, num_rows))]
    grads = torch.randn(rows.numel(), dim, generator=generator)
    args = {"kind": kind, "weights": weights, "state": state, "rows": rows, "grads": grads,
            "lr": draw(st.floats(1e-3, 1.0)), "eps": 1e-8}
    state_breaks = tensor_breaks(state)
    if kind != "sgd":
        state_breaks += [("one column wider", ValueError, torch.rand(num_rows, width + 1)),
                         ("one row short", ValueError, torch.rand(num_rows - 1, width))]
    assert_all_refused(cpu_native.apply_update, args, {
        "kind": [("adam", ValueError, "adam"), ("an int", ValueError, 0)],
        "weights": tensor_breaks(weights, WRONG_ROW_DTYPES),
        "state": state_breaks,
        "rows": tensor_breaks(rows) + index_breaks(draw, rows, num_rows),
        "grads": tensor_breaks(grads) + length_breaks(grads),
        "lr": [("a string", TypeError, "0.1")], "eps": [("None", TypeError, None)]},
        weights, state)
    expected_weights, expected_state = weights.clone(), state.clone()
    sparse_optimizers.update_reference(KINDS[kind], expected_weights, expected_state, rows,
                                       grads, args["lr"], args["eps"])
    cpu_native.apply_update(**args)
    torch.testing.assert_close(weights, expected_weights)
    torch.testing.assert_close(state, expected_state)


def test_usable_only_for_the_dtypes_the_kernels_read():
    # dispatch.use_native asks usable(): an int32 index tensor goes to the
    # torch reference, not to a C loop reading 8 bytes an entry.
    assert cpu_native.usable(torch.zeros(4, 8), torch.arange(4))
    assert not cpu_native.usable(torch.arange(4, dtype=torch.int32))
    assert not cpu_native.usable(torch.zeros(4, dtype=torch.bool))
    assert not cpu_native.usable(torch.zeros(4, dtype=torch.float64))
    assert not cpu_native.usable(torch.empty(4, device="meta"))
    assert not cpu_native.usable(torch.from_numpy(np.arange(8))[::2])
