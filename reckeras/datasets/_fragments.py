"""Files read through `pyarrow.dataset`: the source of parquet, ORC and CSV.

`pyarrow.dataset` opens the files on any pyarrow filesystem, decodes them and
turns `key=value` directories (hive partitions) into columns. The units are
a parquet file's row groups, and whole ORC and CSV files: pyarrow tells
neither where an ORC stripe's rows start nor where a CSV file's lines do, so
those are read from the file's start up to the rows wanted.

A file is *bad* when pyarrow cannot read or decode it. Bad files are found at
open time (parquet and ORC footers; a parquet file whose footer places data
past the end of its data) or when the row counts are first needed (ORC
footers again, CSV text parsed), before any shard is cut; or while reading
(a parquet page that fails its checksum or does not decode, an ORC stripe, a
CSV value). Each error names the file and, where known, the row group,
stripe or row; the reader's `BadFiles` policy raises it or skips the file.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, TypeAlias

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from reckeras.datasets._dataset import rows_of
from reckeras.datasets._files import READ_ERRORS, BadFiles, Located, file_error

# What the readers' `partitioning` takes, passed on to pyarrow.dataset.
Partitioning: TypeAlias = str | ds.Partitioning | ds.PartitioningFactory | None

# Batches decoded ahead of the reader within one unit: enough to overlap
# decoding with the consumer, few enough that a large ORC or CSV file does
# not sit in memory (pyarrow's default is 16).
_BATCH_READAHEAD = 2

# Key of the JSON description that `generate` writes into a parquet footer.
METADATA_KEY = b"reckeras.dataset"

# A parquet file ends with its footer, the footer's length (4 bytes) and
# the magic "PAR1" (4 bytes).
_PARQUET_TAIL_BYTES = 8


class FragmentSource:
    """The source of a `Dataset` over parquet or ORC files.

    Every file must have the schema of the first readable one, checked from
    the footers when the files are opened. Partition columns come after the
    file's. `from_csv`'s source refines this class.

    Args:
        located: the files.
        file_format: how to decode them, a `pyarrow.dataset.FileFormat`.
        partitioning: what `pyarrow.dataset.dataset` takes: "hive", a
            `pyarrow.dataset.partitioning(...)`, or None.
        what: the format's name, for messages.
        bad_files: what to do with a file that cannot be read: raise, or
            skip it (see `BadFiles`).

    Example:

    ```python
    from reckeras.datasets._files import BadFiles, locate
    from reckeras.datasets._fragments import FragmentSource

    located = locate("/data/logs", None, (".orc",), "ORC")
    source = FragmentSource(located, ds.OrcFileFormat(), "hive", "ORC",
                            BadFiles("skip"))
    ```
    """

    def __init__(self, located: Located, file_format: ds.FileFormat,
                 partitioning: Partitioning, what: str, bad_files: BadFiles):
        self.what = what
        self.bad_files = bad_files
        self._format = file_format
        self._filesystem = located.filesystem
        sizes = dict(zip(located.paths, located.sizes, strict=True)) if located.sizes else {}
        dataset = self._open_dataset(located, partitioning)
        opened = self._open_fragments(list(dataset.get_fragments()), sizes)
        self.fragments = [fragment for fragment, _ in opened]
        self.files = [fragment.path for fragment in self.fragments]
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
        self.partition_keys = [field.name for field in partitions]
        self.read_schema = pa.schema([*self.file_schema, *partitions])
        self.schema = self.read_schema
        # Known from the footers (parquet), or counted when first needed.
        self._unit_rows: list[int] | None
        if isinstance(file_format, ds.ParquetFileFormat):
            self._units = [group for _, groups in opened for group in groups]
            self._unit_rows = [group.row_groups[0].num_rows
                               for group in self._units]
        else:
            self._units, self._unit_rows = list(self.fragments), None

    def _open_dataset(self, located: Located,
                      partitioning: Partitioning) -> ds.Dataset:
        # pyarrow reads the first file to learn the schema: a bad first file
        # is skipped (or raised) here, and the next one is tried.
        paths = list(located.paths)
        while True:
            try:
                return ds.dataset(
                    paths, format=self._format, filesystem=located.filesystem,
                    partitioning=partitioning,
                    partition_base_dir=located.base_dir)
            except (*READ_ERRORS, pa.ArrowTypeError) as error:
                unreadable = self._first_file_error(paths[0])
                if unreadable is None:
                    if isinstance(error, OSError):
                        raise
                    # ArrowTypeError: a partition key clashes with a column
                    # of another type.
                    raise ValueError(
                        f"cannot open the {self.what} files: {error}") from error
                self.bad_files.reject(paths[0], file_error(
                    paths[0], unreadable, self.where_unreadable(paths[0], unreadable)),
                    "open", unreadable)
                paths = paths[1:]
                if not paths:
                    raise ValueError(self._nothing_readable()) from error

    def _first_file_error(self, path: str) -> Exception | None:
        try:
            # Reading the schema opens the file and parses its footer.
            _ = self._format.make_fragment(path, self._filesystem).physical_schema
        except READ_ERRORS as error:
            return error
        return None

    def _nothing_readable(self) -> str:
        skipped = self.bad_files.skipped
        return (f"none of the {len(skipped)} {self.what} files is readable "
                f"(on_bad_file='skip' skipped them all); the first: "
                f"{skipped[0].reason}")

    def _open_fragments(
            self, fragments: list[ds.Fragment], sizes: dict[str, int | None],
    ) -> list[tuple[ds.Fragment, list[ds.Fragment]]]:
        """The readable fragments, each with its row groups (parquet).

        Reads every footer: a file that cannot be read is rejected, one of
        another schema raises. Sets `file_schema`, the schema of the first
        readable file.
        """
        opened: list[tuple[ds.Fragment, list[ds.Fragment]]] = []
        for fragment in fragments:
            try:
                schema = fragment.physical_schema.remove_metadata()
                groups = _row_groups(fragment, sizes.get(fragment.path)) \
                    if isinstance(fragment, ds.ParquetFileFragment) else []
            except READ_ERRORS as error:
                self.bad_files.reject(fragment.path,
                                      file_error(fragment.path, error), "open",
                                      error)
                continue
            if opened:
                self.check_schema(fragment.path, schema)
            else:
                self._schema_file, self.file_schema = fragment.path, schema
            opened.append((fragment, groups))
        if not opened:
            raise ValueError(self._nothing_readable())
        return opened

    def check_schema(self, path: str, schema: pa.Schema) -> None:
        """Raises unless a file has the columns of the first file.

        A file of another schema is not a bad file: `on_bad_file="skip"`
        does not skip it.

        Args:
            path: the file.
            schema: its schema, without metadata.

        Raises:
            ValueError: naming the file and showing both schemas.
        """
        if not self.same_columns(schema):
            raise ValueError(
                f"{self.what} file {path} has schema\n{schema}\n"
                f"but {self._schema_file} has\n{self.file_schema}\n"
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

        The first call counts the rows of ORC and CSV files; a file whose
        count fails is rejected (under "skip", dropped from `files` and the
        units before any shard is cut).

        Returns:
            One count per row group (parquet) or file (ORC, CSV).
        """
        # ORC row counts are in the footers, CSV ones need a pass over the
        # text: both wait until a caller needs them.
        if self._unit_rows is None:
            counts = {}
            for fragment in self._units:
                try:
                    counts[fragment.path] = self.count(fragment)
                except READ_ERRORS as error:
                    self.bad_files.reject(fragment.path, file_error(
                        fragment.path, error,
                        self.where_unreadable(fragment.path, error)),
                        "open", error)
            self._units = [unit for unit in self._units if unit.path in counts]
            self.fragments = [fragment for fragment in self.fragments
                              if fragment.path in counts]
            self.files = [path for path in self.files if path in counts]
            self._unit_rows = [counts[unit.path] for unit in self._units]
        return self._unit_rows

    def count(self, fragment: ds.Fragment) -> int:
        """Rows of one file (the ORC footer's count).

        Args:
            fragment: the file.

        Returns:
            Its row count.

        Raises:
            OSError: or another `pyarrow.ArrowException`, pyarrow's own.
        """
        return fragment.count_rows()

    def unit_file(self, unit: int) -> str:
        """The file a unit is read from.

        Args:
            unit: the unit's index in storage order.

        Returns:
            Its path.
        """
        return self._units[unit].path

    def unit_partition(self, unit: int) -> dict[str, Any]:
        """A unit's partition values, from its file's path.

        Args:
            unit: the unit's index in storage order.

        Returns:
            `{key: value}` of the `key=value` directories above its file
            (typed as the partitioning read them); a null value (Hive's
            `__HIVE_DEFAULT_PARTITION__`) is left out.
        """
        return ds.get_partition_keys(self._units[unit].partition_expression)

    def unit_description(self, unit: int) -> dict[str, Any]:
        """The JSON description in a unit's parquet footer (see `generate`).

        Args:
            unit: the unit's index in storage order.

        Returns:
            The description under `METADATA_KEY`, or {} (no description, or
            not parquet).
        """
        fragment = self._units[unit]
        if not isinstance(fragment, ds.ParquetFileFragment):
            return {}
        return footer_description(fragment)

    def where_unreadable(self, path: str, error: Exception) -> str | None:
        """Where in a file opening it or counting its rows failed.

        Asked only when pyarrow's message may not say it.

        Args:
            path: the file.
            error: pyarrow's error.

        Returns:
            None: an ORC footer has no place finer than the file.
        """
        return None

    def read_unit(self, unit: int, start: int, stop: int,
                  columns: list[str] | None) -> Iterator[pa.Table]:
        """Rows [start, stop) of a unit, read no further than `stop`.

        A unit that fails while read is rejected: under "skip" it yields
        the rows decoded before the failure and stops.

        Args:
            unit: the unit's index in storage order.
            start: the unit's first row wanted.
            stop: one past its last row wanted.
            columns: the columns to read; all when None.

        Returns:
            An iterator of tables.

        Raises:
            ValueError: when pyarrow cannot decode the file, or OSError when
                it cannot read it (naming the file, and the row group or
                stripe).
        """
        fragment = self._units[unit]
        try:
            yield from rows_of(fragment.to_batches(
                schema=self.read_schema, columns=columns,
                batch_readahead=_BATCH_READAHEAD), start, stop)
        except READ_ERRORS as error:
            self.bad_files.reject(fragment.path, file_error(
                fragment.path, self.explain(error), self.where(fragment, columns)),
                "read", error)

    def where(self, fragment: ds.Fragment, columns: list[str] | None) -> str | None:
        """Where in a unit reading failed: its row group, or the ORC stripe.

        Args:
            fragment: the unit (a parquet row group or an ORC file).
            columns: the columns that were read; all when None.

        Returns:
            "row group k" for parquet; for ORC, "stripe k" when decoding the
            stripes one by one fails at stripe k, else None.
        """
        if isinstance(fragment, ds.ParquetFileFragment):
            return f"row group {fragment.row_groups[0].id}"
        stripe = _failing_stripe(self._filesystem, fragment.path, columns)
        return None if stripe is None else f"stripe {stripe}"

    def explain(self, error: Exception) -> Exception:
        """pyarrow's error while reading, made clearer for this format.

        Args:
            error: the error.

        Returns:
            The error to report (this one, unchanged; `from_csv`'s source
            names the column pyarrow numbers).
        """
        return error


