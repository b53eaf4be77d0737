"""Host-side encoding of raw batches into the tensors the model reads.

This is the first step of every batch (the "read" stage of the pipeline): a
pyarrow RecordBatch/Table, or a dict of array-likes, becomes a dict of numpy
arrays, one per feature input, and every bad input is rejected here, naming the
feature, before any table row can change:

* numeric features: float32 `[B]`, or `[B, k]` for a vector feature of
  `shape=(k,)` (read from a list column whose non-null rows all hold `k`
  numbers, or a 2-D array of width `k`; any other width -> error); null
  -> NaN (the model fills the feature's `default`), per element for a
  vector (a null vector is `k` NaNs); +-inf -> error; strings -> error.
* Categorical ids: int64, every value an id (negative ones included);
  strings in an int64 feature -> error; strings of a `dtype="string"`
  feature are hashed (`hashing.hash_strings`). A null has no id: its
  length is 0 (its embedding is zeros).
* bucketized Categoricals: float32, null -> NaN (the missing bucket).
* Sequences: int64 `[B, max_len]`, left-aligned; a row's length says how
  many ids it holds (the positions after it hold 0 and are never read); a
  null row is empty; sequences longer than `max_len` keep their last
  `max_len` ids. A weighted sequence adds its weights, float32
  `[B, max_len]` aligned with the ids, under the weights column's name.
* `LENGTHS` (`"__lengths__"`): int32 `[B, R]`, the length of every id
  Categorical and Sequence of each example (`specs.with_lengths` gives the
  columns' order). Missing values and padding are carried by these
  lengths, never by a reserved id value.
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from collections.abc import Sequence as _Sequence
from typing import Any, NamedTuple, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from reckeras.backend_kernels.arrow_columns import ID_TYPES, NUMBER_TYPES, read_block
from reckeras.backend_kernels.hashing import hash_strings
from reckeras.features.specs import LENGTHS, Categorical, Numeric, Sequence, with_lengths

# A raw batch as `as_table` takes it (a pandas DataFrame is taken too).
RawBatch: TypeAlias = pa.Table | pa.RecordBatch | dict[str, Any] | list[dict[str, Any]]


class FeatureInputError(ValueError):
    """A raw batch does not match the declared features.

    The message names the feature at fault. It is a `ValueError`.

    Example:

    ```python
    from reckeras.features.encode import encode

    try:
        encode([rk.features.Categorical("C1", dim=8)], {"C1": ["a", "b"]})
    except rk.features.FeatureInputError as error:
        print(error)   # feature 'C1' is declared int64 but the column holds strings
    ```
    """


def is_dataframe(x: Any) -> bool:
    """Whether `x` is a pandas DataFrame (pandas is not imported for it).

    Args:
        x: any object.

    Returns:
        True for a `pandas.DataFrame`.

    Example:

    ```python
    is_dataframe(pa.table({"a": [1]}))    # False
    ```
    """
    return type(x).__module__.split(".")[0] == "pandas" and \
        type(x).__name__ == "DataFrame"


def as_table(batch: RawBatch) -> pa.Table:
    """A pyarrow Table of a raw batch.

    A list of dicts is rows, one per example (`rows_to_columns`). A pandas
    DataFrame becomes a Table of its columns (`pyarrow.Table.from_pandas`:
    its index is dropped, a float NaN and `None` are missing values, a
    categorical column is dictionary-encoded). A 2-D numpy array in a dict
    becomes a fixed-size list column (full
    sequences, or the vectors of a `Numeric` of `shape=(k,)`), a 2-D
    `numpy.ma.MaskedArray` a list column of each row's unmasked values in
    order (masked entries are padding: ragged sequences as a padded
    array); other values go through `pyarrow.array`.

    Args:
        batch: a pyarrow RecordBatch or Table, a pandas DataFrame, a dict
            of array-likes, or a list of dicts (one per example).

    Returns:
        A `pyarrow.Table` (the batch itself when it is one).

    Raises:
        TypeError: for any other kind of batch.
        FeatureInputError: Python lists of one column that pyarrow cannot
            make one column of (mixed types), naming the column; rows that
            do not all hold the same columns.

    Example:

    ```python
    from reckeras.features.encode import as_table

    hist = np.ma.masked_array([[1, 2], [3, 0]], mask=[[0, 0], [0, 1]])
    table = as_table({"I1": [1.0, 2.0], "hist": hist})
    table.column("hist").to_pylist()   # [[1, 2], [3]]
    ```
    """
    if isinstance(batch, pa.Table):
        return batch
    if isinstance(batch, pa.RecordBatch):
        return pa.Table.from_batches([batch])
    if is_dataframe(batch):
        return pa.Table.from_pandas(batch, preserve_index=False)
    if isinstance(batch, list) and batch:
        batch = rows_to_columns(batch)
    if isinstance(batch, dict):
        columns = {}
        for name, values in batch.items():
            if isinstance(values, np.ma.MaskedArray) and values.ndim == 2:
                present = ~np.ma.getmaskarray(values)
                values = pa.LargeListArray.from_arrays(
                    np.concatenate([[0], np.cumsum(present.sum(axis=1))]),
                    pa.array(np.asarray(values.data)[present]))
            elif isinstance(values, np.ndarray) and values.ndim == 2:
                values = pa.FixedSizeListArray.from_arrays(
                    pa.array(values.reshape(-1)), values.shape[1])
            elif isinstance(values, (list, tuple)):
                # Python lists (JSON): nested lists are list columns.
                values = _python_column(name, values)
            elif not isinstance(values, (pa.Array, pa.ChunkedArray)):
                values = pa.array(np.asarray(values) if np.ndim(values) else values)
            columns[name] = values
        return pa.table(columns)
    raise TypeError(f"a batch must be a pyarrow RecordBatch/Table, a pandas DataFrame, "
                    f"a dict of arrays or a non-empty list of dicts (rows), got "
                    f"{type(batch).__name__}")


def rows_to_columns(rows: list, columns: _Sequence[str] | None = None
                    ) -> dict[str, list]:
    """The columns of a batch given as rows (TF Serving's row format).

    Every row holds every column it gives: a missing value is `None`, not a
    missing key, so that a misspelt key is an error, not a column of nulls.

    Args:
        rows: a list of dicts `{column: value}`, one per example.
        columns: the columns to take, in order (the others are ignored);
            by default every key of the rows, in order of first appearance.

    Returns:
        `{column: [value, ...]}` of the columns some row holds.

    Raises:
        FeatureInputError: a row that is not a dict, or a column some rows
            hold and others do not (naming the first such row).

    Example:

    ```python
    from reckeras.features.encode import rows_to_columns

    rows_to_columns([{"I1": 1.0, "C1": 7}, {"I1": None, "C1": 3}])
    # {"I1": [1.0, None], "C1": [7, 3]}
    ```
    """
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise FeatureInputError(f"instance {index} is not an object of features "
                                    f"(got {type(row).__name__}); expected "
                                    f"{{feature: value, ...}}"
                                    + ("" if columns is None else f" with {list(columns)}"))
    if columns is None:
        columns = list(dict.fromkeys(key for row in rows for key in row))
    batch = {}
    for name in columns:
        held = [name in row for row in rows]
        if not any(held):
            continue
        if not all(held):
            raise FeatureInputError(f"feature {name!r}: instance {held.index(False)} "
                                    f"has no value for it (give None, JSON null, for a "
                                    f"missing value)")
        batch[name] = [row[name] for row in rows]
    return batch


def _python_column(name: str, values: list | tuple) -> pa.Array:
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as error:
        raise FeatureInputError(f"column {name!r}: its values do not make one "
                                f"column ({error})") from None


def _column(table: pa.Table, positions: dict[str, int], spec: Any,
            name: str | None = None) -> pa.Array:
    """The column `name` (by default the spec's own) of the batch."""
    name = spec.name if name is None else name
    position = positions.get(name)
    if position is None:
        raise FeatureInputError(
            f"feature {spec.name!r}: the batch has no column {name!r} "
            f"(columns: {table.column_names[:20]})")
    column = table.column(position)
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _is_string(type_: pa.DataType) -> bool:
    return pa.types.is_string(type_) or pa.types.is_large_string(type_)


def _is_number(type_: pa.DataType) -> bool:
    """Numbers, read as float32: integers, floats, decimals (a warehouse's
    DECIMAL columns) and booleans (as 0 and 1)."""
    return pa.types.is_integer(type_) or pa.types.is_floating(type_) \
        or pa.types.is_decimal(type_) or pa.types.is_boolean(type_)


def _is_list(type_: pa.DataType) -> bool:
    return pa.types.is_list(type_) or pa.types.is_large_list(type_) \
        or pa.types.is_fixed_size_list(type_)


def _numbers(spec: Any, column: pa.Array) -> np.ndarray:
    if not _is_number(column.type):
        hint = "; declare shape=(k,) for a vector feature" \
            if isinstance(spec, Numeric) and _is_list(column.type) else \
            "; a CSV column of numbers is read as text when a missing value is " \
            "written as text ('NA', 'null'): pass those texts in " \
            "from_csv(null_values=...)" if _is_string(column.type) else ""
        raise FeatureInputError(f"feature {spec.name!r}: expected a numeric column, "
                                f"got {column.type}{hint}")
    # Large counts lose precision in float32; that is the documented input type.
    values = column.cast(pa.float32(), safe=False).to_numpy(zero_copy_only=False)
    values = np.asarray(values, dtype=np.float32)
    if np.isinf(values).any():
        raise FeatureInputError(f"feature {spec.name!r}: column holds +-inf")
    return values


def _vectors(spec: Numeric, column: pa.Array) -> np.ndarray:
    """The `[B, k]` float32 values of a vector feature; missing elements NaN."""
    width = spec.shape[0]
    if not _is_list(column.type) or not _is_number(column.type.value_type):
        raise FeatureInputError(f"feature {spec.name!r}: expected a list column of "
                                f"{width} numbers per row, got {column.type}")
    if pa.types.is_fixed_size_list(column.type):
        if column.type.list_size != width:
            raise FeatureInputError(f"feature {spec.name!r}: expected vectors of width "
                                    f"{width}, got width {column.type.list_size}")
    else:
        lengths = pc.list_value_length(column)
        wrong = pc.and_kleene(pc.is_valid(lengths), pc.not_equal(lengths, width))
        if pc.any(wrong).as_py():
            row = pc.index(wrong, True).as_py()
            raise FeatureInputError(
                f"feature {spec.name!r}: row {row} has length {lengths[row].as_py()}; "
                f"expected vectors of width {width}")
    # flatten() skips null rows: they are filled with NaN (the default) below.
    values = _numbers(spec, column.flatten()).reshape(-1, width)
    if not column.null_count:
        return values
    vectors = np.full((len(column), width), np.nan, dtype=np.float32)
    vectors[np.asarray(column.is_valid())] = values
    return vectors


def _ids(spec: Any, values: pa.Array) -> tuple[np.ndarray, np.ndarray | None]:
    """`(ids, present)`: int64 ids of an int or string array (0 at a null)
    and where a value is present (None without nulls)."""
    if pa.types.is_null(values.type):           # nothing but nulls (JSON nulls)
        return np.zeros(len(values), np.int64), np.zeros(len(values), bool)
    if pa.types.is_dictionary(values.type):
        return _dictionary_ids(spec, values)
    if pa.types.is_floating(values.type):
        return _float_ids(spec, values)
    if _is_string(values.type):
        if spec.dtype != "string":
            raise FeatureInputError(
                f"feature {spec.name!r} is declared int64 but the column holds "
                f"strings; declare dtype='string' to hash them")
        values = values.cast(pa.large_string())
        offsets = np.frombuffer(values.buffers()[1], dtype=np.int64)[
            values.offset:values.offset + len(values) + 1]
        data = np.frombuffer(values.buffers()[2], dtype=np.uint8) \
            if values.buffers()[2] is not None else np.zeros(0, np.uint8)
        ids = hash_strings(data, offsets)
    elif pa.types.is_integer(values.type):
        if spec.dtype == "string":
            raise FeatureInputError(f"feature {spec.name!r} is declared string but "
                                    f"the column holds {values.type}")
        if pa.types.is_uint64(values.type):
            # Ids above 2**63 - 1 keep their 64 bits: the id is the bit pattern.
            values = values.view(pa.int64())
        elif values.type != pa.int64():
            values = values.cast(pa.int64())
        filled = values.fill_null(0) if values.null_count else values
        ids = np.asarray(filled.to_numpy(zero_copy_only=False), dtype=np.int64)
    else:
        raise FeatureInputError(f"feature {spec.name!r}: expected integer, string, "
                                f"whole float or dictionary-encoded ids, got "
                                f"{values.type}")
    if not values.null_count:
        return ids, None
    present = np.asarray(values.is_valid())
    return np.where(present, ids, 0), present


def _dictionary_ids(spec: Any, values: pa.DictionaryArray
                    ) -> tuple[np.ndarray, np.ndarray | None]:
    """`_ids` of a dictionary-encoded column (pandas categoricals, parquet
    dictionary pages read as such): each distinct value is turned into an id
    once, and every row takes its entry's."""
    entries, known = _ids(spec, values.dictionary)
    if not len(entries):                        # an empty dictionary: all null
        return np.zeros(len(values), np.int64), np.zeros(len(values), bool)
    indices = np.asarray(values.indices.fill_null(0).to_numpy(zero_copy_only=False),
                         dtype=np.int64)
    ids = entries[indices]
    present = np.asarray(values.is_valid()) if values.null_count else None
    if known is not None:                       # null entries in the dictionary
        present = known[indices] if present is None else present & known[indices]
    return (ids, None) if present is None else (np.where(present, ids, 0), present)


def _float_ids(spec: Any, values: pa.Array) -> tuple[np.ndarray, np.ndarray | None]:
    """`_ids` of a float column of whole numbers: pandas turns an int column
    with missing values into float64, its NaNs the missing ids."""
    if spec.dtype == "string":
        raise FeatureInputError(f"feature {spec.name!r} is declared string but the "
                                f"column holds {values.type}")
    floats = np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.float64)
    present = ~np.isnan(floats)
    whole = floats[present]
    # Above 2**53 a float64 no longer holds every integer: the id is lost.
    bad = (whole != np.floor(whole)) | (np.abs(whole) > 2.0**53)
    if bad.any():
        raise FeatureInputError(f"feature {spec.name!r}: float ids must be whole numbers "
                                f"of at most 2**53 (NaN for a missing id), got "
                                f"{whole[bad][0]!r}")
    ids = np.where(present, floats, 0.0).astype(np.int64)
    return (ids, None) if present.all() else (ids, present)


def _list_lengths(column: pa.Array) -> np.ndarray:
    """int64 lengths of the rows of a list column (0 for a null row)."""
    return np.asarray(pc.list_value_length(column).fill_null(0)
                      .to_numpy(zero_copy_only=False), dtype=np.int64)


def _as_large_list(spec: Sequence, column: pa.Array, what: str) -> pa.Array:
    if pa.types.is_null(column.type):           # every row null: all empty
        column = column.cast(pa.large_list(pa.int64() if what == "ids" else pa.float32()))
    if not _is_list(column.type):
        raise FeatureInputError(f"feature {spec.name!r}: expected a list column of "
                                f"{what}, got {column.type}")
    return column.cast(pa.large_list(column.type.value_type))


def _sequence(spec: Sequence, column: pa.Array, weights: pa.Array | None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """`(ids, lengths, weights)`: `[B, max_len]` left-aligned ids (0 past a
    row's length), `[B]` lengths, and the weights aligned with the ids."""
    column = _as_large_list(spec, column, "ids")
    lengths = _list_lengths(column)
    values = pc.list_flatten(column)
    if values.null_count:
        raise FeatureInputError(f"feature {spec.name!r}: null inside a sequence")
    ids, _ = _ids(spec, values)
    # The positions kept: the last max_len ids of every row.
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    kept = np.minimum(lengths, spec.max_len)
    take = (starts + lengths - kept)[:, None] + np.arange(spec.max_len)[None, :]
    valid = np.arange(spec.max_len)[None, :] < kept[:, None]
    padded = np.zeros((len(lengths), spec.max_len), dtype=np.int64)
    padded[valid] = ids[take[valid]]
    if weights is None:
        return padded, kept, None
    return padded, kept, _sequence_weights(spec, weights, lengths, take, valid)


def _sequence_weights(spec, column, lengths, take, valid):
    """The `[B, max_len]` weights of a weighted sequence, checked against its
    ids' lengths; 0 past a row's length."""
    name = f"feature {spec.name!r}: weights column {spec.weights!r}"
    if _is_list(column.type) and not _is_number(column.type.value_type):
        raise FeatureInputError(f"{name} holds {column.type}, expected a list of "
                                f"numbers")
    column = _as_large_list(spec, column, "weights")
    weight_lengths = _list_lengths(column)
    mismatched = np.flatnonzero(weight_lengths != lengths)
    if mismatched.size:
        row = int(mismatched[0])
        raise FeatureInputError(f"{name}: row {row} has {int(weight_lengths[row])} "
                                f"weights for {int(lengths[row])} ids")
    values = pc.list_flatten(column)
    if values.null_count:
        raise FeatureInputError(f"{name}: null inside the weights")
    values = np.asarray(values.cast(pa.float32(), safe=False)
                        .to_numpy(zero_copy_only=False), dtype=np.float32)
    if not np.isfinite(values).all():
        bad = values[~np.isfinite(values)][0]
        raise FeatureInputError(f"{name} holds a non-finite weight ({bad})")
    padded = np.zeros(take.shape, dtype=np.float32)
    padded[valid] = values[take[valid]]
    return padded


def with_absent_columns(specs: _Sequence[Any], batch: Any,
                        absent: Collection[str]) -> pa.Table:
    """The batch as a Table, with a null column of the right type for each
    feature of `absent` whose column it lacks (read as all missing).

    Args:
        specs: the feature specs.
        batch: pyarrow RecordBatch or Table, or dict of array-likes.
        absent: names of features whose columns may be lacking.

    Returns:
        The Table.

    Example:

    ```python
    specs = [rk.features.Categorical("user", dim=8), rk.features.Categorical("item", dim=8)]
    with_absent_columns(specs, {"user": [1, 2]}, ["item"]).column("item").null_count  # 2
    ```
    """
    table = as_table(batch)
    rows = table.num_rows
    for spec in specs:
        if spec.name not in absent:
            continue
        for name, type_ in _column_types(spec):
            if name not in table.column_names:
                table = table.append_column(name, pa.nulls(rows, type_))
    return table


def _column_types(spec: Any) -> list[tuple[str, pa.DataType]]:
    """The columns a feature reads, each with a type it accepts."""
    if isinstance(spec, Numeric):
        return [(spec.name, pa.list_(pa.float32()) if spec.shape else pa.float32())]
    if isinstance(spec, Categorical):
        number = spec.boundaries is not None
        return [(spec.name, pa.float32() if number else _id_type(spec))]
    if isinstance(spec, Sequence):
        columns = [(spec.name, pa.list_(_id_type(spec)))]
        if spec.weights is not None:
            columns.append((spec.weights, pa.list_(pa.float32())))
        return columns
    return []                      # a Cross reads its members' columns


def _id_type(spec: Any) -> pa.DataType:
    return pa.string() if spec.dtype == "string" else pa.int64()


def encode(specs: _Sequence[Any], batch: RawBatch) -> dict[str, np.ndarray]:
    """Encodes a raw batch into model inputs.

    Args:
        specs: the feature specs.
        batch: what `as_table` takes: a pyarrow RecordBatch or Table, a pandas
            DataFrame, a dict of array-likes or a list of dicts (rows).

    Returns:
        A dict of numpy arrays keyed by feature name (a `Cross` has no input
        of its own: it is computed from its features' ids in the model).

    Raises:
        FeatureInputError: naming the feature at fault.

    Example:

    ```python
    import pyarrow as pa
    from reckeras.features.encode import encode

    specs = [rk.features.Numeric("I1"), rk.features.Categorical("C1", dim=8),
             rk.features.Sequence("hist", dim=8, max_len=3)]
    inputs = encode(specs, {"I1": [1.0, None], "C1": [-7, None],
                            "hist": pa.array([[4, 5], [1, 2, 3, 9]])})
    inputs["C1"]            # array([-7,  0])
    inputs["hist"]          # array([[4, 5, 0], [2, 3, 9]])
    inputs["__lengths__"]   # array([[1, 2], [0, 3]], dtype=int32)
    ```
    """
    table = as_table(batch)
    if table.num_rows == 0:
        raise FeatureInputError("empty batch: it has no rows")
    layout = _layout_of(specs, table.schema)
    inputs: dict[str, np.ndarray] = {}
    one_by_one = layout.one_by_one
    lengths: dict[str, np.ndarray] = {}    # the lengths that are not all 1
    carried = layout.carried
    # Written only where a value is missing (else the shared all-ones one serves).
    lengths_matrix = np.empty((table.num_rows, len(carried)), np.int32, order="F") \
        if carried else None
    written = []                           # the LENGTHS columns id blocks wrote
    for block in layout.blocks:
        ids = block.lengths_columns is not None
        read = read_block(table, block.positions, not ids,
                          lengths_matrix if ids else None, block.lengths_columns)
        if read.first_infinite >= 0:
            raise FeatureInputError(f"feature {block.names[read.first_infinite]!r}: "
                                    f"column holds +-inf")
        # The rows of the transposed view are the matrix's columns (views of it).
        inputs.update(zip(block.names, read.matrix.T, strict=True))
        if ids and read.with_nulls:          # ids: a null is a missing id
            written.append(block.lengths_columns)
    positions = layout.positions
    for spec in one_by_one:            # host side, once per column and batch
        if spec.name in inputs:
            continue                   # encoded as a block
        column = _column(table, positions, spec)
        if isinstance(spec, Numeric):
            inputs[spec.name] = _vectors(spec, column) if spec.shape \
                else _numbers(spec, column)
        elif isinstance(spec, Categorical) and spec.boundaries is not None:
            inputs[spec.name] = _numbers(spec, column)
        elif isinstance(spec, Categorical):
            inputs[spec.name], valid = _ids(spec, column)
            if valid is not None:
                lengths[spec.name] = valid
        elif isinstance(spec, Sequence):
            weights = None if spec.weights is None else \
                _column(table, positions, spec, spec.weights)
            inputs[spec.name], lengths[spec.name], row_weights = _sequence(
                spec, column, weights)
            if spec.weights is not None and row_weights is not None:
                inputs[spec.weights] = row_weights
    if carried and not lengths and not written:
        inputs[LENGTHS] = _all_present(table.num_rows, len(carried))
    elif lengths_matrix is not None:
        # Column-major: the plan reads it feature by feature.
        filled = np.zeros(len(carried), bool)
        for columns in written:
            filled[columns] = True
        for name, valid in lengths.items():
            column = layout.lengths_column[name]
            lengths_matrix[:, column], filled[column] = valid, True
        lengths_matrix[:, ~filled] = 1
        inputs[LENGTHS] = lengths_matrix
    return inputs


# The specs that read a column of their own (a Cross has none).
_READ = (Numeric, Categorical, Sequence)


class _Block(NamedTuple):
    """Columns `encode` reads in one pass (`arrow_columns.read_block`)."""
    positions: np.ndarray    # int64: the columns in the schema
    names: tuple[str, ...]   # their features
    # ids: int64, their LENGTHS columns; None for numbers
    lengths_columns: np.ndarray | None


class _Layout(NamedTuple):
    """How `encode` reads batches of one schema for one list of specs."""
    specs: tuple             # holds the specs alive, so that their ids stay theirs
    identity: tuple          # the specs' ids
    schema: pa.Schema
    positions: dict[str, int]
    blocks: list[_Block]
    one_by_one: list         # the specs read column by column, in order
    carried: list            # `with_lengths(specs)`
    lengths_column: dict     # feature name -> its LENGTHS column


_LAYOUTS: list[_Layout] = []       # the most recent first
_LAYOUTS_KEPT = 8


def _layout_of(specs: _Sequence[Any], schema: pa.Schema) -> _Layout:
    """The layout of `specs` over `schema`, planned once and kept (a
    batch then costs no Python work per block-wise feature: planning it
    again for every batch was a third of a 300-feature batch's encoding).

    The int64 or int32 columns of int64 Categoricals and the numeric
    columns (float32, float64, int64, int32) of scalar Numerics, two or
    more of a kind, are each read in one pass (`arrow_columns.read_block`:
    a column-major matrix whose columns are the features' arrays, nulls
    filled as `_ids` and `_numbers` fill them, the ids' presence written
    into `LENGTHS`, the numbers checked for +-inf); on a batch of hundreds
    of one-hot features that is ~10x faster than column by column. A bad
    value is reported naming its feature. Specs are matched by identity,
    schemas by equality (`Schema.equals` compares fingerprints: ~1 us).
    """
    identity = tuple(map(id, specs))
    for layout in tuple(_LAYOUTS):
        if layout.identity == identity and layout.schema.equals(schema):
            return layout
    positions = {name: i for i, name in enumerate(schema.names)}
    types = schema.types
    ids, floats, one_by_one = [], [], []
    for spec in specs:
        if not isinstance(spec, _READ):
            continue                   # a Cross: computed from its features' ids
        position = positions.get(spec.name)
        if position is not None and isinstance(spec, Categorical) and \
                spec.boundaries is None and spec.dtype != "string" and \
                types[position] in ID_TYPES:
            ids.append(spec)
        elif position is not None and isinstance(spec, Numeric) and not spec.shape \
                and types[position] in NUMBER_TYPES:
            floats.append(spec)
        else:
            one_by_one.append(spec)    # a missing column is reported there
    carried = with_lengths(specs)
    lengths_column = {spec.name: j for j, spec in enumerate(carried)}
    blocks = []
    for block, numbers in ((ids, False), (floats, True)):
        if len(block) < 2:
            one_by_one += block
            continue
        columns = None if numbers else \
            np.array([lengths_column[s.name] for s in block], np.int64)
        blocks.append(_Block(np.array([positions[s.name] for s in block], np.int64),
                             tuple(s.name for s in block), columns))
    order = {id(spec): i for i, spec in enumerate(specs)}
    one_by_one.sort(key=lambda spec: order[id(spec)])
    layout = _Layout(tuple(specs), identity, schema, positions, blocks, one_by_one,
                     carried, lengths_column)
    _LAYOUTS.insert(0, layout)
    del _LAYOUTS[_LAYOUTS_KEPT:]
    return layout


@functools.lru_cache(maxsize=8)
def _all_present(rows: int, columns: int) -> np.ndarray:
    """The LENGTHS of a batch without nulls or sequences, made once per shape
    (filling a fresh one cost a fifth of a 300-feature batch's encoding).
    Nothing writes into model inputs, so batches share it."""
    return np.ones((rows, columns), dtype=np.int32, order="F")


def as_tensors(inputs: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """Torch tensors sharing the memory of `encode`'s arrays.

    The columns `encode` takes block-wise are views of one column-major
    matrix; here they become views of one tensor of it, laid out one after
    another, so that `TransformPlan` takes their block whole instead of
    stacking a thousand of them again. (`torch.from_numpy` of each view would
    give each its own storage, and cost 5 us a column where a slice costs 1.)

    Args:
        inputs: `encode`'s output.

    Returns:
        `{name: tensor}`, each tensor sharing its array's memory.

    Example:

    ```python
    from reckeras.features.encode import as_tensors, encode

    tensors = as_tensors(encode(specs, batch))
    ```
    """
    # id(matrix) -> (its address, its columns as tensors)
    blocks: dict[int, tuple[int, tuple[torch.Tensor, ...]]] = {}
    tensors: dict[str, torch.Tensor] = {}
    for name, value in inputs.items():
        base = value.base
        if isinstance(base, np.ndarray) and base.ndim == 2 and base.flags.f_contiguous \
                and _is_column(value, base):
            block = blocks.get(id(base))
            if block is None:
                # A column-major matrix: every column a view of one tensor, made in one call.
                block = blocks[id(base)] = (base.ctypes.data, torch.from_numpy(
                    np.require(base, requirements="W")).unbind(1))
            address, columns = block
            tensors[name] = columns[(value.ctypes.data - address) // base.strides[1]]
        else:
            tensors[name] = torch.from_numpy(np.require(value, requirements="W"))
    return tensors


def _is_column(value: np.ndarray, base: np.ndarray) -> bool:
    """Whether `value` is a whole column of `base`, a column-major matrix
    (nothing else is taken as one)."""
    return value.ndim == 1 and base.dtype == value.dtype and \
        value.shape[0] == base.shape[0] and value.strides == base.strides[:1]


def raw_columns(specs: _Sequence[Any]) -> list[str]:
    """Names of the raw columns the specs read.

    Args:
        specs: the feature specs.

    Returns:
        The names of the `Numeric`, `Categorical` and `Sequence` specs, in
        order, each weighted Sequence followed by its weights column (a
        `Cross` reads no column of its own).

    Example:

    ```python
    from reckeras.features.encode import raw_columns

    raw_columns([rk.features.Categorical("C1", dim=8),
                 rk.features.Categorical("C2", dim=8),
                 rk.features.Cross(["C1", "C2"], dim=8, hash_buckets=1000)])
    # ['C1', 'C2']
    ```
    """
    names = []
    for spec in specs:
        if isinstance(spec, (Numeric, Categorical, Sequence)):
            names.append(spec.name)
        if isinstance(spec, Sequence) and spec.weights is not None:
            names.append(spec.weights)
    return names
