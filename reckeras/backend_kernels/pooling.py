"""The pooled embedding lookup: bags of ids -> one summed row per bag.

Unpooled sequences use it too: the engine gives every position of a
sequence its own destination (a bag of one id), so `[B, L, D]` is a pooled
output whose bags are positions.

Forward index (kept from the forward pass): for every id in the packed batch,
`unique_index` (its position among the unique rows of the batch),
`destination` (the flat `[B * F]` slot its bag writes to, so results land
directly in the `[B, F, D]` layout the dense network reads) and
`id_weight` (the combiner's scale, 1, 1/len or 1/sqrt(len), times optional
per-id weights).

Pooled forward: the ids grouped by destination (a CSR, see
`aggregation.group_by`) and one segment sum per output slot -- the Triton
segment-sum kernel on CUDA, `embedding_bag` over the batch's unique rows
on CPU (`DestinationMajor`, whose sorted index the CPU backward reuses).
Empty bags give zeros.

Backward: the gradient of every id is `grad_out[destination] * id_weight`;
summed per unique row (`aggregation.aggregate_row_grads`) it is handed to
`apply_row_grads(rows, grads)`, which runs the sparse optimizer on those
rows. On CUDA, a hook that also has `apply_pooled(rows, grad_out,
unique_index, destination, id_weight)` gets the pooled gradient instead, so
that the aggregation and the update run as one kernel (see
`sparse_optimizers.aggregate_and_update`); on CPU the backward reuses the
forward's destination-sorted index and calls the hook. The table is not a leaf of the
autograd graph; the dense network's gradient still flows through `anchor`,
a zero-size tensor that requires grad, so torch calls this backward.

A penalty on rows (embedding regularization) asks `PooledLookup` for a
second output, rows gathered from a table (`penalized`): their gradient
reaches the hook beside the rows' data gradients, in the same backward
(`apply_row_grads(rows, grads, penalized_grads)`), so that one update
applies both.
"""

from collections.abc import Callable
from typing import NamedTuple, Protocol

import torch

from reckeras.backend_kernels import cpu_native
from reckeras.backend_kernels.aggregation import (
    aggregate_row_grads,
    bag_sums,
    group_by,
    is_permutation,
    segment_sum_triton,
    sorted_groups,
    unit_scale,
)
from reckeras.backend_kernels.dispatch import register, use_native, use_triton


class DestinationMajor(NamedTuple):
    """The forward index sorted by destination.

    What the CPU forward gathers, kept for the CPU backward (RecIS's
    aggregation specialised for the forward and the backward index
    structures). Built with `DestinationMajor.of`.

    Args:
        keys: the ids' `unique_index`, sorted by destination (stable).
        scale: their `id_weight` in the same order; None when all are 1.
        offsets: `[num_slots + 1]`: slot `d` holds `keys[offsets[d]:offsets[d + 1]]`.
        slots: the destination of every sorted position; None when it is the
            position itself (one id per slot: a one-hot batch).

    Example:

    ```python
    index = DestinationMajor.of(unique_index, destination, id_weight, num_slots)
    pooled = index.pool(weights, unique_rows)               # the forward
    row_grads = index.row_grads(grad_pooled, unique_rows.numel())   # the backward
    ```
    """

    keys: torch.Tensor
    scale: torch.Tensor | None
    offsets: torch.Tensor
    slots: torch.Tensor | None

    @classmethod
    def of(cls, unique_index: torch.Tensor, destination: torch.Tensor,
           id_weight: torch.Tensor, num_slots: int) -> "DestinationMajor":
        """The index of a batch's forward.

        Args:
            unique_index: int64 `[N]`, every id's row among the unique rows.
            destination: int64 `[N]`, every id's output slot.
            id_weight: float32 `[N]`, every id's scale.
            num_slots: the output slots.

        Returns:
            The `DestinationMajor` of those ids.

        Example:

        ```python
        DestinationMajor.of(torch.tensor([0, 1]), torch.tensor([1, 0]),
                            torch.ones(2), 2)       # a one-hot batch: slots None
        ```
        """
        scale = unit_scale(id_weight)
        counts = torch.bincount(destination, minlength=num_slots)
        if is_permutation(destination, counts):
            # One id per slot: scattering the ids to their slots sorts them.
            def to_slots(values):
                return torch.empty_like(values).scatter_(0, destination, values)

            return cls(to_slots(unique_index), None if scale is None else to_slots(scale),
                       torch.arange(num_slots + 1, device=destination.device), None)
        order, offsets = sorted_groups(destination, counts)
        return cls(unique_index.index_select(0, order),
                   None if scale is None else scale.index_select(0, order), offsets,
                   destination.index_select(0, order))

    def pool(self, weights: torch.Tensor, unique_rows: torch.Tensor) -> torch.Tensor:
        """The forward: the pooled rows of every slot.

        Args:
            weights: `[num_rows, D]`, the table.
            unique_rows: int64 `[U]`, the batch's unique rows of `weights`.

        Returns:
            float32 `[num_slots, D]`.

        Example:

        ```python
        pooled = index.pool(table.weights, unique_rows)
        ```
        """
        compact = weights.index_select(0, unique_rows)      # the batch's rows only
        return bag_sums(self.keys, compact, self.offsets, self.scale)

    def row_grads(self, grad_out: torch.Tensor, num_unique: int) -> torch.Tensor:
        """The backward: `aggregate_row_grads` of the same ids.

        Args:
            grad_out: float32 `[num_slots, D]`, the gradient of `pool`'s output.
            num_unique: `U`, the batch's unique rows.

        Returns:
            float32 `[U, D]`, the gradient of every unique row.

        Example:

        ```python
        grads = index.row_grads(grad_out, unique_rows.numel())
        ```
        """
        order, offsets = group_by(self.keys, num_unique)
        rows = order if self.slots is None else self.slots.index_select(0, order)
        return bag_sums(rows, grad_out, offsets,
                        None if self.scale is None else self.scale.index_select(0, order))


