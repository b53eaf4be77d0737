"""Table updates held back until the step is known to be finite.

Inside `EmbeddingEngine.deferred_updates`, backward applies nothing: each
lookup's update (and, with several ranks, its gradient exchange to the
owners) waits in a `DeferredUpdates` until the caller has checked that the
step is finite (`all_finite`, one reduction per gradient, no host sync), and
then runs, or is dropped. No backward reads a table row (the forward copied
what it pooled), so updates applied after backward give the same rows, bit
for bit, as updates applied during it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from reckeras.embedding.row_store import Pin


def all_finite(tensor: torch.Tensor) -> torch.Tensor:
    """Whether every element of `tensor` is finite, as a 0-d bool tensor
    (on its device: reading it is the only host sync).

    One reduction, a float32 sum, instead of an elementwise test: NaN and
    inf propagate through a sum, and it is ~25x cheaper on a CPU than
    `isfinite(tensor).all()` (0.17 against 4.6 ms for a wide step's
    `[2048, 2400]` pooled gradient). A sum of finite values that overflows
    float32 (above ~3.4e38) also counts as non-finite: a gradient that large
    would overflow the weights it updates anyway.

    Args:
        tensor: any floating tensor (an empty one is finite).

    Returns:
        A 0-d bool tensor.

    Example:

    ```python
    all_finite(torch.tensor([1.0, float("nan")]))     # tensor(False)
    ```
    """
    return torch.isfinite(torch.sum(tensor, dtype=torch.float32))


class DeferredUpdates:
    """The table updates one engine's backward queued, not applied yet.

    Made by `EmbeddingEngine.deferred_updates`; updates run in the order
    backward queued them. Each rank checks only its own gradients: with
    several ranks the caller must combine the flags across ranks, so that
    every rank applies (and joins the gradient exchanges) or none does.

    Args:
        lookup_device: the device of the engine's latest lookup, asked when
            `finite()` has no update to answer for.

    Example:

    ```python
    with engine.deferred_updates() as updates:
        loss.backward()
        if bool(updates.finite()):
            updates.apply()
    ```
    """

    def __init__(self, lookup_device: Callable[[], torch.device]):
        self._lookup_device = lookup_device
        self._pending: list[tuple[Callable[[], None], Pin | None]] = []   # backward order
        self._flags: list[torch.Tensor] = []    # one 0-d bool per update queued in the block

    def queue(self, finite: torch.Tensor, update: Callable[[], None],
              pin: Pin | None) -> None:
        """Queues one lookup's update (the engine's backward calls it).

        Args:
            finite: 0-d bool, whether the gradients it applies are finite.
            update: runs the update.
            pin: what keeps the update's cached rows in place (None: nothing).
        """
        self._flags.append(finite)
        self._pending.append((update, pin))

    def finite(self) -> torch.Tensor:
        """Whether every update queued in the block had finite gradients.

        It covers what each update would apply: the pooled output gradient
        of a fused update, the row gradients otherwise, and with several
        ranks this rank's gradients before their exchange. Updates already
        applied or discarded still count, so the answer stays the same
        after `discard()`.

        Returns:
            A 0-d bool tensor on the gradients' device (no host sync); True
            when nothing was queued (on the device of the engine's latest
            lookup).
        """
        if not self._flags:
            return torch.ones((), dtype=torch.bool, device=self._lookup_device())
        device = self._flags[0].device
        return torch.stack([flag.to(device) for flag in self._flags]).all()

    def apply(self) -> None:
        """Runs the queued updates, in order, and unpins their rows.

        With several ranks it runs their gradient exchanges (collectives):
        every rank must call it at the same point.
        """
        while self._pending:
            update, pin = self._pending.pop(0)
            try:
                update()
            finally:
                if pin is not None:
                    pin.release()

    def discard(self) -> None:
        """Drops the queued updates: no row, state or rank changes; their
        cached rows are unpinned."""
        pending, self._pending = self._pending, []
        for _, pin in pending:
            if pin is not None:
                pin.release()
