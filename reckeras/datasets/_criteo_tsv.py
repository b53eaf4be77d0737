"""Criteo's click-log text format as a dataset source: one unit per file.

Each line of the Kaggle Display Advertising Challenge's train.txt and of the
Criteo 1TB Click Logs' day_N files is: the label, 13 integer counts I1..I13
and 26 hex-hashed categories C1..C26, tab-separated, no header, with empty
fields for missing values. Files may be gzip-compressed (`.gz`). Public
samples re-exported through a dataframe write the counts as decimals
(`260.0`), so counts are parsed as text, then as integers or, failing that,
as whole decimals.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.fs as pafs

from reckeras.datasets._dataset import LABEL, Dataset, rows_of
from reckeras.datasets._files import (
    BadFiles,
    Located,
    PathsOrGlobs,
    file_error,
    lines_before_break,
    locate,
    source_name,
)

NUMERIC_COLUMNS = [f"I{i}" for i in range(1, 14)]
CATEGORICAL_COLUMNS = [f"C{i}" for i in range(1, 27)]
COLUMNS = [LABEL, *NUMERIC_COLUMNS, *CATEGORICAL_COLUMNS]
SCHEMA = pa.schema(
    [pa.field(LABEL, pa.int64())]
    + [pa.field(name, pa.int64()) for name in NUMERIC_COLUMNS]
    + [pa.field(name, pa.string()) for name in CATEGORICAL_COLUMNS])

# How the file is parsed: counts as text, converted by `_counts`.
_READ_TYPES = pa.schema([pa.field(name, pa.string())
                         if name in NUMERIC_COLUMNS else SCHEMA.field(name)
                         for name in COLUMNS])

# A decimal count: digits with an optional fraction and exponent.
_DECIMAL = r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$"

# Bytes parsed per block: big enough to amortize per-block overhead, small
# enough that a multi-GB day file streams in bounded memory.
_BLOCK_BYTES = 16 << 20


class _UnparsedCountError(Exception):
    """A count that is neither an integer nor a whole decimal."""

    def __init__(self, row: int, value: str):
        super().__init__(value)
        self.row = row
        self.value = value


def _counts(text: pa.ChunkedArray) -> pa.ChunkedArray:
    """int64 counts of a text column; raises `_UnparsedCountError` for the first bad one."""
    try:
        return text.cast(pa.int64())
    except pa.ArrowInvalid:
        pass
    well_formed = pc.match_substring_regex(text, _DECIMAL)
    numbers = pc.if_else(well_formed, text, None).cast(pa.float64())
    # float64 holds every integer below 2**53 exactly, far above any count.
    whole = pc.and_(pc.equal(pc.floor(numbers), numbers),
                    pc.less(pc.abs(numbers), 2.0 ** 63))
    bad = pc.and_(pc.is_valid(text), pc.invert(pc.fill_null(whole, False)))
    if pc.any(bad).as_py():
        row = pc.index(bad, True).as_py()
        raise _UnparsedCountError(row, text[row].as_py())
    return numbers.cast(pa.int64())


class _BadCountError(ValueError):
    """A count that is not a whole number, named by file, line and column."""


def _field_count_error(path: str, line: int, fields: int) -> ValueError:
    return ValueError(
        f"{path}, line {line}: expected {len(COLUMNS)} tab-separated "
        f"fields (label, I1..I13, C1..C26), got {fields}")


def _first_bad_line(filesystem: pafs.FileSystem,
                    path: str) -> tuple[int, int] | None:
    """`(line number, field count)` of the first line without 40 fields, if any."""
    with filesystem.open_input_stream(path) as stream:
        line_number, tail = 0, b""
        while chunk := stream.read(_BLOCK_BYTES):
            lines = (tail + chunk).split(b"\n")
            tail = lines.pop()
            for line in lines:
                line_number += 1
                if line.count(b"\t") != len(COLUMNS) - 1:
                    return line_number, line.count(b"\t") + 1
        if tail:
            return line_number + 1, tail.count(b"\t") + 1
    return None


class _CriteoTsvSource:
    """The source of a Criteo TSV `Dataset`: its units are the files."""

    def __init__(self, located: Located, bad_files: BadFiles):
        self._filesystem = located.filesystem
        self.files = located.paths
        self.schema = SCHEMA
        self.bad_files = bad_files
        self._unit_rows: list[int] | None = None

    def unit_rows(self) -> list[int]:
        # Counting lines needs a pass over the files, so it waits until a
        # caller needs row counts (before any shard is cut). The same pass
        # finds a truncated .gz and most lines without 40 fields: under
        # "skip" such files are dropped here, alike on every rank.
        if self._unit_rows is None:
            counts = {}
            for path in self.files:
                try:
                    counts[path] = self._count_lines(path)
                except (OSError, ValueError) as error:
                    self.bad_files.reject(path, error, "open", error.__cause__)
            self.files = [path for path in self.files if path in counts]
            self._unit_rows = [counts[path] for path in self.files]
        return self._unit_rows

    def _count_lines(self, path: str) -> int:
        lines, tabs, last = 0, 0, b"\n"
        try:
            with self._filesystem.open_input_stream(path) as stream:
                while chunk := stream.read(_BLOCK_BYTES):
                    lines += chunk.count(b"\n")
                    tabs += chunk.count(b"\t")
                    last = chunk[-1:]
        except OSError as error:
            whole_lines = lines_before_break(self._filesystem, path)
            raise file_error(path, error, None if whole_lines is None
                             else f"after line {whole_lines}") from error
        lines += last != b"\n"
        # Every line holds 39 tabs: another total means a line that does not
        # (lines that err both ways and balance are found when read).
        if tabs != lines * (len(COLUMNS) - 1):
            bad = _first_bad_line(self._filesystem, path)
            if bad is not None:
                raise _field_count_error(path, *bad)
        return lines

    def read_unit(self, unit: int, start: int, stop: int,
                  columns: list[str] | None) -> Iterator[pa.Table]:
        path = self.files[unit]
        try:
            yield from self._read_rows(path, start, stop, columns)
        except OSError as error:
            self.bad_files.reject(path, file_error(path, error), "read", error)
        except _BadCountError as error:
            self.bad_files.reject(path, error, "read", None)
        except pa.ArrowException as error:
            bad = _first_bad_line(self._filesystem, path)
            self.bad_files.reject(path, file_error(path, error) if bad is None
                                  else _field_count_error(path, *bad), "read",
                                  error)

    def _read_rows(self, path: str, start: int, stop: int,
                   columns: list[str] | None) -> Iterator[pa.Table]:
        reader = pcsv.open_csv(
            self._filesystem.open_input_stream(path),
            read_options=pcsv.ReadOptions(column_names=COLUMNS,
                                          block_size=_BLOCK_BYTES),
            parse_options=pcsv.ParseOptions(delimiter="\t", quote_char=False,
                                            ignore_empty_lines=False),
            convert_options=pcsv.ConvertOptions(
                column_types=_READ_TYPES, null_values=[""],
                strings_can_be_null=True, include_columns=columns or COLUMNS))
        # No header and no skipped lines: row r of the file is line r + 1.
        first_row = start
        for table in rows_of(reader, start, stop):
            for name in NUMERIC_COLUMNS:
                if name not in table.column_names:
                    continue
                try:
                    counts = _counts(table[name])
                except _UnparsedCountError as bad:
                    raise _BadCountError(
                        f"{path}, line {first_row + bad.row + 1}, column "
                        f"{name}: count {bad.value!r} is not an integer") from None
                table = table.set_column(table.column_names.index(name),
                                         SCHEMA.field(name), counts)
            first_row += table.num_rows
            yield table


def criteo_tsv(path_or_glob: PathsOrGlobs, *,
               filesystem: pafs.FileSystem | None = None,
               on_bad_file: str = "raise") -> Dataset:
    """Opens Criteo click logs in their original tab-separated format.

    Lines hold the label, I1..I13 and C1..C26. Batches carry `label` and
    `I1`..`I13` as int64 and `C1`..`C26` as hex strings (hash them with the
    features package); empty fields become nulls. Counts may be written as
    integers (`260`) or whole decimals (`260.0`). Files are streamed block
    by block, so multi-GB day files never load whole; row counts (needed by
    `num_rows`, sharding and shuffling) take one extra pass over the bytes,
    on first need. That pass also finds a truncated `.gz` and a line without
    40 fields (unless lines with too many and too few balance out: those are
    found when read), before any shard is cut.

    Args:
        path_or_glob: a file (plain or `.gz`), a directory (every file
            below it) or a glob such as "criteo/day_*.gz"; a local path or a
            pyarrow filesystem URI. Or a list of them.
        filesystem: a `pyarrow.fs.FileSystem` that `path_or_glob` is in;
            None for a local path or a URI.
        on_bad_file: "raise" to raise the error naming a bad file; "skip" to
            log a warning and go on without it: a file found bad by the
            line count pass is left out of `Dataset.files` (on every rank
            alike), one that fails while read loses the rest of the file.
            `Dataset.skipped_files` lists them.

    Returns:
        A `Dataset` with one unit per file, in sorted path order.

    Raises:
        FileNotFoundError: when nothing matches.
        ValueError: for `on_bad_file` other than "raise" or "skip"; under
            "raise", for a line without 40 fields or a count that is not a
            whole number (naming the file and line).
        OSError: under "raise", for a file that cannot be read, e.g. a
            truncated `.gz` (naming the file and the line it breaks after).

    Example:

    ```python
    days = rk.datasets.criteo_tsv("/data/criteo/day_*.gz")
    batch = next(days.batches(4096, columns=["label", "C1"]))
    ```
    """
    bad_files = BadFiles(on_bad_file)
    located = locate(path_or_glob, filesystem, ("",), "Criteo TSV")
    return Dataset(_CriteoTsvSource(located, bad_files), source_name(path_or_glob), {
        "description": "Criteo click logs (tab-separated: label, I1..I13, "
                       "C1..C26)",
        "format": "criteo_tsv"})
