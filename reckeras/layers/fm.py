"""FM: the second-order term of a factorization machine."""

from __future__ import annotations

from typing import Any

import keras
import torch


@keras.saving.register_keras_serializable(package="reckeras")
class FM(keras.layers.Layer):
    """The pairwise term of a factorization machine (Rendle, 2010), in O(F K).

    Called on `v` of shape `[B, F, K]` (one `K`-dim embedding per
    field), it returns the sum of the dot products of every pair of fields,

    ```
    sum_{i < j} <v_i, v_j> = 1/2 * sum_k ((sum_i v_ik)^2 - sum_i v_ik^2)
    ```

    computed with the right-hand side: `O(F K)` per example instead of the
    `O(F^2 K)` of the pairs. The output is `[B, 1]`, or the `[B, K]`
    per-dimension terms (the "bi-interaction" pooling of NFM) with
    `reduce_sum=False`. It has no weights: in DeepFM the embeddings are
    the factors.

    Args:
        reduce_sum: whether to sum over the `K` dimensions.
        **kwargs: passed to `keras.layers.Layer` (`name`, `dtype`, ...).

    Input shape:
        `[B, F, K]`.

    Output shape:
        `[B, 1]`, or `[B, K]` with `reduce_sum=False`.

    Example:

    ```python
    emb = keras.Input(shape=(26, 16))                   # 26 fields, K = 16
    second_order = rk.layers.FM()(emb)                  # (None, 1)
    bi_interaction = rk.layers.FM(reduce_sum=False)(emb)   # (None, 16)
    ```
    """

    def __init__(self, reduce_sum: bool = True, **kwargs: Any):
        super().__init__(**kwargs)
        if not isinstance(reduce_sum, bool):
            raise ValueError(f"FM reduce_sum must be True or False; got "
                             f"{reduce_sum!r}.")
        self.reduce_sum = reduce_sum

    def _check_shape(self, input_shape: Any) -> tuple[int | None, int, int]:
        shape = tuple(input_shape)
        if len(shape) != 3:
            raise ValueError(f"FM needs inputs of shape [B, F, K] (one K-dim vector "
                             f"per field); got {shape}.")
        return shape

    def call(self, inputs: torch.Tensor) -> torch.Tensor:
        total = keras.ops.sum(inputs, axis=1)
        squares = keras.ops.sum(inputs * inputs, axis=1)
        terms = 0.5 * (total * total - squares)
        return keras.ops.sum(terms, axis=1, keepdims=True) if self.reduce_sum \
            else terms

    def compute_output_shape(
            self, input_shape: tuple[int | None, int, int]) -> tuple[int | None, int]:
        batch, _, dim = self._check_shape(input_shape)
        return (batch, 1 if self.reduce_sum else dim)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "reduce_sum": self.reduce_sum}
