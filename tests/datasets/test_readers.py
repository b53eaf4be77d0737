import gzip
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reckeras.datasets as rkd


def write_parts(directory, parts=3, rows=5):
    directory.mkdir(parents=True, exist_ok=True)
    for part in range(parts):
        start = part * rows
        pq.write_table(pa.table({
            "label": np.arange(start, start + rows) % 2,
            "x": np.arange(start, start + rows, dtype=np.float32),
        }), directory / f"part-{part}.parquet")


class TestFromParquet:
    def test_directory_glob_and_single_file(self, tmp_path):
        write_parts(tmp_path / "d")
        by_dir = rkd.from_parquet(tmp_path / "d")
        by_glob = rkd.from_parquet(str(tmp_path / "d" / "part-*.parquet"))
        single = rkd.from_parquet(tmp_path / "d" / "part-1.parquet")
        assert by_dir.num_rows == by_glob.num_rows == 15
        assert by_dir.files == by_glob.files
        assert by_dir.to_table()["x"].to_pylist() == list(range(15))
        assert single.to_table()["x"].to_pylist() == [5, 6, 7, 8, 9]
        assert by_dir.label == "label"
        assert by_dir.schema.names == ["label", "x"]

    def test_a_list_of_files_dirs_and_globs_reads_each_file_once(self, tmp_path):
        write_parts(tmp_path / "d")
        write_parts(tmp_path / "e", parts=2, rows=4)
        listed = rkd.from_parquet([tmp_path / "d" / "part-2.parquet",
                                   str(tmp_path / "d" / "part-[02].parquet"),
                                   tmp_path / "e"])
        assert listed.files == sorted([str(tmp_path / "d" / "part-0.parquet"),
                                       str(tmp_path / "d" / "part-2.parquet"),
                                       str(tmp_path / "e" / "part-0.parquet"),
                                       str(tmp_path / "e" / "part-1.parquet")])
        assert listed.num_rows == 5 + 5 + 4 + 4
        assert listed.to_table()["x"].to_pylist() == [0, 1, 2, 3, 4, 10, 11, 12, 13, 14,
                                                      0, 1, 2, 3, 4, 5, 6, 7]
        assert listed.name.endswith("d/part-[02].parquet, " + str(tmp_path / "e"))
        with pytest.raises(FileNotFoundError, match="missing"):
            rkd.from_parquet([tmp_path / "d", tmp_path / "missing.parquet"])
        with pytest.raises(ValueError, match="non-empty list"):
            rkd.from_parquet([])

    def test_a_list_keeps_the_partitions_below_its_common_directory(self, tmp_path):
        for day in ("2026-12-01", "2026-12-02"):
            write_parts(tmp_path / "logs" / f"dt={day}", parts=1, rows=2)
        data = rkd.from_parquet([tmp_path / "logs" / "dt=2026-12-01",
                                 tmp_path / "logs" / "dt=2026-12-02" / "part-0.parquet"])
        assert data.to_table()["dt"].to_pylist() == ["2026-12-01"] * 2 + ["2026-12-02"] * 2

    def test_batches_cross_file_boundaries(self, tmp_path):
        write_parts(tmp_path / "d")
        data = rkd.from_parquet(tmp_path / "d")
        batches = list(data.batches(4))
        assert [b.num_rows for b in batches] == [4, 4, 4, 3]
        assert batches[1]["x"].to_pylist() == [4, 5, 6, 7]

    def test_schema_mismatch_names_the_file(self, tmp_path):
        write_parts(tmp_path / "d", parts=2)
        odd = tmp_path / "d" / "part-9.parquet"
        pq.write_table(pa.table({"label": [0], "x": [1.0]}), odd)  # float64
        with pytest.raises(ValueError, match="part-9.parquet"):
            rkd.from_parquet(tmp_path / "d")

    def test_no_match_names_the_pattern(self, tmp_path):
        pattern = str(tmp_path / "missing-*.parquet")
        with pytest.raises(FileNotFoundError, match="missing-"):
            rkd.from_parquet(pattern)
        with pytest.raises(FileNotFoundError):
            rkd.from_parquet(tmp_path / "nope.parquet")

    def test_bayes_auc_needs_teacher_prob(self, tmp_path):
        write_parts(tmp_path / "d")
        with pytest.raises(ValueError, match="teacher_prob") as error:
            rkd.from_parquet(tmp_path / "d").bayes_auc()
        assert str(tmp_path / "d") in str(error.value)


def tsv_line(label, numerics, categoricals):
    return "\t".join([label] + numerics + categoricals) + "\n"


ROWS = [
    tsv_line("1", ["5", "", "-1"] + ["0"] * 10,
             ["68fd1e64", ""] + ["0a519c5c"] * 24),
    tsv_line("0", [""] * 13, [""] * 26),
    tsv_line("0", [str(i) for i in range(13)],
             [f"{i:08x}" for i in range(26)]),
]


