"""Criteo's click-log text format as a dataset source: one unit per file.

Each line of the Kaggle Display Advertising Challenge's train.txt and of the
Criteo 1TB Click Logs' day_N files is: the label, 13 integer counts I1..I13
and 26 hex-hashed categories C1..C26, tab-separated, no header, with empty
fields for missing values. Files may be gzip-compressed (`.gz`).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator, Sequence

import pyarrow as pa
import pyarrow.csv as pcsv

from reckeras.datasets._dataset import LABEL, Dataset

NUMERIC_COLUMNS = [f"I{i}" for i in range(1, 14)]
CATEGORICAL_COLUMNS = [f"C{i}" for i in range(1, 27)]
COLUMNS = [LABEL] + NUMERIC_COLUMNS + CATEGORICAL_COLUMNS
SCHEMA = pa.schema(
    [pa.field(LABEL, pa.int64())]
    + [pa.field(name, pa.int64()) for name in NUMERIC_COLUMNS]
    + [pa.field(name, pa.string()) for name in CATEGORICAL_COLUMNS])

# Bytes parsed per block: big enough to amortize per-block overhead, small
# enough that a multi-GB day file streams in bounded memory.
_BLOCK_BYTES = 16 << 20


def _open_stream(path: str) -> pa.NativeFile:
    return pa.input_stream(path, compression="detect")


def _first_bad_line(path: str) -> tuple[int, int] | None:
    """`(line number, field count)` of the first line without 40 fields, if any."""
    with _open_stream(path) as stream:
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

    def __init__(self, files: Sequence[str | os.PathLike]):
        self.files = [str(f) for f in files]
        self.schema = SCHEMA
        self._unit_rows = None

    def unit_rows(self) -> list[int]:
        # Counting lines needs a pass over the files, so it waits until a
        # caller needs row counts (plain unsharded, unshuffled reads do not).
        if self._unit_rows is None:
            self._unit_rows = [self._count_lines(path) for path in self.files]
        return self._unit_rows

    @staticmethod
    def _count_lines(path: str) -> int:
        lines, last = 0, b"\n"
        with _open_stream(path) as stream:
            while chunk := stream.read(_BLOCK_BYTES):
                lines += chunk.count(b"\n")
                last = chunk[-1:]
        return lines + (last != b"\n")

    def read_unit(self, unit: int, start: int, stop: int,
                  columns: list[str] | None) -> Iterator[pa.Table]:
        path = self.files[unit]
        try:
            yield from self._read_rows(path, start, stop, columns)
        except pa.ArrowInvalid as error:
            bad = _first_bad_line(path)
            if bad is None:
                raise ValueError(f"{path}: {error}") from error
            line, fields = bad
            raise ValueError(
                f"{path}, line {line}: expected {len(COLUMNS)} tab-separated "
                f"fields (label, I1..I13, C1..C26), got {fields}") from error

    def _read_rows(self, path: str, start: int, stop: int,
                   columns: list[str] | None) -> Iterator[pa.Table]:
        reader = pcsv.open_csv(
            _open_stream(path),
            read_options=pcsv.ReadOptions(column_names=COLUMNS,
                                          block_size=_BLOCK_BYTES),
            parse_options=pcsv.ParseOptions(delimiter="\t", quote_char=False,
                                            ignore_empty_lines=False),
            convert_options=pcsv.ConvertOptions(
                column_types=SCHEMA, null_values=[""],
                strings_can_be_null=True, include_columns=columns or COLUMNS))
        offset = 0
        for batch in reader:
            lo, hi = max(start - offset, 0), min(stop - offset, batch.num_rows)
            offset += batch.num_rows
            if lo < hi:
                yield pa.Table.from_batches([batch.slice(lo, hi - lo)])
            if offset >= stop:
                return


def criteo_tsv(path_or_glob: str | os.PathLike) -> Dataset:
    """Opens Criteo click logs in their original tab-separated format.

    Lines hold the label, I1..I13 and C1..C26. Batches carry `label` and
    `I1`..`I13` as int64 and `C1`..`C26` as hex strings (hash them with the
    features package); empty fields become nulls. Files are streamed block
    by block, so multi-GB day files never load whole; row counts (needed by
    `num_rows`, sharding and shuffling) take one extra pass over the bytes.

    Args:
        path_or_glob: a file (plain or `.gz`) or a glob such as
            "criteo/day_*.gz".

    Returns:
        A `Dataset` with one unit per file, in sorted path order.

    Raises:
        FileNotFoundError: when nothing matches.
        ValueError: while reading, for a line without 40 fields (naming the
            file and line).

    Example:

    ```python
    days = rk.datasets.criteo_tsv("/data/criteo/day_*.gz")
    batch = next(days.batches(4096, columns=["label", "C1"]))
    ```
    """
    pattern = os.fspath(path_or_glob)
    files = sorted(p for p in glob.glob(pattern) if os.path.isfile(p))
    if not files:
        raise FileNotFoundError(f"no Criteo TSV files match {pattern!r}")
    return Dataset(_CriteoTsvSource(files), pattern, {
        "description": "Criteo click logs (tab-separated: label, I1..I13, "
                       "C1..C26)",
        "format": "criteo_tsv"})
