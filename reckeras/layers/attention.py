"""TargetAttention: DIN's attention of a target item over a behaviour history."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from typing import Any

import keras
import torch

from reckeras.layers.mlp import MLP, resolve_activation
from reckeras.layers.transformer import packed_tokens


@keras.saving.register_keras_serializable(package="reckeras")
class TargetAttention(keras.layers.Layer):
    """The local activation unit of DIN (Zhou et al., KDD 2018).

    Called on `[query, keys]`, with `query` of shape `[B, D]` (the
    target item's embedding) and `keys` of shape `[B, L, D]` (the
    embeddings of the user's behaviours), and a `mask` of shape `[B, L]`
    (True where a position holds a behaviour; Keras masking's
    `[query mask, keys mask]` is accepted too), it scores every behaviour
    against the target with an MLP over `[q, k, q - k, q * k]` and returns
    the score-weighted sum of the behaviours, `[B, D]`:

    ```
    out = sum_j score(q, k_j) * k_j       (over the valid positions j)
    ```

    As in DIN, the scores are not normalized by default: the sum keeps the
    *intensity* of the user's interest (how many behaviours match), which a
    softmax would discard. With `softmax=True` they are softmax-normalized
    over the valid positions instead. A row with no valid position gives
    zeros. Masked positions are never scored: the layer packs the valid
    behaviours and runs the MLP on them alone, so padding costs nothing.

    Args:
        units: widths of the hidden layers of the scoring MLP (its output
            layer, of width 1 and linear, is added).
        activation: activation of the scoring MLP's hidden layers (DIN uses
            PReLU or its Dice; any `keras.activations` name or callable).
        softmax: whether to softmax-normalize the scores over each row.
        **kwargs: passed to `keras.layers.Layer` (`name`, `dtype`, ...).

    Call arguments:
        inputs: `[query, keys]`, of shapes `[B, D]` and `[B, L, D]`.
        mask: bool `[B, L]`, True at the positions that hold a behaviour;
            `None` means every position does.

    Output shape:
        `[B, D]`.

    Example:

    ```python
    target = keras.Input(shape=(16,))                  # the target item
    history = keras.Input(shape=(50, 16))              # 50 behaviours
    mask = keras.Input(shape=(50,), dtype="bool")      # True at a behaviour
    interest = rk.layers.TargetAttention([80, 40])([target, history], mask=mask)
    interest.shape                                     # (None, 16)
    ```
    """

    def __init__(self, units: Sequence[int] = (80, 40),
                 activation: str | Callable | None = "relu", softmax: bool = False,
                 **kwargs: Any):
        super().__init__(**kwargs)
        if (not isinstance(units, (list, tuple))
                or not all(isinstance(u, numbers.Integral) and not isinstance(u, bool)
                           and int(u) > 0 for u in units)):
            raise ValueError(f"TargetAttention units must be a list of positive ints, "
                             f"e.g. [80, 40]; got {units!r}.")
        if not isinstance(softmax, bool):
            raise ValueError(f"TargetAttention softmax must be True or False; got "
                             f"{softmax!r}.")
        self.units = [int(u) for u in units]
        self.softmax = softmax
        self.activation = resolve_activation("TargetAttention", "activation", activation)
        self._scorer = MLP([*self.units, 1], activation=self.activation,
                           dtype=self.dtype_policy, name="scorer")

    def _check_shapes(self, input_shape: Any) -> tuple[tuple, tuple]:
        if not (isinstance(input_shape, (list, tuple)) and len(input_shape) == 2):
            raise ValueError("TargetAttention takes [query, keys], a list of two "
                             "tensors.")
        query, keys = (tuple(s) for s in input_shape)
        if len(query) != 2 or len(keys) != 3:
            raise ValueError(f"TargetAttention needs query of shape [B, D] and keys of "
                             f"shape [B, L, D]; got {query} and {keys}.")
        if query[-1] is None or query[-1] != keys[-1]:
            raise ValueError(f"TargetAttention needs query and keys of one known "
                             f"dimension D; got query {query} and keys {keys}.")
        return query, keys

    def build(self, input_shape: Any) -> None:
        query, _ = self._check_shapes(input_shape)
        self._scorer.build((None, 4 * query[-1]))

    def call(self, inputs: Sequence[torch.Tensor],
             mask: torch.Tensor | Sequence | None = None) -> torch.Tensor:
        query, keys = inputs
        batch, length, _ = keys.shape
        if isinstance(mask, (list, tuple)):
            mask = mask[1]        # Keras masking passes [query mask, keys mask]
        if mask is None:
            mask = torch.ones(batch, length, dtype=torch.bool, device=keys.device)
        mask = torch.as_tensor(mask, device=keys.device).bool()
        behaviours, index, _ = packed_tokens(keys, mask)
        row = torch.div(index, length, rounding_mode="floor")
        target = query.index_select(0, row)
        scores = self._scorer(torch.cat(
            [target, behaviours, target - behaviours, target * behaviours], dim=1))[:, 0]
        if self.softmax:
            # Shifting by each row's largest score leaves the softmax unchanged
            # and keeps exp() finite.
            largest = torch.full((batch,), float("-inf"), dtype=scores.dtype,
                                 device=scores.device).scatter_reduce(
                0, row, scores.detach(), "amax")
            scores = torch.exp(scores - largest.index_select(0, row))
            totals = scores.new_zeros(batch).index_add(0, row, scores)
            scores = scores / totals.index_select(0, row)
        return query.new_zeros(query.shape).index_add(0, row,
                                                      scores[:, None] * behaviours)

    def compute_mask(self, inputs: Any, mask: Any = None) -> None:
        # The output has no positions left to mask.
        return None

    def compute_output_spec(self, inputs: Sequence[keras.KerasTensor],
                            mask: Any = None) -> keras.KerasTensor:
        query, _ = self._check_shapes([inputs[0].shape, inputs[1].shape])
        return keras.KerasTensor(query, dtype=self.compute_dtype)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update({
            "units": list(self.units),
            "activation": keras.activations.serialize(self.activation),
            "softmax": self.softmax,
        })
        return config
