"""FeatureColumns: raw columns in, dense block and packed sparse batch out."""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterable, Iterator
from typing import Any

import keras
import numpy as np
import torch

from reckeras import _keras_compat
from reckeras.features import encode as encoding
from reckeras.features.plan import TransformPlan
from reckeras.features.specs import LENGTHS, Categorical, Numeric, Sequence, deserialize, serialize


@keras.saving.register_keras_serializable(package="reckeras")
class FeatureColumns(keras.layers.Layer):
    """Turns raw feature columns into model inputs, with fused transforms.

    Calling the layer on the dict of raw inputs returns `(dense, sparse)`:
    `dense` is the `[B, D]` float32 block of the numeric features after
    their transforms (`D` columns: one per scalar feature and `k` per vector
    feature of `shape=(k,)`, in declaration order), and `sparse` is the packed sparse batch
    `{"ids": [N], "offsets": [S * B + 1]}` of every sparse feature (see
    `reckeras.ragged`; with weighted sequences also `"weights": [N]`) for
    `rk.layers.ShardedEmbedding`. Each transform
    kind (missing-value fill, log1p, standardize, bucketize, hash, cross,
    sequence packing) runs as one vectorized op over all its features.

    Args:
        specs: list of `rk.features` specs (Numeric, Categorical, Sequence,
            Cross) or their serialized configs.
        **kwargs: base Layer arguments (`name`, ...).

    Example:

    ```python
    columns = rk.layers.FeatureColumns(
        [rk.features.Numeric("I1", transform="log1p"),
         rk.features.Categorical("C1", dim=16)])
    inputs = columns.inputs()
    dense, sparse = columns(inputs)
    ```
    """

    def __init__(self, specs: list, **kwargs: Any):
        super().__init__(**kwargs)
        # pack() turns every raw column into a tensor of its spec's dtype
        # itself: Keras's per-input conversion would only repeat it.
        _keras_compat.accept_raw_inputs(self)
        self.specs = [deserialize(s) for s in specs]
        self.plan = TransformPlan(self.specs)
        self.input_names = encoding.raw_columns(self.specs) + \
            ([LENGTHS] if self.plan.with_lengths else [])
        # One statistic per dense column: a vector is standardized per element.
        count = self.plan.dense_width
        self.mean = self.add_weight(shape=(count,), initializer="zeros",
                                    trainable=False, name="mean")
        self.std = self.add_weight(shape=(count,), initializer="ones",
                                   trainable=False, name="std")
        self.adapted = self.add_weight(shape=(), initializer="zeros",
                                       trainable=False, name="adapted")
        # (an input tensor, its batch's packed output)
        self._prepacked: tuple[Any, tuple] | None = None

    # ---- declaration ---------------------------------------------------------

    def inputs(self) -> dict:
        """A dict of `keras.Input`, one per raw column, for the functional API.

        Numeric features are float32 of their `shape` (`()` or `(k,)`),
        bucketized Categoricals float32 `()`, other Categoricals int64 `()`,
        Sequences int64 `(max_len,)` (and their weights float32
        `(max_len,)` under the weights column's name). With id Categoricals
        or Sequences, `"__lengths__"` (`rk.features.LENGTHS`) is int32
        `(R,)`: the length of each one's ids (`encode`).

        Returns:
            `{name: keras.Input}` in declaration order (none for a `Cross`),
            then `"__lengths__"`.
        """
        inputs = {}
        for spec in self.specs:
            if isinstance(spec, Numeric):
                inputs[spec.name] = keras.Input(shape=spec.shape, dtype="float32",
                                                name=spec.name)
            elif isinstance(spec, Categorical) and spec.boundaries is not None:
                inputs[spec.name] = keras.Input(shape=(), dtype="float32", name=spec.name)
            elif isinstance(spec, Categorical):
                inputs[spec.name] = keras.Input(shape=(), dtype="int64", name=spec.name)
            elif isinstance(spec, Sequence):
                inputs[spec.name] = keras.Input(shape=(spec.max_len,), dtype="int64",
                                                name=spec.name)
                if spec.weights is not None:
                    inputs[spec.weights] = keras.Input(
                        shape=(spec.max_len,), dtype="float32", name=spec.weights)
        if self.plan.with_lengths:
            inputs[LENGTHS] = keras.Input(shape=(len(self.plan.with_lengths),),
                                          dtype="int32", name=LENGTHS)
        return inputs

    def sequence_mask(self, inputs: dict, name: str) -> Any:
        """Where a sequence feature's rows hold ids: its padding mask.

        Args:
            inputs: the model inputs (`inputs()`, or encoded tensors).
            name: a Sequence feature of these columns.

        Returns:
            bool `[B, max_len]`: True at the first `length` positions of
            every row (a Keras op: it works on `keras.Input`s too).

        Raises:
            ValueError: `name` is not a Sequence of these columns.

        Example:

        ```python
        inputs = columns.inputs()
        mask = columns.sequence_mask(inputs, "hist_items")   # [B, 50]
        ```
        """
        sequences = {s.name: s for s in self.plan.sequences}
        if name not in sequences:
            raise ValueError(f"{name!r} is not a Sequence feature of these columns; "
                             f"the sequences are {sorted(sequences)}")
        column = [s.name for s in self.plan.with_lengths].index(name)
        lengths = inputs[LENGTHS][:, column:column + 1]
        positions = keras.ops.arange(sequences[name].max_len, dtype="int32")
        return keras.ops.less(keras.ops.expand_dims(positions, 0), lengths)

    @property
    def sparse_specs(self) -> list:
        """Sparse specs in slot order (the order of the packed batch)."""
        return self.plan.slots

    @property
    def needs_adapt(self) -> bool:
        """Whether `standardize` features wait for `adapt` (fit runs it)."""
        return any(s.transform == "standardize" for s in self.plan.numeric) and \
            not bool(self.adapted.numpy())

    # ---- host side -----------------------------------------------------------

    def encode(self, batch: Any, absent: Collection[str] = ()) -> dict:
        """Validates and encodes a raw batch into the numpy model inputs.

        Args:
            batch: pyarrow RecordBatch/Table or a dict of array-likes.
            absent: features whose columns the batch may lack: a lacking
                one is read as all missing (a model that ignores them,
                such as a two-tower's query side, `rk.Model.unread_features`).

        Returns:
            dict of numpy arrays keyed by feature name.

        Raises:
            reckeras.features.FeatureInputError: naming the feature at fault.
        """
        if absent:
            batch = encoding.with_absent_columns(self.specs, batch, absent)
        return encoding.encode(self.specs, batch)

    def adapt(self, batches: Iterable) -> None:
        """Computes mean and std of the `standardize` features.

        The statistics are per dense column, so per element of a vector
        feature; missing values count as the feature's `default`, as the
        model sees them.

        Args:
            batches: an iterable of raw batches (RecordBatch, Table or dict).
        """
        columns = [s for s in self.plan.numeric if s.transform == "standardize"]
        if not columns:
            return
        count = 0
        total = np.zeros(self.plan.dense_width)
        squares = np.zeros(self.plan.dense_width)
        defaults = self.plan.numeric_default.numpy().astype(np.float64)
        for batch in batches:
            inputs = self.encode(batch)
            x = np.concatenate([inputs[s.name].reshape(-1, s.size)
                                for s in self.plan.numeric], axis=1)
            x = np.where(np.isnan(x), defaults, x.astype(np.float64))
            count += len(x)
            total += x.sum(axis=0)
            squares += (x * x).sum(axis=0)
        if count == 0:
            raise ValueError("adapt() received no data")
        mean = total / count
        std = np.sqrt(np.maximum(squares / count - mean * mean, 0.0))
        self.mean.assign(mean.astype(np.float32))
        self.std.assign(np.where(std > 0, std, 1.0).astype(np.float32))
        self.adapted.assign(1.0)

    # ---- graph ---------------------------------------------------------------

    def pack(self, inputs: dict) -> tuple[torch.Tensor, dict | None]:
        """The layer's output for a batch of encoded inputs: the transformed
        dense block and the packed sparse batch.

        This is the one preprocessing step of a batch: `fit`, `evaluate` and
        `predict` run it once per batch in their pipeline (before the
        embedding stages need the ids) and hand its result to the model's
        graph in place of calling the layer; calling the layer runs it too.

        Args:
            inputs: `{feature name: tensor}` as `encode` makes them (torch
                tensors or arrays).

        Returns:
            `(dense, sparse)`: float32 `[B, D]` (`D = plan.dense_width`) and
            `{"ids": [N], "offsets": [S * B + 1]}` (and `"weights": [N]`
            with weighted sequences; None without sparse features).

        Example:

        ```python
        dense, sparse = columns.pack(
            {name: torch.as_tensor(v) for name, v in columns.encode(batch).items()})
        ```
        """
        missing = [name for name in self.input_names if name not in inputs]
        if missing:
            raise encoding.FeatureInputError(f"missing input(s) for feature(s) {missing}")
        inputs = {name: torch.as_tensor(inputs[name]) for name in self.input_names}
        if self.plan.numeric:
            dense = self.plan.dense(inputs, self.mean.value, self.std.value)
        else:
            any_input = next(iter(inputs.values()))
            dense = torch.zeros(any_input.shape[0], 0, device=any_input.device)
        sparse = self.plan.packed_sparse(inputs) if self.plan.slots else None
        return dense, sparse

    @contextlib.contextmanager
    def prepacked(self, inputs: dict, packed: tuple) -> Iterator[None]:
        """While open, calling the layer on `inputs` returns `packed`.

        The loops pack each batch once, in their pipeline; a subclassed
        `rk.Model` then calls the layer on the same inputs in its `call`.
        The batch is recognized by its first input tensor (the very object:
        Keras passes tensors through unchanged), so a call on any other
        inputs packs them as usual.

        Args:
            inputs: the batch's encoded inputs.
            packed: `pack(inputs)`, made earlier.

        Example:

        ```python
        packed = columns.pack(inputs)
        with columns.prepacked(inputs, packed):
            outputs = model(inputs)          # columns(inputs) is not packed again
        ```
        """
        self._prepacked = (inputs[self.input_names[0]], packed)
        try:
            yield
        finally:
            self._prepacked = None

    def call(self, inputs: dict) -> tuple:
        given = self._prepacked
        if given is not None and inputs.get(self.input_names[0]) is given[0]:
            return given[1]
        return self.pack(inputs)

    def compute_output_spec(self, inputs: dict) -> tuple:
        batch = next(iter(inputs.values())).shape[0]
        dense = keras.KerasTensor((batch, self.plan.dense_width), dtype="float32")
        sparse = None
        if self.plan.slots:
            sparse = {"ids": keras.KerasTensor((None,), dtype="int64"),
                      "offsets": keras.KerasTensor((None,), dtype="int64")}
            if self.plan.weighted:
                sparse["weights"] = keras.KerasTensor((None,), dtype="float32")
        return dense, sparse

    def get_config(self) -> dict:
        return {**super().get_config(), "specs": [serialize(s) for s in self.specs]}
