"""Batches for fit/evaluate/predict: raw data -> encoded torch tensors.

Accepted data: a reckeras dataset (anything with `batches` and
`num_batches`), a pyarrow Table, a dict of array-likes, or a Keras
`PyDataset` or torch `DataLoader` of ready batches (`batch_sources`), with
the labels in `y` (an array, or a dict of arrays for a model with several
outputs) or in label columns, and per-example loss weights given as an array or as the name
of a column. Every batch is encoded and validated by the
model's FeatureColumns before it reaches the model.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Collection, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from reckeras.features.encode import FeatureInputError, as_table, as_tensors, is_dataframe
from reckeras.pipeline.batch_sources import SourceBatches, is_batch_source
from reckeras.pipeline.label_columns import LABEL_COLUMN, WEIGHT_COLUMN, label_column


class InMemoryData:
    """A pyarrow Table served in batches, with optional label columns.

    With `num_shards` readers (ranks), global batch `k` is the
    `num_shards * batch_size` rows starting at `k * num_shards * batch_size`,
    and reader `i` takes its `i`-th slice of `batch_size`: N ranks at batch b
    see exactly the batches one rank sees at batch N*b.

    Args:
        table: the rows.
        label: name of the label column, `{output name: column}` for a
            model with several outputs, or None (no labels).

    Example:

    ```python
    data = InMemoryData(pa.table({"n": [0.5, 1.0], "label": [0, 1]}), "label")
    first = next(data.batches(1))
    ```
    """

    # What `rk.Model.resume_at` needs to resume mid-epoch on another number
    # of ranks: global batch k holds the same rows whatever the shard count.
    global_batches_independent_of_shards = True

    def __init__(self, table: pa.Table, label: str | dict | None):
        self.table = table
        self.label = label
        self.num_rows = table.num_rows

    def _starts(self, batch_size, shard_index, num_shards):
        return range(shard_index * batch_size, self.num_rows, num_shards * batch_size)

    def num_batches(self, batch_size: int, drop_remainder: bool = False,
                    shard_index: int = 0, num_shards: int = 1) -> int:
        """Batches `batches` yields with the same arguments.

        Args:
            batch_size: rows per batch.
            drop_remainder: leave out a last, smaller batch.
            shard_index: this reader's index.
            num_shards: the number of readers.

        Returns:
            The number of batches.
        """
        starts = self._starts(batch_size, shard_index, num_shards)
        if drop_remainder:
            return sum(1 for start in starts if start + batch_size <= self.num_rows)
        return len(starts)

    def batches(self, batch_size: int, *, shuffle: bool = False, seed: int = 0,
                drop_remainder: bool = False, shard_index: int = 0,
                num_shards: int = 1) -> Iterator[pa.Table]:
        """This reader's batches, as pyarrow Tables.

        Args:
            batch_size: rows per batch.
            shuffle: permute the rows first (the same permutation on every
                reader for one `seed`).
            seed: seed of the permutation.
            drop_remainder: leave out a last, smaller batch.
            shard_index: this reader's index.
            num_shards: the number of readers.

        Returns:
            An iterator of Tables.
        """
        table = self.table
        if shuffle:
            order = np.random.default_rng(seed).permutation(self.num_rows)
            table = table.take(pa.array(order))
        for start in self._starts(batch_size, shard_index, num_shards):
            if drop_remainder and start + batch_size > self.num_rows:
                return
            yield table.slice(start, batch_size)

    def split(self, validation_split: float) -> tuple[InMemoryData, InMemoryData]:
        """The rows before and after the last `validation_split` fraction,
        as Keras's `fit(validation_split=...)` takes them (before shuffling).

        Args:
            validation_split: fraction of the rows held out, in (0, 1).

        Returns:
            `(train, validation)`.
        """
        cut = int(self.num_rows * (1.0 - validation_split))
        if cut == 0 or cut == self.num_rows:
            raise ValueError(f"validation_split={validation_split} of {self.num_rows} "
                             f"rows leaves no training or no validation rows")
        return (InMemoryData(self.table.slice(0, cut), self.label),
                InMemoryData(self.table.slice(cut), self.label))


def as_data(x: Any, y: Any = None, sample_weight: Any = None,
            label: str = "label") -> tuple[Any, str | None]:
    """Wraps `x` (and `y`, `sample_weight`) into something with `batches`,
    `num_batches` and `label` (its label column, `{output: column}`, or None).

    Args:
        x: a reckeras dataset, a pyarrow Table, a pandas DataFrame, a dict
            of array-likes, or a
            `keras.utils.PyDataset` or torch `DataLoader` of batches
            (`batch_sources.SourceBatches`).
        y: labels for in-memory `x` without a `label` column: an array of
            one value (or one row of values) per example, or a dict
            `{output name: array}` for a model with several outputs.
        sample_weight: per-example loss weights: an array (in-memory `x`),
            or the name of a column of `x`.
        label: the label column looked for when `y` is None.

    Returns:
        `(data, weight column name or None)`.
    """
    weight_column = sample_weight if isinstance(sample_weight, str) else None
    if is_batch_source(x):
        if y is not None or sample_weight is not None:
            raise ValueError(f"y and sample_weight must be None when x is a "
                             f"{type(x).__name__}: its batches carry them, as "
                             f"(x, y) or (x, y, sample_weight)")
        source = SourceBatches(x)
        return source, source.weight
    if hasattr(x, "batches") and hasattr(x, "num_batches"):
        if y is not None:
            raise ValueError("y must be None when x is a dataset (labels are a column)")
        if sample_weight is not None and weight_column is None:
            raise ValueError("sample_weight for a dataset must name one of its columns; "
                             "an array of weights needs in-memory x (a dict or a Table)")
        return x, weight_column
    if not isinstance(x, (dict, pa.Table, pa.RecordBatch)) and not is_dataframe(x):
        raise TypeError(f"x must be a reckeras dataset (rk.datasets.load, from_parquet, "
                        f"...), a pyarrow Table, a pandas DataFrame, a dict of arrays, a "
                        f"keras.utils.PyDataset or a torch DataLoader, got "
                        f"{type(x).__name__}; generators and tf.data datasets are not "
                        f"read (a generator can be read only once): wrap the batches "
                        f"in a keras.utils.PyDataset, or write them to parquet")
    table = as_table(x)
    label_columns: str | dict[str, str] | None = label
    if isinstance(y, dict):
        label_columns = {output: f"{LABEL_COLUMN}{output}" for output in y}
        for output, values in y.items():
            table = table.append_column(label_columns[output],
                                        label_column(values, table, output))
    elif y is not None:
        table = table.append_column(LABEL_COLUMN, label_column(y, table, "y"))
        label_columns = LABEL_COLUMN
    if sample_weight is not None and weight_column is None:
        weights = np.asarray(sample_weight, dtype=np.float32)
        if weights.shape != (table.num_rows,):
            raise ValueError(f"sample_weight must hold one weight per example: shape "
                             f"({table.num_rows},), got {weights.shape}")
        table = table.append_column(WEIGHT_COLUMN, pa.array(weights))
        weight_column = WEIGHT_COLUMN
    if isinstance(label_columns, str) and label_columns not in table.column_names:
        label_columns = None
    return InMemoryData(table, label_columns), weight_column


def check_class_weight(class_weight: dict | None) -> dict | None:
    """`class_weight` as Keras takes it: `{class index: weight}`.

    Args:
        class_weight: the user's mapping, or None.

    Returns:
        `{int: float}`, or None.
    """
    if class_weight is None:
        return None
    if not isinstance(class_weight, dict) or not class_weight:
        raise ValueError(f"class_weight must be a non-empty dict {{class index: weight}}, "
                         f"got {class_weight!r}")
    checked = {}
    for key, value in class_weight.items():
        if isinstance(key, numbers.Integral):
            index = int(key)
        elif isinstance(key, numbers.Real) and float(key).is_integer():
            index = int(float(key))
        else:
            raise ValueError(f"class_weight keys must be class indices (ints), got {key!r}")
        weight = float(value) if isinstance(value, numbers.Real) else math.nan
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"class_weight[{key!r}] must be a finite number >= 0, "
                             f"got {value!r}")
        checked[index] = weight
    return checked


@dataclasses.dataclass(frozen=True)
class Targets:
    """What a loop reads beside the features: labels and loss weights.

    Args:
        label: the label column, `{output name: column}` for a model with
            several outputs, or None (the loop takes no labels).
        weight: the per-example loss weight column, or None.
        class_weight: `{class index: weight}` (see `check_class_weight`),
            multiplied into the loss weights by each example's class.
        binary: the label columns that must lie in [0, 1] (read by a binary
            cross-entropy).
    """

    label: str | dict | None = None
    weight: str | None = None
    class_weight: dict | None = None
    binary: frozenset = frozenset()


def _column_values(batch, name, role):
    if name is None or name not in batch.column_names:
        raise FeatureInputError(f"the batch has no {role} column {name!r}")
    column = batch.column(name)
    if column.null_count:
        raise FeatureInputError(f"{role} column {name!r} has missing values")
    return column


def to_tensors(columns: Any, batch: Any, targets: Targets,
               device: torch.device | str = "cpu", unread: Collection[str] = ()) -> tuple:
    """`(inputs, labels, weights)` torch tensors of one raw batch.

    `labels` is None when `targets.label` is None, and a dict `{output
    name: tensor}` when it is a dict; `weights` is None when there are
    neither weights nor class weights.

    Args:
        columns: the model's `rk.layers.FeatureColumns`.
        batch: a pyarrow RecordBatch/Table or a dict of arrays.
        targets: the label and weight columns to read.
        device: device of the tensors (the pipeline keeps them on the host
            and copies them in its h2d stage, `device_copy`).
        unread: features the model ignores, whose columns `batch` may lack
            (`FeatureColumns.encode`'s `absent`).

    Returns:
        `(dict of input tensors, labels or None, weights or None)`.
    """
    inputs = as_tensors(columns.encode(batch, absent=unread))
    labels: dict[str, np.ndarray] | np.ndarray | None
    if isinstance(targets.label, dict):
        labels = {output: _labels(batch, column, column in targets.binary)
                  for output, column in targets.label.items()}
    else:
        labels = None if targets.label is None else \
            _labels(batch, targets.label, targets.label in targets.binary)
    weights = None
    if targets.weight is not None:
        column = _column_values(batch, targets.weight, "sample weight")
        weights = np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float32)
        if not np.isfinite(weights).all() or (weights < 0).any():
            raise FeatureInputError(f"sample weight column {targets.weight!r} must be "
                                    f"finite and non-negative")
    if targets.class_weight is not None:
        by_class = _class_weights(labels, targets.class_weight)
        weights = by_class if weights is None else weights * by_class
    label_tensors = None if labels is None else \
        {output: torch.from_numpy(y) for output, y in labels.items()} \
        if isinstance(labels, dict) else torch.from_numpy(labels)
    weight_tensor = None if weights is None else torch.from_numpy(
        np.require(weights, requirements="W"))
    if torch.device(device).type == "cpu":
        return inputs, label_tensors, weight_tensor
    return ({name: value.to(device) for name, value in inputs.items()},
            None if label_tensors is None else
            {output: y.to(device) for output, y in label_tensors.items()}
            if isinstance(label_tensors, dict) else label_tensors.to(device),
            None if weight_tensor is None else weight_tensor.to(device))


def _labels(batch, label, binary):
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
    if binary and ((y < 0) | (y > 1)).any():
        outside = y[(y < 0) | (y > 1)].flat[0]
        raise FeatureInputError(f"label column {label!r} has values outside [0, 1] (such "
                                f"as {outside:g}), which a binary cross-entropy loss "
                                f"cannot take")
    return np.require(y, requirements="W")


def _class_weights(labels, class_weight):
    """Keras's rule: the class is the rounded label (the argmax of a one-hot
    row); a class missing from `class_weight` weighs 1."""
    if labels.ndim > 1 and labels.shape[1] > 1:
        classes = labels.argmax(axis=1)
    else:
        classes = np.round(labels.reshape(-1)).astype(np.int64)
    distinct, position = np.unique(classes, return_inverse=True)
    # One lookup per distinct class (a handful), then one gather.
    return np.asarray([class_weight.get(int(c), 1.0) for c in distinct],
                      dtype=np.float32)[position]
