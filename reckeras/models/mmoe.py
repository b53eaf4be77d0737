"""MMoE (Ma et al., KDD 2018) built from reckeras's public layers."""

from __future__ import annotations

import numbers
import re
from collections.abc import Sequence as _Sequence
from typing import TYPE_CHECKING, Any

import keras

from reckeras.layers.mlp import MLP
from reckeras.models.esmm import (
    check_tower_options,
    check_units,
    embedding_regularizer,
    shared_features,
)
from reckeras.pipeline.model import Model

if TYPE_CHECKING:
    from reckeras.layers.feature_columns import FeatureColumns

_TASK_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*")


def mmoe(columns: FeatureColumns, tasks: _Sequence[str] = ("ctr", "cvr"),
         num_experts: int = 4, expert_units: _Sequence[int] = (128, 64),
         tower_units: _Sequence[int] = (32,), dropout: float = 0.2,
         output_activation: Any = "sigmoid",
         table_options: dict[str, Any] | None = None,
         norm: str | None = None, embedding_l2: float = 1e-4) -> Model:
    """An uncompiled MMoE over `columns`: one output per task.

    Multi-gate Mixture-of-Experts: `num_experts` expert MLPs read the
    shared representation (the dense features and the pooled embedding of
    every sparse feature, looked up once); each task has its own gate, a
    softmax over the experts computed from the same representation, mixes
    the experts' outputs with its gate's weights, and feeds the mixture to
    its own tower. Tasks share the experts but weigh them differently, so
    related tasks share what helps them both and a less related one can
    lean on other experts.

    Layers are named after the tasks: task `t`'s gate is `"t_gate"`
    (`[B, num_experts]`, summing to 1 per example), its mixture of the
    experts `"t_mix"`, its tower (and output) `"t"`; the experts are
    `"expert_0"`, `"expert_1"`, ..., concatenated in `"expert_outputs"`
    and stacked in `"experts"` (`[B, num_experts, expert_units[-1]]`).
    Read a gate with a sub-model sharing the weights:
    `rk.Model(model.input, model.get_layer("ctr_gate").output)`.

    Args:
        columns: a `rk.layers.FeatureColumns` of pooled sparse features
            (at least one; dims may differ) and Numeric features.
        tasks: the task names, unique, e.g. `("ctr", "cvr")`: each a
            letter then letters, digits, `_`, `.` or `-`. They are the
            keys of the outputs, of `compile`'s `loss` and `metrics`
            dicts and of the labels.
        num_experts: number of shared experts, at least 2 (one expert
            needs no gate: that is a shared-bottom model).
        expert_units: widths of each expert MLP (ReLU on every layer, the
            last included); the last is the width of the experts' output.
        tower_units: hidden widths of each task's tower; each tower ends
            with one unit with `output_activation`. `()` makes each tower
            one unit over the mixture.
        dropout: dropout rate after each hidden layer of the experts and
            the towers. The default, 0.2, was chosen by the zoo's sweep
            (docs/models.md, "The tower sweep"): against no dropout it
            stops rare ids' rows from memorizing their labels' noise.
        output_activation: activation of each tower's output unit
            (`"sigmoid"`: a probability per task).
        table_options: per-table options, passed to `ShardedEmbedding`.
        norm: normalization of each hidden layer of the experts and the
            towers: `None`, `"batch"` or `"layer"` (as `rk.layers.MLP`'s
            `norm`).
        embedding_l2: the L2 factor of an embedding regularizer on every
            table (`keras.regularizers.L2(embedding_l2)` as the
            `ShardedEmbedding`'s `embeddings_regularizer`, on the rows each
            batch looks up, docs/regularization.md); 0 adds none. The
            default, 1e-4, was chosen with `dropout` by the zoo's sweep
            (docs/models.md, "The tower sweep").

    Returns:
        An `rk.Model` with outputs `{task: [B, 1]}`, in `tasks` order.

    Raises:
        ValueError: for no task, task names that repeat, are not strings
            of the form above, or are taken by the other layers; a
            `num_experts` other than an int >= 2, widths other than
            positive ints; a dropout outside `[0, 1)`, an unknown norm; unpooled Sequence
            features, no sparse feature, or a feature named like a layer.

    Example:

    ```python
    columns = rk.layers.FeatureColumns([
        rk.features.Numeric("price", transform="log1p"),
        rk.features.Categorical("user", dim=16),
        rk.features.Categorical("item", dim=16)])
    model = rk.models.mmoe(columns, tasks=("ctr", "cvr"), num_experts=4,
                           expert_units=(64, 32), tower_units=(16,))
    model.compile(
        optimizer="adam",
        loss={"ctr": "binary_crossentropy", "cvr": "binary_crossentropy"},
        loss_weights={"ctr": 1.0, "cvr": 0.5},
        metrics={"ctr": [rk.metrics.AUC()], "cvr": [rk.metrics.AUC()]},
        embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.05))
    # model.fit(table, labels={"ctr": "click", "cvr": "purchase"})
    ```
    """
    if isinstance(tasks, str) or not isinstance(tasks, (list, tuple)) or not tasks:
        raise ValueError(f"mmoe needs at least one task: a list or tuple of task "
                         f"names, e.g. ('ctr', 'cvr'); got {tasks!r}")
    bad = [task for task in tasks
           if not isinstance(task, str) or not _TASK_NAME.fullmatch(task)]
    if bad:
        raise ValueError(f"mmoe: task names must be strings of a letter then letters, "
                         f"digits, '_', '.' or '-'; got {bad}")
    repeated = sorted({task for task in tasks if tasks.count(task) > 1})
    if repeated:
        raise ValueError(f"mmoe: task names must be unique; {repeated} repeat")
    if (not isinstance(num_experts, numbers.Integral) or isinstance(num_experts, bool)
            or num_experts < 2):
        raise ValueError(f"mmoe: num_experts must be an int >= 2 (one expert needs "
                         f"no gate: that is a shared-bottom model), got {num_experts!r}")
    expert_units = check_units("mmoe", "expert_units", expert_units, allow_empty=False)
    tower_units = [*check_units("mmoe", "tower_units", tower_units), 1]
    dropout, norm = check_tower_options("mmoe", dropout, norm)
    experts = [f"expert_{index}" for index in range(num_experts)]
    own = experts + ["expert_outputs", "experts"] + [
        f"{task}{suffix}" for task in tasks for suffix in ("_gate", "_mix")]
    taken = sorted(set(tasks) & (set(own) | {"embedding", "features", columns.name}))
    if taken:
        raise ValueError(f"mmoe: task names {taken} are names of other layers of the "
                         f"model; rename the tasks")
    inputs, features = shared_features(
        columns, table_options, "mmoe", layer_names=own + list(tasks),
        embeddings_regularizer=embedding_regularizer("mmoe", embedding_l2))
    width = expert_units[-1]
    outputs = [MLP(expert_units, output_activation="relu", dropout=dropout, norm=norm,
                   name=name)(features)
               for name in experts]
    stacked = keras.layers.Reshape((num_experts, width), name="experts")(
        keras.layers.Concatenate(axis=1, name="expert_outputs")(outputs))
    results = {}
    for task in tasks:
        gate = keras.layers.Dense(num_experts, activation="softmax",
                                  name=f"{task}_gate")(features)
        mixture = keras.layers.Dot(axes=(1, 1), name=f"{task}_mix")([gate, stacked])
        results[task] = MLP(tower_units, output_activation=output_activation,
                            dropout=dropout, norm=norm, name=task)(mixture)
    return Model(inputs, results, name="mmoe")
