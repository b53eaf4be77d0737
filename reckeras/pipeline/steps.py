"""`rk.Model`'s steps: one batch forward (and backward), as Keras's torch
trainer runs them, with the non-finite guard.

The loops hand each step `PreparedBatch.data`, a `stream.StepData`: Keras's
`(x, y, sample_weight)` carrying the batch the pipeline prepared. `forward`
takes the FeatureColumns' output the pipeline packed once for it, and the
routes the sparse-dist stage planned for its embedding layers, from that
batch; data without a prepared batch (a step called by hand) is packed as a
plain call packs it. Nothing of a step is kept on the model.

`train_step` is Keras's torch `train_step` with three differences: backward
always runs (it also trains the tables); the tables' updates, and the
values the forward assigns to variables (BatchNormalization's moving
statistics, a Dropout's seed), wait until backward is done and the step is
known to be finite (`guard`); the dense gradients are averaged over the
ranks.
"""

from __future__ import annotations

import contextlib
from typing import Any

import keras
import torch

from reckeras import _keras_compat, distributed
from reckeras.pipeline import functional, guard
from reckeras.pipeline.stream import PreparedBatch, StepData


def prepared_batch(data: Any) -> PreparedBatch | None:
    """The `PreparedBatch` a step's data came from.

    Args:
        data: what a step was given.

    Returns:
        `data.prepared` for the loops' `StepData`, else None.
    """
    return data.prepared if isinstance(data, StepData) else None


def forward(model: keras.Model, inputs: dict, training: bool,
            prepared: PreparedBatch | None = None) -> Any:
    """`model(inputs, training=training)`, reusing what the pipeline
    prepared for `inputs`.

    A functional model runs its graph (`functional.forward`); a subclassed
    one its `call`, in which its FeatureColumns layer returns the prepared
    packed output instead of packing again (`FeatureColumns.prepacked`).

    Args:
        model: an `rk.Model`.
        inputs: the batch's encoded inputs.
        training: the call's training flag.
        prepared: the batch `inputs` come from, or None.

    Returns:
        The model's outputs.

    Example:

    ```python
    outputs = forward(model, batch.inputs, False, batch)
    ```
    """
    if prepared is not None and prepared.inputs is not inputs:
        prepared = None
    if isinstance(model, functional.FunctionalGraph):
        return functional.forward(model, inputs, training, prepared)
    if prepared is None or prepared.packed is None:
        return model(inputs, training=training)
    with model.feature_columns.prepacked(inputs, prepared.packed):
        return model(inputs, training=training)


def train_step(model: keras.Model, data: tuple) -> dict:
    """`rk.Model.train_step`: one training step, guarded.

    Args:
        model: a compiled `rk.Model`.
        data: `(x, y, sample_weight)`, a `StepData` from the loops.

    Returns:
        The metrics' values (unchanged by a skipped step).

    Raises:
        NonFiniteStepError: the step is not finite under
            `compile(nonfinite="raise")`; it changed nothing.
    """
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    if model.table_rate is not None:
        model.table_rate.follow()       # a callback may have set the dense rate
    engines = [layer.engine for layer in model.embedding_layers]
    for engine in engines:
        engine.release_pins()       # left by a step that failed mid-way
    with contextlib.ExitStack() as stack:
        updates = [stack.enter_context(engine.deferred_updates()) for engine in engines]
        # What the forward assigns (BatchNormalization's moving statistics,
        # Dropout's seed) waits in the scope, like the tables' updates.
        with _keras_compat.DeferredAssignments() as assigned:
            y_pred = forward(model, x, True, prepared_batch(data))
            model.zero_grad()
            loss = model.compute_loss(x=x, y=y, y_pred=y_pred,
                                      sample_weight=sample_weight, training=True)
        scaled = model.optimizer.scale_loss(loss)
        if scaled.requires_grad:
            scaled.backward()
        trainable = model.trainable_weights[:]
        gradients = [v.value.grad for v in trainable]
        if model.loss is None and trainable and all(g is None for g in gradients):
            # Keras's message for a model without a loss; here the tables'
            # regularization can be the only loss, and it reaches no dense weight.
            raise ValueError("No loss to compute for the dense weights. Provide a `loss` "
                             "argument in `compile()` (the embedding regularizers' "
                             "penalty alone trains no dense weight)")
        if not guard.step_is_finite(loss, gradients, updates):
            return _refuse_step(model, loss, gradients, trainable, updates)
        assigned.commit(model)
        for update in updates:
            update.apply()
        if trainable:
            with torch.no_grad():
                # Each rank's loss is a mean over its own examples:
                # averaging the gradients gives the global mean's.
                distributed.all_reduce_mean_([g for g in gradients if g is not None])
                model.optimizer.apply(gradients, trainable)
    _keras_compat.update_loss_tracker(model, loss, _examples(x, y))
    return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)


def _refuse_step(model, loss, gradients, trainable, updates):
    for update in updates:
        update.discard()
    model.zero_grad()
    if model.nonfinite == "skip":
        model.pipeline_stats["nonfinite_skipped"] = \
            model.pipeline_stats.get("nonfinite_skipped", 0) + 1
        return model.get_metrics_result()
    parts = guard.nonfinite_parts(
        loss, [(v.path, g) for v, g in zip(trainable, gradients, strict=True)],
        [(layer.name, u) for layer, u in zip(model.embedding_layers, updates, strict=True)])
    raise guard.NonFiniteStepError(
        f"{', '.join(parts) or 'another rank'} is not finite (NaN or inf); "
        f"the step was undone: no weight, table row or optimizer state changed. "
        f"compile(nonfinite='skip') skips such steps instead")


def test_step(model: keras.Model, data: tuple) -> dict:
    """`rk.Model.test_step`: loss and metrics, no update.

    Args:
        model: a compiled `rk.Model`.
        data: `(x, y, sample_weight)`, a `StepData` from the loops.

    Returns:
        The metrics' values.
    """
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    y_pred = forward(model, x, False, prepared_batch(data))
    loss = model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,
                              training=False)
    _keras_compat.update_loss_tracker(model, loss, _examples(x, y))
    return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)


def predict_step(model: keras.Model, data: Any) -> Any:
    """`rk.Model.predict_step`: the outputs of one batch.

    Args:
        model: an `rk.Model`.
        data: the batch's inputs, or `(x,)`, `(x, y)`, `(x, y, w)`; a
            `StepData` from the loops.

    Returns:
        The outputs, as `model(x)` returns them.
    """
    x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
    return forward(model, x, False, prepared_batch(data))


def _examples(x, y):
    """The batch size of labels (a tensor, or a dict of them), or of the
    inputs for a model trained without labels."""
    return keras.tree.flatten(x if y is None else y)[0].shape[0]
