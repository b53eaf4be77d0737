import time

import numpy as np
import pytest
import torch

from reckeras.backend_kernels.hashing import initial_rows
from reckeras.embedding.index_build import CATCH_UP_S
from reckeras.embedding.physical_table import PhysicalTable


def test_rows_created_on_first_sight_and_stable():
    table = PhysicalTable(dim=3, init_scale=0.1, seed=7)
    keys = torch.tensor([10, 20, 10, -(2**63), 2**63 - 1])
    rows = table.find_or_insert(keys)
    assert table.num_rows == 4
    assert rows[0] == rows[2] and len(set(rows.tolist())) == 4
    assert sorted(set(rows.tolist())) == [0, 1, 2, 3]
    again = table.find_or_insert(torch.tensor([2**63 - 1, 20, 30]))
    assert again[:2].tolist() == [rows[4].item(), rows[1].item()]
    assert table.num_rows == 5
    assert table.find(torch.tensor([10, 99])).tolist() == [rows[0].item(), -1]


def test_growth_without_bound_keeps_mapping():
    table = PhysicalTable(dim=2)
    keys = torch.randperm(50_000) * 7919 - 10**9
    rows = table.find_or_insert(keys)
    assert table.num_rows == 50_000
    assert torch.equal(table.find(keys), rows)
    assert torch.equal(table.keys[rows], keys)
    assert table.key_index.slot_keys.numel() >= 100_000


def test_initial_rows_depend_on_key_and_seed_only():
    table_a, table_b = PhysicalTable(4, 0.05, seed=1), PhysicalTable(4, 0.05, seed=1)
    table_a.find_or_insert(torch.tensor([1, 2, 3]))
    table_b.find_or_insert(torch.tensor([3, 9, 2, 1]))
    rows_a = table_a.find(torch.tensor([1, 2, 3]))
    rows_b = table_b.find(torch.tensor([1, 2, 3]))
    assert torch.equal(table_a.weights[rows_a], table_b.weights[rows_b])
    values = initial_rows(torch.arange(10_000), 8, 0.05, 1)
    assert values.abs().max() <= 0.05 and abs(values.mean()) < 0.002
    assert not torch.equal(values, initial_rows(torch.arange(10_000), 8, 0.05, 2))


def test_export_load_round_trip():
    table = PhysicalTable(dim=3)
    table.configure_state(1, 0.5)
    table.find_or_insert(torch.tensor([5, 6, 7]))
    table.state[:3, 0] = torch.tensor([1.0, 2.0, 3.0])
    exported = table.export()
    other = PhysicalTable(dim=3)
    other.load(exported)
    other.configure_state(1, 0.5)          # keeps the loaded state
    rows = other.find(torch.tensor([7, 6, 5]))
    np.testing.assert_array_equal(other.weights[rows].numpy(), exported["weights"][::-1])
    np.testing.assert_array_equal(other.state[rows, 0].numpy(), [3.0, 2.0, 1.0])
    with pytest.raises(ValueError, match="dim 4"):
        PhysicalTable(dim=4).load(exported)


def test_a_large_table_grows_in_place(monkeypatch):
    from reckeras.embedding import physical_table as table_module
    monkeypatch.setattr(table_module, "RESERVE_FROM_ROWS", 64)
    table = PhysicalTable(dim=4, init_scale=0.1, seed=3)
    table.configure_state(1, 0.5)
    first = torch.arange(40) * 1009 - 7
    rows = table.find_or_insert(first)
    table.weights[rows] += 1.0                           # trained values to keep
    table.state[rows] = 2.0
    table.mark_written(rows)
    expected = table.weights[rows].clone()
    moved = table.find_or_insert(torch.arange(40, 100) * 1009 - 7)   # -> reserved
    assert moved.min() == 40
    start = table.weights.data_ptr()
    grown = table.find_or_insert(torch.arange(100, 5000) * 1009 - 7)  # grows inside it
    assert table.weights.data_ptr() == start and table.weights.shape[0] >= 5000
    every = torch.arange(5000) * 1009 - 7
    assert torch.equal(table.find(every), torch.cat([rows, moved, grown]))
    torch.testing.assert_close(table.weights[rows], expected)
    assert bool((table.state[rows] == 2.0).all()) and bool((table.state[grown] == 0.5).all())
    # New rows are marked written where they are created (a delta carries
    # them; generations start at 1, so 0 would be "never written"), old ones
    # keep their marks.
    assert table.generation >= 1
    assert bool((table.written_generations()[grown] == table.generation).all())
    assert bool((table.written_generations()[rows] == table.generation).all())
    torch.testing.assert_close(table.weights[grown], initial_rows(
        every[100:], 4, 0.1, 3))
    # Bytes by part count the rows written, not the reservation.
    parts = table.memory_by_part()
    assert parts["rows"] == 5000 * 16 and parts["optimizer_state"] == 5000 * 4
    # Tracking (each row's generation and count, one int32) has one entry
    # more: the one row -1 (no row) writes into.
    assert parts["keys"] == 5000 * 8 and parts["tracking"] == 5001 * 4
    assert parts["index"] == table.key_index.slot_keys.numel() * 16
    assert table.stats()["bytes"] == sum(parts.values())


def test_a_load_into_a_reserved_table_then_growth(monkeypatch):
    from reckeras.embedding import physical_table as table_module
    monkeypatch.setattr(table_module, "RESERVE_FROM_ROWS", 64)
    source = PhysicalTable(dim=2, seed=1)
    source.find_or_insert(torch.arange(300))
    table = PhysicalTable(dim=2, seed=1)
    table.find_or_insert(torch.arange(1000, 1200))
    table.load(source.export())
    table.find_or_insert(torch.arange(300, 700))
    assert torch.equal(table.keys[table.find(torch.arange(700))], torch.arange(700))
    assert bool((table.find(torch.arange(1000, 1200)) == -1).all())
    torch.testing.assert_close(table.weights[table.find(torch.arange(700))],
                               initial_rows(torch.arange(700), 2, 0.05, 1))


