"""Blocks of Arrow columns read into one matrix: the host encoder's first pass.

`features.encode` reads the id Categoricals of a batch as one int64 matrix
and the scalar Numerics as one float32 matrix (column-major: a column per
feature), and a batch with missing values also needs where each id is
present (the `LENGTHS` the plan reads). `read_block` does a block of columns
at once:

* native CPU kernel (`arrow_columns.c`, built with `cpu_native.c`), where it
  can be built: the batch goes to C through the Arrow C data interface
  (`__arrow_c_array__`, zero-copy), and one C loop per column copies or
  converts its values buffer, fills its nulls and unpacks its validity
  bitmap into the lengths, with no Python per column (split over torch's
  threads by column);
* reference (numpy and pyarrow), without the native kernels: column by
  column.

The family has no torch op and no Triton kernel: its input is Arrow memory,
which torch's dispatcher cannot carry, and it runs on the host only, before
any tensor exists (as `hashing.hash_strings` does for strings).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import torch

from reckeras.backend_kernels import cpu_native

# The value types a block reads (the C kernel's COLUMN_* types).
ID_TYPES = (pa.int64(), pa.int32())
NUMBER_TYPES = (pa.float32(), pa.float64(), pa.int64(), pa.int32())

_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype, _capsule_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object,
                                                                         ctypes.c_char_p]


class Block(NamedTuple):
    """A block of columns read by `read_block`.

    Args:
        matrix: `[rows, width]` column-major: int64 ids (0 at a null) or
            float32 numbers (NaN at a null).
        with_nulls: how many of the columns hold a null.
        first_infinite: numbers: the first column holding +-inf, else -1.
    """

    matrix: np.ndarray
    with_nulls: int
    first_infinite: int


def read_block(batch: pa.RecordBatch | pa.Table, positions: np.ndarray, numbers: bool,
               lengths: np.ndarray | None = None,
               lengths_columns: np.ndarray | None = None) -> Block:
    """Columns `positions` of `batch` as one column-major matrix.

    Ids (`numbers=False`) are read from int64 or int32 columns; numbers from
    float32, float64, int64 or int32 columns, converted to float32 as
    pyarrow's unsafe cast does. When `lengths` is given (ids) and a column
    holds a null, every column's 0/1 presence is written into its
    `lengths_columns` column of `lengths`; without a null it is not written.

    Args:
        batch: the batch (a Table's columns may have several chunks).
        positions: int64 `[width]`, the columns' positions in the batch.
        numbers: read float32 numbers instead of int64 ids.
        lengths: int32 `[rows, R]` column-major lengths to write, or None.
        lengths_columns: int64 `[width]`, each column's column of `lengths`.

    Returns:
        A `Block`.

    Raises:
        ValueError: a column of another type (naming it), or outputs that do
            not fit the batch.

    Example:

    ```python
    from reckeras.backend_kernels.arrow_columns import read_block

    batch = pa.record_batch({"a": [1, None], "b": [3, 4]})
    lengths = np.zeros((2, 2), np.int32, order="F")
    block = read_block(batch, np.array([0, 1]), False, lengths, np.array([0, 1]))
    block.matrix        # [[1, 3], [0, 4]]
    lengths             # [[1, 1], [0, 1]]
    ```
    """
    read = read_block_native if cpu_native.available() else read_block_reference
    return read(batch, positions, numbers, lengths, lengths_columns)


def read_block_reference(batch: pa.RecordBatch | pa.Table, positions: np.ndarray,
                         numbers: bool, lengths: np.ndarray | None = None,
                         lengths_columns: np.ndarray | None = None) -> Block:
    """`read_block` with pyarrow and numpy, column by column.

    Args:
        batch, positions, numbers, lengths, lengths_columns: as for
            `read_block`.

    Returns:
        What `read_block` returns.

    Example:

    ```python
    from reckeras.backend_kernels.arrow_columns import read_block_reference

    batch = pa.record_batch({"x": pa.array([0.5, None], pa.float64())})
    read_block_reference(batch, np.array([0]), True).matrix   # [[0.5], [nan]]
    ```
    """
    _check_outputs("read_block_reference", batch, positions, lengths, lengths_columns)
    rows, width = batch.num_rows, len(positions)
    matrix = np.empty((rows, width), np.float32 if numbers else np.int64, order="F")
    present = np.ones((rows, width), bool, order="F")
    with_nulls, first_infinite = 0, -1
    for j, position in enumerate(positions):
        column = _checked_column(batch, int(position), numbers)
        if numbers:
            values = column.cast(pa.float32(), safe=False).to_numpy(zero_copy_only=False)
        else:
            values = column.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
        matrix[:, j] = values
        if column.null_count:
            with_nulls += 1
            present[:, j] = column.is_valid().to_numpy(zero_copy_only=False)
        if numbers and first_infinite < 0 and np.isinf(matrix[:, j]).any():
            first_infinite = j
    if lengths is not None and lengths_columns is not None and with_nulls:
        lengths[:, lengths_columns] = present
    return Block(matrix, with_nulls, first_infinite)


def read_block_native(batch: pa.RecordBatch | pa.Table, positions: np.ndarray,
                      numbers: bool, lengths: np.ndarray | None = None,
                      lengths_columns: np.ndarray | None = None) -> Block:
    """`read_block` in one C pass (`rk_arrow_block`), without Python per column.

    Args:
        batch, positions, numbers, lengths, lengths_columns: as for
            `read_block`.

    Returns:
        What `read_block` returns.

    Raises:
        ValueError: as `read_block`, before anything is written; a
            `RuntimeError` where the native kernels are not available.

    Example:

    ```python
    from reckeras.backend_kernels import arrow_columns, cpu_native

    if cpu_native.available():
        batch = pa.record_batch({"x": pa.array([7, None], pa.int32())})
        arrow_columns.read_block_native(batch, np.array([0]), False).matrix   # [[7], [0]]
    ```
    """
    kernel = "read_block_native"
    _check_outputs(kernel, batch, positions, lengths, lengths_columns)
    library = cpu_native.library()
    if library is None:
        raise RuntimeError(f"arrow_columns.{kernel}: the native kernels are not available "
                           f"in this process (see cpu_native.available())")
    if isinstance(batch, pa.Table):
        batch = _one_batch(batch)
    positions = np.ascontiguousarray(positions, dtype=np.int64)
    width = positions.shape[0]
    matrix = np.empty((batch.num_rows, width), np.float32 if numbers else np.int64,
                      order="F")
    report = np.empty(2, np.int64)
    schema, array = batch.__arrow_c_array__()
    bad = library.rk_arrow_block(
        _capsule_pointer(schema, b"arrow_schema"), _capsule_pointer(array, b"arrow_array"),
        positions.ctypes.data, width, int(numbers), matrix.ctypes.data,
        None if lengths is None else lengths.ctypes.data,
        None if lengths_columns is None else lengths_columns.ctypes.data,
        report.ctypes.data, torch.get_num_threads())
    if bad >= 0:
        _checked_column(batch, int(positions[bad]), numbers)   # raises, naming it
        raise ValueError(f"arrow_columns.{kernel}: column {int(positions[bad])} of the "
                         f"batch cannot be read (its buffers do not hold its rows)")
    return Block(matrix, int(report[0]), int(report[1]))


def _one_batch(table: pa.Table) -> pa.RecordBatch:
    """The table's rows as one record batch (a copy only where a column has
    several chunks)."""
    batches = table.to_batches()
    if len(batches) != 1:
        batches = table.combine_chunks().to_batches() or \
            [pa.RecordBatch.from_pylist([], schema=table.schema)]
    return batches[0]


def _check_outputs(kernel: str, batch: pa.RecordBatch | pa.Table, positions: np.ndarray,
                   lengths: np.ndarray | None, lengths_columns: np.ndarray | None) -> None:
    """The checks the C loop trusts: the outputs' dtypes, layouts and sizes."""
    if not isinstance(batch, (pa.RecordBatch, pa.Table)):
        raise TypeError(f"arrow_columns.{kernel}: batch must be a pyarrow RecordBatch or "
                        f"Table, got {type(batch).__name__}")
    if not isinstance(positions, np.ndarray) or positions.ndim != 1 or \
            positions.dtype.kind not in "iu":
        raise TypeError(f"arrow_columns.{kernel}: positions must be a 1-D integer array")
    if (lengths is None) != (lengths_columns is None):
        raise ValueError(f"arrow_columns.{kernel}: lengths and lengths_columns go together")
    if lengths is None or lengths_columns is None:
        return
    if not isinstance(lengths, np.ndarray) or lengths.dtype != np.int32 or \
            lengths.ndim != 2 or not lengths.flags.f_contiguous or \
            not lengths.flags.writeable or lengths.shape[0] != batch.num_rows:
        raise ValueError(f"arrow_columns.{kernel}: lengths must be a writeable int32 "
                         f"column-major [{batch.num_rows}, R] array")
    if not isinstance(lengths_columns, np.ndarray) or lengths_columns.dtype != np.int64 or \
            lengths_columns.shape != positions.shape or \
            not lengths_columns.flags.c_contiguous:
        raise ValueError(f"arrow_columns.{kernel}: lengths_columns must be int64 "
                         f"[{positions.shape[0]}], one column of lengths per position")
    if lengths_columns.size and (lengths_columns.min() < 0 or
                                 lengths_columns.max() >= lengths.shape[1]):
        raise ValueError(f"arrow_columns.{kernel}: lengths_columns must lie in "
                         f"[0, {lengths.shape[1]})")


def _checked_column(batch: pa.RecordBatch | pa.Table, position: int,
                    numbers: bool) -> pa.Array | pa.ChunkedArray:
    """Column `position`, or a `ValueError` naming it when a block cannot read it."""
    if not 0 <= position < batch.num_columns:
        raise ValueError(f"arrow_columns: position {position} is not a column of the "
                         f"batch ({batch.num_columns} columns)")
    column = batch.column(position)
    types: Sequence[pa.DataType] = NUMBER_TYPES if numbers else ID_TYPES
    if column.type not in types:
        raise ValueError(f"arrow_columns: column {batch.schema.names[position]!r} is "
                         f"{column.type}; a block of {'numbers' if numbers else 'ids'} "
                         f"reads {', '.join(map(str, types))}")
    return column