def pooled_lookup_reference(weights: torch.Tensor, unique_rows: torch.Tensor,
                            unique_index: torch.Tensor, destination: torch.Tensor,
                            id_weight: torch.Tensor, num_slots: int) -> torch.Tensor:
    """The torch reference of `pooled_lookup` (`embedding_bag` on CPU).

    Args:
        weights, unique_rows, unique_index, destination, id_weight, num_slots:
            as for `pooled_lookup`.

    Returns:
        What `pooled_lookup` returns.

    Example:

    ```python
    pooled_lookup_reference(weights, unique_rows, unique_index, destination,
                            id_weight, num_slots)
    ```
    """
    return DestinationMajor.of(unique_index, destination, id_weight,
                               num_slots).pool(weights, unique_rows)


def pooled_lookup_triton(weights: torch.Tensor, unique_rows: torch.Tensor,
                         unique_index: torch.Tensor, destination: torch.Tensor,
                         id_weight: torch.Tensor, num_slots: int) -> torch.Tensor:
    """`pooled_lookup` on CUDA tensors: `aggregation`'s segment-sum kernel.

    Args:
        weights, unique_rows, unique_index, destination, id_weight, num_slots:
            as for `pooled_lookup`.

    Returns:
        What `pooled_lookup` returns.

    Example:

    ```python
    pooled_lookup_triton(weights, unique_rows, unique_index, destination,
                         id_weight, num_slots)
    ```
    """
    order, offsets = group_by(destination, num_slots)
    rows = unique_rows.index_select(0, unique_index)
    return segment_sum_triton(weights, rows, id_weight, order, offsets)


_pooled_lookup = register(
    "pooled_lookup(Tensor weights, Tensor unique_rows, Tensor unique_index, "
    "Tensor destination, Tensor id_weight, int num_slots) -> Tensor",
    reference=pooled_lookup_reference, triton=pooled_lookup_triton,
    native=cpu_native.pool_forward,
    native_usable=lambda weights, unique_rows, unique_index, destination, id_weight, _:
        cpu_native.usable(unique_rows, unique_index, destination, id_weight, table=weights),
    fake=lambda weights, unique_rows, unique_index, destination, id_weight, num_slots:
        weights.new_empty((num_slots, weights.shape[1]), dtype=torch.float32))


def pooled_lookup(weights: torch.Tensor, unique_rows: torch.Tensor,
                  unique_index: torch.Tensor, destination: torch.Tensor,
                  id_weight: torch.Tensor, num_slots: int) -> torch.Tensor:
    """Sums the scaled rows of every id into its output slot.

    The torch op `reckeras::pooled_lookup`: one Triton kernel on CUDA
    tensors, the native kernel or the torch reference on CPU tensors.

    Args:
        weights: float32, float16 or bfloat16 `[num_rows, D]`, the table
            (summed in float32).
        unique_rows: int64 `[U]`, the batch's unique rows of `weights`.
        unique_index: int64 `[N]`, every id's index into `unique_rows`.
        destination: int64 `[N]`, every id's output slot.
        id_weight: float32 `[N]`, every id's scale.
        num_slots: the output slots.

    Returns:
        float32 `[num_slots, D]`: `out[destination[i]] += weights[unique_rows[
        unique_index[i]]] * id_weight[i]`; slots no id writes are zeros.

    Example:

    ```python
    weights = torch.eye(3)
    pooled_lookup(weights, torch.tensor([2, 0]), torch.tensor([0, 1, 1]),
                  torch.tensor([0, 0, 1]), torch.tensor([1.0, 0.5, 1.0]), 2)
    # [[0.5, 0, 1], [1, 0, 0]]
    ```
    """
    return _pooled_lookup(weights, unique_rows, unique_index, destination, id_weight,
                          num_slots)


