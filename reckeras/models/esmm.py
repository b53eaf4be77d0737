"""ESMM (Ma et al., SIGIR 2018) built from reckeras's public layers."""

from __future__ import annotations

import numbers
from collections.abc import Sequence as _Sequence
from typing import TYPE_CHECKING, Any

import keras

from reckeras.layers.mlp import MLP
from reckeras.layers.sharded_embedding import ShardedEmbedding
from reckeras.pipeline.model import Model

if TYPE_CHECKING:
    from reckeras.layers.feature_columns import FeatureColumns


def check_units(model: str, argument: str, units: Any,
                allow_empty: bool = True) -> list[int]:
    """The layer widths `units` as a list of ints, checked.

    Args:
        model: the model's name, for messages.
        argument: the argument's name, for messages.
        units: a list or tuple of positive ints.
        allow_empty: whether `()` is accepted (a tower of no hidden layer).

    Returns:
        `units` as a list of ints.

    Raises:
        ValueError: when `units` is not a list or tuple of positive ints
            (or is empty and `allow_empty` is false).

    Example:

    ```python
    from reckeras.models.esmm import check_units

    check_units("esmm", "tower_units", (64, 32))      # [64, 32]
    # check_units("esmm", "tower_units", (64, 0)) raises a ValueError.
    ```
    """
    if (not isinstance(units, (list, tuple))
            or not all(isinstance(u, numbers.Integral) and not isinstance(u, bool)
                       and int(u) > 0 for u in units)
            or (not units and not allow_empty)):
        kind = "a list" if allow_empty else "a non-empty list"
        raise ValueError(f"{model}: {argument} must be {kind} of positive ints "
                         f"(layer widths), got {units!r}")
    return [int(u) for u in units]


NORMS = (None, "batch", "layer")


def check_tower_options(model: str, dropout: Any, norm: Any) -> tuple[float, str | None]:
    """The towers' `dropout` and `norm` of a zoo model, checked.

    Args:
        model: the model's name, for messages.
        dropout: a rate in `[0, 1)`.
        norm: `None`, `"batch"` or `"layer"` (`rk.layers.MLP`'s `norm`).

    Returns:
        `(dropout, norm)`, the rate as a float.

    Raises:
        ValueError: for a rate outside `[0, 1)` or another norm, naming the
            model.

    Example:

    ```python
    from reckeras.models.esmm import check_tower_options

    check_tower_options("deepfm", 0.1, "batch")      # (0.1, 'batch')
    # check_tower_options("deepfm", 0.1, "group") raises a ValueError.
    ```
    """
    if (not isinstance(dropout, numbers.Real) or isinstance(dropout, bool)
            or not 0.0 <= float(dropout) < 1.0):
        raise ValueError(f"{model}: dropout must be a rate in [0, 1), got {dropout!r}")
    if norm not in NORMS:
        raise ValueError(f"{model}: norm must be one of {NORMS}, got {norm!r}")
    return float(dropout), norm


def embedding_regularizer(model: str, embedding_l2: Any) -> keras.regularizers.L2 | None:
    """The tables' regularizer of a zoo model's `embedding_l2`, checked.

    Args:
        model: the model's name, for messages.
        embedding_l2: a finite number >= 0; 0 means no regularizer.

    Returns:
        `keras.regularizers.L2(embedding_l2)`, or None for 0.

    Raises:
        ValueError: for a negative, non-finite or non-numeric factor,
            naming the model.

    Example:

    ```python
    from reckeras.models.esmm import embedding_regularizer

    embedding_regularizer("deepfm", 0.05)     # keras.regularizers.L2(0.05)
    embedding_regularizer("deepfm", 0.0)      # None
    ```
    """
    if (not isinstance(embedding_l2, numbers.Real) or isinstance(embedding_l2, bool)
            or not 0.0 <= float(embedding_l2) < float("inf")):
        raise ValueError(f"{model}: embedding_l2 must be a finite number >= 0, "
                         f"got {embedding_l2!r}")
    return keras.regularizers.L2(float(embedding_l2)) if embedding_l2 else None


def shared_features(
        columns: FeatureColumns, table_options: dict[str, Any] | None, model: str,
        layer_names: _Sequence[str] = (),
        embeddings_regularizer: keras.regularizers.Regularizer | None = None,
) -> tuple[dict[str, keras.KerasTensor], keras.KerasTensor]:
    """The inputs and the shared representation of a multi-task model.

    The dense features and the pooled embedding of every sparse feature,
    concatenated (a layer named `"features"`; without Numeric features, the
    embeddings alone); the embeddings are looked up once, in one
    `rk.layers.ShardedEmbedding` (named `"embedding"`), and every task
    reads them.

    Args:
        columns: the model's FeatureColumns: pooled sparse features
            (Categorical, Cross, pooled Sequence), at least one, and
            Numeric features.
        table_options: per-table options, passed to `ShardedEmbedding`.
        model: the model's name, for messages.
        layer_names: the names of the model's other layers (its towers,
            ...), which no feature may take: Keras names a model's inputs
            after the features, and a model's layers need distinct names.
        embeddings_regularizer: the `ShardedEmbedding`'s, or None.

    Returns:
        `(inputs, features [B, dense width + sum of dims])`.

    Raises:
        ValueError: when the columns have an unpooled Sequence, no sparse
            feature, or a feature named like a layer of the model.

    Example:

    ```python
    from reckeras.models.esmm import shared_features

    columns = rk.layers.FeatureColumns([
        rk.features.Numeric("price", transform="log1p"),
        rk.features.Categorical("user", dim=8),
        rk.features.Categorical("item", dim=8)])
    inputs, features = shared_features(columns, None, "esmm")
    features.shape   # (None, 17)
    ```
    """
    if not columns.sparse_specs:
        raise ValueError(f"{model} needs at least one sparse feature (Categorical, "
                         f"Cross or pooled Sequence): its tasks share the embeddings")
    unpooled = [spec.name for spec in columns.sparse_specs if not spec.pooled]
    if unpooled:
        raise ValueError(f"{model} reads pooled features only; pool the unpooled "
                         f"Sequence features {unpooled} (combiner='sum' or 'mean')")
    inputs = columns.inputs()
    taken = sorted(set(inputs) & ({"embedding", "features", columns.name}
                                  | set(layer_names)))
    if taken:
        raise ValueError(f"{model}: features {taken} are named like layers of the "
                         f"model; rename them")
    dense, sparse = columns(inputs)
    embedded = ShardedEmbedding(columns, output="concat", name="embedding",
                                table_options=table_options,
                                embeddings_regularizer=embeddings_regularizer)(sparse)
    if not columns.plan.numeric:
        return inputs, embedded
    features = keras.layers.Concatenate(axis=1, name="features")([dense, embedded])
    return inputs, features


