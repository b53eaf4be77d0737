"""DIN (Zhou et al., KDD 2018) built from reckeras's public layers."""

from __future__ import annotations

from collections.abc import Sequence as _Sequence
from typing import TYPE_CHECKING, Any

import keras

from reckeras.features.specs import Categorical, Sequence
from reckeras.layers.attention import TargetAttention
from reckeras.layers.mlp import MLP
from reckeras.layers.sharded_embedding import ShardedEmbedding
from reckeras.models.esmm import check_tower_options, embedding_regularizer
from reckeras.pipeline.model import Model

if TYPE_CHECKING:
    from reckeras.layers.feature_columns import FeatureColumns


def behaviour_pairs(columns: FeatureColumns, history: dict[str, str] | None,
                    model: str) -> list[tuple[Sequence, Categorical]]:
    """The `(history spec, target spec)` pairs of a sequence model.

    Args:
        columns: the model's FeatureColumns.
        history: `{history feature: target feature}`, or `None` to pair
            every unpooled Sequence with the one Categorical sharing its table.
        model: the model's name, for messages.

    Returns:
        A list of `(Sequence, Categorical)` spec pairs, in `history` order.

    Raises:
        ValueError: when a pair is not an unpooled Sequence and a Categorical
            of one dim, a target cannot be picked, an unpooled Sequence is
            left out, or the histories differ in `max_len`.

    Example:

    ```python
    from reckeras.models.din import behaviour_pairs

    columns = rk.layers.FeatureColumns([
        rk.features.Numeric("hist_len", transform="log1p"),
        rk.features.Categorical("item", dim=16, table="item"),
        rk.features.Sequence("hist_items", dim=16, max_len=50, table="item",
                             combiner=None)])
    [(h.name, t.name) for h, t in behaviour_pairs(columns, None, "din")]
    # [('hist_items', 'item')]
    ```
    """
    specs = {s.name: s for s in columns.sparse_specs}
    unpooled = [s.name for s in columns.sparse_specs
                if isinstance(s, Sequence) and not s.pooled]
    if history is None:
        history = {}
        for name in unpooled:
            targets = [s.name for s in columns.sparse_specs
                       if isinstance(s, Categorical) and s.table == specs[name].table]
            if len(targets) != 1:
                raise ValueError(
                    f"{model}: cannot pick the target of history {name!r} (table "
                    f"{specs[name].table!r}): Categorical features on that table: "
                    f"{targets}; pass history={{{name!r}: target feature}}")
            history[name] = targets[0]
    if not history:
        raise ValueError(f"{model} needs a behaviour history: an unpooled Sequence "
                         f"feature (rk.features.Sequence(..., combiner=None)) sharing "
                         f"a table with a Categorical target")
    pairs = []
    for name, target in history.items():
        if name not in unpooled:
            raise ValueError(f"{model}: history {name!r} must be an unpooled Sequence "
                             f"feature (combiner=None) of the columns")
        if not isinstance(specs.get(target), Categorical):
            raise ValueError(f"{model}: target {target!r} of history {name!r} must be "
                             f"a Categorical feature of the columns")
        if specs[name].dim != specs[target].dim:
            raise ValueError(f"{model}: history {name!r} (dim {specs[name].dim}) and "
                             f"its target {target!r} (dim {specs[target].dim}) must "
                             f"share one dim")
        pairs.append((specs[name], specs[target]))
    unused = sorted(set(unpooled) - set(history))
    if unused:
        raise ValueError(f"{model}: unpooled Sequence features {unused} are not "
                         f"histories of the model; pool them (combiner='sum') or "
                         f"list them in history")
    lengths = {spec.name: spec.max_len for spec, _ in pairs}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"{model}: the histories are read position by position "
                         f"together, so they need one max_len; got {lengths}")
    return pairs


