"""from_csv, from_orc, hive partitions and filesystem URIs (issue 14, item 5).

Expected tables are built by numpy/pyarrow from the values the files were
written from (the csv module, pyarrow.parquet, pyarrow.orc), never by the
readers under test.
"""

import csv
import gzip
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.orc as orc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reckeras.datasets as rkd

GENRES = ["Action", "Comedy", "Drama", "Sci-Fi", "Film-Noir", "Children's",
          "a, quoted \"one\""]


def movie_rows(count, seed):
    """Rows of a MovieLens-like table, as Python values."""
    rng = np.random.default_rng(seed)
    rows = []
    for index in range(count):
        genres = [str(g) for g in rng.choice(GENRES, rng.integers(1, 4),
                                             replace=False)]
        rows.append({
            "label": int(rng.integers(0, 2)),
            "movie": int(rng.integers(0, 10**12)),
            # Looks numeric, is an id: declared string below.
            "zip": f"{rng.integers(0, 99999):05d}",
            "score": float(np.round(rng.normal(), 3)),
            "genres": None if index % 7 == 3 else genres,
        })
    return rows


MOVIE_TYPES = {"movie": pa.int64(), "zip": pa.string(),
               "genres": pa.list_(pa.string())}
MOVIE_SCHEMA = pa.schema([("label", pa.int64()), ("movie", pa.int64()),
                          ("zip", pa.string()), ("score", pa.float64()),
                          ("genres", pa.list_(pa.string()))])


def write_csv(path, rows, delimiter=",", header=True, opener=open):
    with opener(path, "wt", newline="") as file:
        writer = csv.writer(file, delimiter=delimiter)
        if header:
            writer.writerow(list(rows[0]))
        for row in rows:
            writer.writerow(["|".join(v) if isinstance(v, list) else
                             "" if v is None else v for v in row.values()])


def expected_table(rows):
    return pa.Table.from_pylist(rows, schema=MOVIE_SCHEMA)


def read_all(data, batch_size=7, **kwargs):
    batches = list(data.batches(batch_size, **kwargs))
    return pa.Table.from_batches(batches, schema=batches[0].schema) \
        if batches else data.schema.empty_table()