def esmm(columns: FeatureColumns, tower_units: _Sequence[int] = (200, 80),
         dropout: float = 0.2,
         table_options: dict[str, Any] | None = None,
         norm: str | None = None, embedding_l2: float = 1e-4) -> Model:
    """An uncompiled ESMM over `columns`: pCTR and pCTCVR over all impressions.

    ESMM (Entire Space Multi-Task Model) estimates the conversion rate
    after a click, `pCVR = p(conversion | click)`, without training it on
    clicked impressions only (a sample-selection bias) and without its
    data sparsity: a CTR tower and a CVR tower read the same embeddings
    (looked up once) and dense features, and the model outputs

    - `"ctr"`: `pCTR = p(click)`, the CTR tower's sigmoid;
    - `"ctcvr"`: `pCTCVR = p(click and conversion) = pCTR * pCVR`, the
      product of both towers' sigmoids,

    both `[B, 1]`. Both outputs are trained on every impression, `"ctr"`
    on the click label and `"ctcvr"` on the click-and-convert label
    (1 only when the impression was clicked and then converted); pCVR gets
    no loss of its own. It is the output of the layer named `"cvr"` (the
    CVR tower; the CTR tower is `"ctr"`, their product `"ctcvr"`), read
    with a sub-model sharing the weights:
    `rk.Model(model.input, model.get_layer("cvr").output).predict(x)`.
    Since `pCTCVR = pCTR * pCVR` with `pCVR <= 1`, every `"ctcvr"`
    prediction is at most the `"ctr"` one.

    Args:
        columns: a `rk.layers.FeatureColumns` of pooled sparse features
            (at least one; dims may differ) and Numeric features.
        tower_units: hidden widths of each tower (the CTR and the CVR tower
            have the same shape); each tower ends with one sigmoid unit.
            `()` makes each tower a logistic regression.
        dropout: dropout rate after each hidden layer of the towers.
            The default, 0.2, was chosen by the zoo's sweep (docs/models.md,
            "The tower sweep"): against no dropout it stops rare ids' rows
            from memorizing their labels' noise.
        table_options: per-table options, passed to `ShardedEmbedding`.
        norm: normalization of each hidden layer of the towers: `None`,
            `"batch"` or `"layer"` (as `rk.layers.MLP`'s `norm`).
        embedding_l2: the L2 factor of an embedding regularizer on every
            table (`keras.regularizers.L2(embedding_l2)` as the
            `ShardedEmbedding`'s `embeddings_regularizer`, on the rows each
            batch looks up, docs/regularization.md); 0 adds none. The
            default, 1e-4, was chosen with `dropout` by the zoo's sweep
            (docs/models.md, "The tower sweep").

    Returns:
        An `rk.Model` with outputs `{"ctr": [B, 1], "ctcvr": [B, 1]}`.

    Raises:
        ValueError: for `tower_units` other than positive ints, a dropout
            outside `[0, 1)`, an unknown norm, unpooled Sequence features, no sparse
            feature, or a feature named `"ctr"`, `"cvr"`, `"ctcvr"`,
            `"embedding"` or `"features"` (the model's layers).

    Example:

    ```python
    columns = rk.layers.FeatureColumns([
        rk.features.Numeric("price", transform="log1p"),
        rk.features.Categorical("user", dim=16),
        rk.features.Categorical("item", dim=16)])
    model = rk.models.esmm(columns, tower_units=(64, 32))
    model.compile(
        optimizer="adam",
        loss={"ctr": "binary_crossentropy", "ctcvr": "binary_crossentropy"},
        metrics={"ctr": [rk.metrics.AUC()], "ctcvr": [rk.metrics.AUC()]},
        embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.05))
    # model.fit(table, labels={"ctr": "click", "ctcvr": "conversion"})
    cvr = rk.Model(model.input, model.get_layer("cvr").output)  # pCVR
    ```
    """
    units = [*check_units("esmm", "tower_units", tower_units), 1]
    dropout, norm = check_tower_options("esmm", dropout, norm)
    inputs, features = shared_features(
        columns, table_options, "esmm", layer_names=("ctr", "cvr", "ctcvr"),
        embeddings_regularizer=embedding_regularizer("esmm", embedding_l2))
    ctr = MLP(units, output_activation="sigmoid", dropout=dropout, norm=norm,
              name="ctr")(features)
    cvr = MLP(units, output_activation="sigmoid", dropout=dropout, norm=norm,
              name="cvr")(features)
    ctcvr = keras.layers.Multiply(name="ctcvr")([ctr, cvr])
    return Model(inputs, {"ctr": ctr, "ctcvr": ctcvr}, name="esmm")
