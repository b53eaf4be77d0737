"""Dataset.windows: one dataset per partition value, ordered by value."""

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

import reckeras.datasets as rkd

DAYS = ["2026-12-02", "2026-11-30", "2026-12-01"]   # written out of order
HOURS = [21, 3, 10]                                  # "10" < "21" < "3" as text


def write_logs(root, days=DAYS, hours=HOURS, rows=7, row_group_size=3):
    """logs/dt=<day>/hour=<h>/part-0.parquet; x encodes (day, hour, row)."""
    written = {}
    for day_index, day in enumerate(days):
        for hour in hours:
            x = np.arange(rows) + 1000 * hour + 100_000 * day_index
            table = pa.table({"label": x % 2, "x": x})
            directory = root / f"dt={day}" / f"hour={hour}"
            directory.mkdir(parents=True)
            pq.write_table(table, directory / "part-0.parquet",
                           row_group_size=row_group_size)
            written[(day, hour)] = table
    return written


def test_windows_by_day_and_hour_are_ordered_by_value(tmp_path):
    written = write_logs(tmp_path / "logs")
    logs = rkd.from_parquet(tmp_path / "logs")
    windows = logs.windows(["dt", "hour"])
    expected = [(day, hour) for day in sorted(DAYS) for hour in sorted(HOURS)]
    assert [tuple(w.partition.values()) for w in windows] == expected
    assert [list(w.partition) for w in windows] == [["dt", "hour"]] * len(expected)
    assert windows[0].name == f"{tmp_path / 'logs'}[dt=2026-11-30/hour=3]"
    for window, key in zip(windows, expected):
        table = window.to_table()
        assert table["x"].to_pylist() == written[key]["x"].to_pylist()
        assert set(table["dt"].to_pylist()) == {key[0]}
        assert set(table["hour"].to_pylist()) == {key[1]}
        assert window.num_rows == 7
        assert window.label == "label"
        assert len(window.files) == 1 and f"hour={key[1]}" in window.files[0]
    assert sum(w.num_rows for w in windows) == logs.num_rows


def test_windows_by_day_hold_every_hour_and_nest(tmp_path):
    written = write_logs(tmp_path / "logs")
    days = rkd.from_parquet(tmp_path / "logs").windows("dt")
    assert [d.partition for d in days] == [{"dt": d} for d in sorted(DAYS)]
    for day in days:
        # Within a window the rows keep storage (sorted path) order.
        expected = np.concatenate([written[(day.partition["dt"], h)]["x"].to_numpy()
                                   for h in sorted(HOURS, key=str)])
        np.testing.assert_array_equal(day.to_table()["x"].to_numpy(), expected)
        assert len(day.files) == 3
        hours = day.windows("hour")
        assert [h.partition for h in hours] == [{"hour": h} for h in sorted(HOURS)]
        assert hours[0].name.endswith("[dt=" + day.partition["dt"] + "][hour=3]")


def test_hours_read_as_strings_sort_as_text(tmp_path):
    write_logs(tmp_path / "logs", days=DAYS[:1])
    declared = ds.partitioning(pa.schema([("dt", pa.string()), ("hour", pa.string())]),
                               flavor="hive")
    logs = rkd.from_parquet(tmp_path / "logs", partitioning=declared)
    assert [w.partition["hour"] for w in logs.windows("hour")] == ["10", "21", "3"]


def test_declared_date_partitions_sort_as_dates(tmp_path):
    write_logs(tmp_path / "logs", hours=[1])
    declared = ds.partitioning(pa.schema([("dt", pa.date32()), ("hour", pa.int64())]),
                               flavor="hive")
    days = rkd.from_parquet(tmp_path / "logs", partitioning=declared).windows("dt")
    assert [str(d.partition["dt"]) for d in days] == sorted(DAYS)


