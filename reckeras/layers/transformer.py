"""TransformerBlock: self-attention over variable-length behaviour sequences."""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import keras
import torch

from reckeras.backend_kernels.jagged_attention import jagged_attention
from reckeras.layers.mlp import resolve_activation


def _check_positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"TransformerBlock {name} must be a positive int; got "
                         f"{value!r}.")
    return int(value)


def _check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"TransformerBlock {name} must be True or False; got "
                         f"{value!r}.")
    return value


def packed_tokens(x: torch.Tensor,
                  mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The valid tokens of a padded batch, packed, and where they came from.

    Args:
        x: `[B, L, D]`.
        mask: bool `[B, L]`, True at the valid tokens.

    Returns:
        `(tokens [N, D], index [N], offsets [B + 1])`: `index` is each
        token's flat position `b * L + l` in `x`, and sequence `b`
        holds tokens `offsets[b]:offsets[b + 1]` in their original order.

    Example:

    ```python
    from reckeras.layers.transformer import packed_tokens

    x = torch.arange(12.0).reshape(2, 3, 2)
    mask = torch.tensor([[True, True, False], [False, True, False]])
    tokens, index, offsets = packed_tokens(x, mask)
    index     # tensor([0, 1, 4])
    offsets   # tensor([0, 2, 3])
    ```
    """
    index = mask.reshape(-1).nonzero().squeeze(1)
    offsets = torch.zeros(mask.shape[0] + 1, dtype=torch.int64, device=mask.device)
    torch.cumsum(mask.sum(1), dim=0, out=offsets[1:])
    return x.reshape(-1, x.shape[-1]).index_select(0, index), index, offsets


@keras.saving.register_keras_serializable(package="reckeras")
class TransformerBlock(keras.layers.Layer):
    """One transformer encoder block over padded, variable-length sequences.

    Multi-head self-attention then a position-wise feed-forward network, each
    with a residual connection and layer normalization (before the sublayer
    with `norm_first`, as in pre-LN transformers; after the residual sum
    otherwise, as in the original transformer and BST). Called on `x` of
    shape `[B, L, D]` with a `mask` of shape `[B, L]` (True where a
    position holds a behaviour), every valid position attends to the valid
    positions of its own row only (with `causal`, to those at or before
    it); the output is `[B, L, D]` with zeros at masked positions. Rows of
    length 0 give zeros, never NaN.

    The block runs padding-free: the valid tokens are packed into `[N, D]`
    (`N` = number of valid positions in the batch), every per-token layer
    runs on them alone, and the attention is
    `reckeras.backend_kernels.jagged_attention` (a Triton flash-attention
    kernel over the packed sequences on GPU, with the key mask fused in; the
    torch SDPA reference with the mask on CPU). A batch of long-tailed
    histories thus costs its number of behaviours, not `B * L`.

    Dropout applies to the attention output and to the feed-forward output
    (each before its residual sum), in training only; attention
    probabilities are not dropped. The mask is also propagated (Keras
    masking), so a following block receives it without being passed it.

    Args:
        num_heads: number of attention heads; must divide `D`.
        ff_dim: width of the hidden layer of the feed-forward network.
        dropout: dropout rate in [0, 1).
        causal: whether a position attends only to itself and earlier
            positions.
        norm_first: pre-LN (True) or post-LN (False).
        learned_positions: whether to add a learned `[L, D]` position
            embedding to the input first (`L` must be known when the layer
            is built).
        activation: activation of the feed-forward hidden layer, anything
            `keras.activations.get` accepts.
        epsilon: epsilon of the layer normalizations.
        **kwargs: passed to `keras.layers.Layer` (`name`, `dtype`, ...).

    Call arguments:
        inputs: `[B, L, D]`.
        mask: bool `[B, L]`, True at the positions that hold a behaviour;
            `None` means every position does.
        training: whether dropout applies.

    Output shape:
        `[B, L, D]`, zeros at the masked positions.

    Example:

    ```python
    history = keras.Input(shape=(50, 16))              # 50 behaviours of 16
    mask = keras.Input(shape=(50,), dtype="bool")      # True at a behaviour
    x = rk.layers.TransformerBlock(num_heads=2, ff_dim=64,
                                   learned_positions=True)(history, mask=mask)
    x.shape                                            # (None, 50, 16)
    ```
    """

    def __init__(self, num_heads: int, ff_dim: int, dropout: float = 0.0,
                 causal: bool = False, norm_first: bool = True,
                 learned_positions: bool = False,
                 activation: str | Callable | None = "relu", epsilon: float = 1e-6,
                 **kwargs: Any):
        super().__init__(**kwargs)
        self.num_heads = _check_positive_int("num_heads", num_heads)
        self.ff_dim = _check_positive_int("ff_dim", ff_dim)
        if (isinstance(dropout, bool) or not isinstance(dropout, numbers.Real)
                or not 0.0 <= dropout < 1.0):
            raise ValueError(f"TransformerBlock dropout must be a rate in [0, 1); got "
                             f"{dropout!r}.")
        self.dropout: float = float(dropout)
        self.causal: bool = _check_bool("causal", causal)
        self.norm_first: bool = _check_bool("norm_first", norm_first)
        self.learned_positions: bool = _check_bool("learned_positions", learned_positions)
        self.activation: Callable = resolve_activation("TransformerBlock", "activation",
                                                       activation)
        if (isinstance(epsilon, bool) or not isinstance(epsilon, numbers.Real)
                or not epsilon > 0):
            raise ValueError(f"TransformerBlock epsilon must be > 0; got {epsilon!r}.")
        self.epsilon: float = float(epsilon)
        self.supports_masking = True

    def _check_shape(self, input_shape: Any) -> tuple[int | None, int | None, int]:
        shape = tuple(input_shape)
        if len(shape) != 3 or shape[-1] is None:
            raise ValueError(f"TransformerBlock needs inputs of shape [B, L, D] with a "
                             f"known D; got {shape}.")
        if shape[-1] % self.num_heads:
            raise ValueError(f"TransformerBlock num_heads={self.num_heads} must divide "
                             f"the model dimension D={shape[-1]}.")
        if self.learned_positions and shape[1] is None:
            raise ValueError(f"TransformerBlock(learned_positions=True) needs the "
                             f"sequence length L to be known; got inputs of shape "
                             f"{shape}.")
        return shape

    def build(self, input_shape: tuple[int | None, int | None, int]) -> None:
        _, length, dim = self._check_shape(input_shape)
        policy = self.dtype_policy
        if self.learned_positions:
            self.positions = self.add_weight(
                shape=(length, dim), name="positions",
                initializer=keras.initializers.RandomNormal(stddev=0.02))
        self._attention_norm = keras.layers.LayerNormalization(
            epsilon=self.epsilon, dtype=policy, name="attention_norm")
        self._qkv = keras.layers.Dense(3 * dim, dtype=policy, name="qkv")
        self._attention_output = keras.layers.Dense(dim, dtype=policy,
                                                    name="attention_output")
        self._ff_norm = keras.layers.LayerNormalization(
            epsilon=self.epsilon, dtype=policy, name="ff_norm")
        self._ff_inner = keras.layers.Dense(self.ff_dim, activation=self.activation,
                                            dtype=policy, name="ff_inner")
        self._ff_outer = keras.layers.Dense(dim, dtype=policy, name="ff_outer")
        self._dropout = keras.layers.Dropout(self.dropout, dtype=policy)
        for layer, width in ((self._attention_norm, dim), (self._qkv, dim),
                             (self._attention_output, dim), (self._ff_norm, dim),
                             (self._ff_inner, dim), (self._ff_outer, self.ff_dim)):
            layer.build((None, width))

    def _attend(self, tokens: torch.Tensor, offsets: torch.Tensor,
                max_len: int) -> torch.Tensor:
        heads = self.num_heads
        q, k, v = self._qkv(tokens).view(tokens.shape[0], 3, heads,
                                         tokens.shape[1] // heads).unbind(1)
        out = jagged_attention(q, k, v, offsets, max_len, causal=self.causal)
        return self._attention_output(out.reshape(tokens.shape))

    def call(self, inputs: torch.Tensor, mask: torch.Tensor | None = None,
             training: bool | None = None) -> torch.Tensor:
        x = inputs
        batch, length, dim = x.shape
        if self.learned_positions:
            x = x + self.positions[:length]
        if mask is None:
            mask = torch.ones(batch, length, dtype=torch.bool, device=x.device)
        mask = torch.as_tensor(mask, device=x.device).bool()
        tokens, index, offsets = packed_tokens(x, mask)
        h = self._attention_norm(tokens) if self.norm_first else tokens
        h = tokens + self._dropout(self._attend(h, offsets, length), training=training)
        if not self.norm_first:
            h = self._attention_norm(h)
        f = self._ff_norm(h) if self.norm_first else h
        h = h + self._dropout(self._ff_outer(self._ff_inner(f)), training=training)
        if not self.norm_first:
            h = self._ff_norm(h)
        out = h.new_zeros(batch * length, dim).index_copy(0, index, h)
        return out.view(batch, length, dim)

    def compute_output_spec(self, inputs: keras.KerasTensor, mask: Any = None,
                            training: bool | None = None) -> keras.KerasTensor:
        self._check_shape(inputs.shape)
        return keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update({
            "num_heads": self.num_heads,
            "ff_dim": self.ff_dim,
            "dropout": self.dropout,
            "causal": self.causal,
            "norm_first": self.norm_first,
            "learned_positions": self.learned_positions,
            "activation": keras.activations.serialize(self.activation),
            "epsilon": self.epsilon,
        })
        return config
