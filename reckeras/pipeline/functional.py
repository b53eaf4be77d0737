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
from typing import Any, Callable

from reckeras import _keras_compat
from reckeras.pipeline import dense_routing
from reckeras.pipeline.declared_inputs import DeclaredInputs


class FunctionalGraph(_keras_compat.DeclaredInputsShortcut):
    """Mixin of `rk.Model`'s functional class: the steps run its graph.

    Args:
        *args: `keras.Model`'s functional arguments (`inputs`, `outputs`,
            `name`, ...).
        **kwargs: the same, by keyword.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        _keras_compat.freeze_input_spec(self)
        self._declared_inputs = DeclaredInputs.of(_keras_compat.functional_inputs(self))

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

    def _forward(self, inputs, training):
        """`self(inputs, training=training)`, without Keras's per-call work
        on inputs that are already as declared (what the loops feed).

        For the running step's batch the FeatureColumns layer is not called:
        its output was packed once by the pipeline (`FeatureColumns.pack`),
        and each embedding layer fed by it gets the routes the sparse-dist
        stage planned for it. Every other layer is called as usual.
        """
        flat = self.inputs_as_declared(inputs)      # outside: one check per input
        columns = self.feature_columns
        if flat is None or not columns.built:
            return self(inputs, training=training)
        if self._dense_routes is None:
            # The model's own Dense matmuls run in oneDNN on CPU: decided once.
            self._dense_routes = dense_routing.dense_routes(self)
        prepared = self._prepared if self._prepared is not None \
            and self._prepared.inputs is inputs else None
        replace = {**self._dense_routes,
                   columns: prepared_output(prepared) if prepared else columns.pack}
        if prepared is not None:
            for layer, future in prepared.routes.items():
                replace[layer] = functools.partial(layer, training=training,
                                                   routed=future.result())
        outputs = _keras_compat.run_functional_graph(self, flat, training, replace)
        return self(inputs, training=training) if outputs is None else outputs

    def _layers_fed_by_columns(self):
        """Embedding layers that look up the FeatureColumns' packed batch
        itself, once per step: the stages may work on their ids ahead."""
        if not hasattr(self, "_fed_layers"):
            columns = self.feature_columns
            names = [s.name for s in columns.sparse_specs]
            self._fed_layers = [
                layer for layer in self.embedding_layers
                if [s.name for s in layer.packing.slots] == names
                and _keras_compat.called_once_on_outputs_of(layer, columns)]
        return self._fed_layers

    def _declared_outputs(self):
        """The structure of the outputs (labels are checked against it)."""
        return _keras_compat.functional_outputs(self)


def prepared_output(batch: Any) -> Callable:
    """A stand-in for the FeatureColumns layer in the graph.

    Args:
        batch: a `stream.PreparedBatch` the pipeline packed once
            (`FeatureColumns.pack`).

    Returns:
        A function returning `batch.packed` whatever it is called with.
    """
    return lambda *args, **kwargs: batch.packed
