"""`split_per_user` and `user_items` against a per-user reference written
with plain Python loops, on random ragged logs."""

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reckeras as rk
from reckeras.datasets._user_splits import held_out_counts

logs = st.lists(st.tuples(st.integers(0, 6), st.integers(0, 30), st.integers(0, 5)),
                min_size=1, max_size=80)


def table_of(rows):
    users, items, times = zip(*rows, strict=True)
    return pa.table({"user_id": pa.array(users, pa.int64()),
                     "item_id": pa.array(items, pa.int64()),
                     "timestamp": pa.array(times, pa.int64())})


def as_rows(table):
    return list(zip(*(table[c].to_pylist() for c in ("user_id", "item_id", "timestamp")),
                    strict=True))


def expected_held(n, fraction):
    held = 0
    while held < n - 1 and held < fraction * n - 1e-9:     # ceil, at most n - 1
        held += 1
    return held


@settings(max_examples=60, deadline=None)
@given(logs, st.sampled_from([0.1, 0.2, 0.5, 0.9]))
def test_time_split_holds_out_each_users_last_rows(rows, fraction):
    train, held = rk.datasets.split_per_user(table_of(rows), by="time", fraction=fraction)
    expected_train, expected_held_rows = [], []
    for user in sorted({r[0] for r in rows}):
        mine = [(r[2], position) for position, r in enumerate(rows) if r[0] == user]
        count = expected_held(len(mine), fraction)
        held_positions = {position for _, position in sorted(mine)[len(mine) - count:]} \
            if count else set()
        for _, position in mine:
            (expected_held_rows if position in held_positions else expected_train).append(
                position)
    assert as_rows(train) == [rows[p] for p in sorted(expected_train)]
    assert as_rows(held) == [rows[p] for p in sorted(expected_held_rows)]


@settings(max_examples=60, deadline=None)
@given(logs, st.sampled_from([0.1, 0.3, 0.5]), st.integers(0, 3))
def test_random_split_counts_and_seed(rows, fraction, seed):
    table = table_of(rows)
    train, held = rk.datasets.split_per_user(table, fraction=fraction, seed=seed)
    again, _ = rk.datasets.split_per_user(table, fraction=fraction, seed=seed)
    assert train.equals(again)
    assert train.num_rows + held.num_rows == len(rows)
    users = [r[0] for r in rows]
    for user in set(users):
        n = users.count(user)
        assert held["user_id"].to_pylist().count(user) == expected_held(n, fraction)
    # Together the parts are the rows, each part in input order.
    assert sorted(as_rows(train) + as_rows(held)) == sorted(rows)


def test_random_split_draws_differ_by_seed():
    rows = [(0, item, 0) for item in range(100)]
    held = [rk.datasets.split_per_user(table_of(rows), seed=s)[1]["item_id"].to_pylist()
            for s in (0, 1)]
    assert len(held[0]) == len(held[1]) == 20 and held[0] != held[1]


def test_held_out_counts():
    np.testing.assert_array_equal(held_out_counts(np.array([0, 1, 2, 10, 11, 30]), 0.1),
                                  [0, 0, 1, 1, 2, 3])


@settings(max_examples=60, deadline=None)
@given(logs, st.lists(st.integers(0, 9), max_size=12))
def test_user_items_pads_each_users_items(rows, users):
    result = rk.datasets.user_items(table_of(rows), np.array(users, dtype=np.int64))
    lists = [[r[1] for r in rows if r[0] == u] for u in users]
    width = max(map(len, lists), default=0)
    assert result.dtype == np.int64 and result.shape == (len(users), width)
    for row, items in zip(result.tolist(), lists, strict=True):
        assert row == items + [-1] * (width - len(items))


def test_bad_arguments_name_the_problem():
    table = table_of([(0, 1, 0)])
    with pytest.raises(ValueError, match="by must be one of"):
        rk.datasets.split_per_user(table, by="day")
    with pytest.raises(ValueError, match=r"fraction must be in \(0, 1\)"):
        rk.datasets.split_per_user(table, fraction=1.0)
    with pytest.raises(ValueError, match="no column 'ts'"):
        rk.datasets.split_per_user(table, by="time", timestamp="ts")
    with pytest.raises(ValueError, match="'item_id' holds a negative item -3"):
        rk.datasets.user_items(table_of([(0, -3, 0)]), [0])
    floats = table.set_column(1, "item_id", pa.array([1.5]))
    with pytest.raises(ValueError, match="'item_id' must hold integers"):
        rk.datasets.user_items(floats, [0])
    with pytest.raises(TypeError, match="Dataset or a pyarrow Table"):
        rk.datasets.split_per_user({"user_id": [0]})


def test_works_on_a_dataset():
    test = rk.datasets.load("retrieval_synth", "test")
    train, held = rk.datasets.split_per_user(test, by="time", fraction=0.5)
    assert train.num_rows + held.num_rows == test.num_rows
