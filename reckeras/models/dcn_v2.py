"""DCN-V2 (Wang et al., WWW 2021) built from reckeras's public layers."""

from __future__ import annotations

from collections.abc import Sequence as _Sequence
from typing import TYPE_CHECKING, Any

import keras

from reckeras.layers.crossnet import CrossNet
from reckeras.layers.mlp import MLP
from reckeras.layers.sharded_embedding import ShardedEmbedding
from reckeras.models.esmm import check_tower_options, embedding_regularizer
from reckeras.pipeline.model import Model

if TYPE_CHECKING:
    from reckeras.layers.feature_columns import FeatureColumns

STRUCTURES = ("stacked", "parallel")


def dcn_v2(columns: FeatureColumns, cross_layers: int = 3, low_rank: int | None = None,
           deep_units: _Sequence[int] = (256, 128), structure: str = "stacked",
           output_activation: Any = "sigmoid",
           table_options: dict[str, Any] | None = None,
           dropout: float = 0.2, norm: str | None = None,
           embedding_l2: float = 1e-4) -> Model:
    """An uncompiled DCN-V2 over `columns`.

    The dense features and every pooled embedding are concatenated into
    `x_0`; a `rk.layers.CrossNet` and a deep MLP either run one after the
    other (`"stacked"`: cross network, then MLP) or side by side
    (`"parallel"`: both read `x_0`, their outputs are concatenated), and
    a last linear layer gives the output.

    Args:
        columns: a `rk.layers.FeatureColumns` whose sparse features are
            pooled (Categorical, Cross, pooled Sequence); dims may differ.
        cross_layers: number of cross layers.
        low_rank: `None` for full cross matrices, else their rank.
        deep_units: widths of the deep MLP's layers (ReLU).
        structure: `"stacked"` or `"parallel"`.
        output_activation: activation of the output layer.
        table_options: per-table options, passed to `ShardedEmbedding`.
        dropout: dropout rate after each hidden layer of the deep MLP.
            The default, 0.2, was chosen by the zoo's sweep (docs/models.md,
            "The tower sweep"): against no dropout it stops rare ids' rows
            from memorizing their labels' noise.
        norm: normalization of each hidden layer of the deep MLP: `None`,
            `"batch"` or `"layer"` (as `rk.layers.MLP`'s `norm`).
        embedding_l2: the L2 factor of an embedding regularizer on every
            table (`keras.regularizers.L2(embedding_l2)` as the
            `ShardedEmbedding`'s `embeddings_regularizer`, on the rows each
            batch looks up, docs/regularization.md); 0 adds none. The
            default, 1e-4, was chosen with `dropout` by the zoo's sweep
            (docs/models.md, "The tower sweep").

    Returns:
        An `rk.Model`.

    Raises:
        ValueError: for an unknown `structure`, a dropout outside
            `[0, 1)` or an unknown norm.

    Example:

    ```python
    columns = rk.layers.FeatureColumns(
        [rk.features.Numeric(f"I{i}", transform="log1p") for i in range(1, 14)]
        + [rk.features.Categorical(f"C{i}", dim=16) for i in range(1, 27)])
    model = rk.models.dcn_v2(columns, cross_layers=3, low_rank=64)
    model.compile(optimizer="adam", loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.05))
    ```
    """
    if structure not in STRUCTURES:
        raise ValueError(f"dcn_v2 structure must be one of {STRUCTURES}, got "
                         f"{structure!r}")
    dropout, norm = check_tower_options("dcn_v2", dropout, norm)
    inputs = columns.inputs()
    dense, sparse = columns(inputs)
    embedded = ShardedEmbedding(columns, output="concat",
                                table_options=table_options,
                                embeddings_regularizer=embedding_regularizer(
                                    "dcn_v2", embedding_l2))(sparse)
    x0 = keras.ops.concatenate([dense, embedded], axis=1)
    crossed = CrossNet(cross_layers, low_rank=low_rank)(x0)
    if structure == "stacked":
        output = MLP([*deep_units, 1], output_activation=output_activation,
                     dropout=dropout, norm=norm)(crossed)
    else:
        deep = MLP(list(deep_units), output_activation="relu", dropout=dropout,
                   norm=norm)(x0)
        joined = keras.ops.concatenate([crossed, deep], axis=1)
        output = MLP([1], output_activation=output_activation)(joined)
    return Model(inputs, output, name="dcn_v2")