@pytest.mark.slow
def test_the_index_is_built_ahead_in_the_background(monkeypatch):
    from reckeras.embedding import key_index as index_module
    monkeypatch.setattr(index_module, "BUILD_AHEAD_FROM_SLOTS", 64)
    builds = []
    original = index_module.IndexBuild

    def counted(*args):
        build = original(*args)
        builds.append((build, build.rows))
        return build

    monkeypatch.setattr(index_module, "IndexBuild", counted)
    table = PhysicalTable(dim=2, seed=5)
    keys = torch.randperm(200_000) * 104729 - 2**40
    rows = []
    for chunk in keys.split(997):
        rows.append(table.find_or_insert(chunk))
        if table.key_index.building is not None:
            time.sleep(2 * CATCH_UP_S)     # let the build catch up
    rows = torch.cat(rows)
    # The doublings past 4096 slots (where a chunk of 997 keys no longer
    # crosses both 60% of the limit and the limit) came from builds begun
    # chunks before: 2^13 .. 2^19.
    assert len(builds) >= 7 and all(start > 0 for _, start in builds)
    # The builds took the keys created while they ran, not only those before.
    assert all(build.rows > start for build, start in builds)
    assert table.key_index.slot_keys.numel() == 2**19
    assert torch.equal(rows, torch.arange(200_000))
    assert torch.equal(table.find(keys), rows)
    assert torch.equal(table.keys[:200_000], keys)


def test_a_load_during_a_background_build_wins(monkeypatch):
    from reckeras.embedding import key_index as index_module
    monkeypatch.setattr(index_module, "BUILD_AHEAD_FROM_SLOTS", 64)
    table = PhysicalTable(dim=2, seed=5)
    table.find_or_insert(torch.arange(50))              # 128 slots
    table.find_or_insert(torch.arange(50, 60))          # 50 rows: past 60% of its 64
    assert table.key_index.building is not None
    source = PhysicalTable(dim=2, seed=5)
    source.find_or_insert(torch.arange(1000, 1030))
    building = table.key_index.building
    table.load(source.export())
    # The build of the old rows is dropped.
    assert building is not None and table.key_index.building is None
    table.find_or_insert(torch.arange(2000, 2100))
    assert bool((table.find(torch.arange(60)) == -1).all())
    assert torch.equal(table.keys[table.find(torch.arange(1000, 1030))],
                       torch.arange(1000, 1030))
    assert torch.equal(table.find(torch.arange(2000, 2100)), torch.arange(30, 130))


def test_a_table_dropped_during_a_background_build_ends_it(monkeypatch):
    import gc
    import threading
    from reckeras.embedding import key_index as index_module
    monkeypatch.setattr(index_module, "BUILD_AHEAD_FROM_SLOTS", 64)
    table = PhysicalTable(dim=2, seed=5, name="dropped")
    table.find_or_insert(torch.arange(50))
    table.find_or_insert(torch.arange(50, 60))
    build = table.key_index.building
    assert build is not None
    del table
    gc.collect()
    build._thread.join(timeout=5)
    assert not build._thread.is_alive()
    assert not [t for t in threading.enumerate() if t.name == "reckeras-index-dropped"]


EXITS_DURING_A_BUILD = """
import threading, time, torch
from reckeras.backend_kernels import hash_table
from reckeras.embedding import key_index, physical_table as table_module
real_rehash = hash_table.rehash
started = threading.Event()

def slow_rehash(*args, **kwargs):
    # The build is inside parallel torch ops when the script ends.
    started.set()
    for _ in range(40):
        torch.full((20_000_000,), -1, dtype=torch.int64)
    return real_rehash(*args, **kwargs)

hash_table.rehash = slow_rehash
key_index.BUILD_AHEAD_FROM_SLOTS = 64
torch.set_num_threads(2)
table = table_module.PhysicalTable(dim=2, seed=5)
table.find_or_insert(torch.arange(50))
table.find_or_insert(torch.arange(50, 60))
assert table.key_index.building is not None
assert started.wait(10)
print("leaving while the build runs")
"""


@pytest.mark.slow
def test_a_process_that_ends_during_a_background_build_exits_cleanly(tmp_path):
    # Without the exit hook the build's daemon thread, left inside a parallel
    # torch op, aborted the interpreter's finalization (exit code 134).
    import subprocess
    import sys
    script = tmp_path / "exits_during_a_build.py"
    script.write_text(EXITS_DURING_A_BUILD)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "leaving while the build runs" in done.stdout
    assert "terminate called" not in done.stderr


def test_reserved_rows_are_inserted_without_moving_the_arrays():
    table = PhysicalTable(dim=4, seed=1)
    table.load({"keys": np.arange(100), "weights": np.ones((100, 4), np.float32),
                "state": np.zeros((100, 0), np.float32)})
    table.reserve_rows(50)
    weights, slots = table.weights.data_ptr(), table.key_index.slot_keys.data_ptr()
    rows = table.find_or_insert(torch.arange(100, 150))
    assert torch.equal(rows, torch.arange(100, 150))
    assert (table.weights.data_ptr(), table.key_index.slot_keys.data_ptr()) == (weights, slots)
    np.testing.assert_array_equal(table.find(torch.arange(150)).numpy(), np.arange(150))
    np.testing.assert_array_equal(table.weights[:100].numpy(), np.ones((100, 4)))