class _LookupContext(Protocol):
    """What `PooledLookup` keeps in torch's context of a call."""

    saved_tensors: tuple[torch.Tensor, ...]
    apply_row_grads: Callable
    index: DestinationMajor | None      # the CPU forward's, reused by the backward
    needs_input_grad: tuple[bool, ...]

    def save_for_backward(self, *tensors: torch.Tensor) -> None: ...


class PooledLookup(torch.autograd.Function):
    """`pooled_lookup` whose backward applies the sparse optimizer.

    Example:

    ```python
    anchor = torch.zeros(0, requires_grad=True)
    pooled = PooledLookup.apply(anchor, weights, unique_rows, unique_index,
                                destination, id_weight, num_slots, optimizer_hook)
    pooled.backward(grad)          # optimizer_hook(rows, row_grads) ran
    pooled, rows = PooledLookup.apply(anchor, weights, unique_rows, unique_index,
                                      destination, id_weight, num_slots, optimizer_hook,
                                      (weights, unique_rows))
    (pooled.sum() + rows.square().sum()).backward()
    # optimizer_hook(rows, row_grads, 2 * rows) ran
    ```
    """

    @staticmethod
    def forward(ctx: _LookupContext, anchor: torch.Tensor, weights: torch.Tensor,
                unique_rows: torch.Tensor, unique_index: torch.Tensor,
                destination: torch.Tensor, id_weight: torch.Tensor, num_slots: int,
                apply_row_grads: Callable,
                penalized: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The pooled rows; keeps the forward index for the backward.

        Args:
            ctx: torch's context of this call.
            anchor: a zero-size tensor that requires grad, so that torch
                calls `backward` (the table is not a leaf of the graph).
            weights, unique_rows, unique_index, destination, id_weight,
                num_slots: as for `pooled_lookup`.
            apply_row_grads: the hook `apply_row_grads(rows, grads)` that
                updates the rows; one that also has `apply_pooled(rows,
                grad_out, unique_index, destination, id_weight)` gets the
                pooled gradient instead on CUDA and with the native kernels
                (unless `penalized` is given).
            penalized: `(table, rows)` of the rows a penalty falls on, or
                None; the hook is then called `apply_row_grads(rows, grads,
                penalized_grads)` with the gradient of the second output.

        Returns:
            What `pooled_lookup` returns; with `penalized`, also
            `table[rows]` as float32.
        """
        ctx.save_for_backward(unique_rows, unique_index, destination, id_weight)
        ctx.apply_row_grads = apply_row_grads
        if use_triton(weights) or use_native(unique_rows, unique_index, destination,
                                             id_weight, table=weights):
            ctx.index = None
            pooled = pooled_lookup(weights, unique_rows, unique_index, destination,
                                   id_weight, num_slots)
        else:
            ctx.index = DestinationMajor.of(unique_index, destination, id_weight, num_slots)
            pooled = ctx.index.pool(weights, unique_rows)
        if penalized is None:
            return pooled
        table, rows = penalized
        return pooled, table.index_select(0, rows).float()

    @staticmethod
    def backward(ctx: _LookupContext, grad_out: torch.Tensor,
                 *penalized_grads: torch.Tensor) -> tuple[None, ...]:
        """Hands the rows' gradients (or the pooled gradient) to the hook.

        Args:
            ctx: the context `forward` filled.
            grad_out: float32 `[num_slots, D]`, the gradient of the output.
            *penalized_grads: with `penalized`, the gradient of the
                penalized rows.

        Returns:
            No gradient for any input: the hook has updated the rows.
        """
        unique_rows, unique_index, destination, id_weight = ctx.saved_tensors
        no_grads = (None,) * len(ctx.needs_input_grad)
        if ctx.index is not None:                # CPU: reuse the forward's index
            row_grads = ctx.index.row_grads(grad_out, unique_rows.numel())
        elif hasattr(ctx.apply_row_grads, "apply_pooled") and not penalized_grads:
            ctx.apply_row_grads.apply_pooled(unique_rows, grad_out, unique_index,
                                             destination, id_weight)
            return no_grads
        else:
            row_grads = aggregate_row_grads(grad_out, unique_index, destination,
                                            id_weight, unique_rows.numel())
        ctx.apply_row_grads(unique_rows, row_grads, *penalized_grads)
        return no_grads


# ---- positions in bags ------------------------------------------------------------

def sequence_positions(offsets: torch.Tensor,
                       num_ids: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The bag of every id of a packed batch and its position in that bag.

    Args:
        offsets: int64 `[R + 1]` bag offsets.
        num_ids: `offsets[-1]`, the number of ids.

    Returns:
        `(bag, position)`: int64 `[num_ids]` each.

    Example:

    ```python
    sequence_positions(torch.tensor([0, 2, 2, 3]), 3)   # ([0, 0, 2], [0, 1, 0])
    ```
    """
    lengths = offsets[1:] - offsets[:-1]
    bag = torch.repeat_interleave(torch.arange(lengths.numel(), device=offsets.device),
                                  lengths, output_size=num_ids)
    position = torch.arange(num_ids, device=offsets.device) - offsets.index_select(0, bag)
    return bag, position
