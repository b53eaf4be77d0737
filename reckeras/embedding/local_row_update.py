"""The backward hook of a lookup in one table of this rank (one process, or
rows this rank owns and looked up itself)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch


class LocalRowUpdate:
    """`PooledLookup`'s backward hook for the rows of one local table.

    Called with the rows' gradients (`__call__`), it adds the penalty's
    gradient of the same rows, if any, and updates them; `apply_pooled`
    hands the pooled gradient to the optimizer instead, which (on CUDA, or
    with the native CPU kernels) aggregates it per row and updates the rows
    in one pass. Either update runs through `schedule` (the engine's: now,
    or queued in its open deferral); `pin` keeps the cached rows until then.

    Args:
        schedule: `schedule(grads, update, pin)`, runs or defers `update()`.
        pin: the store's pin of the looked-up cached rows, or None.
        apply_rows: `apply_rows(rows, grads)` updates rows from their grads.
        apply_pooled: `apply_pooled(rows, grad_out, unique_index,
            destination, id_weight)` updates rows from the pooled gradient.

    Example:

    ```python
    update = LocalRowUpdate(engine_schedule, None, apply_rows, apply_pooled)
    update(unique_rows, row_grads)      # what PooledLookup's backward calls
    ```
    """

    def __init__(self, schedule: Callable, pin: Any, apply_rows: Callable,
                 apply_pooled: Callable):
        self._schedule, self._pin = schedule, pin
        self._apply_rows, self._apply_pooled = apply_rows, apply_pooled

    def __call__(self, rows: torch.Tensor, grads: torch.Tensor,
                 penalized_grads: torch.Tensor | None = None) -> None:
        if penalized_grads is not None:     # the penalty of the same rows
            grads = grads + penalized_grads
        self._schedule(grads, functools.partial(self._apply_rows, rows, grads), self._pin)

    def apply_pooled(self, rows: torch.Tensor, grad_out: torch.Tensor,
                     unique_index: torch.Tensor, destination: torch.Tensor,
                     id_weight: torch.Tensor) -> None:
        """Updates `rows` from the pooled gradient, now or deferred.

        Args:
            rows: the unique rows of the lookup.
            grad_out: the gradient of the pooled output.
            unique_index: each id's position among `rows`.
            destination: each id's output slot.
            id_weight: each id's pooling scale.
        """
        self._schedule(grad_out, functools.partial(self._apply_pooled, rows, grad_out,
                                                   unique_index, destination, id_weight),
                       self._pin)
