import gzip

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

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

    def test_no_match(self, tmp_path):
        with pytest.raises(FileNotFoundError, match="day_"):
            rkd.criteo_tsv(str(tmp_path / "day_*"))
