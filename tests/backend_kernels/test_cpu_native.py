"""The native CPU kernels against the torch references, and their sanitized build."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reckeras import config
from reckeras.backend_kernels import bucket_index, cpu_native, hash_table
from reckeras.backend_kernels.hashing import initial_rows_reference, mix64_reference

pytestmark = pytest.mark.skipif(not cpu_native.available(),
                                reason="no C compiler: native kernels unavailable")

EXTREMES = [0, 1, -1, 2**63 - 1, -(2**63), -(2**63) + 1]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=300),
       st.lists(st.integers(0, 40), min_size=1, max_size=8))
def test_table_keys(ids, counts):
    ids = torch.tensor(ids + EXTREMES, dtype=torch.int64)
    counts = torch.tensor(counts, dtype=torch.int64)
    ids = ids.repeat(int(counts.sum()) // max(ids.numel(), 1) + 1)[:int(counts.sum())]
    salt = torch.randint(-(2**62), 2**62, (counts.numel(),))
    expected = mix64_reference(ids) ^ salt.repeat_interleave(counts)
    assert torch.equal(cpu_native.table_keys(ids, salt, counts), expected)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=300),
       st.integers(1, 33), st.floats(1e-4, 10.0), st.integers(-(2**63), 2**63 - 1))
def test_initial_rows_bitwise(keys, dim, scale, seed):
    keys = torch.tensor(keys + EXTREMES, dtype=torch.int64)
    expected = initial_rows_reference(keys, dim, scale, seed)
    assert torch.equal(cpu_native.initial_rows(keys, dim, scale, seed), expected)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=400))
def test_find_or_insert_matches_reference_mapping(keys):
    keys = torch.tensor(keys + EXTREMES + keys[:50], dtype=torch.int64)
    capacity = hash_table.capacity_for(keys.numel())
    native_keys, native_rows = hash_table.new_slots(capacity)
    rows, count = cpu_native.find_or_insert(native_keys, native_rows, keys, 0)
    distinct = torch.unique(torch.where(keys == hash_table.EMPTY, keys + 1, keys))
    assert count == distinct.numel()
    # Same key -> same row, distinct keys -> distinct rows, rows dense 0..n-1.
    stored = torch.where(keys == hash_table.EMPTY, keys + 1, keys)
    first_row = {}
    for key, row in zip(stored.tolist(), rows.tolist()):
        assert first_row.setdefault(key, row) == row
    assert sorted(first_row.values()) == list(range(count))
    # The slots are laid out exactly as the reference's find reads them.
    assert torch.equal(hash_table.find_reference(native_keys, native_rows, keys), rows)
    missing, _ = cpu_native.find_or_insert(native_keys, native_rows,
                                           torch.tensor([12345678912345]), count,
                                           insert=False)
    expected_missing = hash_table.find_reference(native_keys, native_rows,
                                                 torch.tensor([12345678912345]))
    assert torch.equal(missing, expected_missing)


def sized_index(new_keys):
    """An empty index and arena with room for `new_keys` keys (`room_needed`)."""
    capacity, directory_capacity = bucket_index.room_needed(bucket_index.new_index()[2],
                                                            new_keys)
    return (bucket_index.new_index(directory_capacity, capacity),
            torch.zeros(new_keys, dtype=torch.int64))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=400),
       st.lists(st.integers(-(2**63), 2**63 - 1), max_size=100))
def test_bucket_find_or_insert_matches_the_reference_mapping(keys, more):
    keys = torch.tensor(keys + EXTREMES + keys[:50], dtype=torch.int64)
    more = torch.tensor(more + keys[::3].tolist(), dtype=torch.int64)
    index, arena = sized_index(keys.numel() + more.numel())
    reference_index, reference_arena = sized_index(keys.numel() + more.numel())
    row_of, count, reference_count = {}, 0, 0
    for batch in (keys, more):
        rows, count = cpu_native.bucket_find_or_insert(*index, arena, batch, count)
        # A key keeps its row; a new one takes the next, in order of first position.
        expected = [row_of.setdefault(key, len(row_of)) for key in batch.tolist()]
        assert rows.tolist() == expected and count == len(row_of)
        assert torch.equal(arena[rows], batch)
        # The reference reads the index the kernel wrote, and the kernel the
        # reference's (which numbers the rows of a call in its own order).
        assert torch.equal(bucket_index.find_reference(*index, arena, batch), rows)
        reference_rows, reference_count = bucket_index.find_or_insert_reference(
            *reference_index, reference_arena, batch, reference_count)
        assert reference_count == count
        found, unchanged = cpu_native.bucket_find_or_insert(
            *reference_index, reference_arena, batch, count, insert=False)
        assert torch.equal(found, reference_rows) and unchanged == count
        assert torch.equal(reference_arena[reference_rows], batch)
    absent = torch.tensor([k for k in (12345678912345, -7, 2**62) if k not in row_of],
                          dtype=torch.int64)
    missing, unchanged = cpu_native.bucket_find_or_insert(*index, arena, absent, count,
                                                          insert=False)
    assert missing.tolist() == [-1] * absent.numel() and unchanged == count
    assert torch.equal(missing, bucket_index.find_reference(*index, arena, absent))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 50), max_size=300))
def test_unique_rows(rows):
    rows = torch.tensor(rows, dtype=torch.int64)
    unique, index = cpu_native.unique_rows(rows, 51)
    assert torch.equal(unique[index], rows)
    assert sorted(unique.tolist()) == sorted(set(rows.tolist()))
    again, _ = cpu_native.unique_rows(rows, 51)       # the buffer was reset
    assert torch.equal(again, unique)


def present_values(draw_present, values):
    """numpy's compaction of `values` where `draw_present` holds, and its offsets."""
    kept = np.asarray(values, dtype=np.int64)[np.asarray(draw_present, dtype=bool)]
    offsets = np.concatenate([[0], np.cumsum(np.asarray(draw_present, dtype=np.int64))])
    return kept, offsets


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(-(2**63), 2**63 - 1), st.booleans()), max_size=300),
       st.sampled_from(["drawn", "all present", "all absent"]))
