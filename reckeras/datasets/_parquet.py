"""Parquet files as a dataset source: one unit per row group."""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

import pyarrow.parquet as pq

from reckeras.datasets._dataset import Dataset

# Key of the JSON description that `generate` writes into the file footer.
METADATA_KEY = b"reckeras.dataset"


class _ParquetSource:
    """The source of a parquet `Dataset`: its units are the row groups."""

    def __init__(self, files: Sequence[str | os.PathLike]):
        self.files = [str(f) for f in files]
        self._metadata = [pq.read_metadata(f) for f in self.files]
        self.schema = pq.read_schema(self.files[0])
        for path in self.files[1:]:
            other = pq.read_schema(path)
            if not other.equals(self.schema, check_metadata=False):
                raise ValueError(
                    f"parquet file {path} has schema\n{other.remove_metadata()}\n"
                    f"but {self.files[0]} has\n{self.schema.remove_metadata()}\n"
                    f"all files of a dataset must share one schema")
        # Units are (file index, row group index) in storage order.
        self._units = [(f, g) for f, meta in enumerate(self._metadata)
                       for g in range(meta.num_row_groups)]
        self._unit_rows = [self._metadata[f].row_group(g).num_rows
                           for f, g in self._units]

    def unit_rows(self) -> list[int]:
        return self._unit_rows

    def read_unit(self, unit: int, start: int, stop: int,
                  columns: list[str] | None) -> Iterator[pa.Table]:
        file_index, group = self._units[unit]
        # Passing the footer read at construction skips re-parsing it.
        with pq.ParquetFile(self.files[file_index],
                            metadata=self._metadata[file_index]) as parquet_file:
            table = parquet_file.read_row_group(group, columns=columns)
        yield table.slice(start, stop - start)

    def description(self) -> dict[str, Any]:
        raw = (self.schema.metadata or {}).get(METADATA_KEY)
        return json.loads(raw) if raw else {}


def _expand(path_or_glob: str | os.PathLike) -> list[str]:
    pattern = os.fspath(path_or_glob)
    if os.path.isdir(pattern):
        files = sorted(str(p) for p in Path(pattern).rglob("*.parquet"))
    elif any(char in pattern for char in "*?["):
        files = sorted(p for p in glob.glob(pattern, recursive=True)
                       if os.path.isfile(p))
    else:
        files = [pattern] if os.path.isfile(pattern) else []
    if not files:
        raise FileNotFoundError(f"no parquet files match {pattern!r}")
    return files


def open_files(files: Sequence[str | os.PathLike], name: str) -> Dataset:
    """A `Dataset` over the given parquet files.

    Its metadata is the JSON description `generate` writes into the first
    file's footer (empty for other files).

    Args:
        files: the parquet files, in storage order; they must share one
            schema.
        name: the dataset's name, for messages.

    Returns:
        A `Dataset` with one unit per row group.

    Raises:
        ValueError: when the files do not share one schema.

    Example:

    ```python
    from reckeras.datasets._parquet import open_files

    path = rk.datasets.load("criteo_synth", split="test").files[0]
    test = open_files([path], "my_test")
    ```
    """
    source = _ParquetSource(files)
    return Dataset(source, name, source.description())


def from_parquet(path_or_glob: str | os.PathLike) -> Dataset:
    """Opens parquet files as a `Dataset`.

    Args:
        path_or_glob: a parquet file, a directory (every `*.parquet` file
            below it), or a glob pattern such as "data/day_*.parquet".

    Returns:
        A `Dataset` over the matching files, in sorted path order.

    Raises:
        FileNotFoundError: when nothing matches.
        ValueError: when the files do not share one schema (naming the file
            that differs).

    Example:

    ```python
    train = rk.datasets.from_parquet("/data/criteo/train/*.parquet")
    batches = train.batches(4096, shuffle=True, seed=0)
    ```
    """
    return open_files(_expand(path_or_glob), os.fspath(path_or_glob))
