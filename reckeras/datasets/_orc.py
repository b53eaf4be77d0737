"""ORC files as a dataset source: one unit per file."""

from __future__ import annotations

import os

import pyarrow.dataset as ds
import pyarrow.fs as pafs

from reckeras.datasets._dataset import LABEL, Dataset
from reckeras.datasets._files import locate
from reckeras.datasets._fragments import FragmentSource, Partitioning


def from_orc(path_or_glob: str | os.PathLike, *,
             partitioning: Partitioning = "hive",
             filesystem: pafs.FileSystem | None = None,
             label: str = LABEL) -> Dataset:
    """Opens ORC files as a `Dataset`, as `from_parquet` opens parquet.

    Everything `from_parquet` says of paths, URIs and hive partitions holds.
    The unit of shuffling and sharding is a whole file (pyarrow does not
    tell how many rows an ORC stripe holds), so a shard that starts inside a
    file decodes the file from its start, and shuffling permutes files, then
    rows within windows.

    Args:
        path_or_glob: an ORC file, a directory (every `*.orc` file below
            it), or a glob; a local path or a pyarrow filesystem URI.
        partitioning: "hive" to read `key=value` directories as columns, a
            `pyarrow.dataset.partitioning(...)`, or None.
        filesystem: a `pyarrow.fs.FileSystem` that `path_or_glob` is in;
            None for a local path or a URI.
        label: the name of the label column (`Dataset.label` is None when
            the files have no such column).

    Returns:
        A `Dataset` over the matching files, in sorted path order.

    Raises:
        FileNotFoundError: when nothing matches.
        ValueError: when a file is not readable ORC or does not share the
            first file's schema (naming the file), or a partition key is
            also a column.

    Example:

    ```python
    logs = rk.datasets.from_orc("/data/logs")   # logs/dt=.../part-*.orc
    batch = next(logs.batches(4096, columns=["label", "dt"]))
    ```
    """
    located = locate(path_or_glob, filesystem, (".orc",), "ORC")
    source = FragmentSource(located, ds.OrcFileFormat(), partitioning, "ORC")
    return Dataset(source, os.fspath(path_or_glob), {"format": "orc"}, label)