def test_compact_present(entries, pattern):
    values = [value for value, _ in entries]
    present = [{"drawn": keep, "all present": True, "all absent": False}[pattern]
               for _, keep in entries]
    ids, offsets = cpu_native.compact_present(torch.tensor(values, dtype=torch.int64),
                                              torch.tensor(present, dtype=torch.bool))
    kept, expected_offsets = present_values(present, values)
    assert ids.tolist() == kept.tolist()
    assert offsets.tolist() == expected_offsets.tolist()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 4), max_size=300))
def test_bag_of_ids(lengths):
    offsets = torch.tensor([0, *np.cumsum(lengths, dtype=np.int64)], dtype=torch.int64)
    expected = np.repeat(np.arange(len(lengths)), lengths)
    assert cpu_native.bag_of_ids(offsets, sum(lengths)).tolist() == expected.tolist()


@pytest.mark.parametrize("offsets, num_ids", [
    ([1, 2], 2), ([0, 2, 1, 3], 3), ([0, 1, 2], 3), ([0, 3], 2), ([], 0)])
def test_bag_of_ids_refuses_offsets_that_are_not_offsets(offsets, num_ids):
    with pytest.raises(ValueError, match="bag_of_ids: offsets must start at 0"):
        cpu_native.bag_of_ids(torch.tensor(offsets, dtype=torch.int64), num_ids)


