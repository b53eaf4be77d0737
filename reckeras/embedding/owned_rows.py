"""The rows of a lookup with several ranks: resolved and updated by their owners.

Every row is owned by one rank (`sharding.owner_of`). In a lookup, each
rank's unique keys travel to their owners (`comm`), the owners resolve them
to rows of their stores and send the rows back; in backward each rank's
gradients travel the same route to the owners, which sum them over the
ranks, divide by the world size (each rank's loss is a mean over its own
examples) and run the optimizer on their rows. `OwnedRows` is that, for one
lookup and physical table; the engine builds it and hands it to the pooled
lookup as its backward hook.

A penalty counted by the owners (`regularization.RowPenalty.on_owner`) falls
on the owner's distinct rows among every rank's requests; its gradient is
added to their summed gradient on the owner.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from reckeras.backend_kernels.aggregation import unique_rows
from reckeras.embedding.regularization import RowPenalty
from reckeras.embedding.row_store import RowStore

if TYPE_CHECKING:
    from reckeras.embedding.comm import FlatRoute, HierarchicalRoute


class OwnedRows:
    """One physical table's rows of one lookup, from and back to their owners.

    After construction: `values` holds the rows this rank asked for
    (`[U, D]`, one per unique key of its route, zeros for keys without a
    row), `unique` indexes them (`arange(U)`), `pin` is the owner's pin of
    cached rows (or None), `requests` the keys this rank's store served, and
    `penalized` the `(table, rows)` a penalty falls on: the requested rows,
    or the owner's own distinct rows when the owners count the penalty.
    Calling it is the pooled lookup's backward hook.

    Args:
        store: this rank's row store of the physical table.
        route: the lookup's route of this table (`comm`).
        training: create rows for new keys, and train them.
        penalty: the table's `RowPenalty` when the lookup returns its
            penalty, else None.
        world_size: the ranks.
        round_seed: the step's seed for rounding half-precision rows.
        run_update: `run_update(checked, update, pin)`, the engine's: runs
            `update` now or defers it, with the finiteness of `checked`.
        apply_row_grads: `apply_row_grads(store, rows, grads, round_seed)`,
            the engine's optimizer step on rows of `store`.

    Example:

    ```python
    owned = OwnedRows(store, route, True, None, 2, seed, engine_update, engine_apply)
    pooled = PooledLookup.apply(anchor, owned.values, owned.unique, unique_index,
                                destination, id_weight, num_slots, owned)
    ```
    """

    def __init__(self, store: RowStore, route: FlatRoute | HierarchicalRoute,
                 training: bool, penalty: RowPenalty | None,
                 world_size: int, round_seed: int, run_update: Callable,
                 apply_row_grads: Callable):
        self.store, self.route, self.world_size = store, route, world_size
        self.round_seed = round_seed
        self._run_update, self._apply_row_grads = run_update, apply_row_grads
        store.check_fits(route.owner_keys, training)
        owner_rows, self.pin = store.resolve(route.owner_keys, training, route.owner_tags)
        self.requests = owner_rows.numel()
        # Ids without a row (unseen at inference, not admitted) read zeros.
        owner_values = torch.where((owner_rows >= 0).unsqueeze(1),
                                   store.weights[owner_rows.clamp(min=0)], 0.0)
        self.values = route.rows_to_requesters(owner_values)
        self.unique = torch.arange(self.values.shape[0], device=self.values.device)
        self.on_owner = penalty is not None and penalty.on_owner
        self.owned = None
        if training or self.on_owner:
            # The owner's distinct rows among all ranks' requests: where the
            # summed gradients go, and the rows the owner's penalty counts.
            present = (owner_rows >= 0).nonzero().squeeze(1)
            unique, unique_index = unique_rows(owner_rows[present], store.row_bound)
            self.owned = (present, unique, unique_index)
        self.penalized = (store.weights, self.owned[1]) if self.owned is not None \
            and self.on_owner else (self.values, self.unique)

    def __call__(self, _: torch.Tensor, grads: torch.Tensor,
                 penalized_grads: torch.Tensor | None = None) -> None:
        """The backward hook: exchanges and applies (or defers) the update.

        Args:
            _: the requested rows' indices (`unique`).
            grads: float32 `[U, D]`, this rank's gradients of `values`.
            penalized_grads: the gradient of the `penalized` rows, or None.
        """
        owner_penalty_grads = None
        checked = grads
        if penalized_grads is not None and self.on_owner:
            owner_penalty_grads = penalized_grads
            checked = grads.sum() + penalized_grads.sum()    # NaN and inf propagate
        elif penalized_grads is not None:
            grads = grads + penalized_grads        # the requested rows' penalty
        # This rank's gradients before the exchange: each rank checks its own
        # and the caller agrees across ranks, so all exchange or none does.
        self._run_update(checked, lambda: self._apply(grads, owner_penalty_grads), self.pin)

    def _apply(self, grads, owner_penalty_grads):
        owner_grads = self.route.grads_to_owners(grads) / self.world_size
        present, unique, position = self.owned
        summed = owner_grads.new_zeros(unique.numel(), owner_grads.shape[1])
        summed.index_add_(0, position, owner_grads[present])
        if owner_penalty_grads is not None:
            # The owner's penalty counts world_size times in its rank's loss
            # (the reported loss is the mean over the ranks): its gradient too.
            summed += owner_penalty_grads / self.world_size
        self._apply_row_grads(self.store, unique, summed, self.round_seed)
