"""The dtypes a table's rows may be stored in, and their numpy form.

A table keeps its rows (`weights`) in float32, float16 or bfloat16
(`TableOptions(dtype=...)`); optimizer state is float32 always. Exported
rows (`RowStore.export`, checkpoints, `model.save`) keep the table's dtype.
numpy has no bfloat16: its arrays use `ml_dtypes.bfloat16` (the type Keras's
own weights store reads and writes), and cross to torch as raw 16-bit words,
since `torch.from_numpy` does not know that type.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch

# The names `TableOptions.dtype` takes, and the torch dtypes they mean.
ROW_DTYPES = {"float32": torch.float32, "float16": torch.float16,
              "bfloat16": torch.bfloat16}
_NUMPY = {torch.float32: np.dtype(np.float32), torch.float16: np.dtype(np.float16),
          torch.bfloat16: np.dtype(ml_dtypes.bfloat16)}


def row_dtype(name: str) -> torch.dtype:
    """The torch dtype of a `TableOptions.dtype` name.

    Args:
        name: `"float32"`, `"float16"` or `"bfloat16"`.

    Returns:
        The torch dtype.

    Raises:
        ValueError: another name.

    Example:

    ```python
    row_dtype("bfloat16")   # torch.bfloat16
    ```
    """
    if name not in ROW_DTYPES:
        raise ValueError(f"row dtype must be one of {tuple(ROW_DTYPES)}, got {name!r}")
    return ROW_DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    """The `TableOptions.dtype` name of a row dtype.

    Args:
        dtype: `torch.float32`, `torch.float16` or `torch.bfloat16`.

    Returns:
        Its name, as `row_dtype` takes it.

    Example:

    ```python
    dtype_name(torch.float16)   # "float16"
    ```
    """
    return str(dtype).removeprefix("torch.")


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype of exported rows of a row dtype.

    Args:
        dtype: a row dtype.

    Returns:
        `float32`, `float16` or `ml_dtypes.bfloat16`.

    Example:

    ```python
    numpy_dtype(torch.bfloat16)   # dtype(bfloat16)
    ```
    """
    return _NUMPY[dtype]


def to_numpy(rows: torch.Tensor) -> np.ndarray:
    """A CPU tensor's values as a numpy array sharing its memory.

    Args:
        rows: a CPU tensor, of a row dtype or any dtype numpy knows.

    Returns:
        The array (bfloat16 as `ml_dtypes.bfloat16`).

    Example:

    ```python
    to_numpy(torch.ones(2, 4, dtype=torch.bfloat16)).dtype   # bfloat16
    ```
    """
    if rows.dtype == torch.bfloat16:
        return rows.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return rows.numpy()


def to_torch(values: np.ndarray | torch.Tensor) -> torch.Tensor:
    """An array as a CPU tensor sharing its memory (a tensor as itself).

    Args:
        values: a numpy array (`ml_dtypes.bfloat16` included) or a tensor.

    Returns:
        The tensor, bfloat16 for `ml_dtypes.bfloat16`.

    Example:

    ```python
    to_torch(np.zeros(3, ml_dtypes.bfloat16)).dtype   # torch.bfloat16
    ```
    """
    if isinstance(values, torch.Tensor):
        return values
    values = np.ascontiguousarray(values)       # torch.from_numpy takes no negative strides
    if values.dtype == _NUMPY[torch.bfloat16]:
        return torch.from_numpy(values.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(values)
