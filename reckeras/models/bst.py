"""BST, the Behavior Sequence Transformer (Chen et al., 2019), from public layers."""

from __future__ import annotations

from collections.abc import Sequence as _Sequence
from typing import TYPE_CHECKING, Any

import keras

from reckeras.layers.mlp import MLP
from reckeras.layers.transformer import TransformerBlock
from reckeras.models.din import behaviour_features
from reckeras.models.esmm import check_tower_options, embedding_regularizer
from reckeras.pipeline.model import Model

if TYPE_CHECKING:
    from reckeras.layers.feature_columns import FeatureColumns


def bst(columns: FeatureColumns, history: dict[str, str] | None = None,
        num_blocks: int = 1, num_heads: int = 2, ff_dim: int | None = None,
        dropout: float = 0.1, learned_positions: bool = True, norm_first: bool = True,
        top_units: _Sequence[int] = (200, 80, 1), output_activation: Any = "sigmoid",
        table_options: dict[str, Any] | None = None,
        norm: str | None = None, embedding_l2: float = 1e-4) -> Model:
    """An uncompiled BST over `columns`.

    The target item is put in front of the user's behaviours, and the
    sequence `[target, b_1, ..., b_n]` goes through `num_blocks`
    `rk.layers.TransformerBlock`s (padding-free; masked past `n`). The
    target's output -- the target after attending to the behaviours -- and
    the masked mean of all outputs join the dense features and every pooled
    embedding in the top MLP. (The paper concatenates all outputs, which
    presumes fixed-length sequences.)

    Args:
        columns: as for `rk.models.din`: unpooled Sequence histories and
            their Categorical targets.
        history: `{history feature: target feature}`; by default each
            unpooled Sequence is paired with the Categorical sharing its
            table.
        num_blocks: number of transformer blocks.
        num_heads: attention heads; must divide the width of a behaviour
            (the sum of the histories' dims).
        ff_dim: feed-forward width; 4 times the behaviour width by default.
        dropout: dropout rate of the blocks and after each hidden layer of
            the top MLP. The default, 0.1, is the blocks' (the zoo's sweep,
            docs/models.md, measured the MLP towers' 0.2 on models
            without blocks).
        learned_positions: add learned position embeddings (first block).
        norm_first: pre-LN blocks (BST uses post-LN, which trains slower
            here: 0.805 against 0.817 test AUC on `taobao_synth`).
        top_units: widths of the top MLP; the last is the output width.
        output_activation: activation of the last top layer.
        table_options: per-table options, passed to `ShardedEmbedding`.
        norm: normalization of each hidden layer of the top MLP: `None`,
            `"batch"` or `"layer"` (as `rk.layers.MLP`'s `norm`; the blocks
            have their own layer normalization).
        embedding_l2: the L2 factor of an embedding regularizer on every
            table (`keras.regularizers.L2(embedding_l2)` as the
            `ShardedEmbedding`'s `embeddings_regularizer`, on the rows each
            batch looks up, docs/regularization.md); 0 adds none. The
            default, 1e-4, was chosen with `dropout` by the zoo's sweep
            (docs/models.md, "The tower sweep").

    Returns:
        An `rk.Model`.

    Raises:
        ValueError: when `num_heads` does not divide the behaviour width,
            for a dropout outside `[0, 1)` or an unknown norm, or as
            `rk.models.din` for the histories.

    Example:

    ```python
    columns = rk.layers.FeatureColumns([
        rk.features.Numeric("hist_len", transform="log1p"),
        rk.features.Categorical("item", dim=16, table="item"),
        rk.features.Sequence("hist_items", dim=16, max_len=50, table="item",
                             combiner=None)])
    model = rk.models.bst(columns, num_blocks=2, num_heads=4)
    model.compile(optimizer="adam", loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.05))
    ```
    """
    dropout, norm = check_tower_options("bst", dropout, norm)
    inputs, query, keys, mask, context = behaviour_features(
        columns, history, table_options, "bst",
        embeddings_regularizer=embedding_regularizer("bst", embedding_l2))
    width = query.shape[-1]
    if width % num_heads:
        raise ValueError(f"bst: num_heads={num_heads} must divide the width of a "
                         f"behaviour ({width}, the sum of the histories' dims)")
    sequence = keras.ops.concatenate([keras.ops.expand_dims(query, 1), keys], axis=1)
    target_present = keras.ops.ones_like(keras.ops.expand_dims(mask[:, 0], 1))
    sequence_mask = keras.ops.concatenate([target_present, mask], axis=1)
    for block in range(num_blocks):
        sequence = TransformerBlock(
            num_heads, ff_dim or 4 * width, dropout=dropout, norm_first=norm_first,
            learned_positions=learned_positions and block == 0)(
            sequence, mask=sequence_mask)
    weights = keras.ops.expand_dims(keras.ops.cast(sequence_mask, "float32"), 2)
    mean = keras.ops.sum(sequence, axis=1) / keras.ops.sum(weights, axis=1)
    features = keras.ops.concatenate([context, sequence[:, 0], mean], axis=1)
    output = MLP(list(top_units), output_activation=output_activation, dropout=dropout,
                 norm=norm)(features)
    return Model(inputs, output, name="bst")
