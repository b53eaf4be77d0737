"""The checks at the boundary between Python and the native CPU kernels.

`cpu_native`'s wrappers run them on every argument before they call C, which
trusts the sizes it is passed: a bad argument is a `TypeError` or
`ValueError` naming the kernel and the argument, never a wild read or write.
Each is a few attribute reads (~0.4 us a tensor), as they run on every call
(`is_cpu`, not `device.type`: building the device object costs 0.4 us alone).
"""

import numbers
import operator
from typing import Any

import torch

INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1


def check_tensor(kernel: str, name: str, value: Any, dtype: torch.dtype | tuple,
                 dims: int) -> None:
    """Raises unless `value` is a dense contiguous CPU tensor of `dtype` and `dims` dims.

    Args:
        kernel: the wrapper's name, for the message.
        name: the argument's name, for the message.
        value: the argument.
        dtype: its dtype, or a tuple of the dtypes it may have.
        dims: its number of dimensions.

    Raises:
        TypeError: for a non-tensor or a wrong dtype.
        ValueError: for a tensor not dense on the CPU, of other dims, or not
            contiguous.

    Example:

    ```python
    check_tensor("table_keys", "ids", torch.arange(3), torch.int64, 1)   # passes
    ```
    """
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"cpu_native.{kernel}: {name} must be a torch.Tensor, got "
                        f"{type(value).__name__}")
    if value.dtype not in (dtype if isinstance(dtype, tuple) else (dtype,)):
        raise TypeError(f"cpu_native.{kernel}: {name} must be {dtype}, got {value.dtype}")
    if not value.is_cpu or value.layout != torch.strided:
        raise ValueError(f"cpu_native.{kernel}: {name} must be a dense CPU tensor, got "
                         f"{value.layout} on {value.device}")
    if value.dim() != dims:
        raise ValueError(f"cpu_native.{kernel}: {name} must have {dims} "
                         f"dimension{'s' if dims > 1 else ''}, got shape "
                         f"{tuple(value.shape)}")
    if not value.is_contiguous():
        raise ValueError(f"cpu_native.{kernel}: {name} must be contiguous, got strides "
                         f"{value.stride()} for shape {tuple(value.shape)}")


def check_integer(kernel: str, name: str, value: Any, low: int = 0,
                  high: int = INT64_MAX) -> int:
    """`value` as an int, if it is an integer in `[low, high]`.

    Args:
        kernel: the wrapper's name, for the message.
        name: the argument's name, for the message.
        value: the argument.
        low: its least value.
        high: its greatest value.

    Returns:
        The integer.

    Raises:
        TypeError: for a value that is not an integer.
        ValueError: for one outside `[low, high]`.

    Example:

    ```python
    check_integer("rehash", "capacity", 64, 1, 2**62)   # 64
    ```
    """
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"cpu_native.{kernel}: {name} must be an integer, got "
                        f"{type(value).__name__}") from None
    if not low <= number <= high:
        raise ValueError(f"cpu_native.{kernel}: {name} must lie in [{low}, {high}], "
                         f"got {number}")
    return number


def check_real(kernel: str, name: str, value: Any) -> float:
    """`value` as a float, if it is a real number.

    Args:
        kernel: the wrapper's name, for the message.
        name: the argument's name, for the message.
        value: the argument.

    Returns:
        The float.

    Raises:
        TypeError: for a value that is not a real number.

    Example:

    ```python
    check_real("apply_update", "lr", 1)   # 1.0
    ```
    """
    if not isinstance(value, numbers.Real):
        raise TypeError(f"cpu_native.{kernel}: {name} must be a real number, got "
                        f"{type(value).__name__}")
    return float(value)


def check_forward_index(kernel: str, unique_index: Any, destination: Any,
                        id_weight: Any) -> int:
    """The number of ids of a forward index (pool and aggregate), once checked.

    Args:
        kernel: the wrapper's name, for the message.
        unique_index: int64 `[N]`, every id's row among the unique rows.
        destination: int64 `[N]`, every id's output slot.
        id_weight: float32 `[N]`, every id's scale.

    Returns:
        `N`.

    Raises:
        TypeError, ValueError: as `check_tensor`, and for lengths that differ.

    Example:

    ```python
    check_forward_index("aggregate", torch.tensor([0]), torch.tensor([1]),
                        torch.ones(1))   # 1
    ```
    """
    check_tensor(kernel, "unique_index", unique_index, torch.int64, 1)
    check_tensor(kernel, "destination", destination, torch.int64, 1)
    check_tensor(kernel, "id_weight", id_weight, torch.float32, 1)
    n = destination.shape[0]
    for name, tensor in (("unique_index", unique_index), ("id_weight", id_weight)):
        if tensor.shape[0] != n:
            raise ValueError(f"cpu_native.{kernel}: {name} has {tensor.shape[0]} entries "
                             f"and destination {n}: one of each per id")
    return n


