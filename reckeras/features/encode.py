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
* Categorical ids: int64; null -> -1 (missing values share one row); negative
  ids -> error; strings in an int64 feature -> error; strings of a
  `dtype="string"` feature are hashed (`hashing.hash_strings`).
* bucketized Categoricals: float32, null -> NaN (the missing bucket).
* Sequences: int64 `[B, max_len]`, left-aligned, padded with -1; sequences
  longer than `max_len` keep their last `max_len` ids.
"""

from __future__ import annotations

from collections.abc import Sequence as _Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reckeras.backend_kernels.hashing import hash_strings
from reckeras.features.plan import MISSING_ID
from reckeras.features.specs import Categorical, Numeric, Sequence



class FeatureInputError(ValueError):
    """A raw batch does not match the declared features.

    The message names the feature at fault. It is a `ValueError`.

    Example:

    ```python
    from reckeras.features.encode import encode

    try:
        encode([rk.features.Categorical("C1", dim=8)], {"C1": [3, -5]})
    except rk.features.FeatureInputError as error:
        print(error)   # feature 'C1': negative id -5; ids must be non-negative
    ```
    """


def as_table(batch: pa.Table | pa.RecordBatch | dict[str, Any]) -> pa.Table:
    """A pyarrow Table of a raw batch.

    A 2-D numpy array in a dict becomes a fixed-size list column (a padded
    sequence, or the vectors of a `Numeric` of `shape=(k,)`); other values
    go through `pyarrow.array`.

    Args:
        batch: a pyarrow RecordBatch or Table, or a dict of array-likes.

    Returns:
        A `pyarrow.Table` (the batch itself when it is one).

    Raises:
        TypeError: for any other kind of batch.

    Example:

    ```python
    from reckeras.features.encode import as_table

    table = as_table({"I1": [1.0, 2.0], "hist": np.array([[1, 2], [3, -1]])})
    table.num_rows   # 2
    ```
    """
    if isinstance(batch, pa.Table):
        return batch
    if isinstance(batch, pa.RecordBatch):
        return pa.Table.from_batches([batch])
    if isinstance(batch, dict):
        columns = {}
        for name, values in batch.items():
            if isinstance(values, np.ndarray) and values.ndim == 2:
                values = pa.FixedSizeListArray.from_arrays(
                    pa.array(values.reshape(-1)), values.shape[1])
            elif not isinstance(values, (pa.Array, pa.ChunkedArray)):
                values = pa.array(np.asarray(values) if np.ndim(values) else values)
            columns[name] = values
        return pa.table(columns)
    raise TypeError(f"a batch must be a pyarrow RecordBatch/Table or a dict of "
                    f"arrays, got {type(batch).__name__}")


def _column(table: pa.Table, positions: dict[str, int], spec: Any) -> pa.Array:
    position = positions.get(spec.name)
    if position is None:
        raise FeatureInputError(
            f"feature {spec.name!r}: the batch has no column {spec.name!r} "
            f"(columns: {table.column_names[:20]})")
    column = table.column(position)
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _is_string(type_: pa.DataType) -> bool:
    return pa.types.is_string(type_) or pa.types.is_large_string(type_)


def _is_number(type_: pa.DataType) -> bool:
    return pa.types.is_integer(type_) or pa.types.is_floating(type_)


def _is_list(type_: pa.DataType) -> bool:
    return pa.types.is_list(type_) or pa.types.is_large_list(type_) \
        or pa.types.is_fixed_size_list(type_)


def _numbers(spec: Any, column: pa.Array) -> np.ndarray:
    if not _is_number(column.type):
        hint = "; declare shape=(k,) for a vector feature" \
            if isinstance(spec, Numeric) and _is_list(column.type) else ""
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


def _ids(spec: Any, values: pa.Array) -> np.ndarray:
    """Non-negative int64 ids of an int or string array; nulls -> `MISSING_ID`."""
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
        if values.type != pa.int64():
            values = values.cast(pa.int64())
        filled = values.fill_null(0) if values.null_count else values
        ids = np.asarray(filled.to_numpy(zero_copy_only=False), dtype=np.int64)
        if (ids < 0).any():
            bad = int(ids[ids < 0][0])
            raise FeatureInputError(f"feature {spec.name!r}: negative id {bad}; ids "
                                    f"must be non-negative")
    else:
        raise FeatureInputError(f"feature {spec.name!r}: expected int64 or string "
                                f"ids, got {values.type}")
    if values.null_count:
        ids = np.where(np.asarray(values.is_null()), MISSING_ID, ids)
    return ids


def _sequence(spec: Sequence, column: pa.Array) -> np.ndarray:
    if pa.types.is_fixed_size_list(column.type):
        # Already padded (dict input of a 2-D array): -1 marks padding.
        width = column.type.list_size
        flat = column.flatten()
        padded = np.asarray(flat.cast(pa.int64()).to_numpy(zero_copy_only=False),
                            dtype=np.int64).reshape(-1, width)
        if (padded < MISSING_ID).any():
            raise FeatureInputError(f"feature {spec.name!r}: negative id in sequence")
        if width > spec.max_len:
            raise FeatureInputError(f"feature {spec.name!r}: padded width {width} "
                                    f"exceeds max_len {spec.max_len}")
        return np.pad(padded, ((0, 0), (0, spec.max_len - width)),
                      constant_values=MISSING_ID)
    if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)):
        raise FeatureInputError(f"feature {spec.name!r}: expected a list column, "
                                f"got {column.type}")
    column = column.cast(pa.large_list(column.type.value_type))
    lengths = np.asarray(pc.list_value_length(column).fill_null(0)
                         .to_numpy(zero_copy_only=False), dtype=np.int64)
    values = pc.list_flatten(column)
    if values.null_count:
        raise FeatureInputError(f"feature {spec.name!r}: null inside a sequence")
    ids = _ids(spec, values)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    kept = np.minimum(lengths, spec.max_len)
    first = starts + lengths - kept            # keep the last max_len ids
    position = np.arange(spec.max_len)
    take = first[:, None] + position[None, :]
    valid = position[None, :] < kept[:, None]
    padded = np.full((len(lengths), spec.max_len), MISSING_ID, dtype=np.int64)
    padded[valid] = ids[take[valid]]
    return padded


def encode(specs: _Sequence[Any],
           batch: pa.Table | pa.RecordBatch | dict[str, Any]) -> dict[str, np.ndarray]:
    """Encodes a raw batch into model inputs.

    Args:
        specs: the feature specs.
        batch: pyarrow RecordBatch or Table, or dict of array-likes.

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
    inputs = encode(specs, {"I1": [1.0, None], "C1": [7, None],
                            "hist": pa.array([[4, 5], [1, 2, 3, 9]])})
    inputs["C1"]     # array([ 7, -1])
    inputs["hist"]   # array([[ 4,  5, -1], [ 2,  3,  9]])
    ```
    """
    table = as_table(batch)
    if table.num_rows == 0:
        raise FeatureInputError("empty batch: it has no rows")
    # Table.column(name) scans the schema: look names up once per batch.
    positions = {name: i for i, name in enumerate(table.column_names)}
    inputs = _plain_blocks(specs, table, positions)
    for spec in specs:                 # host side, once per column and batch
        if spec.name in inputs:
            continue
        column = _column(table, positions, spec)
        if isinstance(spec, Numeric):
            inputs[spec.name] = _vectors(spec, column) if spec.shape \
                else _numbers(spec, column)
        elif isinstance(spec, Categorical) and spec.boundaries is not None:
            inputs[spec.name] = _numbers(spec, column)
        elif isinstance(spec, Categorical):
            inputs[spec.name] = _ids(spec, column)
        elif isinstance(spec, Sequence):
            inputs[spec.name] = _sequence(spec, column)
    return inputs


def _plain_blocks(specs: _Sequence[Any], table: pa.Table,
                  positions: dict[str, int]) -> dict[str, np.ndarray]:
    """The features whose columns need no per-column work, encoded block-wise.

    int64 columns of int64 Categoricals and float32 columns of scalar
    Numerics, without nulls, are each converted in one pyarrow call (a column-major
    matrix whose columns are the features' arrays) and checked in one numpy
    pass; on a batch of hundreds of one-hot features that is ~10x faster
    than column by column. A block with a null goes column by column (its
    null policy); a bad value is reported naming its feature.
    """
    types = table.schema.types
    int64, float32 = pa.int64(), pa.float32()
    ids, floats = [], []
    for spec in specs:
        position = positions.get(spec.name)
        if position is None:
            continue                   # reported by the per-column path
        if isinstance(spec, Categorical) and spec.boundaries is None \
                and spec.dtype != "string" and types[position] == int64:
            ids.append(spec)
        elif isinstance(spec, Numeric) and not spec.shape \
                and types[position] == float32:
            floats.append(spec)
    inputs = {}
    for block, bad, message in (
            (ids, lambda m: m < 0, "negative id {}; ids must be non-negative"),
            (floats, np.isinf, "column holds +-inf")):
        if len(block) < 2:
            continue
        selected = table.select([positions[s.name] for s in block])
        if any(column.null_count for column in selected.columns):
            continue
        matrix = np.asarray(selected.to_tensor(row_major=False))
        flagged = bad(matrix)
        if flagged.any():
            column = int(flagged.any(axis=0).argmax())
            value = matrix[flagged[:, column], column][0]
            raise FeatureInputError(f"feature {block[column].name!r}: "
                                    + message.format(value))
        inputs.update((spec.name, matrix[:, j]) for j, spec in enumerate(block))
    return inputs


def raw_columns(specs: _Sequence[Any]) -> list[str]:
    """Names of the raw columns the specs read.

    Args:
        specs: the feature specs.

    Returns:
        The names of the `Numeric`, `Categorical` and `Sequence` specs, in
        order (a `Cross` reads no column of its own).

    Example:

    ```python
    from reckeras.features.encode import raw_columns

    raw_columns([rk.features.Categorical("C1", dim=8),
                 rk.features.Categorical("C2", dim=8),
                 rk.features.Cross(["C1", "C2"], dim=8, hash_buckets=1000)])
    # ['C1', 'C2']
    ```
    """
    return [s.name for s in specs if isinstance(s, (Numeric, Categorical, Sequence))]
