"""A `PhysicalTable`'s change tracking in one int32 a row: the generation a
row was last written in (what `export_changes` returns) and the count of
steps that saw it, saturating at 2047 (`MAX_COUNT`), checked against
counts and generations kept by hand."""

import numpy as np
import pytest
import torch

from reckeras.embedding import physical_table as table_module
from reckeras.embedding.physical_table import PhysicalTable


def test_the_packing_constants():
    assert table_module.COUNT_BITS == 11
    assert table_module.MAX_COUNT == 2047
    assert table_module.MAX_GENERATION == 2**20 - 1
    # The largest entry is a non-negative int32.
    assert (table_module.MAX_GENERATION << 11) | 2047 == 2**31 - 1


def test_a_count_saturates_at_2047():
    table = PhysicalTable(dim=2)
    rows = table.find_or_insert(torch.tensor([10, 20, 30]))
    for _ in range(3000):
        table.mark_written(rows[:1])
    for _ in range(2047):
        table.mark_written(rows[1:2])
    for _ in range(2046):
        table.mark_written(rows[2:3])
    assert table.seen_counts()[rows].tolist() == [2047, 2047, 2046]
    exported = table.export()
    assert dict(zip(exported["keys"].tolist(), exported["seen_steps"].tolist())) == \
        {10: 2047, 20: 2047, 30: 2046}
    assert exported["seen_steps"].dtype == np.int32
    # Saturated, a row still takes the generation of its next mark.
    table.next_generation()
    table.mark_written(rows[:1])
    assert table.written_generations()[rows].tolist() == [2, 1, 1]
    assert table.seen_counts()[rows].tolist() == [2047, 2047, 2046]


def test_duplicates_count_once_and_row_minus_one_marks_nothing():
    table = PhysicalTable(dim=2)
    rows = table.find_or_insert(torch.tensor([1, 2, 3, 4]))
    table.next_generation()
    table.next_generation()                            # generation 3
    minus = torch.tensor([-1])
    table.mark_written(torch.cat([minus, rows[[0, 0, 0, 2]], minus, rows[[2]], minus]))
    table.mark_written(torch.cat([rows[[2, 2]], minus]))
    table.mark_written(torch.tensor([-1, -1], dtype=torch.int64))
    assert table.seen_counts().tolist() == [1, 0, 2, 0]
    assert table.written_generations().tolist() == [3, 1, 3, 1]
    assert table.export_changes(2)["keys"].tolist() == [1, 3]
    # The sink entry takes row -1's marks; the rows it becomes start clean.
    new = table.find_or_insert(torch.arange(100, 200))
    assert table.seen_counts()[new].eq(0).all()
    assert table.written_generations()[new].eq(3).all()


def test_export_changes_after_several_generations():
    table = PhysicalTable(dim=2)
    keys = torch.arange(100, 120)
    rows = table.find_or_insert(keys)                  # generation 1: all 20 rows
    written = {int(k): 1 for k in keys}                # key -> generation, by hand
    counts = dict.fromkeys(written, 0)
    plan = {1: [0, 1, 2], 2: [], 3: [2, 3, 4, 5], 4: [7], 5: [0, 19]}
    for generation in range(1, 6):
        assert table.generation == generation
        for i in plan[generation]:
            table.mark_written(rows[[i, i]])
            written[100 + i] = generation
            counts[100 + i] += 1
        assert table.next_generation() == generation
    created = table.find_or_insert(torch.tensor([500, 501]))  # in generation 6
    table.mark_written(created[:1])
    written.update({500: 6, 501: 6})
    counts.update({500: 1, 501: 0})
    for since in range(7):
        changes = table.export_changes(since)
        expected = sorted(k for k, g in written.items() if g > since)
        assert sorted(changes["keys"].tolist()) == expected, since
        assert dict(zip(changes["keys"].tolist(), changes["seen_steps"].tolist())) == \
            {k: counts[k] for k in expected}
    assert sorted(table.export_changes(4)["keys"].tolist()) == [100, 119, 500, 501]
    # Compaction keeps each kept row's generation and count.
    keep = table.find(torch.tensor([100, 103, 107, 110, 500]))
    moved = table.compact(keep.sort().values)
    kept = table.keys[moved].tolist()
    assert table.written_generations()[moved].tolist() == [written[k] for k in kept]
    assert table.seen_counts()[moved].tolist() == [counts[k] for k in kept]


