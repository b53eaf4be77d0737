"""`rk.Model`'s `train_on_batch`, `test_on_batch` and `predict_on_batch`.

Keras's own versions hand `x` straight to the step; an `rk.Model`'s step
takes a batch the loops prepared (validated and encoded by the
FeatureColumns, packed once, labels and weights read, on the Keras device).
Here one batch goes through exactly the stream `fit`, `evaluate` and
`predict` use, so `train_on_batch(x, y)` trains as `fit` on that one batch
does, and `test_on_batch`/`predict_on_batch` give `evaluate`'s and
`predict`'s figures.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import keras
import torch

from reckeras import _keras_compat
from reckeras.pipeline import loops
from reckeras.pipeline.batch_sources import is_batch_source
from reckeras.pipeline.batches import Targets, as_data, check_class_weight
from reckeras.pipeline.targets import model_targets


class OneBatch:
    """In-memory data served as one batch, on every rank alike.

    Keras's `*_on_batch` take the batch of this process: under torchrun each
    rank gives its own, and none is split across the ranks.

    Args:
        data: the `batches.InMemoryData` of the batch.

    Example:

    ```python
    data, _ = as_data({"n": [0.5, 1.0]}, y=[0, 1])
    batch = OneBatch(data)
    [table] = list(batch.batches(batch.rows, shard_index=1, num_shards=2))
    ```
    """

    def __init__(self, data: Any):
        self.data = data
        self.label = data.label
        self.rows = data.num_rows

    def num_batches(self, batch_size: int, **kwargs: Any) -> int:
        """One batch, whatever the batch size or the shard.

        Args:
            batch_size: ignored: the batch is what was given.
            **kwargs: the sharding arguments, ignored.

        Returns:
            1.
        """
        return 1

    def batches(self, batch_size: int, **kwargs: Any) -> Iterator:
        """The batch itself, once, whatever the shard.

        Args:
            batch_size: ignored: the batch is what was given.
            **kwargs: shuffling and sharding arguments, ignored (Keras does
                not shuffle a batch it is given).

        Returns:
            An iterator of the one pyarrow Table.
        """
        yield self.data.table


class OnBatchMethods(_keras_compat.ModelMixin):
    """Mixin of `rk.Model`: Keras's `*_on_batch` methods, each running one
    batch through the preparation of the loops.

    As in Keras 3.15, each call resets the metrics first: the logs are those
    of this batch alone. Under torchrun every rank calls them together, each
    with a batch of its own (the lookups of sharded tables are collectives);
    the logs are over all ranks' examples, as `fit`'s are.
    """

    def _one_batch(self, x, y, sample_weight, class_weight, method, training):
        """The stream of the one batch `x` (`method` names the caller)."""
        if (hasattr(x, "batches") and hasattr(x, "num_batches")) or is_batch_source(x):
            loop = method.split("_on_batch")[0].replace("train", "fit").replace("test",
                                                                                 "evaluate")
            raise TypeError(f"{method}() takes one batch: a dict of arrays or a pyarrow "
                            f"Table, got {type(x).__name__}, a source of batches; use "
                            f"{loop}() for it")
        data, weight = as_data(x, y, sample_weight)
        batch = OneBatch(data)
        targets = Targets() if method == "predict_on_batch" else \
            model_targets(self, data, None, weight, class_weight, method)
        if training:
            loops.prepare_to_train(self, batch, batch.rows)
        return loops.epoch_stream(self, batch, batch.rows, 1, targets, training, pipeline=False)

    def train_on_batch(self, x: Any, y: Any = None, sample_weight: Any = None,
                       class_weight: dict | None = None,
                       return_dict: bool = False) -> Any:
        """One training step on one batch, like `keras.Model.train_on_batch`.

        Trains exactly as `fit(x, y, batch_size=<its rows>, epochs=1,
        shuffle=False)` does (the first call adapts the FeatureColumns on
        the batch if they need it, and builds a subclassed model).

        Args:
            x: the batch: a dict of arrays or a pyarrow Table (with a `label`
                column unless `y` is given).
            y: its labels (an array, or `{output: array}`).
            sample_weight: per-example loss weights: an array, or the name of
                a column of `x`.
            class_weight: `{class index: weight}`, as in `fit`.
            return_dict: return `{name: value}` instead of a list.

        Returns:
            The loss and metrics of this batch (a scalar when there is only
            the loss).

        Raises:
            ValueError: the model is not compiled, or both `class_weight`
                and `sample_weight` are given.

        Example:

        ```python
        logs = model.train_on_batch({"n": n, "a": a}, y, return_dict=True)
        ```
        """
        self._must_be_compiled("train_on_batch")
        class_weight = check_class_weight(class_weight)
        if class_weight is not None and sample_weight is not None:
            raise ValueError("train_on_batch(): you cannot use class_weight and "
                             "sample_weight at the same time (Keras's rule): fold the "
                             "class weights into sample_weight instead")
        stream = self._one_batch(x, y, sample_weight, class_weight, "train_on_batch", True)
        self.make_train_function()
        self.reset_metrics()
        self.train()
        try:
            with stream as batches:
                for batch in batches:
                    self.train_step(batch.data)
        finally:
            self.eval()
        return loops.returned_logs(self, loops.synced_metrics_result(self), return_dict)

    def test_on_batch(self, x: Any, y: Any = None, sample_weight: Any = None,
                      return_dict: bool = False) -> Any:
        """Loss and metrics of one batch, like `keras.Model.test_on_batch`:
        what `evaluate` gives on it.

        Args:
            x: the batch, as in `train_on_batch`.
            y: its labels.
            sample_weight: per-example loss weights.
            return_dict: return `{name: value}` instead of a list.

        Returns:
            The loss and metrics (a scalar when there is only the loss).

        Raises:
            ValueError: the model is not compiled.

        Example:

        ```python
        loss, auc = model.test_on_batch(batch)      # batch holds a label column
        ```
        """
        self._must_be_compiled("test_on_batch")
        stream = self._one_batch(x, y, sample_weight, None, "test_on_batch", False)
        self.make_test_function()
        self.reset_metrics()
        with torch.no_grad(), stream as batches:
            for batch in batches:
                self.test_step(batch.data)
        return loops.returned_logs(self, loops.synced_metrics_result(self), return_dict)

    def predict_on_batch(self, x: Any) -> Any:
        """The model's outputs for one batch, as numpy, like
        `keras.Model.predict_on_batch`: what `predict` gives on it.

        Args:
            x: the batch: a dict of arrays or a pyarrow Table.

        Returns:
            The outputs (numpy, or a dict or list of numpy arrays).

        Example:

        ```python
        scores = model.predict_on_batch(batch)[:, 0]
        ```
        """
        stream = self._one_batch(x, None, None, None, "predict_on_batch", False)
        self.make_predict_function()
        with torch.no_grad(), stream as batches:
            for batch in batches:
                outputs = self.predict_step(batch.data)
        return keras.tree.map_structure(keras.ops.convert_to_numpy, outputs)

    def _must_be_compiled(self, method):
        if not self.compiled:
            raise ValueError(f"You must call compile() before {method}()")

