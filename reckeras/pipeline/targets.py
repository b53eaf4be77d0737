"""What a loop reads beside the features, checked against the model.

`fit`, `evaluate` and `train_on_batch`/`test_on_batch` read label columns
(one, or one per output of a model with dict outputs) and loss weights; the
labels a binary cross-entropy reads are checked to lie in [0, 1] as each
batch is encoded (`batches.to_tensors`).
"""

from __future__ import annotations

from typing import Any

import keras

from reckeras.pipeline.batches import Targets
from reckeras.pipeline.functional import declared_outputs


def targets_for(data: Any, labels: str | dict | None, weight: str | None,
                class_weight: dict | None, loop: str, outputs: Any, loss: Any) -> Targets:
    """The `Targets` of a loop over `data`, checked against the model.

    Args:
        data: the loop's data (`batches.as_data`): its `label` is the label
            column(s) found in it.
        labels: the label column(s) the user named, or None for `data`'s.
        weight: the loss weight column, or None.
        class_weight: `{class index: weight}` (checked), or None.
        loop: the loop's name, for the messages (`"fit"`, ...).
        outputs: the structure of the model's outputs, or None when it is
            not known before a call (a subclassed model).
        loss: the compiled loss (a dict per output, or one).

    Returns:
        The `batches.Targets`.

    Raises:
        ValueError: no labels for a compiled loss or a `class_weight`, labels
            that do not match the outputs, or `class_weight` for a model with
            several outputs.

    Example:

    ```python
    targets = targets_for(data, None, None, None, "fit", model.outputs[0],
                          "binary_crossentropy")
    ```
    """
    label = data.label if labels is None else labels
    if label is None and loss is None and class_weight is None:
        # A model that computes its own loss (`compute_loss`, `add_loss`)
        # trains without labels, as in Keras.
        return Targets(None, weight, class_weight, frozenset())
    if label is None:
        raise ValueError(f"{loop}() needs labels: a 'label' column in x, y, or labels=")
    if outputs is not None:
        _check_against_outputs(label, outputs)
    if class_weight is not None and isinstance(label, dict):
        raise ValueError("class_weight is only supported for models with a single "
                         "output (Keras's rule); weigh the examples with "
                         "sample_weight instead")
    return Targets(label, weight, class_weight, _binary_label_columns(label, loss))


def model_targets(model: keras.Model, data: Any, labels: str | dict | None,
                  weight: str | None, class_weight: dict | None, loop: str) -> Targets:
    """`targets_for` a compiled `rk.Model`: checked against its outputs'
    structure (`functional.declared_outputs`) and its loss.

    Args:
        model: the `rk.Model`.
        data: the loop's data (`batches.as_data`).
        labels: the label column(s) the user named, or None.
        weight: the loss weight column, or None.
        class_weight: `{class index: weight}`, or None.
        loop: the loop's name, for the messages.

    Returns:
        The `batches.Targets`.
    """
    return targets_for(data, labels, weight, class_weight, loop,
                       declared_outputs(model), model.loss)


def _check_against_outputs(label, outputs):
    if isinstance(outputs, dict):
        if not isinstance(label, dict):
            raise ValueError(f"the model has outputs {sorted(outputs)}: give one label "
                             f"per output, y={{output: array}} or "
                             f"labels={{output: column}}")
        if label.keys() != outputs.keys():
            raise ValueError(f"labels name outputs {sorted(label)} but the model has "
                             f"outputs {sorted(outputs)}")
    elif isinstance(label, dict):
        raise ValueError(f"labels for outputs {sorted(label)} were given, but the model "
                         f"has a single output: build it with dict outputs "
                         f"rk.Model(inputs, {{name: output, ...}})")
    elif isinstance(outputs, (list, tuple)) and len(outputs) > 1:
        raise ValueError("rk.Model trains several outputs given as a dict "
                         "rk.Model(inputs, {name: output, ...}), with labels per name")


def _binary_label_columns(label, loss):
    """The label columns a binary cross-entropy reads (checked in [0, 1])."""
    losses = loss if isinstance(loss, dict) else \
        dict.fromkeys(label, loss) if isinstance(label, dict) else {None: loss}
    columns = label if isinstance(label, dict) else {None: label}
    return frozenset(columns[output] for output, one in losses.items()
                     if output in columns and _is_binary_crossentropy(one))


def _is_binary_crossentropy(loss):
    """Whether `loss` (a name, a function or a Loss) is a binary cross-entropy."""
    name = loss if isinstance(loss, str) else \
        getattr(loss, "name", None) or getattr(loss, "__name__", "")
    return name in ("binary_crossentropy", "binary_focal_crossentropy")
