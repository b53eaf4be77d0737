import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import reckeras.datasets as rkd


def row_keys(batches):
    """One int64 per row, unique within the fixture: prob bits and id hash."""
    table = pa.Table.from_batches(list(batches))
    prob_bits = table["teacher_prob"].to_numpy().view(np.uint32).astype(np.int64)
    id_hash = np.zeros(table.num_rows, np.int64)
    for column in ("C3", "C12", "C16", "C21", "I5"):
        id_hash = id_hash * 1_000_003 + table[column].fill_null(-1).to_numpy()
    return (prob_bits << 32) | (id_hash & 0xFFFFFFFF)


def test_row_keys_identify_rows(small_synth):
    keys = row_keys(small_synth.batches(100_000))
    assert len(np.unique(keys)) == small_synth.num_rows


def test_fixture_has_several_row_groups(small_synth):
    assert pq.ParquetFile(small_synth.files[0]).num_row_groups == 3
    assert small_synth.num_rows == 2 * 65_536 + 1_000


@pytest.mark.parametrize("drop_remainder", [False, True])
def test_batch_sizes(small_synth, drop_remainder):
    sizes = [b.num_rows for b in small_synth.batches(
        5_000, drop_remainder=drop_remainder, columns=["label"])]
    full, rest = divmod(small_synth.num_rows, 5_000)
    assert sizes == [5_000] * full + ([] if drop_remainder else [rest])
    assert len(sizes) == small_synth.num_batches(5_000, drop_remainder)


def test_batches_are_record_batches_of_the_selected_columns(small_synth):
    batch = next(small_synth.batches(64, columns=["C1", "label"]))
    assert isinstance(batch, pa.RecordBatch)
    assert batch.schema.names == ["C1", "label"]


def test_unshuffled_batches_follow_storage_order(small_synth):
    expected = small_synth.to_table().column("teacher_prob")
    streamed = pa.Table.from_batches(list(small_synth.batches(
        7_777, columns=["teacher_prob"]))).column("teacher_prob")
    assert streamed.equals(expected)


def test_reiterable(small_synth):
    first = row_keys(small_synth.batches(10_000, shuffle=True, seed=3))
    again = row_keys(small_synth.batches(10_000, shuffle=True, seed=3))
    np.testing.assert_array_equal(first, again)


def test_shuffle_changes_order_but_keeps_rows(small_synth):
    plain = row_keys(small_synth.batches(10_000))
    shuffled = row_keys(small_synth.batches(10_000, shuffle=True, seed=1))
    other = row_keys(small_synth.batches(10_000, shuffle=True, seed=2))
    assert not np.array_equal(shuffled, plain)
    assert not np.array_equal(shuffled, other)
    np.testing.assert_array_equal(np.sort(shuffled), np.sort(plain))


@pytest.mark.parametrize("num_shards", [2, 3, 5])
@pytest.mark.parametrize("shuffle", [False, True])
def test_shards_are_disjoint_balanced_and_cover_all_rows(
        small_synth, num_shards, shuffle):
    shards = [row_keys(small_synth.batches(
        4_096, shuffle=shuffle, seed=7, shard_index=k, num_shards=num_shards))
        for k in range(num_shards)]
    union = np.concatenate(shards)
    np.testing.assert_array_equal(
        np.sort(union), np.sort(row_keys(small_synth.batches(100_000))))
    sizes = [len(shard) for shard in shards]
    assert max(sizes) - min(sizes) <= 1
    for k, shard in enumerate(shards):
        assert -(-len(shard) // 4_096) == small_synth.num_batches(
            4_096, shard_index=k, num_shards=num_shards)


def test_more_shards_than_row_groups_split_by_rows(tmp_path):
    table = pa.table({"label": np.arange(10) % 2, "x": np.arange(10)})
    pq.write_table(table, tmp_path / "one_group.parquet")
    data = rkd.from_parquet(tmp_path / "one_group.parquet")
    shards = [pa.Table.from_batches(list(data.batches(
        3, shard_index=k, num_shards=4)))["x"].to_pylist() for k in range(4)]
    assert shards == [[0, 1], [2, 3, 4], [5, 6], [7, 8, 9]]


@pytest.mark.parametrize("kwargs, message", [
    ({"batch_size": 0}, "batch_size"),
    ({"batch_size": 8, "num_shards": 0}, "num_shards"),
    ({"batch_size": 8, "shard_index": 2, "num_shards": 2}, "shard_index"),
    ({"batch_size": 8, "columns": ["label", "nope"]}, "nope"),
])
def test_bad_arguments(small_synth, kwargs, message):
    with pytest.raises(ValueError, match=message):
        small_synth.batches(**kwargs)
