"""Batches for fit/evaluate/predict: raw data -> encoded torch tensors.

Accepted data: a reckeras dataset (anything with ``batches`` and ``label``),
a pyarrow Table, or a dict of array-likes (with the labels in ``y`` or in a
``label`` column). Every batch is encoded and validated by the model's
FeatureColumns before it reaches the model.
"""

import numpy as np
import pyarrow as pa
import torch
from keras.src.backend.torch.core import get_device

from reckeras.features.encode import FeatureInputError, as_table


class InMemoryData:
    """A pyarrow Table served in batches, with an optional label column.

    With ``num_shards`` readers (ranks), global batch ``k`` is the
    ``num_shards * batch_size`` rows starting at ``k * num_shards *
    batch_size``, and reader ``i`` takes its ``i``-th slice of ``batch_size``:
    N ranks at batch b see exactly the batches one rank sees at batch N*b.
    """

    def __init__(self, table, label):
        self.table = table
        self.label = label
        self.num_rows = table.num_rows

    def _starts(self, batch_size, shard_index, num_shards):
        return range(shard_index * batch_size, self.num_rows, num_shards * batch_size)

    def num_batches(self, batch_size, drop_remainder=False, shard_index=0, num_shards=1):
        starts = self._starts(batch_size, shard_index, num_shards)
        if drop_remainder:
            return sum(1 for start in starts if start + batch_size <= self.num_rows)
        return len(starts)

    def batches(self, batch_size, *, shuffle=False, seed=0, drop_remainder=False,
                shard_index=0, num_shards=1):
        table = self.table
        if shuffle:
            order = np.random.default_rng(seed).permutation(self.num_rows)
            table = table.take(pa.array(order))
        for start in self._starts(batch_size, shard_index, num_shards):
            if drop_remainder and start + batch_size > self.num_rows:
                return
            yield table.slice(start, batch_size)


def as_data(x, y=None, label="label"):
    """Wraps ``x`` (and ``y``) into something with ``batches``/``num_batches``."""
    if hasattr(x, "batches") and hasattr(x, "num_batches"):
        if y is not None:
            raise ValueError("y must be None when x is a dataset (labels are a column)")
        return x
    table = as_table(x)
    if y is not None:
        y = np.asarray(y, dtype=np.float32).reshape(table.num_rows, -1)
        column = pa.array(y[:, 0]) if y.shape[1] == 1 else \
            pa.FixedSizeListArray.from_arrays(pa.array(y.reshape(-1)), y.shape[1])
        table = table.append_column("__label__", column)
        label = "__label__"
    return InMemoryData(table, label if label in table.column_names else None)


def _column_values(batch, name, role):
    if name is None or name not in batch.column_names:
        raise FeatureInputError(f"the batch has no {role} column {name!r}")
    column = batch.column(name)
    if column.null_count:
        raise FeatureInputError(f"{role} column {name!r} has missing values")
    return column


def to_tensors(columns, batch, label, with_label, weight_column=None, device=None):
    """``(inputs, labels, weights)`` torch tensors of one raw batch.

    ``labels`` is None when ``with_label`` is false, ``weights`` when there
    is no ``weight_column``. The tensors are on ``device`` (default: Keras's
    device); the pipeline keeps them on the host and copies them in its h2d
    stage (``device_copy``).
    """
    device = torch.device(device or get_device())
    inputs, labels, weights = _host_tensors(columns, batch, label, with_label,
                                            weight_column)
    if device.type == "cpu":
        return inputs, labels, weights
    return ({name: value.to(device) for name, value in inputs.items()},
            None if labels is None else labels.to(device),
            None if weights is None else weights.to(device))


def _host_tensors(columns, batch, label, with_label, weight_column):
    inputs = {name: torch.from_numpy(np.require(value, requirements="W"))
              for name, value in columns.encode(batch).items()}
    weights = None
    if weight_column is not None:
        column = _column_values(batch, weight_column, "sample weight")
        weights = np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float32)
        if not np.isfinite(weights).all() or (weights < 0).any():
            raise FeatureInputError(f"sample weight column {weight_column!r} must be "
                                    f"finite and non-negative")
        weights = torch.from_numpy(weights.copy())
    if not with_label:
        return inputs, None, weights
    column = _column_values(batch, label, "label")
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_fixed_size_list(column.type):
        y = np.asarray(column.flatten().to_numpy(zero_copy_only=False), np.float32)
        y = y.reshape(-1, column.type.list_size)
    else:
        y = np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float32)
    if not np.isfinite(y).all():
        raise FeatureInputError(f"label column {label!r} has NaN or inf")
    return inputs, torch.from_numpy(np.require(y, requirements="W")), weights
