"""Embedding regularization: a penalty on the rows a batch looks up.

A sparse step reads and updates only the rows its batch looks up, so the
penalty of a table falls on those rows: a `RowPenalty` applies a regularizer
(any callable from a `[rows, dim]` float32 tensor to a scalar, such as a Keras
regularizer) to them, in the forward pass. The pooled lookup hands the rows
to autograd as a second output (`pooling.PooledLookup`), so the penalty's
gradient reaches the same per-row update as the data loss's: one optimizer
step per row and batch, with the sum of both gradients.

Two ways to count (`regularize`):

- `"distinct"`: every row the batch looks up, once (`regularizer(rows)`).
  When a batch looks up every row, this is a dense layer's penalty.
- `"occurrence"`: every lookup, over the batch size
  (`regularizer(rows[unique_index]) / batch`): a row seen in every example
  is penalized as with `"distinct"`, a row seen in a tenth of them a tenth
  as much.

With several ranks the data loss of each rank is a mean over its own
examples, the reported loss the mean over the ranks, and each row's
gradient the sum over the ranks divided by their number `W`. For the
penalty to count as on one rank with the whole batch:

- `"distinct"` is computed by the rows' owners, over the rows any rank
  looked up (each row once), times `W`: the mean over the ranks is then the
  sum of the owners' penalties, and the owner adds the penalty's gradient
  divided by `W` to the row's summed gradient.
- `"occurrence"` is computed by each rank on its own lookups over its own
  batch size, like the data loss, and travels with the data gradient.

Either way a regularizer is applied to parts of the rows (per table, per
rank) and the parts are added: it must be a sum over rows, each row's term 0
for a zero row (ids without a row read zeros), as L1, L2 and L1L2 are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from reckeras.embedding.options import REGULARIZE, TableOptions


class RowPenalty:
    """The penalty on the looked-up rows of one physical table.

    Args:
        regularizer: from float32 `[rows, dim]` to a scalar tensor, a sum
            over rows that is 0 for zero rows (a Keras regularizer).
        regularize: `"distinct"` or `"occurrence"` (see the module).

    Example:

    ```python
    penalty = RowPenalty(keras.regularizers.L2(0.05), "distinct")
    penalty(rows, unique_index, batch=4096, world_size=1)   # 0.05 * sum(rows ** 2)
    ```
    """

    def __init__(self, regularizer: Callable[[torch.Tensor], Any], regularize: str):
        if regularize not in REGULARIZE:
            raise ValueError(f"regularize must be one of {REGULARIZE}, got {regularize!r}")
        self.regularizer = regularizer
        self.regularize = regularize

    @property
    def on_owner(self) -> bool:
        """Whether with several ranks the rows' owners compute it
        (`"distinct"`: a row looked up by several ranks counts once)."""
        return self.regularize == "distinct"

    def __call__(self, rows: torch.Tensor, unique_index: torch.Tensor, batch: int,
                 world_size: int) -> torch.Tensor:
        """The penalty of one lookup.

        Args:
            rows: float32 `[U, D]`: with `"distinct"` the rows to penalize
                (with several ranks, the owner's); with `"occurrence"` the
                lookup's unique rows.
            unique_index: int64 `[N]`, every id's index into `rows`
                (`"occurrence"` only).
            batch: the examples of this rank's batch.
            world_size: the ranks.

        Returns:
            A 0-d float32 tensor.
        """
        if self.on_owner:
            return self.regularizer(rows) * world_size
        if batch == 0:
            return rows.new_zeros(())
        return self.regularizer(rows.index_select(0, unique_index)) / batch


def _same(first: Any, second: Any) -> bool:
    """Whether two regularizers penalize alike: the same object, or of one
    class with one config (Keras's regularizers have no equality)."""
    if first is second:
        return True
    return type(first) is type(second) and hasattr(first, "get_config") \
        and first.get_config() == second.get_config()


def group_penalties(group_tables: list[list[str]], group_options: list[list[TableOptions]],
                    dims: list[int], regularizer: Any, regularize: str
                    ) -> list[RowPenalty | None]:
    """The penalty of every physical table, from its tables' options and
    the layer's defaults.

    Args:
        group_tables: the logical tables of each physical table
            (`PackingPlan.group_tables`).
        group_options: their `TableOptions` (`PackingPlan.group_options`),
            each regularizer already resolved to a callable.
        dims: each physical table's dim.
        regularizer: the layer's regularizer (None: tables without one of
            their own are not regularized).
        regularize: the layer's `"distinct"` or `"occurrence"`.

    Returns:
        One `RowPenalty` (or None: not regularized) per physical table.

    Raises:
        ValueError: tables of one physical table that disagree, or a
            regularizer that does not give a scalar 0 for a zero row; the
            message names the tables.
    """
    if regularize not in REGULARIZE:
        raise ValueError(f"regularize must be one of {REGULARIZE}, got {regularize!r}")
    penalties: list[RowPenalty | None] = []
    for names, options, dim in zip(group_tables, group_options, dims, strict=True):
        chosen: list[tuple[Any, str | None]] = []
        for o in options:
            table_regularizer = o.embeddings_regularizer or regularizer
            chosen.append((table_regularizer, None if table_regularizer is None
                           else o.regularize or regularize))
        first, mode = chosen[0]
        if any(not _same(first, other) or other_mode != mode
               for other, other_mode in chosen[1:]):
            described = dict(zip(names, chosen, strict=True))
            raise ValueError(
                f"tables {names} are packed into one physical table (dim {dim}), so they "
                f"need one embeddings_regularizer and regularize; got {described}. Give "
                f"them the same TableOptions regularization, or different dims")
        if first is None:
            penalties.append(None)
            continue
        assert mode is not None     # a table with a regularizer has its mode
        _check_zero_row(first, names, dim)
        penalties.append(RowPenalty(first, mode))
    return penalties


def _check_zero_row(regularizer, names, dim):
    """A regularizer's penalty of zero rows must be a scalar 0: ids without
    a row (unseen at inference, not admitted yet) read zeros and must add
    nothing."""
    try:
        value = torch.as_tensor(regularizer(torch.zeros(2, dim)))
    except Exception as error:
        raise ValueError(f"the embeddings_regularizer of tables {names} (dim {dim}) fails "
                         f"on a float32 [rows, {dim}] tensor of rows: {error}") from error
    if value.dim() != 0 or float(value) != 0.0:
        raise ValueError(f"the embeddings_regularizer of tables {names} (dim {dim}) must "
                         f"give a scalar 0 for zero rows (ids without a row read zeros "
                         f"and add no penalty), got {value.tolist()!r}")
