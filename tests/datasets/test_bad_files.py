"""Bad data files (issue 17, item 3): errors name the file, `on_bad_file`.

Every fault is injected for real: files cut with `os.truncate` or spliced,
bytes flipped inside a parquet page or an ORC stripe footer, text lines cut
or garbled, `.gz` streams cut. Expected rows come from what was written
(`key` numbers every row) or from pyarrow.parquet / the csv module reading
the good files, never from the readers under test.
"""

import csv
import gzip
import logging
import os
import re
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.orc as orc
import pyarrow.parquet as pq
import pytest

import reckeras.datasets as rkd

ROWS = 2_000              # rows per file; `key` numbers them across files
GROUP_ROWS = 500          # parquet row groups per file: 4


def key_table(first, rows=ROWS):
    keys = np.arange(first, first + rows)
    return pa.table({
        "label": keys % 2,
        "key": keys,
        "x": np.random.default_rng(first).normal(size=rows),
        "s": [f"id{key % 97}" for key in keys],
    })


def write_parquet(directory, parts=3, checksums=True):
    directory.mkdir(exist_ok=True)
    paths = [directory / f"part-{part}.parquet" for part in range(parts)]
    for part, path in enumerate(paths):
        pq.write_table(key_table(part * ROWS), path, row_group_size=GROUP_ROWS,
                       write_page_checksum=checksums)
    return paths


def flip(path, offset, count=8):
    with open(path, "r+b") as file:
        file.seek(offset)
        data = file.read(count)
        file.seek(offset)
        file.write(bytes(byte ^ 0xFF for byte in data))


def chunk_span(path, row_group, column):
    """[first, end) bytes of a column chunk, from pyarrow.parquet's metadata."""
    chunk = pq.ParquetFile(path).metadata.row_group(row_group).column(column)
    first = chunk.dictionary_page_offset if chunk.has_dictionary_page \
        else chunk.data_page_offset
    return first, first + chunk.total_compressed_size


def keys_of(data, batch_size=300, **kwargs):
    # Every column: a bad page is found only when its column is read.
    batches = list(data.batches(batch_size, **kwargs))
    return np.concatenate([b["key"].to_numpy() for b in batches]) \
        if batches else np.zeros(0, np.int64)


def good_keys(paths):
    return np.concatenate([pq.read_table(path)["key"].to_numpy() for path in paths])


def group_keys(part, row_group):
    """The keys written to a row group of part-<part>.parquet."""
    first = part * ROWS + row_group * GROUP_ROWS
    return np.arange(first, first + GROUP_ROWS)


def without(keys, dropped):
    return keys[~np.isin(keys, dropped)]


