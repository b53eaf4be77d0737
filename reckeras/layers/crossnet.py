"""CrossNet: the cross network of DCN-V2."""

from __future__ import annotations

import numbers
from typing import Any

import keras
import torch


@keras.saving.register_keras_serializable(package="reckeras")
class CrossNet(keras.layers.Layer):
    """The cross network of DCN-V2 (Wang et al., WWW 2021).

    A stack of `num_layers` cross layers over `x_0` of shape `[B, D]`
    (the concatenated dense features and embeddings); layer `l` computes

    ```
    x_{l+1} = x_0 * (W_l x_l + b_l) + x_l
    ```

    (`*` elementwise), so `l` layers hold every feature cross of degree up
    to `l + 1`. With `low_rank=r`, `W_l` is the product `U_l V_l` of
    `[D, r]` and `[r, D]` matrices (DCN-V2's low-rank cross, `2 D r`
    instead of `D^2` weights per layer). The output has `x_0`'s shape.

    Args:
        num_layers: number of cross layers, a positive int.
        low_rank: `None` for full `[D, D]` matrices, or the rank `r`.
        use_bias: whether the layers have the bias `b_l`.
        kernel_initializer: initializer of the matrices (each gets its own
            copy, so the layers do not start equal).
        bias_initializer: initializer of the biases.
        **kwargs: passed to `keras.layers.Layer` (`name`, `dtype`, ...).

    Input shape:
        `[B, D]`, with `D` known.

    Output shape:
        `[B, D]`.

    Example:

    ```python
    dense = keras.Input(shape=(13,))
    emb = keras.Input(shape=(416,))                     # 26 embeddings of 16
    x0 = keras.ops.concatenate([dense, emb], axis=1)    # (None, 429)
    crossed = rk.layers.CrossNet(num_layers=3, low_rank=64)(x0)   # (None, 429)
    out = rk.layers.MLP([256, 1], output_activation="sigmoid")(crossed)
    ```
    """

    def __init__(self, num_layers: int = 3, low_rank: int | None = None,
                 use_bias: bool = True,
                 kernel_initializer: str | keras.initializers.Initializer
                 = "glorot_uniform",
                 bias_initializer: str | keras.initializers.Initializer = "zeros",
                 **kwargs: Any):
        super().__init__(**kwargs)
        for name, value in (("num_layers", num_layers), ("low_rank", low_rank)):
            if value is None and name == "low_rank":
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) \
                    or value < 1:
                raise ValueError(f"CrossNet {name} must be a positive int"
                                 f"{' or None' if name == 'low_rank' else ''}; got "
                                 f"{value!r}.")
        if not isinstance(use_bias, bool):
            raise ValueError(f"CrossNet use_bias must be True or False; got "
                             f"{use_bias!r}.")
        self.num_layers = int(num_layers)
        self.low_rank = None if low_rank is None else int(low_rank)
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)

    def _check_shape(self, input_shape: Any) -> tuple[int | None, int]:
        shape = tuple(input_shape)
        if len(shape) != 2 or shape[-1] is None:
            raise ValueError(f"CrossNet needs inputs of shape [B, D] with a known D; "
                             f"got {shape}.")
        return shape

    def _initializer(
            self, initializer: keras.initializers.Initializer
    ) -> keras.initializers.Initializer:
        # A fresh copy per weight: one unseeded instance would give every
        # layer the same initial matrix.
        return keras.initializers.get(keras.initializers.serialize(initializer))

    def build(self, input_shape: tuple[int | None, int]) -> None:
        dim = self._check_shape(input_shape)[-1]
        self.kernels, self.biases = [], []
        for layer in range(self.num_layers):
            if self.low_rank is None:
                factors = [((dim, dim), f"kernel_{layer}")]
            else:
                factors = [((dim, self.low_rank), f"down_{layer}"),
                           ((self.low_rank, dim), f"up_{layer}")]
            self.kernels.append([
                self.add_weight(shape=shape, name=name,
                                initializer=self._initializer(self.kernel_initializer))
                for shape, name in factors])
            if self.use_bias:
                self.biases.append(self.add_weight(
                    shape=(dim,), name=f"bias_{layer}",
                    initializer=self._initializer(self.bias_initializer)))

    def call(self, inputs: torch.Tensor) -> torch.Tensor:
        x0 = x = inputs
        for layer in range(self.num_layers):
            projected = x
            for factor in self.kernels[layer]:
                projected = keras.ops.matmul(projected, factor)
            if self.use_bias:
                projected = projected + self.biases[layer]
            x = x0 * projected + x
        return x

    def compute_output_shape(
            self, input_shape: tuple[int | None, int]) -> tuple[int | None, int]:
        return self._check_shape(input_shape)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update({
            "num_layers": self.num_layers,
            "low_rank": self.low_rank,
            "use_bias": self.use_bias,
            "kernel_initializer":
                keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
        })
        return config