def footer_description(fragment: ds.ParquetFileFragment) -> dict[str, Any]:
    """The JSON description `generate` writes into a parquet file's footer.

    Args:
        fragment: the file, or one of its row groups.

    Returns:
        The description under `METADATA_KEY`, or {} when there is none.

    Example:

    ```python
    from reckeras.datasets._fragments import footer_description

    footer_description(source.fragments[0])["name"]   # "criteo_synth"
    ```
    """
    raw = (fragment.metadata.metadata or {}).get(METADATA_KEY)
    return json.loads(raw) if raw else {}


def _row_groups(fragment: ds.ParquetFileFragment,
                size: int | None) -> list[ds.Fragment]:
    """A parquet file's row groups, checked to end before its footer."""
    groups = fragment.split_by_row_group()
    metadata = fragment.metadata
    if size is None or not metadata.num_row_groups:
        return groups
    data_end = size - _PARQUET_TAIL_BYTES - metadata.serialized_size
    # Writers lay row groups out in order, so bytes cut out anywhere (the
    # footer kept) push the last row group's recorded end past the footer's
    # start; checking it alone keeps the open cheap for wide files.
    last = metadata.num_row_groups - 1
    row_group = metadata.row_group(last)
    for column in range(row_group.num_columns):
        chunk = row_group.column(column)
        # Where a chunk starts, as pyarrow's reader computes it.
        first = chunk.data_page_offset
        if chunk.has_dictionary_page and 0 < chunk.dictionary_page_offset < first:
            first = chunk.dictionary_page_offset
        end = first + chunk.total_compressed_size
        if end > data_end:
            raise pa.ArrowInvalid(
                f"{fragment.path}, row group {last}: the footer places "
                f"column {chunk.path_in_schema!r} at bytes [{first}, "
                f"{end}), but the data ends at byte {data_end}: the file "
                f"was cut")
    return groups


def _failing_stripe(filesystem: pafs.FileSystem, path: str,
                    columns: list[str] | None) -> int | None:
    """The first ORC stripe that does not decode, found once a read failed."""
    # Imported here: pyarrow builds without ORC support cannot import it, and
    # only ORC data needs it.
    import pyarrow.orc as orc

    try:
        with filesystem.open_input_file(path) as file:
            reader = orc.ORCFile(file)
            names = [name for name in reader.schema.names
                     if columns is None or name in columns]
            for stripe in range(reader.nstripes):
                try:
                    reader.read_stripe(stripe, columns=names)
                except READ_ERRORS:
                    return stripe
    except READ_ERRORS:
        return None
    return None

