"""Batches from a source the user built: a `keras.utils.PyDataset` or a
`torch.utils.data.DataLoader`, read as Keras's `fit` reads them.

Each item the source gives is one step's batch: `x`, `(x,)`, `(x, y)` or
`(x, y, sample_weight)`, with `x` a dict of arrays (numpy arrays, torch
tensors or lists, one per input) or a pyarrow Table, `y` an array or a dict
`{output name: array}`, `sample_weight` an array. Every batch is laid out as
the first one (labels or none, the same outputs, weights or none).

A source is this process's data: under torchrun each rank reads all of its
own source (give each rank its part, e.g. a `DistributedSampler`), and the
ranks take as many steps as the shortest source allows.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import keras
import numpy as np
import pyarrow as pa
import torch

from reckeras.features.encode import FeatureInputError, as_table
from reckeras.pipeline.label_columns import LABEL_COLUMN, WEIGHT_COLUMN, label_column


def is_batch_source(x: Any) -> bool:
    """Whether `x` is a source of ready batches (`SourceBatches` reads it).

    Args:
        x: what was given as a loop's data.

    Returns:
        True for a `keras.utils.PyDataset` or a `torch.utils.data.DataLoader`.
    """
    return isinstance(x, (keras.utils.PyDataset, torch.utils.data.DataLoader))


def end_epoch(data: Any) -> None:
    """Ends an epoch over a loop's data: a PyDataset's `on_epoch_end`.

    Args:
        data: the loop's data (`batches.as_data`); only `SourceBatches`
            have anything to do.
    """
    if isinstance(data, SourceBatches):
        data.end_epoch()


def _on_host(values: Any) -> Any:
    """Torch tensors as numpy arrays (pyarrow reads those); others as given."""
    if isinstance(values, torch.Tensor):
        return values.detach().cpu().numpy()
    return values


class SourceBatches:
    """A PyDataset's or DataLoader's batches as the loops read data.

    The batch size is the source's: the loops' `batch_size` is ignored, as
    Keras ignores it for these sources. A finite `PyDataset` is read in
    index order, or in an order permuted by `seed` when the loop shuffles;
    the loops call its `on_epoch_end` after each epoch (`end_epoch`). A `DataLoader` is read in
    its own order (its sampler shuffles or not). An infinite PyDataset
    (`num_batches` None) or a DataLoader without a length needs the loop's
    `steps_per_epoch` or `steps`.

    Args:
        source: a `keras.utils.PyDataset` or `torch.utils.data.DataLoader`.

    Raises:
        ValueError: a first batch that is not `x`, `(x,)`, `(x, y)` or
            `(x, y, sample_weight)`, or a source without batches.

    Example:

    ```python
    class Clicks(keras.utils.PyDataset):
        def __len__(self):
            return 10
        def __getitem__(self, i):
            rows = slice(1024 * i, 1024 * (i + 1))
            return {"C1": ids[rows], "I1": counts[rows]}, labels[rows]

    data = SourceBatches(Clicks())
    data.label, data.num_batches(4096)          # ("__label__", 10)
    ```
    """

    # Each rank reads its own source: the examples of a global step depend
    # on the number of ranks.
    global_batches_independent_of_shards = False

    def __init__(self, source: Any):
        self.source = source
        self.kind = type(source).__name__
        first = next(self._items(shuffle=False, seed=0), None)
        if first is None:
            raise ValueError(f"the {self.kind} gives no batch")
        x, y, weights = self._parts(first, 0)
        self._outputs = sorted(y) if isinstance(y, dict) else None
        self._weighted = weights is not None
        if isinstance(y, dict):
            self.label: str | dict | None = {output: f"{LABEL_COLUMN}{output}"
                                             for output in y}
        elif y is not None:
            self.label = LABEL_COLUMN
        else:
            self.label = "label" if "label" in as_table(self._features(x)).column_names \
                else None
        self.weight = WEIGHT_COLUMN if self._weighted else None

    def num_batches(self, batch_size: int, drop_remainder: bool = False,
                    shard_index: int = 0, num_shards: int = 1) -> int | None:
        """The source's number of batches.

        Args:
            batch_size: ignored: the source makes its batches.
            drop_remainder: ignored.
            shard_index: ignored: the source is this rank's.
            num_shards: ignored.

        Returns:
            The count, or None for a source without an end or a length.
        """
        if isinstance(self.source, keras.utils.PyDataset):
            return self.source.num_batches
        try:
            return len(self.source)
        except TypeError:                     # a DataLoader over an IterableDataset
            return None

    def batches(self, batch_size: int, *, shuffle: bool = False, seed: int = 0,
                drop_remainder: bool = False, shard_index: int = 0,
                num_shards: int = 1) -> Iterator[pa.Table]:
        """The source's batches, as pyarrow Tables with the label and weight
        columns the loops read.

        Args:
            batch_size: ignored: the source makes its batches.
            shuffle: permute a finite PyDataset's batch order.
            seed: seed of the permutation.
            drop_remainder: ignored.
            shard_index: ignored: the source is this rank's.
            num_shards: ignored.

        Returns:
            An iterator of Tables.
        """
        for index, item in enumerate(self._items(shuffle, seed)):
            yield self._table(item, index)

    def end_epoch(self) -> None:
        """Runs a PyDataset's `on_epoch_end`, as Keras does after each epoch
        of `fit` and after `evaluate` and `predict`."""
        if isinstance(self.source, keras.utils.PyDataset):
            self.source.on_epoch_end()

    def _items(self, shuffle: bool, seed: int) -> Iterator[Any]:
        if not isinstance(self.source, keras.utils.PyDataset):
            yield from self.source
            return
        count = self.source.num_batches
        if count is None:
            yield from map(self.source.__getitem__, itertools.count())
            return
        order = np.random.default_rng(seed).permutation(count) if shuffle else range(count)
        for index in order:
            yield self.source[int(index)]

    def _parts(self, item: Any, index: int) -> tuple[Any, Any, Any]:
        if isinstance(item, (dict, pa.Table, pa.RecordBatch)):
            return item, None, None
        if isinstance(item, (tuple, list)) and 1 <= len(item) <= 3:
            x, y, weights = (*item, None, None)[:3]
            return x, y, weights
        raise ValueError(f"batch {index} of the {self.kind} must be x, (x,), (x, y) or "
                         f"(x, y, sample_weight), got {type(item).__name__}")

    def _features(self, x: Any) -> Any:
        if isinstance(x, dict):
            return {name: _on_host(values) for name, values in x.items()}
        return x

    def _table(self, item: Any, index: int) -> pa.Table:
        x, y, weights = self._parts(item, index)
        outputs = sorted(y) if isinstance(y, dict) else None
        if (y is None) != (self.label in (None, "label")) or outputs != self._outputs \
                or (weights is not None) != self._weighted:
            raise FeatureInputError(
                f"batch {index} of the {self.kind} is laid out unlike its first batch: "
                f"labels {_layout(y)} and {'' if weights is not None else 'no '}weights, "
                f"against {self._first_layout()}")
        try:
            table = as_table(self._features(x))
        except TypeError as error:
            raise TypeError(f"batch {index} of the {self.kind}: x must be a dict of arrays "
                            f"or a pyarrow Table, got {type(x).__name__}") from error
        if isinstance(y, dict):
            for output, values in y.items():
                table = table.append_column(f"{LABEL_COLUMN}{output}",
                                            label_column(_on_host(values), table, output))
        elif y is not None:
            table = table.append_column(LABEL_COLUMN, label_column(_on_host(y), table, "y"))
        if weights is not None:
            weights = np.asarray(_on_host(weights), dtype=np.float32)
            if weights.shape != (table.num_rows,):
                raise ValueError(f"batch {index} of the {self.kind}: sample_weight must "
                                 f"hold one weight per example: shape ({table.num_rows},), "
                                 f"got {weights.shape}")
            table = table.append_column(WEIGHT_COLUMN, pa.array(weights))
        return table

    def _first_layout(self) -> str:
        labels = "none" if self.label in (None, "label") else \
            ("for outputs " + ", ".join(self._outputs) if self._outputs else "one array")
        return f"the first batch's labels {labels} and {'' if self._weighted else 'no '}weights"


def _layout(y: Any) -> str:
    if y is None:
        return "none"
    return "for outputs " + ", ".join(sorted(y)) if isinstance(y, dict) else "one array"