def test_compact_present_refuses_bad_arguments():
    with pytest.raises(TypeError, match=r"compact_present: present must be torch\.bool"):
        cpu_native.compact_present(torch.arange(3), torch.ones(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="present and values differ in length"):
        cpu_native.compact_present(torch.arange(3), torch.ones(2, dtype=torch.bool))


@pytest.mark.parametrize("dim", [1, 3, 16, 100])
def test_pool_forward_and_aggregate(dim):
    generator = torch.Generator().manual_seed(dim)
    n, slots, rows_total = 500, 64, 40
    weights = torch.randn(rows_total, dim, generator=generator)
    unique = torch.randperm(rows_total, generator=generator)[:30]
    unique_index = torch.randint(0, 30, (n,), generator=generator)
    destination = torch.randint(0, slots, (n,), generator=generator)
    id_weight = torch.rand(n, generator=generator)
    expected = torch.zeros(slots, dim).index_add_(
        0, destination, weights[unique][unique_index] * id_weight[:, None])
    torch.testing.assert_close(cpu_native.pool_forward(weights, unique, unique_index,
                                                       destination, id_weight, slots),
                               expected, rtol=1e-5, atol=1e-5)
    grad_out = torch.randn(slots, dim, generator=generator)
    expected = torch.zeros(30, dim).index_add_(
        0, unique_index, grad_out[destination] * id_weight[:, None])
    torch.testing.assert_close(cpu_native.aggregate(grad_out, unique_index, destination,
                                                    id_weight, 30),
                               expected, rtol=1e-5, atol=1e-5)


def test_outputs_are_zeroed_where_no_id_writes():
    # The wrappers hand the C loops uninitialized memory: fill the memory
    # the allocator hands out next with NaN, and ask for outputs most of whose
    # slots (rows) no id writes.
    weights, unique = torch.ones(4, 8), torch.tensor([3, 1])
    index, destination, scale = torch.tensor([0, 1]), torch.tensor([5, 900]), torch.ones(2)
    for _ in range(3):
        torch.full((1000, 8), float("nan"))
        out = cpu_native.pool_forward(weights, unique, index, destination, scale, 1000)
        expected = torch.zeros(1000, 8)
        expected[[5, 900]] = 1.0
        assert torch.equal(out, expected)
        torch.full((2, 8), float("nan"))
        grads = cpu_native.aggregate(out, index, destination, scale, 2)
        assert torch.equal(grads, torch.ones(2, 8))


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "rowwise_adagrad"])
def test_apply_update(kind):
    generator = torch.Generator().manual_seed(0)
    weights = torch.randn(20, 5, generator=generator)
    width = {"sgd": 0, "adagrad": 5, "rowwise_adagrad": 1}[kind]
    state = torch.rand(20, width, generator=generator)
    rows = torch.tensor([3, 7, 0])
    grads = torch.randn(3, 5, generator=generator)
    w, s = weights.clone(), state.clone()
    cpu_native.apply_update(kind, w, s, rows, grads, 0.1, 1e-8)
    expected_w, expected_s = weights.clone(), state.clone()
    if kind == "sgd":
        expected_w[rows] -= 0.1 * grads
    elif kind == "adagrad":
        expected_s[rows] += grads * grads
        expected_w[rows] -= 0.1 * grads / (expected_s[rows].sqrt() + 1e-8)
    else:
        expected_s[rows, 0] += (grads * grads).mean(dim=1)
        expected_w[rows] -= 0.1 * grads / (expected_s[rows].sqrt() + 1e-8)
    torch.testing.assert_close(w, expected_w)
    torch.testing.assert_close(s, expected_s)
    untouched = [r for r in range(20) if r not in rows.tolist()]
    assert torch.equal(w[untouched], weights[untouched])


@pytest.fixture
def threads():
    """Runs a test body with a given torch intra-op thread count."""
    before = torch.get_num_threads()

    def use(count):
        torch.set_num_threads(count)

    yield use
    torch.set_num_threads(before)


