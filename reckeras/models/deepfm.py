"""DeepFM (Guo et al., IJCAI 2017) built from reckeras's public layers."""

from __future__ import annotations

from collections.abc import Sequence as _Sequence
from typing import TYPE_CHECKING, Any

import keras

from reckeras.features.specs import FeatureSpec, deserialize, serialize
from reckeras.layers.fm import FM
from reckeras.layers.mlp import MLP
from reckeras.layers.sharded_embedding import ShardedEmbedding
from reckeras.models.esmm import check_tower_options, embedding_regularizer
from reckeras.pipeline.model import Model

if TYPE_CHECKING:
    from reckeras.layers.feature_columns import FeatureColumns


def _first_order_specs(columns: FeatureColumns) -> list[FeatureSpec]:
    """The sparse specs with dim 1, on tables of their own (`<table>:linear`)."""
    specs = []
    for spec in columns.sparse_specs:
        config = serialize(spec)
        config["config"] = {**config["config"], "dim": 1,
                            "table": f"{spec.table}:linear"}
        specs.append(config)
    return [deserialize(config) for config in specs]


def deepfm(columns: FeatureColumns, deep_units: _Sequence[int] = (256, 128),
           dropout: float = 0.2, output_activation: Any = "sigmoid",
           table_options: dict[str, Any] | None = None,
           norm: str | None = None, embedding_l2: float = 1e-4) -> Model:
    """An uncompiled DeepFM over `columns`.

    The logit is the sum of three terms sharing one input: a first-order
    term (one learned weight per id, from dim-1 tables `<table>:linear`,
    plus a linear function of the dense features), the factorization
    machine's pairwise term over the embeddings (`rk.layers.FM`), and a
    deep MLP over the dense features and the flattened embeddings.

    Args:
        columns: a `rk.layers.FeatureColumns` whose sparse features are
            pooled and share one dim (the FM's factors).
        deep_units: widths of the deep MLP's hidden layers.
        dropout: dropout rate after each hidden layer of the deep MLP.
            The default, 0.2, was chosen by the zoo's sweep (docs/models.md,
            "The tower sweep"): against no dropout it stops rare ids' rows
            from memorizing their labels' noise.
        output_activation: activation applied to the summed logit.
        table_options: per-table options, passed to `ShardedEmbedding`
            (of the factor tables).
        norm: normalization of each hidden layer of the deep MLP: `None`,
            `"batch"` or `"layer"` (as `rk.layers.MLP`'s `norm`).
        embedding_l2: the L2 factor of an embedding regularizer on every
            table, the first-order weights' included (`keras.regularizers.L2(embedding_l2)` as the
            `ShardedEmbedding`'s `embeddings_regularizer`, on the rows each
            batch looks up, docs/regularization.md); 0 adds none. The
            default, 1e-4, was chosen with `dropout` by the zoo's sweep
            (docs/models.md, "The tower sweep").

    Returns:
        An `rk.Model`.

    Raises:
        ValueError: when the sparse features have several dims, for a
            dropout outside `[0, 1)` or an unknown norm.

    Example:

    ```python
    columns = rk.layers.FeatureColumns(
        [rk.features.Numeric(f"I{i}", transform="log1p") for i in range(1, 14)]
        + [rk.features.Categorical(f"C{i}", dim=16) for i in range(1, 27)])
    model = rk.models.deepfm(columns, deep_units=(256, 128))
    model.compile(optimizer="adam", loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.05))
    ```
    """
    dropout, norm = check_tower_options("deepfm", dropout, norm)
    dims = {spec.dim for spec in columns.sparse_specs}
    if len(dims) != 1:
        raise ValueError(f"deepfm needs sparse features of one dim (the FM's factor "
                         f"size), got dims {sorted(dims)}")
    inputs = columns.inputs()
    dense, sparse = columns(inputs)
    regularizer = embedding_regularizer("deepfm", embedding_l2)
    factors = ShardedEmbedding(columns, table_options=table_options,
                               embeddings_regularizer=regularizer)(sparse)
    # Small initial weights: dim-1 rows would start at +-1 each by default.
    weights = ShardedEmbedding(_first_order_specs(columns), output="concat",
                               init_scale=0.01, embeddings_regularizer=regularizer)(sparse)
    first_order = keras.ops.sum(weights, axis=1, keepdims=True)
    if columns.plan.numeric:
        first_order = first_order + MLP([1])(dense)
    second_order = FM()(factors)
    flat = keras.ops.reshape(factors, (-1, factors.shape[1] * factors.shape[2]))
    deep = MLP([*deep_units, 1], dropout=dropout, norm=norm)(
        keras.ops.concatenate([dense, flat], axis=1))
    output = keras.layers.Activation(output_activation)(
        first_order + second_order + deep)
    return Model(inputs, output, name="deepfm")