def test_a_state_reset_marks_every_row_and_keeps_the_counts():
    table = PhysicalTable(dim=2)
    rows = table.find_or_insert(torch.tensor([1, 2, 3]))
    table.mark_written(rows[:2])
    table.mark_written(rows[:1])
    table.next_generation()
    table.next_generation()
    table.configure_state(1, 0.5)                      # a new optimizer state
    assert table.written_generations().tolist() == [3, 3, 3]
    assert table.seen_counts().tolist() == [2, 1, 0]


def test_a_load_clamps_counts_to_2047_and_marks_rows_written():
    # Counts as a checkpoint saved before they saturated may hold them.
    arrays = {"keys": np.array([7, 8, 9, 10], np.int64),
              "weights": np.ones((4, 2), np.float32), "state": np.zeros((4, 0), np.float32),
              "seen_steps": np.array([5000, 2047, 3, 0], np.int32)}
    table = PhysicalTable(dim=2)
    table.find_or_insert(torch.tensor([1, 2]))
    for _ in range(4):
        table.next_generation()                        # generation 5
    table.load(arrays)
    rows = table.find(torch.tensor([7, 8, 9, 10]))
    assert table.seen_counts()[rows].tolist() == [2047, 2047, 3, 0]
    assert table.written_generations()[rows].tolist() == [5, 5, 5, 5]
    assert dict(zip(table.export()["keys"].tolist(), table.export()["seen_steps"].tolist())) \
        == {7: 2047, 8: 2047, 9: 3, 10: 0}
    changes = table.export_changes(4)
    assert sorted(changes["keys"].tolist()) == [7, 8, 9, 10]
    assert sorted(changes["deleted"].tolist()) == [1, 2]
    assert table.export_changes(5)["keys"].size == 0
    # A row loaded saturated stays at 2047 when marked again.
    table.mark_written(rows)
    assert table.seen_counts()[rows].tolist() == [2047, 2047, 4, 1]


def test_generations_stop_at_the_limit_with_an_error_naming_the_table():
    table = PhysicalTable(dim=2, name="user_id")
    rows = table.find_or_insert(torch.tensor([1, 2]))
    table.generation = 2**20 - 2
    assert table.next_generation() == 2**20 - 2
    table.mark_written(rows[:1])                       # the last generation holds
    assert table.written_generations().tolist() == [2**20 - 1, 1]
    assert table.seen_counts().tolist() == [1, 0]
    with pytest.raises(RuntimeError, match=r"user_id.*1048575.*new process"):
        table.next_generation()
    assert table.generation == 2**20 - 1               # unchanged
    assert table.tracking.min() >= 0                   # nothing wrapped negative
    assert table.export_changes(2**20 - 2)["keys"].tolist() == [1]


@pytest.mark.parametrize("reserve_from, held_rows", [(2**20, 2000), (64, 1500)])
def test_tracking_takes_4_bytes_a_row(monkeypatch, reserve_from, held_rows):
    # 1000 rows, then 500 more: the arrays double to 2000 rows. A table in
    # reserved memory (from 64 rows on) counts the 1500 rows written, another
    # its whole capacity.
    monkeypatch.setattr(table_module, "RESERVE_FROM_ROWS", reserve_from)
    table = PhysicalTable(dim=4)
    table.find_or_insert(torch.arange(1000))
    table.find_or_insert(torch.arange(1000, 1500))
    assert table.weights.shape[0] == 2000
    # One int32 a row, and the one entry the row -1 writes into.
    assert table.memory_by_part()["tracking"] == (held_rows + 1) * 4
    assert table._bytes_per_row() == 4 * 4 + 8 + 4    # row, key, tracking
