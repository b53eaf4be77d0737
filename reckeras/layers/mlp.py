"""A multilayer perceptron as a single Keras layer."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from typing import Any

import keras
import torch

_NORM_LAYERS = {
    "batch": keras.layers.BatchNormalization,
    "layer": keras.layers.LayerNormalization,
}


def resolve_activation(layer: str, argument: str,
                       identifier: str | Callable | None) -> Callable:
    """`keras.activations.get(identifier)`, with an error naming the layer.

    Args:
        layer: the layer's class name, for the message.
        argument: the name of the layer argument, for the message.
        identifier: anything `keras.activations.get` accepts: a name, a
            callable or `None` (linear).

    Returns:
        The activation function.

    Raises:
        ValueError: for an unknown name, naming the layer and the argument.

    Example:

    ```python
    from reckeras.layers.mlp import resolve_activation

    relu = resolve_activation("MLP", "activation", "relu")
    # resolve_activation("MLP", "activation", "rleu") raises a ValueError
    # that names MLP's activation argument.
    ```
    """
    try:
        return keras.activations.get(identifier)
    except ValueError:
        raise ValueError(
            f"{layer} got an unknown {argument}={identifier!r}; pass a name from "
            f"keras.activations (e.g. 'relu'), a callable or None.") from None


@keras.saving.register_keras_serializable(package="reckeras")
class MLP(keras.layers.Layer):
    """A stack of `Dense` layers, as in the towers of DLRM and DCN.

    Each hidden layer is `Dense` (no activation), then the optional
    normalization, then `activation`, then dropout. The last layer is a
    `Dense` with `output_activation` and no normalization or dropout.
    Every `Dense` gets its own copy of `kernel_initializer`, so equal-shaped
    layers do not start with equal kernels.

    Args:
        units: list of positive ints, the width of each layer; the last one is
            the output width.
        activation: activation of the hidden layers, anything
            `keras.activations.get` accepts.
        output_activation: activation of the last layer; `None` is linear.
        dropout: dropout rate in [0, 1) after each hidden activation, applied
            only in training.
        norm: `None`, `"batch"` (`BatchNormalization`) or `"layer"`
            (`LayerNormalization`), applied to each hidden layer before its
            activation.
        use_bias: whether the `Dense` layers have a bias.
        kernel_initializer: initializer of the `Dense` kernels.
        **kwargs: passed to `keras.layers.Layer` (`name`, `dtype`, ...).

    Call arguments:
        inputs: a tensor of shape `[..., D]`.
        training: whether dropout applies.

    Input shape:
        `[..., D]`, usually `[B, D]`.

    Output shape:
        `[..., units[-1]]`.

    Example:

    ```python
    dense = keras.Input(shape=(13,))
    x = rk.layers.MLP([512, 256, 16])(dense)                  # (None, 16)
    out = rk.layers.MLP([64, 1], output_activation="sigmoid",
                        dropout=0.1, norm="layer")(x)         # (None, 1)
    ```
    """

    def __init__(self, units: Sequence[int],
                 activation: str | Callable | None = "relu",
                 output_activation: str | Callable | None = None,
                 dropout: float = 0.0, norm: str | None = None,
                 use_bias: bool = True,
                 kernel_initializer: str | keras.initializers.Initializer
                 = "glorot_uniform",
                 **kwargs: Any):
        super().__init__(**kwargs)
        if (not isinstance(units, (list, tuple)) or not units
                or not all(isinstance(u, numbers.Integral)
                           and not isinstance(u, bool) and int(u) > 0
                           for u in units)):
            raise ValueError(
                f"MLP units must be a non-empty list of positive ints, e.g. "
                f"[256, 1]; got {units!r}.")
        if (not isinstance(dropout, numbers.Real)
                or isinstance(dropout, bool) or not 0.0 <= dropout < 1.0):
            raise ValueError(
                f"MLP dropout must be a rate in [0, 1); got {dropout!r}.")
        if norm is not None and norm not in _NORM_LAYERS:
            raise ValueError(
                f"MLP norm must be None, 'batch' or 'layer'; got {norm!r}.")
        self.units: list[int] = [int(u) for u in units]
        self.activation: Callable = resolve_activation("MLP", "activation", activation)
        self.output_activation: Callable = resolve_activation("MLP", "output_activation",
                                                              output_activation)
        self.dropout: float = float(dropout)
        self.norm: str | None = norm
        self.use_bias: bool = use_bias
        self.kernel_initializer: keras.initializers.Initializer = keras.initializers.get(
            kernel_initializer)

        self._stack: list[keras.layers.Layer] = []
        for width in self.units[:-1]:
            self._stack.append(keras.layers.Dense(
                width, use_bias=use_bias,
                kernel_initializer=self._new_kernel_initializer(),
                dtype=self.dtype_policy))
            if norm is not None:
                self._stack.append(
                    _NORM_LAYERS[norm](dtype=self.dtype_policy))
            self._stack.append(keras.layers.Activation(
                self.activation, dtype=self.dtype_policy))
            if self.dropout > 0.0:
                self._stack.append(keras.layers.Dropout(
                    self.dropout, dtype=self.dtype_policy))
        self._stack.append(keras.layers.Dense(
            self.units[-1], activation=self.output_activation,
            use_bias=use_bias,
            kernel_initializer=self._new_kernel_initializer(),
            dtype=self.dtype_policy))

    def _new_kernel_initializer(self) -> keras.initializers.Initializer:
        # An unseeded Keras initializer fixes its seed when it is created, so
        # one shared instance would give equal-shaped layers equal kernels.
        return keras.initializers.get(
            keras.initializers.serialize(self.kernel_initializer))

    def build(self, input_shape: tuple[int | None, ...]) -> None:
        shape = tuple(input_shape)
        for layer in self._stack:
            layer.build(shape)
            shape = layer.compute_output_shape(shape)

    def call(self, inputs: torch.Tensor,
             training: bool | None = None) -> torch.Tensor:
        if self._can_fuse(inputs, training):
            return self._fused_call(inputs)
        x = inputs
        for layer in self._stack:
            x = layer(x, training=training)
        return x

    def _can_fuse(self, inputs: Any, training: bool | None) -> bool:
        """Whether `_fused_call` computes exactly what the stack would.

        It does for float32 2-D torch inputs and plain float32 `Dense`
        layers: no norm, no dropout in training, no quantization, no LoRA.
        """
        return (isinstance(inputs, torch.Tensor) and inputs.dim() == 2
                and self.norm is None and not (self.dropout > 0.0 and training)
                and self.compute_dtype == "float32" and self.variable_dtype == "float32"
                and inputs.dtype == torch.float32
                and all(layer.quantization_mode is None and not layer.lora_enabled
                        for layer in self._stack if isinstance(layer, keras.layers.Dense)))

    def _fused_call(self, x: torch.Tensor) -> torch.Tensor:
        # The stack's own weights, with the bias folded into the matmul
        # (addmm) and one Keras layer call less per layer: ~3 ms of a
        # ~55 ms DLRM training step on CPU.
        dense = [layer for layer in self._stack if isinstance(layer, keras.layers.Dense)]
        for index, layer in enumerate(dense):
            kernel = layer.kernel.value
            x = torch.addmm(layer.bias.value, x, kernel) if self.use_bias \
                else torch.mm(x, kernel)
            last = index == len(dense) - 1
            x = (self.output_activation if last else self.activation)(x)
        return x

    def compute_output_shape(
            self, input_shape: tuple[int | None, ...]) -> tuple[int | None, ...]:
        return (*input_shape[:-1], self.units[-1])

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update({
            "units": list(self.units),
            "activation": keras.activations.serialize(self.activation),
            "output_activation":
                keras.activations.serialize(self.output_activation),
            "dropout": self.dropout,
            "norm": self.norm,
            "use_bias": self.use_bias,
            "kernel_initializer":
                keras.initializers.serialize(self.kernel_initializer),
        })
        return config
