"""Which of a model's layers run their Dense matmuls in oneDNN, decided once.

`rk.Model`'s steps run its functional graph with some layers replaced
(`_keras_compat.run_functional_graph`). `dense_routes` gives the replacements
that put oneDNN under the model's own dense layers: each `keras.layers.Dense`
of the graph, and each reckeras layer of the graph that holds `Dense` layers
(`rk.layers.MLP`'s stack, for one), is called as usual (`Layer.__call__`:
masks, activity losses, `training` from the call context) inside a
`dense_matmul.RoutedKernels` block that knows only that layer's kernels.
Nothing else of the forward runs inside such a block, so a user's own layer
that calls `torch.matmul`, or holds a `Dense` of its own, runs plain torch
(as do the layers of a Keras model nested in the graph).

The model decides at its first step and keeps the answer: a built model's
layers and kernel tensors do not change (Keras assigns weights in place).
A `Dense` that is quantized or has LoRA enabled at that point stays with
torch. `rk.config.set(onednn_dense=False)` (or `RECKERAS_ONEDNN_DENSE=0`)
before the first step turns the routing off.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping

import keras

from reckeras import _keras_compat, config
from reckeras.backend_kernels import dense_matmul


def dense_routes(model: keras.Model) -> Mapping[keras.layers.Layer, Callable]:
    """The `{layer: call}` replacements that run `model`'s own dense layers'
    matmuls in oneDNN.

    Args:
        model: a built functional model.

    Returns:
        For each layer of the graph that is a plain float32 `Dense`, or a
        reckeras layer holding such `Dense` layers, a function that calls
        it inside a `RoutedKernels` block of its kernels; empty when the
        `onednn_dense` option is off or torch lacks oneDNN. The mapping is
        read-only, which also keeps Keras from tracking it (and the layers
        it holds) when the model keeps it as an attribute.

    Example:

    ```python
    routes = dense_routes(model)          # {dense_layer: call, mlp_layer: call}
    ```
    """
    routes: dict[keras.layers.Layer, Callable] = {}
    if not (config.options().onednn_dense and dense_matmul.available()):
        return types.MappingProxyType(routes)
    for layer in model.layers:
        if isinstance(layer, keras.layers.Dense):
            denses = [layer]
        elif type(layer).__module__.startswith("reckeras."):
            denses = [inner for inner in _keras_compat.walk_layers(layer)
                      if isinstance(inner, keras.layers.Dense)]
        else:
            continue            # the user's layer: its code runs as written
        kernels = [dense.kernel.value for dense in denses if _plain(dense)]
        if kernels:
            routes[layer] = _routed_call(layer, dense_matmul.RoutedKernels(kernels))
    return types.MappingProxyType(routes)


def _plain(dense: keras.layers.Dense) -> bool:
    # A quantized kernel is not float32, and with LoRA `kernel` is a sum
    # computed per call: neither is a tensor the block could recognize.
    return (dense.built and dense.quantization_mode is None and not dense.lora_enabled
            and dense.variable_dtype == "float32")


def _routed_call(layer: keras.layers.Layer, block: dense_matmul.RoutedKernels) -> Callable:
    def call(*args, **kwargs):
        with block:
            return layer(*args, **kwargs)
    return call