class TestParquet:
    @pytest.mark.parametrize("where", ["footer", "row group"])
    def test_cut_file_is_named_when_opened(self, tmp_path, where):
        paths = write_parquet(tmp_path / "d")
        bad = paths[1]
        cut = os.path.getsize(bad) - 10 if where == "footer" else \
            sum(chunk_span(bad, 2, 1)) // 2
        os.truncate(bad, cut)
        with pytest.raises(ValueError, match=re.escape(str(bad))):
            rkd.from_parquet(tmp_path / "d")
        data = rkd.from_parquet(tmp_path / "d", on_bad_file="skip")
        assert data.files == [str(paths[0]), str(paths[2])]
        [skipped] = data.skipped_files
        assert (skipped.path, skipped.when) == (str(bad), "open")
        assert "magic bytes" in skipped.reason
        np.testing.assert_array_equal(keys_of(data), good_keys([paths[0], paths[2]]))
        assert data.num_rows == 2 * ROWS

    def test_footer_kept_but_data_cut_is_named_when_opened(self, tmp_path):
        paths = write_parquet(tmp_path / "d")
        bad = paths[2]
        first, end = chunk_span(bad, 1, 1)
        data = bad.read_bytes()
        # 100 bytes of row group 1 spliced out; the footer still describes them.
        bad.write_bytes(data[:first + 100] + data[first + 200:])
        with pytest.raises(ValueError, match=rf"{re.escape(str(bad))}, row group 3: "
                                             r"the footer places .*was cut"):
            rkd.from_parquet(tmp_path / "d")
        skipping = rkd.from_parquet(tmp_path / "d", on_bad_file="skip")
        assert skipping.files == [str(paths[0]), str(paths[1])]
        np.testing.assert_array_equal(keys_of(skipping), good_keys(paths[:2]))

    def test_flipped_page_fails_its_checksum_naming_the_row_group(self, tmp_path):
        paths = write_parquet(tmp_path / "d")
        bad = paths[1]
        first, end = chunk_span(bad, 2, 2)          # row group 2, column x
        flip(bad, (first + end) // 2)
        data = rkd.from_parquet(tmp_path / "d")     # footers are fine
        with pytest.raises(OSError, match=rf"{re.escape(str(bad))}, row group 2: "
                                          r".*CRC checksum verification failed"):
            data.to_table()
        skipping = rkd.from_parquet(tmp_path / "d", on_bad_file="skip")
        expected = without(np.arange(3 * ROWS), group_keys(1, 2))
        for _ in range(2):                          # every pass skips it again
            np.testing.assert_array_equal(keys_of(skipping), expected)
        [skipped] = skipping.skipped_files
        assert (skipped.path, skipped.when) == (str(bad), "read")
        assert f"{bad}, row group 2: " in skipped.reason
        assert skipping.files == [str(path) for path in paths]
        np.testing.assert_array_equal(skipping.to_table()["key"].to_numpy(), expected)

    def test_flipped_page_header_is_named_without_checksums(self, tmp_path):
        paths = write_parquet(tmp_path / "d", checksums=False)
        chunk = pq.ParquetFile(paths[0]).metadata.row_group(1).column(1)
        flip(paths[0], chunk.data_page_offset, 4)   # the page header of `key`
        with pytest.raises(OSError, match=rf"(?s){re.escape(str(paths[0]))}, "
                                          r"row group 1: .*page header"):
            rkd.from_parquet(tmp_path / "d").to_table()
        skipping = rkd.from_parquet(tmp_path / "d", on_bad_file="skip")
        np.testing.assert_array_equal(
            keys_of(skipping), without(np.arange(3 * ROWS), group_keys(0, 1)))

    def test_first_file_bad(self, tmp_path):
        paths = write_parquet(tmp_path / "d")
        os.truncate(paths[0], 100)
        with pytest.raises(ValueError, match=re.escape(str(paths[0]))):
            rkd.from_parquet(tmp_path / "d")
        data = rkd.from_parquet(tmp_path / "d", on_bad_file="skip")
        assert data.files == [str(paths[1]), str(paths[2])]
        assert data.schema == key_table(0).schema
        np.testing.assert_array_equal(keys_of(data), good_keys(paths[1:]))

    def test_every_file_bad(self, tmp_path):
        paths = write_parquet(tmp_path / "d", parts=2)
        for path in paths:
            os.truncate(path, 100)
        with pytest.raises(ValueError, match=r"none of the 2 parquet files is "
                                             r"readable.*part-0\.parquet"):
            rkd.from_parquet(tmp_path / "d", on_bad_file="skip")

    def test_other_schema_raises_even_when_skipping(self, tmp_path):
        write_parquet(tmp_path / "d", parts=2)
        pq.write_table(pa.table({"label": [0]}), tmp_path / "d" / "part-9.parquet")
        with pytest.raises(ValueError, match=r"part-9\.parquet has schema"):
            rkd.from_parquet(tmp_path / "d", on_bad_file="skip")

    def test_skip_logs_a_warning(self, tmp_path, caplog):
        paths = write_parquet(tmp_path / "d", parts=2)
        os.truncate(paths[1], 100)
        with caplog.at_level(logging.WARNING, logger="reckeras.datasets"):
            rkd.from_parquet(tmp_path / "d", on_bad_file="skip")
        [record] = caplog.records
        assert str(paths[1]) in record.getMessage()
        assert "dropped before sharding" in record.getMessage()


class TestShards:
    @pytest.mark.parametrize("num_shards", [2, 3])
    def test_file_bad_when_opened_leaves_shards_of_the_good_rows(self, tmp_path,
                                                                 num_shards):
        paths = write_parquet(tmp_path / "d", parts=4)
        os.truncate(paths[1], os.path.getsize(paths[1]) // 2)
        data = rkd.from_parquet(tmp_path / "d", on_bad_file="skip")
        shards = [keys_of(data, shard_index=k, num_shards=num_shards,
                          shuffle=True, seed=5) for k in range(num_shards)]
        for k, shard in enumerate(shards):
            assert len(list(data.batches(300, shard_index=k, num_shards=num_shards))) \
                == data.num_batches(300, shard_index=k, num_shards=num_shards)
        joined = np.sort(np.concatenate(shards))
        np.testing.assert_array_equal(joined, np.sort(good_keys(
            [paths[0], paths[2], paths[3]])))

    def test_shard_that_loses_rows_while_reading_makes_them_up(self, tmp_path):
        paths = write_parquet(tmp_path / "d", parts=2)
        first, end = chunk_span(paths[1], 1, 2)
        flip(paths[1], (first + end) // 2)           # rows 2500..2999: shard 1
        data = rkd.from_parquet(tmp_path / "d", on_bad_file="skip")
        counts = [len(list(data.batches(300, shard_index=k, num_shards=2)))
                  for k in range(2)]
        assert counts == [data.num_batches(300, shard_index=k, num_shards=2)
                          for k in range(2)] == [7, 7]
        np.testing.assert_array_equal(keys_of(data, shard_index=0, num_shards=2),
                                      np.arange(0, 2000))
        # Shard 1 ([2000, 4000) but for the 500 bad rows) wraps around to
        # the first shard's first 500 rows.
        np.testing.assert_array_equal(
            keys_of(data, shard_index=1, num_shards=2),
            np.r_[2000:2500, 3000:4000, 0:500])


def orc_stripes(path):
    """(offset, index, data, footer lengths) of an uncompressed ORC file's
    stripes, read from its postscript and footer (protobuf) by hand."""
    def varint(data, at):
        value = shift = 0
        while True:
            byte = data[at]
            at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value, at

    def fields(data):
        at, found = 0, []
        while at < len(data):
            key, at = varint(data, at)
            number, wire = key >> 3, key & 7
            if wire == 0:
                value, at = varint(data, at)
            else:
                assert wire == 2, wire
                size, at = varint(data, at)
                value, at = data[at:at + size], at + size
            found.append((number, value))
        return found

    data = path.read_bytes()
    postscript_size = data[-1]
    postscript = dict(fields(data[-1 - postscript_size:-1]))
    assert postscript.get(2, 0) == 0                    # compression: NONE
    footer = data[-1 - postscript_size - postscript[1]:-1 - postscript_size]
    return [tuple(dict(fields(value)).get(field, 0) for field in (1, 2, 3, 4))
            for number, value in fields(footer) if number == 3]


class TestOrc:
    def write(self, directory, compression="zlib"):
        directory.mkdir(exist_ok=True)
        paths = [directory / f"part-{part}.orc" for part in range(3)]
        for part, path in enumerate(paths):
            orc.write_table(key_table(part * ROWS), path, stripe_size=4 << 10,
                            compression=compression)
        return paths

    def test_truncated_file_is_named_when_opened(self, tmp_path):
        paths = self.write(tmp_path / "d")
        os.truncate(paths[2], os.path.getsize(paths[2]) // 2)
        with pytest.raises(OSError, match=re.escape(str(paths[2]))):
            rkd.from_orc(tmp_path / "d")
        data = rkd.from_orc(tmp_path / "d", on_bad_file="skip")
        assert data.files == [str(paths[0]), str(paths[1])]
        assert [s.when for s in data.skipped_files] == ["open"]
        np.testing.assert_array_equal(keys_of(data), np.arange(2 * ROWS))

    def test_flipped_stripe_footer_names_the_stripe(self, tmp_path):
        paths = self.write(tmp_path / "d", compression="uncompressed")
        stripes = orc_stripes(paths[1])
        assert len(stripes) >= 2
        offset, index, data_size, footer = stripes[1]
        flip(paths[1], offset + index + data_size, footer)
        with pytest.raises(OSError, match=rf"{re.escape(str(paths[1]))}, stripe 1: "):
            rkd.from_orc(tmp_path / "d").to_table()
        data = rkd.from_orc(tmp_path / "d", on_bad_file="skip")
        keys = keys_of(data)
        # The bad file keeps what was decoded before stripe 1 (a prefix of
        # its rows, maybe empty); the others are whole.
        kept = keys[(keys >= ROWS) & (keys < 2 * ROWS)]
        np.testing.assert_array_equal(kept, np.arange(ROWS, ROWS + len(kept)))
        assert len(kept) < ROWS
        np.testing.assert_array_equal(without(keys, kept), np.r_[0:ROWS, 2 * ROWS:3 * ROWS])
        assert [s.when for s in data.skipped_files] == ["read"]


def write_text(path, rows, delimiter=",", header=True, opener=open):
    with opener(path, "wt", newline="") as file:
        writer = csv.writer(file, delimiter=delimiter, lineterminator="\n")
        if header:
            writer.writerow(["label", "key", "x", "s"])
        writer.writerows(rows)


def text_rows(first, rows=ROWS):
    return [[key % 2, key, f"{key * 0.25}", f"id{key % 97}"]
            for key in range(first, first + rows)]


def csv_keys(data):
    return data.to_table()["key"].to_numpy()


class TestCsv:
    def write(self, directory, parts=3, opener=open, suffix=".csv"):
        directory.mkdir(exist_ok=True)
        paths = [directory / f"part-{part}{suffix}" for part in range(parts)]
        for part, path in enumerate(paths):
            write_text(path, text_rows(part * ROWS), opener=opener)
        return paths

    def test_garbled_line_is_named_when_rows_are_counted(self, tmp_path):
        paths = self.write(tmp_path / "d")
        lines = paths[1].read_text().split("\n")
        lines[6] = "1,2006"                              # line 7: 2 fields
        paths[1].write_text("\n".join(lines))
        data = rkd.from_csv(tmp_path / "d")
        with pytest.raises(ValueError, match=rf"{re.escape(str(paths[1]))}.*"
                                             r"Row #7: Expected 4 columns, got 2"):
            data.num_rows
        skipping = rkd.from_csv(tmp_path / "d", on_bad_file="skip")
        assert skipping.files == [str(paths[0]), str(paths[2])]
        assert [s.when for s in skipping.skipped_files] == ["open"]
        np.testing.assert_array_equal(csv_keys(skipping),
                                      np.r_[0:ROWS, 2 * ROWS:3 * ROWS])

    def test_cut_last_line_is_named(self, tmp_path):
        paths = self.write(tmp_path / "d")
        text = paths[2].read_bytes()
        os.truncate(paths[2], text.rindex(b","))       # the last line loses `s`
        with pytest.raises(ValueError, match=rf"{re.escape(str(paths[2]))}.*"
                                             rf"Row #{ROWS + 1}: Expected 4 columns, "
                                             r"got 3"):
            rkd.from_csv(tmp_path / "d").to_table()
        skipping = rkd.from_csv(tmp_path / "d", on_bad_file="skip")
        np.testing.assert_array_equal(csv_keys(skipping), np.arange(2 * ROWS))

    @pytest.mark.slow
    def test_value_that_does_not_fit_skips_the_rest_of_the_file(self, tmp_path):
        paths = self.write(tmp_path / "d", parts=2)
        # 8 MiB: pyarrow decodes blocks of 1 MiB, a few ahead of the reader.
        rows = text_rows(ROWS, 400_000)
        rows[350_000][1] = "not-a-key"                   # line 350002
        write_text(paths[1], rows)
        with pytest.raises(ValueError, match=rf"{re.escape(str(paths[1]))}.*"
                                             r"'key'.*Row #350002.*not-a-key"):
            rkd.from_csv(tmp_path / "d").to_table()
        skipping = rkd.from_csv(tmp_path / "d", on_bad_file="skip")
        keys = csv_keys(skipping)
        # The blocks decoded before the bad one stay.
        kept = len(keys) - ROWS
        assert 0 < kept < 350_000
        np.testing.assert_array_equal(keys, np.arange(ROWS + kept))
        [skipped] = skipping.skipped_files
        assert (skipped.path, skipped.when) == (str(paths[1]), "read")

    def test_truncated_gzip_names_the_line_it_breaks_after(self, tmp_path):
        paths = self.write(tmp_path / "d", opener=gzip.open, suffix=".csv.gz")
        packed = paths[0].read_bytes()
        paths[0].write_bytes(packed[:len(packed) // 2])
        # The lines whole in what Python's zlib decodes of the cut stream.
        decoded = zlib.decompressobj(wbits=31).decompress(packed[:len(packed) // 2])
        whole = decoded.count(b"\n")
        with pytest.raises(OSError) as error:
            rkd.from_csv(tmp_path / "d").num_rows
        match = re.search(rf"{re.escape(str(paths[0]))}, after line (\d+): ",
                          str(error.value))
        assert match and whole - 8192 // 10 <= int(match.group(1)) <= whole
        skipping = rkd.from_csv(tmp_path / "d", on_bad_file="skip")
        assert skipping.files == [str(paths[1]), str(paths[2])]
        np.testing.assert_array_equal(csv_keys(skipping), np.arange(ROWS, 3 * ROWS))


def criteo_line(key):
    return "\t".join([str(key % 2), str(key)] + ["1"] * 12
                     + [f"{key % 251:08x}"] * 26) + "\n"


class TestCriteoTsv:
    def write(self, directory, opener=open, suffix=""):
        directory.mkdir(exist_ok=True)
        paths = [directory / f"day_{day}{suffix}" for day in range(3)]
        for day, path in enumerate(paths):
            with opener(path, "wt") as file:
                file.write("".join(criteo_line(key)
                                   for key in range(day * ROWS, (day + 1) * ROWS)))
        return paths

    @staticmethod
    def keys(data):
        return data.to_table()["I1"].to_numpy()

    def test_cut_line_is_named_when_lines_are_counted(self, tmp_path):
        paths = self.write(tmp_path / "d")
        text = paths[1].read_bytes()
        os.truncate(paths[1], text.rindex(b"\t"))       # the last line: 39 fields
        with pytest.raises(ValueError, match=rf"{re.escape(str(paths[1]))}, line "
                                             rf"{ROWS}: expected 40 .*got 39"):
            rkd.criteo_tsv(tmp_path / "d").num_rows
        skipping = rkd.criteo_tsv(tmp_path / "d", on_bad_file="skip")
        assert skipping.files == [str(paths[0]), str(paths[2])]
        np.testing.assert_array_equal(self.keys(skipping),
                                      np.r_[0:ROWS, 2 * ROWS:3 * ROWS])

    def test_truncated_gzip_names_the_line_it_breaks_after(self, tmp_path):
        paths = self.write(tmp_path / "d", opener=gzip.open, suffix=".gz")
        packed = paths[2].read_bytes()
        paths[2].write_bytes(packed[:len(packed) // 3])
        decoded = zlib.decompressobj(wbits=31).decompress(packed[:len(packed) // 3])
        with pytest.raises(OSError) as error:
            rkd.criteo_tsv(tmp_path / "d").num_rows
        match = re.search(rf"{re.escape(str(paths[2]))}, after line (\d+): ",
                          str(error.value))
        assert match and int(match.group(1)) <= decoded.count(b"\n")
        skipping = rkd.criteo_tsv(tmp_path / "d", on_bad_file="skip")
        np.testing.assert_array_equal(self.keys(skipping), np.arange(2 * ROWS))

    def test_lines_that_balance_are_named_when_read(self, tmp_path):
        paths = self.write(tmp_path / "d")
        lines = paths[0].read_text().split("\n")
        lines[9] = lines[9] + "\textra"                 # line 10: 41 fields
        lines[10] = lines[10].rsplit("\t", 1)[0]        # line 11: 39 fields
        paths[0].write_text("\n".join(lines))
        data = rkd.criteo_tsv(tmp_path / "d")
        assert data.num_rows == 3 * ROWS                # the tab count balances
        with pytest.raises(ValueError, match=rf"{re.escape(str(paths[0]))}, line 10: "
                                             r"expected 40 .*got 41"):
            data.to_table()
        skipping = rkd.criteo_tsv(tmp_path / "d", on_bad_file="skip")
        np.testing.assert_array_equal(self.keys(skipping), np.arange(ROWS, 3 * ROWS))
        assert [s.when for s in skipping.skipped_files] == ["read"]

    def test_count_that_is_not_a_number_skips_the_file(self, tmp_path):
        paths = self.write(tmp_path / "d")
        lines = paths[2].read_text().split("\n")
        fields = lines[4].split("\t")
        fields[3] = "x1"                                 # I3 of line 5
        lines[4] = "\t".join(fields)
        paths[2].write_text("\n".join(lines))
        with pytest.raises(ValueError, match=rf"{re.escape(str(paths[2]))}, line 5, "
                                             r"column I3: count 'x1'"):
            rkd.criteo_tsv(tmp_path / "d").to_table()
        skipping = rkd.criteo_tsv(tmp_path / "d", on_bad_file="skip")
        np.testing.assert_array_equal(self.keys(skipping), np.arange(2 * ROWS))


@pytest.mark.parametrize("reader", [rkd.from_parquet, rkd.from_orc, rkd.from_csv,
                                    rkd.criteo_tsv])
@pytest.mark.parametrize("value", ["ignore", "Skip", None, True])
def test_on_bad_file_is_checked(tmp_path, reader, value):
    with pytest.raises(ValueError, match=r"on_bad_file must be 'raise' or 'skip', "
                                         rf"got {re.escape(repr(value))}"):
        reader(tmp_path / "none", on_bad_file=value)
