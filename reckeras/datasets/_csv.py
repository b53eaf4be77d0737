"""Delimited text files (CSV, TSV) as a dataset source: one unit per file."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from reckeras.datasets._dataset import LABEL, Dataset
from reckeras.datasets._files import (
    BadFiles,
    Located,
    PathsOrGlobs,
    lines_before_break,
    locate,
    source_name,
)
from reckeras.datasets._fragments import FragmentSource, Partitioning

# What a directory's files may be called; pyarrow decompresses by extension.
_SUFFIXES = tuple(f"{kind}{compression}" for kind in (".csv", ".tsv")
                  for compression in ("", ".gz", ".bz2"))


def _is_list(type_: pa.DataType) -> bool:
    return pa.types.is_list(type_) or pa.types.is_large_list(type_)


class _CsvSource(FragmentSource):
    """The source of a CSV `Dataset`: files as units, list columns split."""

    def __init__(self, located: Located,
                 partitioning: Partitioning,
                 read_options: pcsv.ReadOptions,
                 parse_options: pcsv.ParseOptions,
                 column_types: Mapping[str, pa.DataType],
                 null_values: Sequence[str], list_delimiter: str,
                 bad_files: BadFiles):
        convert_options = pcsv.ConvertOptions(
            # List columns are read as text, then split.
            column_types={name: pa.string() if _is_list(type_) else type_
                          for name, type_ in column_types.items()},
            null_values=list(null_values), strings_can_be_null=True)
        # Headers are compared before any value is converted, so that a
        # conversion error's column number names the right column.
        self._header_format = ds.CsvFileFormat(read_options=read_options,
                                               parse_options=parse_options)
        super().__init__(located, ds.CsvFileFormat(
            read_options=read_options, parse_options=parse_options,
            convert_options=convert_options), partitioning, "CSV", bad_files)
        unknown = sorted(set(column_types) - set(self.file_schema.names))
        if unknown:
            raise ValueError(
                f"column_types names columns {unknown} that {self._schema_file} "
                f"does not have; its columns are {self.file_schema.names}")
        self._declared = set(column_types)
        self._lists = {name: type_ for name, type_ in column_types.items()
                       if _is_list(type_)}
        self._list_delimiter = list_delimiter
        self.schema = pa.schema([
            pa.field(field.name, self._lists.get(field.name, field.type))
            for field in self.read_schema])
        self._checked = {self._schema_file}

    def _open_fragments(
            self, fragments: list[ds.Fragment], sizes: dict[str, int | None],
    ) -> list[tuple[ds.Fragment, list[ds.Fragment]]]:
        # A CSV file's header is read only with its data: reading a block of
        # every file up front would cost as much as a pass over small files.
        # The first file's first block gave pyarrow the schema.
        self._schema_file = fragments[0].path
        self.file_schema = fragments[0].physical_schema.remove_metadata()
        return [(fragment, []) for fragment in fragments]

    def same_columns(self, schema: pa.Schema) -> bool:
        """Whether a file of this `schema` has the first file's columns.

        Types are not compared: every file is converted with the first
        file's types (declared or inferred), so a value that does not fit
        fails when read, naming its file, column and row.

        Args:
            schema: the file's schema, with the types pyarrow infers.

        Returns:
            True when the column names are the first file's, in order.
        """
        return schema.names == self.file_schema.names

    def _untyped(self, path: str) -> ds.Fragment:
        return self._header_format.make_fragment(path, self._filesystem)

    def count(self, fragment: ds.Fragment) -> int:
        """Rows of a file, counted by parsing it without converting values.

        A line with another number of fields, or a compressed stream that
        breaks, fails here; a value that does not fit its column is reported
        when read, with its column and row.

        Args:
            fragment: the file.

        Returns:
            Its row count.

        Raises:
            OSError: or another `pyarrow.ArrowException`, pyarrow's own.
        """
        return self._untyped(fragment.path).count_rows()

    def where_unreadable(self, path: str, error: Exception) -> str | None:
        """The line after which a compressed file's stream broke.

        Args:
            path: the file.
            error: pyarrow's error (a parse error already names its row).

        Returns:
            "after line n" for an I/O error when reading the file again
            breaks after n whole lines, else None.
        """
        lines = lines_before_break(self._filesystem, path) \
            if isinstance(error, OSError) else None
        return None if lines is None else f"after line {lines}"

    def read_unit(self, unit: int, start: int, stop: int,
                  columns: list[str] | None) -> Iterator[pa.Table]:
        """Rows [start, stop) of a file, list columns split.

        Args:
            unit: the file's index in storage order.
            start: the file's first row wanted.
            stop: one past its last row wanted.
            columns: the columns to read; all when None.

        Returns:
            An iterator of tables.

        Raises:
            ValueError: for a header that differs from the first file's
                (under either policy), or a value that does not fit its
                column (naming the file; under "skip", the rest of the file
                is skipped instead).
        """
        path = self.files[unit]
        if path not in self._checked:
            self.check_schema(path, self._untyped(path).physical_schema)
            self._checked.add(path)
        for table in super().read_unit(unit, start, stop, columns):
            try:
                yield self._split_lists(table, path)
            except ValueError as error:
                self.bad_files.reject(path, error, "read", error.__cause__)
                return

    def where(self, fragment: ds.Fragment, columns: list[str] | None) -> str | None:
        """None: pyarrow's CSV errors name their row ("Row #7").

        Args:
            fragment: the file.
            columns: the columns that were read.

        Returns:
            None.
        """
        return None

    def explain(self, error: Exception) -> Exception:
        """Names the column of a conversion error, and where its type came from.

        Args:
            error: pyarrow's error, e.g. "In CSV column #3: Row #7: CSV
                conversion error to int64: invalid value 'x'".

        Returns:
            The error with the column's name after its number and, for a
            column whose type was inferred, a hint to declare it.
        """
        match = re.search(r"CSV column #(\d+)", str(error))
        names = self.file_schema.names
        if match is None or int(match.group(1)) >= len(names):
            return error
        name = names[int(match.group(1))]
        message = str(error).replace(match.group(0),
                                     f"{match.group(0)} ({name!r})")
        if name not in self._declared:
            message += (f"; the type of {name!r} was inferred from the first "
                        f"block of {self._schema_file}: declare it in "
                        f"column_types")
        return type(error)(message)

    def _split_lists(self, table: pa.Table, path: str) -> pa.Table:
        for name, list_type in self._lists.items():
            if name not in table.column_names:
                continue
            parts = pc.split_pattern(table[name], self._list_delimiter)
            try:
                lists = parts.cast(list_type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
                raise ValueError(f"{path}, column {name!r} (a list of "
                                 f"{list_type.value_type}): {error}") from error
            table = table.set_column(table.column_names.index(name),
                                     pa.field(name, list_type), lists)
        return table


def from_csv(path_or_glob: PathsOrGlobs, *,
             column_types: Mapping[str, pa.DataType] | None = None,
             column_names: Sequence[str] | None = None, delimiter: str = ",",
             list_delimiter: str = "|", null_values: Sequence[str] = ("",),
             partitioning: Partitioning = "hive",
             filesystem: pafs.FileSystem | None = None,
             label: str = LABEL, on_bad_file: str = "raise") -> Dataset:
    """Opens delimited text files (CSV, TSV) as a `Dataset`.

    Files are decoded by `pyarrow.csv`, streamed block by block, and may be
    compressed (`.gz`, `.bz2`). Columns get the types of `column_types`;
    the others are inferred from the first block of the first file, and
    every file is read with those types, so declare a column whose first
    values mislead the inference (ids that look numeric, floats first
    written as integers). A column declared as a list, e.g.
    `pa.list_(pa.string())`, holds `list_delimiter`-separated values
    (MovieLens genres: `Comedy|Drama`). Paths, URIs and hive partitions work
    as in `from_parquet`. The unit of shuffling and sharding is a whole
    file; row counts (needed by `num_rows`, sharding and shuffling) take one
    extra pass over the text, on first need. That pass finds a line with
    another number of fields and a compressed stream that breaks (a
    truncated `.gz`), before any shard is cut; a value that does not fit its
    column is found when read.

    Args:
        path_or_glob: a file, a directory (every `.csv` or `.tsv` file
            below it, plain or compressed), or a glob; a local path or a
            pyarrow filesystem URI. Or a list of them.
        column_types: a type for some columns, e.g.
            `{"user": pa.int64(), "genres": pa.list_(pa.string())}`.
        column_names: the column names when the files have no header line
            (the first line is then data); None when they have one.
        delimiter: the field separator, e.g. "\\t" for TSV.
        list_delimiter: the separator of the values of list columns.
        null_values: the field texts that mean a missing value, for every
            column (strings too); a missing list is a null list.
        partitioning: "hive" to read `key=value` directories as columns, a
            `pyarrow.dataset.partitioning(...)`, or None.
        filesystem: a `pyarrow.fs.FileSystem` that `path_or_glob` is in;
            None for a local path or a URI.
        label: the name of the label column (`Dataset.label` is None when
            the files have no such column).
        on_bad_file: "raise" to raise the error naming a file that cannot
            be read or decoded; "skip" to log a warning and go on without
            it: a file found bad by the row count pass is left out of
            `Dataset.files` (on every rank alike), one that fails while read
            loses the rest of the file. `Dataset.skipped_files` lists them.
            A file whose header differs from the first file's always raises.

    Returns:
        A `Dataset` over the matching files, in sorted path order.

    Raises:
        FileNotFoundError: when nothing matches.
        ValueError: when `column_types` names a column the files lack or
            `on_bad_file` is neither "raise" nor "skip"; under "raise", for a
            line pyarrow cannot parse or a value that does not fit its
            column's type (naming the file, and the column and row where
            pyarrow tells them); for a file whose header differs from the
            first file's.
        OSError: under "raise", for a file that cannot be read, e.g. a
            truncated `.gz` (naming the file and the line it breaks after).

    Example:

    ```python
    movies = rk.datasets.from_csv(
        "ml-latest-small/movies.csv",
        column_types={"movieId": pa.int64(), "genres": pa.list_(pa.string())},
        label="movieId")
    next(movies.batches(2))["genres"]   # [["Adventure", "Animation", ...], ...]
    ```
    """
    bad_files = BadFiles(on_bad_file)
    located = locate(path_or_glob, filesystem, _SUFFIXES, "CSV")
    source = _CsvSource(
        located, partitioning,
        pcsv.ReadOptions(column_names=None if column_names is None
                         else list(column_names)),
        pcsv.ParseOptions(delimiter=delimiter), dict(column_types or {}),
        null_values, list_delimiter, bad_files)
    return Dataset(source, source_name(path_or_glob), {"format": "csv"}, label)
