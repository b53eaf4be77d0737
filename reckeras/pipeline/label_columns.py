"""The columns the loops add to a batch for its labels and loss weights.

Labels given as `y` (an array, or `{output: array}`) and weights given as
`sample_weight` join the batch's Table as columns of these names, so every
kind of data reaches the steps as one Table per batch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

LABEL_COLUMN = "__label__"
WEIGHT_COLUMN = "__sample_weight__"


def label_column(values: Any, table: pa.Table, name: str) -> pa.Array:
    """One label column: a value (or a fixed-size row of values) per example.

    Args:
        values: the labels, one entry (a number or a row of numbers) per row
            of `table`.
        table: the batch the labels go with.
        name: the labels' name in messages (`"y"` or an output's name).

    Returns:
        A float32 column, or a fixed-size list column for rows of values.
    """
    values = np.asarray(values, dtype=np.float32)
    if values.shape[:1] != (table.num_rows,):
        raise ValueError(f"labels {name!r} must hold one entry per example: "
                         f"{table.num_rows}, got shape {values.shape}")
    values = values.reshape(table.num_rows, int(np.prod(values.shape[1:])))  # 0 rows too
    return pa.array(values[:, 0]) if values.shape[1] == 1 else \
        pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])