class TestCriteoTsv:
    def test_values_types_and_nulls(self, tmp_path):
        path = tmp_path / "day_0"
        path.write_text("".join(ROWS))
        data = rkd.criteo_tsv(path)
        assert data.num_rows == 3
        table = data.to_table()
        assert table.schema.field("label").type == pa.int64()
        assert table.schema.field("I1").type == pa.int64()
        assert table.schema.field("C1").type == pa.string()
        assert table["label"].to_pylist() == [1, 0, 0]
        assert table["I1"].to_pylist() == [5, None, 0]
        assert table["I2"].to_pylist() == [None, None, 1]
        assert table["I3"].to_pylist() == [-1, None, 2]
        assert table["C1"].to_pylist() == ["68fd1e64", None, "00000000"]
        assert table["C2"].to_pylist() == [None, None, "00000001"]
        assert table["C26"].to_pylist() == ["0a519c5c", None, "00000019"]

    def test_gzip_glob_shards_and_columns(self, tmp_path):
        for day in range(2):
            with gzip.open(tmp_path / f"day_{day}.gz", "wt") as f:
                f.write("".join(ROWS * 2))
        data = rkd.criteo_tsv(str(tmp_path / "day_*.gz"))
        assert data.num_rows == 12
        shards = [pa.Table.from_batches(list(data.batches(
            5, columns=["label", "C1"], shard_index=k, num_shards=3)))
            for k in range(3)]
        assert [s.num_rows for s in shards] == [4, 4, 4]
        assert shards[0].schema.names == ["label", "C1"]
        joined = pa.concat_tables(shards)["C1"].to_pylist()
        assert joined == ["68fd1e64", None, "00000000"] * 4

    def test_wrong_field_count_names_file_and_line(self, tmp_path):
        path = tmp_path / "bad.txt"
        path.write_text(ROWS[0] + ROWS[1] + "1\t2\t3\n" + ROWS[2])
        with pytest.raises(ValueError, match=r"bad\.txt, line 3: .*got 3"):
            rkd.criteo_tsv(path).to_table()

    def test_truncated_gzip_names_the_file(self, tmp_path):
        packed = gzip.compress("".join(ROWS * 200).encode())
        (tmp_path / "day_9.gz").write_bytes(packed[:len(packed) // 2])
        with pytest.raises(OSError, match=r"day_9\.gz"):
            rkd.criteo_tsv(tmp_path / "day_9.gz").num_rows
        with pytest.raises(OSError, match=r"day_9\.gz"):
            list(rkd.criteo_tsv(tmp_path / "day_9.gz").batches(10))

    def test_no_match(self, tmp_path):
        with pytest.raises(FileNotFoundError, match="day_"):
            rkd.criteo_tsv(str(tmp_path / "day_*"))


def criteo_text(rows, write_count):
    """Criteo lines from (label, counts, categories) rows; counts via
    `write_count(value)` (None: an empty field)."""
    return "".join(tsv_line(
        str(label), ["" if v is None else write_count(v) for v in counts],
        ["" if c is None else c for c in categories])
        for label, counts, categories in rows)


CRITEO_ROWS = st.lists(st.tuples(
    st.integers(0, 1),
    st.lists(st.one_of(st.none(), st.integers(-1, 10**9)), min_size=13,
             max_size=13),
    st.lists(st.one_of(st.none(), st.sampled_from(["68fd1e64", "0a519c5c"])),
             min_size=26, max_size=26)), min_size=1, max_size=40)


class TestCriteoDecimalCounts:
    @settings(max_examples=25, deadline=None)
    @given(CRITEO_ROWS, st.sampled_from(["{}.0", "{}.000", "{}e0"]))
    def test_decimal_file_reads_as_the_integer_file(self, rows, decimal):
        with tempfile.TemporaryDirectory() as directory:
            integers = Path(directory) / "integers.txt"
            decimals = Path(directory) / "decimals.txt"
            integers.write_text(criteo_text(rows, str))
            decimals.write_text(criteo_text(rows, decimal.format))
            expected = pa.table(
                [pa.array([r[0] for r in rows], pa.int64())]
                + [pa.array([r[1][i] for r in rows], pa.int64())
                   for i in range(13)]
                + [pa.array([r[2][i] for r in rows], pa.string())
                   for i in range(26)],
                schema=rkd.criteo_tsv(integers).schema)
            assert rkd.criteo_tsv(integers).to_table().equals(expected)
            from_decimals = rkd.criteo_tsv(decimals)
            assert from_decimals.to_table().equals(expected)
            shards = [pa.Table.from_batches(list(from_decimals.batches(
                3, shard_index=k, num_shards=2)), expected.schema)
                for k in range(2)]
            assert pa.concat_tables(shards).equals(expected)

    def test_mixed_forms_in_one_file(self, tmp_path):
        path = tmp_path / "day_0"
        path.write_text(tsv_line("1", ["260.0", "3", "", "-1.0", "1e2"]
                                 + ["0"] * 8, ["x"] * 26))
        table = rkd.criteo_tsv(path).to_table()
        assert [table[f"I{i}"][0].as_py() for i in range(1, 6)] == \
            [260, 3, None, -1, 100]

    @pytest.mark.parametrize("bad", ["2.5", "abc", "nan", "1e30"])
    def test_non_integer_count_names_file_line_and_column(self, tmp_path, bad):
        path = tmp_path / "day_3"
        good = tsv_line("0", ["1.0"] * 13, ["x"] * 26)
        path.write_text(good * 2 + tsv_line("1", ["1.0"] * 4 + [bad]
                                            + ["1.0"] * 8, ["x"] * 26))
        with pytest.raises(ValueError,
                           match=rf"day_3, line 3, column I5: count '{bad}'"):
            rkd.criteo_tsv(path).to_table()
        # Also when the bad line is read by the second of two shards.
        with pytest.raises(ValueError, match="day_3, line 3, column I5"):
            list(rkd.criteo_tsv(path).batches(1, shard_index=1, num_shards=2))