class TestFromCsv:
    def test_declared_types_and_list_column(self, tmp_path):
        rows = movie_rows(40, seed=0)
        write_csv(tmp_path / "movies.csv", rows)
        data = rkd.from_csv(tmp_path / "movies.csv", column_types=MOVIE_TYPES)
        assert data.schema == MOVIE_SCHEMA
        assert data.num_rows == 40
        assert data.label == "label"
        assert data.to_table().equals(expected_table(rows))
        assert read_all(data).equals(expected_table(rows))

    @settings(max_examples=15, deadline=None)
    @given(st.lists(st.fixed_dictionaries({
        "label": st.integers(0, 1),
        "ids": st.one_of(st.none(), st.lists(st.integers(-2**62, 2**62),
                                             min_size=1, max_size=4)),
        "name": st.one_of(st.none(), st.text(
            st.characters(blacklist_categories=["Cs", "Cc"]), min_size=1,
            max_size=6)),
    }), min_size=1, max_size=30), st.sampled_from([",", "\t", ";"]))
    def test_round_trip(self, rows, delimiter):
        schema = pa.schema([("label", pa.int64()),
                            ("ids", pa.list_(pa.int64())),
                            ("name", pa.string())])
        with tempfile.TemporaryDirectory() as directory:
            path = Path(directory) / "rows.csv"
            with open(path, "w", newline="") as file:
                writer = csv.writer(file, delimiter=delimiter)
                writer.writerow(["label", "ids", "name"])
                for row in rows:
                    writer.writerow([
                        row["label"],
                        "" if row["ids"] is None else "|".join(map(str, row["ids"])),
                        "" if row["name"] is None else row["name"]])
            data = rkd.from_csv(path, delimiter=delimiter, column_types={
                "ids": pa.list_(pa.int64()), "name": pa.string()})
            assert data.to_table().equals(pa.Table.from_pylist(rows, schema))

    def test_no_header_tsv_gzip_and_other_list_delimiter(self, tmp_path):
        rows = [{"label": 1, "tags": ["a", "b"]}, {"label": 0, "tags": ["c"]}]
        with gzip.open(tmp_path / "part.tsv.gz", "wt") as file:
            file.write("1\ta;b\n0\tc\n")
        data = rkd.from_csv(tmp_path, column_names=["label", "tags"],
                            delimiter="\t", list_delimiter=";",
                            column_types={"tags": pa.list_(pa.string())})
        assert data.files == [str(tmp_path / "part.tsv.gz")]
        assert data.to_table().to_pylist() == rows

    def test_columns_selection_and_missing_label(self, tmp_path):
        rows = movie_rows(10, seed=1)
        write_csv(tmp_path / "m.csv", rows)
        data = rkd.from_csv(tmp_path / "m.csv", column_types=MOVIE_TYPES,
                            label="rating")
        assert data.label is None
        batch = next(data.batches(4, columns=["genres"]))
        assert batch.schema == pa.schema([MOVIE_SCHEMA.field("genres")])
        assert batch["genres"].to_pylist() == [r["genres"] for r in rows[:4]]

    def test_unknown_declared_column(self, tmp_path):
        write_csv(tmp_path / "m.csv", movie_rows(3, seed=0))
        with pytest.raises(ValueError, match=r"\['rating'\].*m\.csv"):
            rkd.from_csv(tmp_path / "m.csv", column_types={"rating": pa.float32()})

    def test_value_of_the_wrong_type_names_file_column_and_row(self, tmp_path):
        write_csv(tmp_path / "a.csv", movie_rows(5, seed=0))
        (tmp_path / "b.csv").write_text(
            "label,movie,zip,score,genres\n1,7,00001,0.5,Drama\n"
            "0,not-an-id,00002,0.1,Drama\n")
        data = rkd.from_csv(str(tmp_path / "*.csv"), column_types=MOVIE_TYPES)
        with pytest.raises(ValueError, match=r"b\.csv.*'movie'.*Row #3.*"
                                             r"not-an-id"):
            data.to_table()

    def test_inferred_type_that_later_files_break_says_so(self, tmp_path):
        (tmp_path / "a.csv").write_text("label,score\n1,\n")   # score: null
        (tmp_path / "b.csv").write_text("label,score\n1,0.5\n")
        with pytest.raises(ValueError, match=r"b\.csv.*'score'.*inferred from "
                                             r"the first block of .*a\.csv"):
            rkd.from_csv(tmp_path).to_table()
        data = rkd.from_csv(tmp_path, column_types={"score": pa.float64()})
        assert data.to_table()["score"].to_pylist() == [None, 0.5]

    def test_truncated_gzip_names_the_file(self, tmp_path):
        text = "label,v\n" + "".join(f"{i % 2},{i}\n" for i in range(300_000))
        packed = gzip.compress(text.encode())
        (tmp_path / "cut.csv.gz").write_bytes(packed[:len(packed) * 3 // 4])
        with pytest.raises(OSError, match=r"cut\.csv\.gz"):
            rkd.from_csv(tmp_path / "cut.csv.gz").to_table()

    def test_list_value_of_the_wrong_type_names_file_and_column(self, tmp_path):
        (tmp_path / "a.csv").write_text("label,ids\n1,1|2\n0,3|x\n")
        data = rkd.from_csv(tmp_path / "a.csv",
                            column_types={"ids": pa.list_(pa.int64())})
        with pytest.raises(ValueError, match=r"a\.csv, column 'ids'.*'x'"):
            data.to_table()

    def test_other_header_names_the_file(self, tmp_path):
        write_csv(tmp_path / "a.csv", movie_rows(3, seed=0))
        (tmp_path / "b.csv").write_text("label,movie\n1,2\n")
        data = rkd.from_csv(tmp_path, column_types=MOVIE_TYPES)
        with pytest.raises(ValueError, match=r"CSV file .*b\.csv has schema"):
            data.to_table()


def mixed_table(rows, seed):
    """A table of numeric, id and list<int64> columns."""
    rng = np.random.default_rng(seed)
    return pa.table({
        "label": rng.integers(0, 2, rows),
        "x": rng.normal(size=rows).astype(np.float32),
        "id": rng.integers(0, 1000, rows),
        "tags": pa.array([[int(v) for v in rng.integers(0, 9, k)]
                          for k in rng.integers(0, 4, rows)],
                         pa.list_(pa.int64())),
    })


class TestFromOrc:
    def test_equals_the_same_data_as_parquet(self, tmp_path):
        (tmp_path / "orc").mkdir()
        (tmp_path / "parquet").mkdir()
        tables = [mixed_table(rows, seed) for seed, rows in enumerate((50, 1, 23))]
        for part, table in enumerate(tables):
            orc.write_table(table, tmp_path / "orc" / f"part-{part}.orc")
            pq.write_table(table, tmp_path / "parquet" / f"part-{part}.parquet",
                           row_group_size=10)
        from_orc = rkd.from_orc(tmp_path / "orc")
        from_parquet = rkd.from_parquet(tmp_path / "parquet")
        expected = pa.concat_tables(tables)
        assert from_orc.schema == expected.schema
        assert from_orc.num_rows == expected.num_rows
        assert from_orc.to_table().equals(expected)
        assert read_all(from_orc).equals(read_all(from_parquet))
        assert from_orc.metadata == {"format": "orc"}

    def test_several_stripes(self, tmp_path):
        table = pa.table({"label": np.arange(300_000) % 2,
                          "x": np.arange(300_000)})
        orc.write_table(table, tmp_path / "big.orc", stripe_size=64 << 10)
        assert orc.ORCFile(tmp_path / "big.orc").nstripes > 1
        data = rkd.from_orc(tmp_path / "big.orc")
        shard = read_all(data, 50_000, shard_index=1, num_shards=3)
        assert shard["x"].to_pylist() == list(range(100_000, 200_000))

    def test_truncated_file_names_it(self, tmp_path):
        orc.write_table(mixed_table(20, 0), tmp_path / "good.orc")
        data = (tmp_path / "good.orc").read_bytes()
        (tmp_path / "cut.orc").write_bytes(data[:len(data) // 2])
        # pyarrow raises an OSError for a bad ORC footer, as it does for
        # other I/O failures: the type is pyarrow's, the message names the file.
        with pytest.raises((ValueError, OSError), match=r"cut\.orc"):
            rkd.from_orc(tmp_path)
        with pytest.raises((ValueError, OSError), match=r"cut\.orc"):
            rkd.from_orc(str(tmp_path / "*.orc"))

    def test_schema_mismatch_names_the_file(self, tmp_path):
        orc.write_table(mixed_table(5, 0), tmp_path / "a.orc")
        orc.write_table(mixed_table(5, 1).drop_columns(["x"]), tmp_path / "b.orc")
        with pytest.raises(ValueError, match=r"ORC file .*b\.orc has schema"):
            rkd.from_orc(tmp_path)


class TestParquetFiles:
    def test_truncated_file_names_it(self, tmp_path):
        pq.write_table(mixed_table(20, 0), tmp_path / "a.parquet")
        data = (tmp_path / "a.parquet").read_bytes()
        (tmp_path / "b.parquet").write_bytes(data[:-20])
        with pytest.raises(ValueError, match=r"b\.parquet"):
            rkd.from_parquet(tmp_path)
        with pytest.raises(ValueError, match=r"b\.parquet"):
            rkd.from_parquet(tmp_path / "b.parquet")

    def test_hidden_and_underscore_files_are_skipped(self, tmp_path):
        pq.write_table(mixed_table(4, 0), tmp_path / "part-0.parquet")
        (tmp_path / "_SUCCESS").write_text("")
        (tmp_path / "_tmp").mkdir()
        (tmp_path / "_tmp" / "x.parquet").write_bytes(b"partial")
        (tmp_path / ".part-1.parquet.crc").write_bytes(b"crc")
        assert rkd.from_parquet(tmp_path).files == [str(tmp_path / "part-0.parquet")]

    def test_recursive_glob(self, tmp_path):
        for sub in ("a", "a/b", "c"):
            (tmp_path / sub).mkdir(parents=True, exist_ok=True)
            pq.write_table(mixed_table(2, 0), tmp_path / sub / "p.parquet")
        found = rkd.from_parquet(str(tmp_path / "a" / "**" / "*.parquet")).files
        assert found == [str(tmp_path / "a" / "b" / "p.parquet"),
                         str(tmp_path / "a" / "p.parquet")]


DAYS = ["2026-11-29", "2026-11-30", "2026-12-01"]
HOURS = ["03", "17"]


def write_table(fmt, table, path):
    if fmt == "parquet":
        pq.write_table(table, path, row_group_size=4)
    elif fmt == "orc":
        orc.write_table(table, path)
    else:
        pa_csv.write_csv(table, path)


def write_partitioned(root, fmt, rows_per_day=(6, 0, 9)):
    """`root/dt=<day>/hour=<hh>/part-0.<fmt>`; returns the expected table."""
    expected = []
    for index, (day, rows) in enumerate(zip(DAYS, rows_per_day)):
        for hour in HOURS:
            table = pa.table({
                "label": np.arange(rows, dtype=np.int64) % 2,
                "x": np.arange(rows, dtype=np.float64) + 100 * index + int(hour),
            })
            directory = root / f"dt={day}" / f"hour={hour}"
            directory.mkdir(parents=True)
            write_table(fmt, table, directory / f"part-0.{fmt}")
            # In sorted path order, as the readers list files.
            expected.append(table.append_column(
                "dt", pa.array([day] * rows, pa.string())).append_column(
                "hour", pa.array([int(hour)] * rows, pa.int32())))
    return pa.concat_tables(expected)


READERS = {
    "parquet": rkd.from_parquet, "orc": rkd.from_orc,
    # pyarrow writes 103.0 as "103": inference alone would read int64.
    "csv": lambda path, **kwargs: rkd.from_csv(
        path, column_types={"x": pa.float64()}, **kwargs)}


@pytest.mark.parametrize("fmt", ["parquet", "orc", "csv"])
class TestHivePartitions:
    def test_partition_columns_per_file(self, tmp_path, fmt):
        expected = write_partitioned(tmp_path / "logs", fmt)
        data = READERS[fmt](tmp_path / "logs")
        assert len(data.files) == 6
        assert data.schema.names == ["label", "x", "dt", "hour"]
        assert data.to_table().equals(expected)
        assert read_all(data, 5).equals(expected)
        only = read_all(data, 4, columns=["dt"])
        assert only["dt"].to_pylist() == expected["dt"].to_pylist()

    def test_glob_below_the_partitions(self, tmp_path, fmt):
        expected = write_partitioned(tmp_path / "logs", fmt)
        data = READERS[fmt](str(tmp_path / "logs" / "dt=2026-12-01" / "*" / "*"))
        # The glob's fixed part is the partition base: dt is above it.
        assert data.schema.names == ["label", "x", "hour"]
        day = expected.filter(pc.equal(expected["dt"], "2026-12-01"))
        assert data.to_table().equals(day.drop_columns(["dt"]))

    def test_declared_partition_types_and_none(self, tmp_path, fmt):
        write_partitioned(tmp_path / "logs", fmt)
        declared = ds.partitioning(pa.schema([("dt", pa.string()),
                                              ("hour", pa.int64())]),
                                   flavor="hive")
        data = READERS[fmt](tmp_path / "logs", partitioning=declared)
        assert data.schema.field("hour").type == pa.int64()
        assert READERS[fmt](tmp_path / "logs", partitioning=None).schema.names \
            == ["label", "x"]

    def test_partition_key_clashing_with_a_column(self, tmp_path, fmt):
        tagged = pa.table({"label": [1], "tag": ["b"]})
        (tmp_path / "same" / "tag=a").mkdir(parents=True)
        write_table(fmt, tagged, tmp_path / "same" / "tag=a" / f"p.{fmt}")
        with pytest.raises(ValueError, match="partition key 'tag'"):
            READERS[fmt](tmp_path / "same")
        write_partitioned(tmp_path / "logs", fmt)
        (tmp_path / "logs" / "x=1").mkdir()
        write_table(fmt, pa.table({"label": [1], "x": [0.5]}),
                    tmp_path / "logs" / "x=1" / f"p.{fmt}")
        with pytest.raises(ValueError, match="Field x"):
            READERS[fmt](tmp_path / "logs")


ROWS = 103
def criteo_line(row):
    # I1 carries the row id; the rest is filler of the right shape.
    return "\t".join([str(row % 2), str(row)] + ["1"] * 12
                     + [f"{row:08x}"] * 26) + "\n"


@pytest.fixture(scope="module")
def same_rows(tmp_path_factory):
    """The rows 0..102 (column `row`, or I1 for Criteo) in three files of
    every format, split 40 / 13 / 50; returns {format: dataset}."""
    root = tmp_path_factory.mktemp("same_rows")
    bounds = [0, 40, 53, ROWS]
    for fmt in ("parquet", "orc", "csv", "tsv"):
        (root / fmt).mkdir()
    for part, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
        table = pa.table({"label": np.arange(lo, hi) % 2,
                          "row": np.arange(lo, hi)})
        pq.write_table(table, root / "parquet" / f"part-{part}.parquet",
                       row_group_size=7)
        orc.write_table(table, root / "orc" / f"part-{part}.orc")
        pa_csv.write_csv(table, root / "csv" / f"part-{part}.csv")
        (root / "tsv" / f"day_{part}").write_text(
            "".join(criteo_line(row) for row in range(lo, hi)))
    return {"parquet": rkd.from_parquet(root / "parquet"),
            "orc": rkd.from_orc(root / "orc"),
            "csv": rkd.from_csv(root / "csv"),
            "tsv": rkd.criteo_tsv(str(root / "tsv" / "day_*"))}


def row_ids(data, batch_size, **kwargs):
    column = "I1" if "I1" in data.schema.names else "row"
    batches = list(data.batches(batch_size, columns=[column], **kwargs))
    assert all(b.num_rows == batch_size for b in batches[:-1])
    return [v for b in batches for v in b[column].to_pylist()]


FORMATS = ["parquet", "orc", "csv", "tsv"]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("num_shards", [2, 3])
def test_shards_are_the_single_reader_rows_cut_in_ranges(same_rows, fmt,
                                                         num_shards):
    data = same_rows[fmt]
    assert row_ids(data, 8) == list(range(ROWS))
    for k in range(num_shards):
        shard = row_ids(data, 8, shard_index=k, num_shards=num_shards)
        lo, hi = ROWS * k // num_shards, ROWS * (k + 1) // num_shards
        assert shard == list(range(lo, hi))
        assert data.num_batches(8, shard_index=k, num_shards=num_shards) == \
            -(-len(shard) // 8)


@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=8, deadline=None)
@given(num_shards=st.integers(1, 4), batch_size=st.integers(1, 40),
       seed=st.integers(0, 2**32 - 1))
def test_shuffled_shards_cover_every_row_once(same_rows, fmt, num_shards,
                                              batch_size, seed):
    data = same_rows[fmt]
    shards = [row_ids(data, batch_size, shuffle=True, seed=seed, shard_index=k,
                      num_shards=num_shards) for k in range(num_shards)]
    assert sorted(v for shard in shards for v in shard) == list(range(ROWS))
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    again = row_ids(data, batch_size, shuffle=True, seed=seed,
                    shard_index=num_shards - 1, num_shards=num_shards)
    assert again == shards[-1]


@pytest.mark.parametrize("fmt", FORMATS)
def test_shuffle_depends_on_the_seed(same_rows, fmt):
    data = same_rows[fmt]
    first = row_ids(data, 16, shuffle=True, seed=1)
    assert first == row_ids(data, 16, shuffle=True, seed=1)
    assert first != row_ids(data, 16, shuffle=True, seed=2)
    assert first != list(range(ROWS))
    assert sorted(first) == list(range(ROWS))


class TestFilesystems:
    def test_file_uris(self, tmp_path, same_rows):
        for fmt, reader in (("parquet", rkd.from_parquet),
                            ("orc", rkd.from_orc), ("csv", rkd.from_csv)):
            by_path = same_rows[fmt]
            directory = Path(by_path.files[0]).parent
            by_uri = reader(directory.as_uri())
            assert by_uri.files == by_path.files
            assert by_uri.to_table().equals(by_path.to_table())
            glob_uri = reader(directory.as_uri() + "/part-[02].*")
            assert [Path(f).name for f in glob_uri.files] == \
                [f"part-0.{fmt}", f"part-2.{fmt}"]
        tsv = same_rows["tsv"]
        by_uri = rkd.criteo_tsv(Path(tsv.files[0]).parent.as_uri() + "/day_*")
        assert by_uri.to_table().equals(tsv.to_table())

    def test_file_uri_with_hive_partitions(self, tmp_path):
        expected = write_partitioned(tmp_path / "logs", "parquet")
        data = rkd.from_parquet((tmp_path / "logs").as_uri())
        assert data.to_table().equals(expected)

    def test_missing_path_names_it(self, tmp_path):
        for reader in (rkd.from_parquet, rkd.from_orc, rkd.from_csv,
                       rkd.criteo_tsv):
            with pytest.raises(FileNotFoundError, match="nothing-here"):
                reader((tmp_path / "nothing-here").as_uri())
            with pytest.raises(FileNotFoundError, match="nothing-here"):
                reader(str(tmp_path / "nothing-here" / "*"))

    def test_in_memory_filesystem(self):
        mock = getattr(pafs, "_MockFileSystem", None)
        if mock is None:
            pytest.skip("this pyarrow ships no in-memory filesystem")
        filesystem = mock()
        table = mixed_table(30, seed=4)
        for day in DAYS[:2]:
            filesystem.create_dir(f"logs/dt={day}")
            with filesystem.open_output_stream(f"logs/dt={day}/p.parquet") as out:
                pq.write_table(table, out, row_group_size=8)
            with filesystem.open_output_stream(f"logs/dt={day}/p.orc") as out:
                orc.write_table(table, out)
            with filesystem.open_output_stream(f"logs/dt={day}/p.csv") as out:
                out.write(b"label,id\n" + b"".join(
                    f"{label},{id_}\n".encode() for label, id_ in
                    zip(table["label"].to_pylist(), table["id"].to_pylist())))
        doubled = pa.concat_tables([table, table])
        days = [d for d in DAYS[:2] for _ in range(30)]
        for reader, columns in ((rkd.from_parquet, table.column_names),
                                (rkd.from_orc, table.column_names),
                                (rkd.from_csv, ["label", "id"])):
            data = reader("logs", filesystem=filesystem)
            read = data.to_table()
            assert read.select(columns).equals(doubled.select(columns))
            assert read["dt"].to_pylist() == days
            shards = [row for k in range(3) for row in read_all(
                data, 9, shard_index=k, num_shards=3).to_pylist()]
            assert shards == read.to_pylist()
