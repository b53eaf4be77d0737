"""Feature interaction layers."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import torch


@keras.saving.register_keras_serializable(package="reckeras")
class DotInteraction(keras.layers.Layer):
    """Pairwise dot products of feature vectors, as in DLRM.

    Called on `[x, emb]`, with `x` of shape `[B, D]` (the output of the
    bottom MLP) and `emb` of shape `[B, F, D]` (one embedding per sparse
    feature), the layer stacks them into `n = F + 1` vectors `t_0 = x`,
    `t_1 = emb[:, 0]`, ..., `t_F = emb[:, F - 1]` and returns the dot products
    `<t_i, t_j>` for every pair `i > j` (`i >= j` with `self_interaction`),
    ordered by `i`, then `j`: `(1, 0), (2, 0), (2, 1), (3, 0), ...`. With
    `skip_connection`, `x` is prepended to them, as DLRM feeds its top MLP.

    Called on `emb` alone, the vectors are `t_0 = emb[:, 0]`, ...,
    `t_{F-1} = emb[:, F - 1]` (`n = F`); there is no `x` to prepend, so
    `skip_connection` must be False.

    The output has shape `[B, D * skip_connection + n * (n - 1) / 2]`, plus
    `n` with `self_interaction`.

    Args:
        self_interaction: whether to include each vector's dot product with
            itself (the diagonal).
        skip_connection: whether to prepend `x` to the dot products.
        **kwargs: passed to `keras.layers.Layer` (`name`, `dtype`, ...).

    Call arguments:
        inputs: `[x, emb]`, or `emb` alone (with `skip_connection=False`).

    Example:

    ```python
    dense = keras.Input(shape=(13,))
    emb = keras.Input(shape=(26, 16))                 # one vector per feature
    x = rk.layers.MLP([512, 256, 16])(dense)          # (None, 16)
    z = rk.layers.DotInteraction()([x, emb])          # (None, 16 + 27 * 26 // 2)
    pairs = rk.layers.DotInteraction(skip_connection=False)(emb)   # (None, 325)
    ```
    """

    def __init__(self, self_interaction: bool = False,
                 skip_connection: bool = True, **kwargs: Any):
        super().__init__(**kwargs)
        self.self_interaction = bool(self_interaction)
        self.skip_connection = bool(skip_connection)
        self._pair_index_by_device: dict[str, torch.Tensor] = {}

    def _batch_vectors_dim(self, input_shape: Any) -> tuple[int | None, int, int]:
        """Validates the input shapes; returns `(B, n, D)`."""
        if isinstance(input_shape, (list, tuple)) and input_shape and all(
                isinstance(s, (list, tuple)) for s in input_shape):
            if len(input_shape) != 2:
                raise ValueError(
                    f"DotInteraction takes [x, emb] or a single emb tensor; "
                    f"got {len(input_shape)} tensors.")
            x_shape, emb_shape = (tuple(s) for s in input_shape)
            if len(x_shape) != 2:
                raise ValueError(
                    f"DotInteraction needs x of shape [B, D]; got "
                    f"{x_shape}.")
        else:
            x_shape, emb_shape = None, tuple(input_shape)
            if self.skip_connection:
                raise ValueError(
                    f"DotInteraction was called on a single tensor of shape "
                    f"{emb_shape}, so there is no x for skip_connection=True "
                    f"to prepend; call it on [x, emb] or set "
                    f"skip_connection=False.")
        if len(emb_shape) != 3:
            raise ValueError(
                f"DotInteraction needs emb of shape [B, F, D]; got "
                f"{emb_shape}.")
        batch, features, dim = emb_shape
        if features is None or dim is None:
            raise ValueError(
                f"DotInteraction needs the feature count F and the dimension D "
                f"of emb to be known; got emb of shape {emb_shape}.")
        if x_shape is None:
            return batch, features, dim
        if x_shape[1] != dim:
            raise ValueError(
                f"DotInteraction needs x's last dimension to equal emb's D; "
                f"got x of shape {x_shape} (last dimension {x_shape[1]}) and "
                f"emb of shape {emb_shape} (D = {dim}).")
        return batch, features + 1, dim

    def build(self, input_shape: Any) -> None:
        _, vectors, _ = self._batch_vectors_dim(input_shape)
        rows, cols = np.tril_indices(
            vectors, k=0 if self.self_interaction else -1)
        self._pair_index = torch.from_numpy(rows * vectors + cols)

    def _pair_index_on(self, device: torch.device) -> torch.Tensor:
        # One copy per device, so a GPU step does not pay a host-to-device
        # copy of the index.
        key = str(device)
        if key not in self._pair_index_by_device:
            self._pair_index_by_device[key] = self._pair_index.to(device)
        return self._pair_index_by_device[key]

    def call(self, inputs: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
        if not isinstance(inputs, (list, tuple)):
            return self._pairs(inputs)         # build refused skip_connection here
        x, emb = inputs
        pairs = self._pairs(torch.cat([x.unsqueeze(1), emb], dim=1))
        return torch.cat([x, pairs], dim=1) if self.skip_connection else pairs

    def _pairs(self, vectors: torch.Tensor) -> torch.Tensor:
        """The dot products of the chosen pairs of `vectors` (`[B, n, D]`)."""
        gram = torch.bmm(vectors, vectors.transpose(1, 2)).flatten(1)
        return gram.index_select(1, self._pair_index_on(gram.device))

    def compute_output_shape(self, input_shape: Any) -> tuple[int | None, int]:
        batch, vectors, dim = self._batch_vectors_dim(input_shape)
        pairs = vectors * (vectors - 1) // 2
        if self.self_interaction:
            pairs += vectors
        return (batch, dim * self.skip_connection + pairs)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update({
            "self_interaction": self.self_interaction,
            "skip_connection": self.skip_connection,
        })
        return config
