"""Compile-time metrics of `rk.Model`: Keras's, and the GAUC ones.

`rk.metrics.GAUC` reads each example's group from the model's inputs, which
Keras's compiled metrics never see: `rk.Model.compile` keeps them apart
(`split_group_metrics`), `compute_metrics` feeds them the group column
(`update_group_metrics`), and the compile config saves them
(`group_metrics_config`) for `compile_from_config` to put back
(`with_group_metrics`).
"""

from __future__ import annotations

from typing import Any

import keras

from reckeras.metrics import GAUC


def split_group_metrics(metrics: list | dict | None) -> tuple:
    """Compile's `metrics` split into Keras's and the GAUC ones.

    Args:
        metrics: compile's `metrics`: a list (one output) or
            `{output: list}`.

    Returns:
        `(Keras metrics, GAUC metrics, the output each GAUC reads)`; the
        output is None for a model with one output.

    Raises:
        ValueError: two outputs' GAUC metrics share a name.

    Example:

    ```python
    keras_metrics, gaucs, outputs = split_group_metrics(
        [rk.metrics.AUC(), rk.metrics.GAUC("user_id")])
    ```
    """
    if isinstance(metrics, dict):
        keras_metrics, gaucs, outputs = {}, [], []
        for output, entries in metrics.items():
            entries = keras.tree.flatten(entries) if isinstance(entries, (list, tuple)) \
                else [entries]
            gaucs += [m for m in entries if isinstance(m, GAUC)]
            outputs += [output for m in entries if isinstance(m, GAUC)]
            keras_metrics[output] = [m for m in entries if not isinstance(m, GAUC)]
        names = [m.name for m in gaucs]
        if len(set(names)) != len(names):
            raise ValueError(f"each output's GAUC needs a name of its own (they show in the "
                             f"logs under it), got {names}: e.g. GAUC('user_id', "
                             f"name='ctr_gauc')")
        return keras_metrics, gaucs, outputs
    metrics = list(metrics or [])
    gaucs = [m for m in metrics if isinstance(m, GAUC)]
    return [m for m in metrics if not isinstance(m, GAUC)] or None, gaucs, [None] * len(gaucs)


def update_group_metrics(gaucs: list, outputs: list, x: dict, y: Any, y_pred: Any,
                         sample_weight: Any) -> None:
    """Updates the GAUC metrics on one batch, each with its group column.

    Args:
        gaucs: the GAUC metrics (`split_group_metrics`).
        outputs: the output each reads (None: the model's only one).
        x: the batch's inputs (each GAUC's `group` names one).
        y: the labels.
        y_pred: the model's outputs.
        sample_weight: per-example weights, or None.

    Example:

    ```python
    update_group_metrics([gauc], [None], x, y, y_pred, None)
    ```
    """
    for output, metric in zip(outputs, gaucs, strict=True):
        metric.update_state(y if output is None else y[output],
                            y_pred if output is None else y_pred[output],
                            sample_weight, groups=x[metric.group])


def group_metrics_config(gaucs: list, outputs: list) -> list[dict]:
    """The GAUC metrics as the compile config saves them.

    Args:
        gaucs: the GAUC metrics.
        outputs: the output each reads (None: the model's only one).

    Returns:
        `[{"output": output, "config": metric config}, ...]`.
    """
    return [{"output": output, "config": metric.get_config()}
            for output, metric in zip(outputs, gaucs, strict=True)]


def with_group_metrics(metrics: Any, saved: list[dict]) -> Any:
    """Compile's `metrics` with the saved GAUC metrics put back.

    Args:
        metrics: the Keras metrics of the deserialized compile config.
        saved: `group_metrics_config`'s entries (or, from models saved
            before per-output GAUC, bare GAUC configs).

    Returns:
        The metrics: a list, or `{output: list}`.

    Example:

    ```python
    metrics = with_group_metrics(["auc"], [{"output": None, "config": {...}}])
    ```
    """
    for entry in saved:
        output, gauc = entry.get("output"), GAUC(**entry.get("config", entry))
        if output is None:
            metrics = [*(metrics or []), gauc]
        else:
            metrics = dict(metrics or {})
            metrics[output] = [*keras.tree.flatten(metrics.get(output) or []), gauc]
    return metrics