def behaviour_features(
        columns: FeatureColumns, history: dict[str, str] | None,
        table_options: dict[str, Any] | None, model: str,
        embeddings_regularizer: keras.regularizers.Regularizer | None = None,
) -> tuple[dict[str, keras.KerasTensor], keras.KerasTensor, keras.KerasTensor,
           keras.KerasTensor, keras.KerasTensor]:
    """What DIN and BST share: their inputs, the target and history tensors.

    The histories (e.g. items and categories) are concatenated position by
    position, and so are their targets, as DIN embeds a behaviour as the
    concatenation of its item's and its category's embeddings. The mask is
    the first history's: the histories must be aligned (one behaviour per
    position in all of them).

    Args:
        columns: the model's FeatureColumns.
        history: as for `behaviour_pairs`.
        table_options: per-table options, passed to `ShardedEmbedding`.
        model: the model's name, for messages.
        embeddings_regularizer: the `ShardedEmbedding`'s, or None.

    Returns:
        `(inputs, query [B, Dq], keys [B, L, Dq], mask [B, L],
        context [B, n])`, `context` being the dense features and every
        pooled embedding, targets included.

    Example:

    ```python
    from reckeras.models.din import behaviour_features

    columns = rk.layers.FeatureColumns([
        rk.features.Numeric("hist_len", transform="log1p"),
        rk.features.Categorical("item", dim=16, table="item"),
        rk.features.Sequence("hist_items", dim=16, max_len=50, table="item",
                             combiner=None)])
    inputs, query, keys, mask, context = behaviour_features(
        columns, None, None, "din")
    keys.shape   # (None, 50, 16)
    ```
    """
    pairs = behaviour_pairs(columns, history, model)
    inputs = columns.inputs()
    dense, sparse = columns(inputs)
    embedded = ShardedEmbedding(columns, output="dict", table_options=table_options,
                                embeddings_regularizer=embeddings_regularizer)(sparse)

    def joined(tensors: list[keras.KerasTensor], axis: int) -> keras.KerasTensor:
        return tensors[0] if len(tensors) == 1 else \
            keras.ops.concatenate(tensors, axis=axis)

    query = joined([embedded[target.name] for _, target in pairs], 1)
    keys = joined([embedded[history.name] for history, _ in pairs], 2)
    mask = columns.sequence_mask(inputs, pairs[0][0].name)
    histories = {history.name for history, _ in pairs}
    context = keras.ops.concatenate(
        [dense] + [tensor for name, tensor in embedded.items() if name not in histories],
        axis=1)
    return inputs, query, keys, mask, context


def din(columns: FeatureColumns, history: dict[str, str] | None = None,
        attention_units: _Sequence[int] = (80, 40), attention_activation: Any = "relu",
        softmax: bool = False, top_units: _Sequence[int] = (200, 80, 1),
        output_activation: Any = "sigmoid",
        table_options: dict[str, Any] | None = None,
        dropout: float = 0.2, norm: str | None = None,
        embedding_l2: float = 1e-4) -> Model:
    """An uncompiled DIN over `columns`.

    The target item attends over the user's behaviours with DIN's activation
    unit (`rk.layers.TargetAttention`); the resulting interest vector joins
    the dense features and every pooled embedding (user profile, target) in
    the top MLP.

    Args:
        columns: a `rk.layers.FeatureColumns` with at least one unpooled
            `Sequence` history (`combiner=None`) and its `Categorical`
            target, e.g. `hist_items`/`item` on a shared table
            `"item"`; more pairs (`hist_cats`/`category`) are
            concatenated per position.
        history: `{history feature: target feature}`; by default each
            unpooled Sequence is paired with the Categorical sharing its
            table.
        attention_units: hidden widths of the activation unit's MLP.
        attention_activation: their activation (DIN uses PReLU or Dice;
            ReLU learns faster than sigmoid here).
        softmax: softmax-normalize the attention scores (DIN does not).
        top_units: widths of the top MLP; the last is the output width.
        output_activation: activation of the last top layer.
        table_options: per-table options, passed to `ShardedEmbedding`.
        dropout: dropout rate after each hidden layer of the top MLP.
            The default, 0.2, was chosen by the zoo's sweep (docs/models.md,
            "The tower sweep"): against no dropout it stops rare ids' rows
            from memorizing their labels' noise.
        norm: normalization of each hidden layer of the top MLP: `None`,
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
        ValueError: when the columns have no history or the histories do
            not pair with targets (see `behaviour_pairs`), for a dropout
            outside `[0, 1)` or an unknown norm.

    Example:

    ```python
    columns = rk.layers.FeatureColumns([
        rk.features.Numeric("hist_len", transform="log1p"),
        rk.features.Categorical("item", dim=16, table="item"),
        rk.features.Sequence("hist_items", dim=16, max_len=50, table="item",
                             combiner=None)])
    model = rk.models.din(columns)
    model.compile(optimizer="adam", loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.05))
    ```
    """
    dropout, norm = check_tower_options("din", dropout, norm)
    inputs, query, keys, mask, context = behaviour_features(
        columns, history, table_options, "din",
        embeddings_regularizer=embedding_regularizer("din", embedding_l2))
    interest = TargetAttention(list(attention_units), activation=attention_activation,
                               softmax=softmax)([query, keys], mask=mask)
    features = keras.ops.concatenate([context, interest], axis=1)
    output = MLP(list(top_units), output_activation=output_activation, dropout=dropout,
                 norm=norm)(features)
    return Model(inputs, output, name="din")
