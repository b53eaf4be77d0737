"""ORC files as a dataset source: one unit per file.

ORC streams carry no checksums: bytes changed inside a stripe may decode to
other values. What fails to decode (a broken compression chunk, stream or
stripe footer) names the file and, found by decoding the stripes one by one
once a read failed, the stripe.
"""

from __future__ import annotations

import pyarrow.dataset as ds
import pyarrow.fs as pafs

from reckeras.datasets._dataset import LABEL, Dataset
from reckeras.datasets._files import BadFiles, PathsOrGlobs, locate, source_name
from reckeras.datasets._fragments import FragmentSource, Partitioning


def from_orc(path_or_glob: PathsOrGlobs, *,
             partitioning: Partitioning = "hive",
             filesystem: pafs.FileSystem | None = None,
             label: str = LABEL, on_bad_file: str = "raise") -> Dataset:
    """Opens ORC files as a `Dataset`, as `from_parquet` opens parquet.

    Everything `from_parquet` says of paths, URIs and hive partitions holds.
    The unit of shuffling and sharding is a whole file (pyarrow does not
    tell how many rows an ORC stripe holds), so a shard that starts inside a
    file decodes the file from its start, and shuffling permutes files, then
    rows within windows. Footers are read when the files are opened, and
    again for the row counts (once, when first needed, before any shard is
    cut): a truncated file is found then.

    Args:
        path_or_glob: an ORC file, a directory (every `*.orc` file below
            it), or a glob; a local path or a pyarrow filesystem URI. Or a
            list of them.
        partitioning: "hive" to read `key=value` directories as columns, a
            `pyarrow.dataset.partitioning(...)`, or None.
        filesystem: a `pyarrow.fs.FileSystem` that `path_or_glob` is in;
            None for a local path or a URI.
        label: the name of the label column (`Dataset.label` is None when
            the files have no such column).
        on_bad_file: "raise" or "skip", as for `from_parquet`; a file that
            fails while read loses the rest of the file.

    Returns:
        A `Dataset` over the matching files, in sorted path order.

    Raises:
        FileNotFoundError: when nothing matches.
        OSError: under "raise", when a file's footer cannot be read
            (pyarrow's type, naming the file).
        ValueError: when a file does not share the first file's schema
            (naming the file), a partition key is also a column, no file is
            readable (under "skip"), or `on_bad_file` is neither "raise" nor
            "skip".

    Example:

    ```python
    logs = rk.datasets.from_orc("/data/logs")   # logs/dt=.../part-*.orc
    batch = next(logs.batches(4096, columns=["label", "dt"]))
    ```
    """
    bad_files = BadFiles(on_bad_file)
    located = locate(path_or_glob, filesystem, (".orc",), "ORC")
    source = FragmentSource(located, ds.OrcFileFormat(), partitioning, "ORC",
                            bad_files)
    return Dataset(source, source_name(path_or_glob), {"format": "orc"}, label)
