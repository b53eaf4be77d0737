"""What `rk.Model(inputs, outputs)` adds to `rk.Model`: a graph to read.

A functional model's graph is known before any batch: its inputs are declared
(what the loops feed is matched in one pass, `DeclaredInputs`), its outputs'
structure is known (labels are checked against it), and which embedding
layers look up the FeatureColumns' packed batch itself, once per step, can be
read off the graph, so the pipeline's stages may plan their lookups ahead
(`stream.EpochStream`). A subclassed `rk.Model` has none of this: its `call`
is code, run as it is.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from reckeras import _keras_compat
from reckeras.pipeline import dense_routing
from reckeras.pipeline.declared_inputs import DeclaredInputs


class FunctionalGraph(_keras_compat.DeclaredInputsShortcut):
    """Mixin of `rk.Model`'s functional class: the steps run its graph
    (`forward`).

    Args:
        *args: `keras.Model`'s functional arguments (`inputs`, `outputs`,
            `name`, ...).
        **kwargs: the same, by keyword.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        _keras_compat.freeze_input_spec(self)
        self._declared_inputs = DeclaredInputs.of(_keras_compat.functional_inputs(self))
        self._dense_routes: Mapping[Any, Callable] | None = None   # see `dense_routes`
        self._fed_layers: list | None = None             # see `fed_embedding_layers`

    def inputs_as_declared(self, inputs: Any) -> list | None:
        """The flat input list when `inputs` is a dict of exactly the input
        names holding torch tensors of the declared dtypes and shapes on the
        Keras device (what fit, evaluate and predict feed), else None.

        Args:
            inputs: what the model is called on.

        Returns:
            The tensors in Keras's flat order, or None.
        """
        declared = self._declared_inputs
        return None if declared is None else declared.match(inputs)

    # Methods, not properties: Keras's saving reads every attribute of the
    # model, and these must be decided by their first use, not by a save.

    def dense_routes(self) -> Mapping[Any, Callable]:
        """The calls that run the model's own Dense matmuls in oneDNN on CPU
        (`dense_routing.dense_routes`), decided at the first call (`forward`,
        on the built model) and kept.

        Returns:
            `{layer: call}`, read-only.
        """
        if self._dense_routes is None:
            self._dense_routes = dense_routing.dense_routes(self)
        return self._dense_routes

    def fed_embedding_layers(self) -> list:
        """The embedding layers that look up the FeatureColumns' packed
        batch itself, once per step (see `fed_layers`), read off the graph
        at the first call and kept.

        Returns:
            The `ShardedEmbedding` layers.
        """
        if self._fed_layers is None:
            columns = self.feature_columns
            names = [s.name for s in columns.sparse_specs]
            self._fed_layers = [
                layer for layer in self.embedding_layers
                if [s.name for s in layer.packing.slots] == names
                and _keras_compat.called_once_on_outputs_of(layer, columns)]
        return self._fed_layers


def forward(model: FunctionalGraph, inputs: dict, training: bool,
            prepared: Any = None) -> Any:
    """`model(inputs, training=training)`, without Keras's per-call work on
    inputs that are already as declared (what the loops feed).

    For the prepared batch the FeatureColumns layer is not called: its
    output was packed once by the pipeline (`FeatureColumns.pack`), and each
    embedding layer fed by it gets the routes the sparse-dist stage planned
    for it. Every other layer is called as usual; the model's own Dense
    layers run their matmuls in oneDNN (`dense_routing`, decided at the
    first call).

    Args:
        model: a functional `rk.Model`.
        inputs: the batch's encoded inputs.
        training: the call's training flag.
        prepared: the `stream.PreparedBatch` of `inputs`, or None.

    Returns:
        The model's outputs.

    Example:

    ```python
    outputs = forward(model, batch.inputs, False, batch)
    ```
    """
    flat = model.inputs_as_declared(inputs)      # outside: one check per input
    columns = model.feature_columns
    if flat is None or not columns.built:
        return model(inputs, training=training)
    replace = {**model.dense_routes(),
               columns: prepared_output(prepared) if prepared else columns.pack}
    if prepared is not None:
        for layer, future in prepared.routes.items():
            replace[layer] = functools.partial(layer, training=training,
                                               routed=future.result())
    outputs = _keras_compat.run_functional_graph(model, flat, training, replace)
    return model(inputs, training=training) if outputs is None else outputs


def fed_layers(model: Any) -> list:
    """The embedding layers that look up the FeatureColumns' packed batch
    itself, once per step (the pipeline's stages may work on their ids
    ahead): read off a functional model's graph once; none in a subclassed
    model, whose `call` is code, not a graph to read.

    Args:
        model: an `rk.Model`.

    Returns:
        The `ShardedEmbedding` layers.

    Example:

    ```python
    stream = EpochStream(model.feature_columns, fed_layers(model), data, ...)
    ```
    """
    return model.fed_embedding_layers() if isinstance(model, FunctionalGraph) else []


def declared_outputs(model: Any) -> Any:
    """The structure of a model's outputs (labels are checked against it).

    Args:
        model: an `rk.Model`.

    Returns:
        A functional model's outputs; None for a subclassed model (known
        only by calling it).
    """
    return _keras_compat.functional_outputs(model) \
        if isinstance(model, FunctionalGraph) else None


def rebase_on_functional(cls: type, model: type, functional_model: type) -> type:
    """Puts `functional_model` in place of `model` in `cls`'s bases (and in
    those of its bases between it and `model`).

    A subclass of `rk.Model` given `(inputs, outputs)`, as Keras allows,
    becomes functional this way (Keras rebases such a subclass on its
    `Functional`, which here would rebase `rk.Model` itself).

    Args:
        cls: the subclass.
        model: `rk.Model`.
        functional_model: its functional class.

    Returns:
        `cls`, rebased.
    """
    cls.__bases__ = tuple(
        functional_model if base is model else
        rebase_on_functional(base, model, functional_model)
        if issubclass(base, model) and not issubclass(base, functional_model) else base
        for base in cls.__bases__)
    return cls


def prepared_output(batch: Any) -> Callable:
    """A stand-in for the FeatureColumns layer in the graph.

    Args:
        batch: a `stream.PreparedBatch` the pipeline packed once
            (`FeatureColumns.pack`).

    Returns:
        A function returning `batch.packed` whatever it is called with.
    """
    return lambda *args, **kwargs: batch.packed