def test_shards_and_shuffles_of_a_window_cover_it_once(tmp_path):
    write_logs(tmp_path / "logs", rows=50, row_group_size=8)
    window = rkd.from_parquet(tmp_path / "logs").windows("dt")[1]
    expected = sorted(window.to_table()["x"].to_pylist())
    assert len(expected) == 150
    for shuffle in (False, True):
        shards = [[x for batch in window.batches(16, shuffle=shuffle, seed=4,
                                                 shard_index=rank, num_shards=3)
                   for x in batch["x"].to_pylist()] for rank in range(3)]
        assert sorted(sum(shards, [])) == expected
        assert [len(s) for s in shards] == [50, 50, 50]
        assert window.num_batches(16, shard_index=2, num_shards=3) == 4
    ordered = [x for b in window.batches(16) for x in b["x"].to_pylist()]
    shuffled = [x for b in window.batches(16, shuffle=True, seed=4)
                for x in b["x"].to_pylist()]
    assert ordered != shuffled


def test_csv_windows(tmp_path):
    for day, values in (("2026-12-02", [5, 6]), ("2026-12-01", [1, 2, 3])):
        directory = tmp_path / "csv" / f"dt={day}"
        directory.mkdir(parents=True)
        pcsv.write_csv(pa.table({"label": [v % 2 for v in values], "x": values}),
                       directory / "part.csv")
    days = rkd.from_csv(tmp_path / "csv").windows("dt")
    assert [d.partition["dt"] for d in days] == ["2026-12-01", "2026-12-02"]
    assert [d.to_table()["x"].to_pylist() for d in days] == [[1, 2, 3], [5, 6]]
    assert days[0].metadata == {"format": "csv"}


def test_window_metadata_is_its_first_footer(tmp_path):
    for day in DAYS:
        table = pa.table({"label": [0, 1]}).replace_schema_metadata(
            {b"reckeras.dataset": f'{{"day": "{day}"}}'})
        (tmp_path / f"dt={day}").mkdir()
        pq.write_table(table, tmp_path / f"dt={day}" / "p.parquet")
    days = rkd.from_parquet(tmp_path).windows("dt")
    assert [d.metadata["day"] for d in days] == sorted(DAYS)


def test_no_partition_columns(tmp_path):
    write_logs(tmp_path / "logs", days=DAYS[:1], hours=[1])
    unpartitioned = rkd.from_parquet(tmp_path / "logs", partitioning=None)
    with pytest.raises(ValueError, match="partition columns.*has none"):
        unpartitioned.windows("dt")
    tsv = tmp_path / "day_0"
    tsv.write_text("\t".join(["1"] + ["1"] * 13 + ["a"] * 26) + "\n")
    with pytest.raises(ValueError, match="partition columns"):
        rkd.criteo_tsv(tsv).windows("dt")


def test_unknown_key_is_named_with_the_keys_there_are(tmp_path):
    write_logs(tmp_path / "logs", days=DAYS[:1], hours=[1])
    logs = rkd.from_parquet(tmp_path / "logs")
    with pytest.raises(ValueError, match=r"'day' is not a partition column.*\['dt', 'hour'\]"):
        logs.windows("day")
    with pytest.raises(ValueError, match="'x' is not a partition column"):
        logs.windows(["dt", "x"])
    with pytest.raises(ValueError, match="distinct"):
        logs.windows([])
    with pytest.raises(ValueError, match="distinct"):
        logs.windows(["dt", "dt"])


def test_a_file_without_the_key_is_named(tmp_path):
    write_logs(tmp_path / "logs", days=DAYS[:1], hours=[1])
    stray = tmp_path / "logs" / f"dt={DAYS[0]}" / "stray.parquet"
    pq.write_table(pa.table({"label": [1], "x": [9]}), stray)
    logs = rkd.from_parquet(tmp_path / "logs")
    assert [d.num_rows for d in logs.windows("dt")] == [8]
    with pytest.raises(ValueError, match=r"stray\.parquet has no value of partition key 'hour'"):
        logs.windows("hour")


def test_a_null_partition_value_is_named(tmp_path):
    write_logs(tmp_path / "logs", days=DAYS[:1], hours=[1])
    directory = tmp_path / "logs" / "dt=__HIVE_DEFAULT_PARTITION__" / "hour=1"
    directory.mkdir(parents=True)
    pq.write_table(pa.table({"label": [1], "x": [9]}), directory / "part-0.parquet")
    with pytest.raises(ValueError, match="HIVE_DEFAULT_PARTITION.*has no value of "
                                         "partition key 'dt'"):
        rkd.from_parquet(tmp_path / "logs").windows("dt")