def check_bucket_index(kernel: str, buckets: Any, directory: Any,
                       shape: Any) -> tuple[int, int]:
    """The bucket and directory capacities of a bucketized index, once checked.

    Args:
        kernel: the wrapper's name, for the message.
        buckets: int32 `[capacity, 32]`, one 128-byte bucket a row.
        directory: int32 `[directory capacity]`.
        shape: int64 `[2]`: the buckets in use and the global depth.

    Returns:
        `(capacity, directory capacity)`.

    Raises:
        TypeError, ValueError: as `check_tensor`; for buckets of other than
            32 words, or a `shape` that the arrays cannot hold.

    Example:

    ```python
    check_bucket_index("bucket_find_or_insert", *bucket_index.new_index(64))   # (1, 64)
    ```
    """
    check_tensor(kernel, "buckets", buckets, torch.int32, 2)
    check_tensor(kernel, "directory", directory, torch.int32, 1)
    check_tensor(kernel, "shape", shape, torch.int64, 1)
    capacity = buckets.shape[0]
    if buckets.shape[1] != 32:
        raise ValueError(f"cpu_native.{kernel}: buckets {tuple(buckets.shape)} must be "
                         f"[capacity, 32] (128 bytes a bucket)")
    if shape.shape[0] != 2:
        raise ValueError(f"cpu_native.{kernel}: shape must hold 2 values, got "
                         f"{shape.shape[0]}")
    num_buckets, depth = (int(v) for v in shape.tolist())
    if not 1 <= num_buckets <= capacity or not 0 <= depth <= 32 or \
            2**depth > directory.shape[0]:
        raise ValueError(f"cpu_native.{kernel}: shape ({num_buckets} buckets, depth {depth}) "
                         f"does not fit arrays of {capacity} buckets and a directory of "
                         f"{directory.shape[0]} entries")
    return capacity, directory.shape[0]


def check_hash_map(kernel: str, slot_keys: Any, slot_rows: Any) -> int:
    """The slot count of a hash map's two arrays, once checked.

    Args:
        kernel: the wrapper's name, for the message.
        slot_keys: int64 `[capacity]`, the map's keys.
        slot_rows: int64 `[capacity]`, the map's rows.

    Returns:
        The capacity.

    Raises:
        TypeError, ValueError: as `check_tensor`, and for lengths that differ.

    Example:

    ```python
    check_hash_map("rehash", *hash_table.new_slots(16))   # 16
    ```
    """
    check_tensor(kernel, "slot_keys", slot_keys, torch.int64, 1)
    check_tensor(kernel, "slot_rows", slot_rows, torch.int64, 1)
    if slot_rows.shape[0] != slot_keys.shape[0]:
        raise ValueError(f"cpu_native.{kernel}: slot_keys has {slot_keys.shape[0]} slots "
                         f"and slot_rows {slot_rows.shape[0]}")
    return slot_keys.shape[0]


def out_of_range(kernel: str, name: str, index: torch.Tensor, bound: int,
                 bound_name: str) -> ValueError:
    """The error for `index` holding values outside `[0, bound)`.

    For the error path: a C kernel reported bad indices, and this counts them.

    Args:
        kernel: the wrapper's name, for the message.
        name: the index argument's name.
        index: the index tensor.
        bound: the end of its valid range.
        bound_name: what `bound` is (`"num_slots"`).

    Returns:
        The `ValueError` to raise.

    Example:

    ```python
    raise out_of_range("unique_rows", "rows", rows, num_rows, "num_rows")
    ```
    """
    bad = index[(index < 0) | (index >= bound)]
    return ValueError(f"cpu_native.{kernel}: {name} holds {bad.numel()} values outside "
                      f"[0, {bound_name}={bound}) (from {int(bad.min())} to "
                      f"{int(bad.max())})")
