"""Compile-time metrics of `rk.Model`: Keras's, and the GAUC ones.

`rk.metrics.GAUC` reads each example's group from the model's inputs, which
Keras's compiled metrics never see: `rk.Model.compile` keeps them apart and
`compute_metrics` feeds them the group column.
"""

from __future__ import annotations

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