def test_results_do_not_depend_on_the_thread_count(threads):
    # Large enough that every parallel kernel splits (>= 16384 items a
    # thread); hot rows repeat so that per-row sums have many terms.
    torch.manual_seed(0)
    n, num_rows, dim, slots = 200_000, 50_000, 8, 150_000
    ids = torch.randint(0, 10**12, (n,))
    counts = torch.tensor([n // 4] * 4)
    salt = torch.randint(-(2**62), 2**62, (4,))
    rows = torch.randint(0, 1000, (n,)) ** 2 % num_rows
    unique, unique_index = cpu_native.unique_rows(rows, num_rows)
    weights = torch.randn(num_rows, dim)
    destination = torch.randint(0, slots, (n,))
    id_weight = torch.rand(n)
    grad_out = torch.randn(slots, dim)
    initial_state = torch.rand(num_rows, dim)
    slot_keys, slot_rows = hash_table.new_slots(hash_table.capacity_for(n))
    keys = cpu_native.table_keys(ids, salt, counts)
    cpu_native.find_or_insert(slot_keys, slot_rows, keys[: n // 2], 0)
    index, arena = sized_index(n)
    inserted, num_rows = cpu_native.bucket_find_or_insert(*index, arena, keys[: n // 2], 0)

    present = torch.rand(n) > 0.3
    present[n // 3: n // 3 + 20_000] = False        # a thread's whole range absent
    bag_offsets = torch.cat([torch.zeros(1, dtype=torch.int64),
                             torch.randint(0, 2, (n,)).cumsum(0)])
    bag_offsets[n // 2:] = bag_offsets[n // 2]      # empty bags up to the end
    results = {}
    for count in (1, 2, 3):
        threads(count)
        table, state = weights.clone(), initial_state.clone()
        grads = cpu_native.aggregate(grad_out, unique_index, destination, id_weight,
                                     unique.numel())
        cpu_native.apply_update("adagrad", table, state, unique, grads, 0.1, 1e-8)
        # The inserts (their lookups on the threads) into a copy of the index.
        copy = [t.clone() for t in (*index, arena)]
        rows_inserted = cpu_native.bucket_find_or_insert(*copy, keys, num_rows)[0]
        results[count] = (
            cpu_native.table_keys(ids, salt, counts),
            cpu_native.initial_rows(ids[:50_000], dim, 0.05, 7),
            cpu_native.find_or_insert(slot_keys, slot_rows, keys, n, insert=False)[0],
            cpu_native.bucket_find_or_insert(*index, arena, keys, num_rows, insert=False)[0],
            rows_inserted, *copy,
            cpu_native.pool_forward(weights, unique, unique_index, destination,
                                    id_weight, slots),
            grads, table, state, *cpu_native.compact_present(ids, present),
            cpu_native.bag_of_ids(bag_offsets, int(bag_offsets[-1])))
    for count in (2, 3):
        for one, many in zip(results[1], results[count]):
            assert torch.equal(one, many)
    compacted, compacted_offsets, bags = results[1][-3:]
    assert torch.equal(compacted, ids[present])
    assert torch.equal(compacted_offsets[1:], present.long().cumsum(0))
    assert torch.equal(bags, torch.arange(n).repeat_interleave(bag_offsets.diff()))
    # And the found rows are right: the first half was inserted, the rest is absent.
    found = results[1][2]
    assert bool((found[: n // 2] >= 0).all())
    found, rows_inserted = results[1][3:5]
    assert torch.equal(found[: n // 2], inserted) and bool((found[n // 2:] == -1).all())
    assert torch.equal(found, bucket_index.find_reference(*index, arena, keys))
    assert torch.equal(rows_inserted[: n // 2], inserted)
    assert bool((rows_inserted[n // 2:] >= num_rows).all())


# ---- the sanitized build (RECKERAS_NATIVE_SANITIZE=1, scripts/test_sanitized.sh) --------

def asan_runtime() -> str | None:
    """The compiler's AddressSanitizer runtime, or None where it has none."""
    try:
        found = subprocess.run([os.environ.get("CC", "cc"), "-print-file-name=libasan.so"],
                               capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return found if os.path.isabs(found) and os.path.exists(found) else None


def run_python(code: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2])


def sanitized_env() -> dict:
    return {**os.environ, "RECKERAS_NATIVE_SANITIZE": "1", "LD_PRELOAD": asan_runtime(),
            "ASAN_OPTIONS": "detect_leaks=0"}     # CPython leaks by design


requires_asan = pytest.mark.skipif(asan_runtime() is None,
                                   reason="the C compiler has no AddressSanitizer runtime")

# Each case: a call the wrapper refuses, then the same bad argument handed to
# the C function directly (a size that lies about a tensor), which must abort
# the process with the sanitizer's report.
SANITIZER_CASES = {
    "a row past the table": ("""
        weights, state = torch.zeros(20, 5), torch.zeros(20, 1)
        rows, grads = torch.tensor([20]), torch.ones(1, 5)
        try:
            cpu_native.apply_update("rowwise_adagrad", weights, state, rows, grads, 0.1, 1e-8)
        except ValueError as error:
            print("refused:", error, flush=True)
        # table_rows 21 for a table of 20 rows: row 20 is written past its end.
        library.rk_apply_update(2, address(weights), 0, address(state), 1, 5, 21,
                                address(rows), address(grads), 1, 0.1, 1e-8, 0, 1)
        """, "ERROR: AddressSanitizer: heap-buffer-overflow"),
    "a row count that overflows int64": ("""
        slot_keys, slot_rows = torch.full((4,), -2**63), torch.full((4,), -1)
        keys, rows = torch.tensor([7]), torch.empty(1, dtype=torch.int64)
        try:
            cpu_native.find_or_insert(slot_keys, slot_rows, keys, 2**63 - 1)
        except ValueError as error:
            print("refused:", error, flush=True)
        library.rk_find_or_insert(address(slot_keys), address(slot_rows), 4, address(keys), 1,
                                  address(rows), 2**63 - 1, 1, 1)
        """, "runtime error: signed integer overflow"),
    "a new row past the arena": ("""
        buckets, directory = (torch.zeros(4, 32, dtype=torch.int32),
                              torch.zeros(8, dtype=torch.int32))
        shape, arena = torch.tensor([1, 0]), torch.zeros(4, dtype=torch.int64)
        keys, rows = torch.tensor([7]), torch.empty(1, dtype=torch.int64)
        try:
            cpu_native.bucket_find_or_insert(buckets, directory, shape, arena, keys, 5)
        except ValueError as error:
            print("refused:", error, flush=True)
        # arena_capacity 8 for an arena of 4 rows, all in use: row 4 is written
        # past its end.
        library.rk_bucket_find_or_insert(address(buckets), address(directory),
                                         address(shape), 4, 8, address(arena), 8, 4,
                                         address(keys), 1, address(rows), 1, 1)
        """, "ERROR: AddressSanitizer: heap-buffer-overflow"),
}


@requires_asan
@pytest.mark.parametrize("case", sorted(SANITIZER_CASES))
@pytest.mark.slow
def test_the_sanitized_build_catches_what_the_wrappers_refuse(case):
    calls, report = SANITIZER_CASES[case]
    # The module alone, by its path: importing the reckeras package would
    # import Keras, seconds of a sanitized start-up that test nothing here.
    result = run_python(textwrap.dedent(f"""
        import ctypes
        import importlib.util
        import torch
        spec = importlib.util.spec_from_file_location("cpu_native", {cpu_native.__file__!r})
        cpu_native = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(cpu_native)
        library = cpu_native.library()
        assert "sanitized" in library._name, library._name
        address = lambda tensor: ctypes.c_void_p(tensor.data_ptr())
        """) + textwrap.dedent(calls) + 'print("the raw call returned", flush=True)\n',
        sanitized_env())
    assert "refused: cpu_native." in result.stdout, result.stdout + result.stderr
    assert result.returncode != 0 and "the raw call returned" not in result.stdout
    assert report in result.stderr, result.stderr[-3000:]


def test_a_sanitized_build_that_cannot_be_built_raises(tmp_path, monkeypatch):
    # Without a compiler the optimized build falls back to the torch
    # references; the sanitized one must say so instead of testing nothing.
    monkeypatch.setattr(cpu_native, "_library", None)      # as before the first call
    monkeypatch.setattr(cpu_native, "_failed", False)
    config.set(native_sanitize=True, cache_dir=tmp_path / "cache")
    monkeypatch.setenv("CC", str(tmp_path / "no-cc"))
    with pytest.raises(RuntimeError, match="RECKERAS_NATIVE_SANITIZE=1 but the sanitized"):
        cpu_native.library()
