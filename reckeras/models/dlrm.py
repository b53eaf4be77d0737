"""DLRM (Naumov et al., 2019) built from reckeras's public layers."""

from __future__ import annotations

from collections.abc import Sequence as _Sequence
from typing import TYPE_CHECKING, Any

from reckeras.layers.interactions import DotInteraction
from reckeras.layers.mlp import MLP
from reckeras.layers.sharded_embedding import ShardedEmbedding
from reckeras.models.esmm import check_tower_options, embedding_regularizer
from reckeras.pipeline.model import Model

if TYPE_CHECKING:
    from reckeras.layers.feature_columns import FeatureColumns


def dlrm(columns: FeatureColumns, bottom_units: _Sequence[int] = (512, 256, 16),
         top_units: _Sequence[int] = (512, 256, 1), self_interaction: bool = False,
         output_activation: Any = "sigmoid",
         table_options: dict[str, Any] | None = None,
         dropout: float = 0.2, norm: str | None = None,
         embedding_l2: float = 1e-4) -> Model:
    """An uncompiled DLRM over `columns`.

    Dense features go through the bottom MLP, whose output joins the pooled
    embeddings of every sparse feature in a pairwise dot interaction; the top
    MLP maps the interaction (with the bottom output) to the prediction.

    Args:
        columns: a `rk.layers.FeatureColumns` with at least one numeric
            feature and pooled sparse features of one dim.
        bottom_units: widths of the bottom MLP; the last must equal the
            embedding dim.
        top_units: widths of the top MLP; the last is the output width.
        self_interaction: include each vector's dot with itself.
        output_activation: activation of the last top layer.
        table_options: per-table admission/eviction options, passed to
            `ShardedEmbedding`.
        dropout: dropout rate after each hidden layer of the bottom and
            the top MLP. The default, 0.2, was chosen by the zoo's sweep
            (docs/models.md, "The tower sweep"): against no dropout it
            stops rare ids' rows from memorizing their labels' noise.
        norm: normalization of each hidden layer of the bottom and the top MLP: `None`,
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
        ValueError: when the columns have no Numeric feature, sparse
            features of several dims, a last bottom unit other than
            their dim, a dropout outside `[0, 1)` or an unknown norm.

    Example:

    ```python
    columns = rk.layers.FeatureColumns(
        [rk.features.Numeric(f"I{i}", transform="log1p") for i in range(1, 14)]
        + [rk.features.Categorical(f"C{i}", dim=16) for i in range(1, 27)])
    model = rk.models.dlrm(columns)      # bottom MLP ends at the dim, 16
    model.compile(optimizer="adam", loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.05))
    ```
    """
    dropout, norm = check_tower_options("dlrm", dropout, norm)
    dims = {spec.dim for spec in columns.sparse_specs}
    if len(dims) != 1:
        raise ValueError(f"dlrm needs sparse features of one dim, got dims {sorted(dims)}")
    if not columns.plan.numeric:
        raise ValueError("dlrm needs at least one Numeric feature for the bottom MLP")
    if bottom_units[-1] != next(iter(dims)):
        raise ValueError(f"the last bottom unit ({bottom_units[-1]}) must equal the "
                         f"embedding dim ({next(iter(dims))})")
    inputs = columns.inputs()
    dense, sparse = columns(inputs)
    embedded = ShardedEmbedding(
        columns, table_options=table_options,
        embeddings_regularizer=embedding_regularizer("dlrm", embedding_l2))(sparse)
    bottom = MLP(list(bottom_units), dropout=dropout, norm=norm)(dense)
    interaction = DotInteraction(self_interaction=self_interaction)([bottom, embedded])
    output = MLP(list(top_units), output_activation=output_activation, dropout=dropout,
                 norm=norm)(interaction)
    return Model(inputs, output, name="dlrm")
