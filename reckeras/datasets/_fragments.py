"""Files read through `pyarrow.dataset`: the source of parquet, ORC and CSV.

`pyarrow.dataset` opens the files on any pyarrow filesystem, decodes them and
turns `key=value` directories (hive partitions) into columns. The units are
a parquet file's row groups, and whole ORC and CSV files: pyarrow tells
neither where an ORC stripe's rows start nor where a CSV file's lines do, so
those are read from the file's start up to the rows wanted.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.dataset as ds

from reckeras.datasets._dataset import rows_of
from reckeras.datasets._files import Located, file_error

# What the readers' `partitioning` takes, passed on to pyarrow.dataset.
Partitioning = str | ds.Partitioning | ds.PartitioningFactory | None

# Batches decoded ahead of the reader within one unit: enough to overlap
# decoding with the consumer, few enough that a large ORC or CSV file does
# not sit in memory (pyarrow's default is 16).
_BATCH_READAHEAD = 2


class FragmentSource:
    """The source of a `Dataset` over parquet or ORC files.

    Every file must have the schema of the first, checked from the footers
    when the files are opened. Partition columns come after the file's.
    `from_csv`'s source refines this class.

    Args:
        located: the files.
        file_format: how to decode them, a `pyarrow.dataset.FileFormat`.
        partitioning: what `pyarrow.dataset.dataset` takes: "hive", a
            `pyarrow.dataset.partitioning(...)`, or None.
        what: the format's name, for messages.

    Example:

    ```python
    from reckeras.datasets._files import locate
    from reckeras.datasets._fragments import FragmentSource

    located = locate("/data/logs", None, (".orc",), "ORC")
    source = FragmentSource(located, ds.OrcFileFormat(), "hive", "ORC")
    ```
    """

    def __init__(self, located: Located, file_format: ds.FileFormat,
                 partitioning: Partitioning, what: str):
        self.what = what
        try:
            dataset = ds.dataset(
                located.paths, format=file_format,
                filesystem=located.filesystem, partitioning=partitioning,
                partition_base_dir=located.base_dir)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
            # ArrowTypeError: a partition key clashes with a column of
            # another type.
            raise ValueError(f"cannot open the {what} files: {error}") from error
        self.fragments = list(dataset.get_fragments())
        self.files = [fragment.path for fragment in self.fragments]
        self.file_schema = _physical_schema(self.fragments[0])
        keys = {key for fragment in self.fragments
                for key in ds.get_partition_keys(fragment.partition_expression)}
        clashes = sorted(keys & set(self.file_schema.names))
        if clashes:
            raise ValueError(
                f"partition key {clashes[0]!r} of the paths below "
                f"{located.base_dir!r} is also a column of "
                f"{self.files[0]}; rename one, or pass partitioning=None")
        # The dataset's schema is the first file's, then the partition keys.
        partitions = [field for field in dataset.schema if field.name in keys]
        self.read_schema = pa.schema([*self.file_schema, *partitions])
        self.schema = self.read_schema
        self._check_files()
        if isinstance(file_format, ds.ParquetFileFormat):
            self._units = [group for fragment in self.fragments
                           for group in _row_groups(fragment)]
            self._unit_rows = [group.row_groups[0].num_rows
                               for group in self._units]
        else:
            self._units, self._unit_rows = self.fragments, None

    def _check_files(self) -> None:
        for fragment in self.fragments[1:]:
            self.check_file(fragment)

    def check_file(self, fragment: ds.Fragment) -> None:
        """Raises unless a file has the columns of the first file.

        Args:
            fragment: the file.

        Raises:
            ValueError: naming the file and showing both schemas.
        """
        schema = _physical_schema(fragment)
        if not self.same_columns(schema):
            raise ValueError(
                f"{self.what} file {fragment.path} has schema\n{schema}\n"
                f"but {self.files[0]} has\n{self.file_schema}\n"
                f"all files of a dataset must share one schema")

    def same_columns(self, schema: pa.Schema) -> bool:
        """Whether a file of this `schema` matches the first file.

        Args:
            schema: the file's schema, without metadata.

        Returns:
            True when it equals the first file's.
        """
        return schema.equals(self.file_schema)

    def unit_rows(self) -> list[int]:
        """Rows per unit, in storage order.

        Returns:
            One count per row group (parquet) or file (ORC, CSV).
        """
        # ORC row counts are in the footers, CSV ones need a pass over the
        # text: both wait until a caller needs them.
        if self._unit_rows is None:
            self._unit_rows = [count_rows(fragment) for fragment in self._units]
        return self._unit_rows

    def read_unit(self, unit: int, start: int, stop: int,
                  columns: list[str] | None) -> Iterator[pa.Table]:
        """Rows [start, stop) of a unit, read no further than `stop`.

        Args:
            unit: the unit's index in storage order.
            start: the unit's first row wanted.
            stop: one past its last row wanted.
            columns: the columns to read; all when None.

        Returns:
            An iterator of tables.

        Raises:
            ValueError: when pyarrow cannot decode the file, or OSError when
                it cannot read it (naming the file).
        """
        fragment = self._units[unit]
        try:
            yield from rows_of(fragment.to_batches(
                schema=self.read_schema, columns=columns,
                batch_readahead=_BATCH_READAHEAD), start, stop)
        except (pa.ArrowInvalid, OSError) as error:
            raise file_error(fragment.path, self.explain(error)) from error

    def explain(self, error: Exception) -> Exception:
        """pyarrow's error while reading, made clearer for this format.

        Args:
            error: the error.

        Returns:
            The error to report (this one, unchanged; `from_csv`'s source
            names the column pyarrow numbers).
        """
        return error


def _physical_schema(fragment: ds.Fragment) -> pa.Schema:
    try:
        return fragment.physical_schema.remove_metadata()
    except (pa.ArrowInvalid, OSError) as error:
        raise file_error(fragment.path, error) from error


def _row_groups(fragment: ds.Fragment) -> list[ds.Fragment]:
    try:
        return fragment.split_by_row_group()
    except (pa.ArrowInvalid, OSError) as error:
        raise file_error(fragment.path, error) from error


def count_rows(fragment: ds.Fragment) -> int:
    """Rows of a file or row group, naming the file when it cannot be read.

    Args:
        fragment: the `pyarrow.dataset.Fragment`.

    Returns:
        Its row count (from the footer for parquet and ORC; for CSV, by
        parsing the text).

    Raises:
        ValueError: for bad data, or OSError for an I/O failure (naming the
            file).

    Example:

    ```python
    from reckeras.datasets._fragments import count_rows

    count_rows(next(ds.dataset("part-0.orc", format="orc").get_fragments()))
    ```
    """
    try:
        return fragment.count_rows()
    except (pa.ArrowInvalid, OSError) as error:
        raise file_error(fragment.path, error) from error
