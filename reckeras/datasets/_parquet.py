"""Parquet files as a dataset source: one unit per row group.

Pages are read with their checksums verified: a page written with a CRC
(pyarrow's `write_page_checksum=True`, and other writers that set it) whose
bytes changed fails to read, naming its file and row group, instead of
decoding to other values.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import pyarrow.dataset as ds
import pyarrow.fs as pafs

from reckeras.datasets._dataset import LABEL, Dataset
from reckeras.datasets._files import BadFiles, Located, PathsOrGlobs, locate, source_name
from reckeras.datasets._fragments import (
    METADATA_KEY,
    FragmentSource,
    Partitioning,
    footer_description,
)

__all__ = ["METADATA_KEY", "from_parquet", "open_files"]


def _format() -> ds.ParquetFileFormat:
    return ds.ParquetFileFormat(default_fragment_scan_options=(
        ds.ParquetFragmentScanOptions(page_checksum_verification=True)))


def _description(source: FragmentSource) -> dict[str, Any]:
    return footer_description(source.fragments[0])


def open_files(files: Sequence[str | os.PathLike], name: str,
               partition_base_dir: str | os.PathLike | None = None) -> Dataset:
    """A `Dataset` over the given local parquet files.

    Its metadata is the JSON description `generate` writes into the first
    file's footer (empty for other files).

    Args:
        files: the parquet files, in storage order; they must share one
            schema.
        name: the dataset's name, for messages.
        partition_base_dir: a directory above the files whose `key=value`
            subdirectories are read as hive partition columns; None for
            none.

    Returns:
        A `Dataset` with one unit per row group.

    Raises:
        ValueError: when a file is not readable parquet or the files do not
            share one schema (naming the file).

    Example:

    ```python
    from reckeras.datasets._parquet import open_files

    path = rk.datasets.load("criteo_synth", split="test").files[0]
    test = open_files([path], "my_test")
    ```
    """
    paths = [os.fspath(file) for file in files]
    filesystem = pafs.LocalFileSystem()
    located = Located(filesystem, paths, os.fspath(partition_base_dir or ""),
                      [info.size for info in filesystem.get_file_info(paths)])
    source = FragmentSource(located, _format(),
                            None if partition_base_dir is None else "hive",
                            "parquet", BadFiles("raise"))
    return Dataset(source, name, _description(source))


def from_parquet(path_or_glob: PathsOrGlobs, *,
                 partitioning: Partitioning = "hive",
                 filesystem: pafs.FileSystem | None = None,
                 label: str = LABEL, on_bad_file: str = "raise") -> Dataset:
    """Opens parquet files as a `Dataset`.

    Directories named `key=value` below the given directory (hive
    partitions, as in `logs/dt=2026-11-30/part-0.parquet`) become columns
    after the files' own, one value per file: use them as features like any
    column.

    Every footer is read when the files are opened: a truncated file (no
    footer), or one whose footer places row groups past the end of its data,
    is found then, before any shard is cut. A page that fails its checksum or
    does not decode is found when read, naming the file and row group.

    Args:
        path_or_glob: a parquet file, a directory (every `*.parquet` file
            below it), or a glob pattern such as "data/day_*.parquet" (`**`
            for any depth); a local path, or a URI of any pyarrow filesystem
            such as "file:///data/logs". Or a list of them: the files of
            each, once each.
        partitioning: "hive" to read `key=value` directories as columns
            (pyarrow infers their type: int32 for integers, else string);
            a `pyarrow.dataset.partitioning(...)` to declare their types or
            read another layout; None to ignore the directory names.
        filesystem: a `pyarrow.fs.FileSystem` that `path_or_glob` is in;
            None for a local path or a URI.
        label: the name of the label column (`Dataset.label` is None when
            the files have no such column).
        on_bad_file: "raise" to raise the error naming a file that cannot
            be read; "skip" to log a warning and go on without it: a file
            found bad when opened is left out of `Dataset.files` (on every
            rank alike, so shards agree), one that fails while read loses
            the rest of that row group. `Dataset.skipped_files` lists them.

    Returns:
        A `Dataset` over the matching files, in sorted path order, with one
        unit per row group.

    Raises:
        FileNotFoundError: when nothing matches.
        ValueError: when a file is not readable parquet (under "raise"; under
            "skip" when none is) or does not share the first file's schema
            (naming the file), a partition key is also a column, or
            `on_bad_file` is neither "raise" nor "skip".

    Example:

    ```python
    train = rk.datasets.from_parquet("/data/criteo/train/*.parquet")
    batches = train.batches(4096, shuffle=True, seed=0)
    logs = rk.datasets.from_parquet("file:///data/logs")   # logs/dt=.../*.parquet
    logs.schema.field("dt")   # dt: string
    ```
    """
    bad_files = BadFiles(on_bad_file)
    located = locate(path_or_glob, filesystem, (".parquet",), "parquet")
    source = FragmentSource(located, _format(), partitioning, "parquet",
                            bad_files)
    return Dataset(source, source_name(path_or_glob), _description(source), label)
