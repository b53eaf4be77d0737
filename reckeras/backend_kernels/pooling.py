"""Embedding lookups: pooled (bags -> [B, F, D]) and unpooled (sequences -> [B, L, D]).

Forward index (kept from the forward pass): for every id in the packed batch,
``unique_index`` (its position among the unique rows of the batch),
``destination`` (the flat ``[B * F]`` slot its bag writes to, so results land
directly in the ``[B, F, D]`` layout the dense network reads) and
``id_weight`` (the combiner's scale, 1, 1/len or 1/sqrt(len), times optional
per-id weights).

Pooled forward: the ids grouped by destination (a CSR, see
``aggregation.group_by``) and one segment sum per output slot -- the Triton
segment-sum kernel on CUDA, ``embedding_bag`` over the batch's unique rows
on CPU (``DestinationMajor``, whose sorted index the CPU backward reuses).
Empty bags give zeros.

Backward: the gradient of every id is ``grad_out[destination] * id_weight``;
summed per unique row (``aggregation.aggregate_row_grads``) it is handed to
``apply_row_grads(rows, grads)``, which runs the sparse optimizer on those
rows. On CUDA, a hook that also has ``apply_pooled(rows, grad_out,
unique_index, destination, id_weight)`` gets the pooled gradient instead, so
that the aggregation and the update run as one kernel (see
``sparse_optimizers.aggregate_and_update``); on CPU the backward reuses the
forward's destination-sorted index and calls the hook. The table is not a leaf of the
autograd graph; the dense network's gradient still flows through ``anchor``,
a zero-size tensor that requires grad, so torch calls this backward.
"""

from typing import NamedTuple

import torch

from reckeras.backend_kernels.aggregation import (aggregate_row_grads, bag_sums,
                                                  column_block, group_by,
                                                  is_permutation, segment_sum_triton,
                                                  sorted_groups, unit_scale)
from reckeras.backend_kernels.dispatch import (TritonKernels, constexpr, kernel,
                                               use_native, use_triton)

BLOCK_L = 16          # sequence positions per program


class DestinationMajor(NamedTuple):
    """The forward index sorted by destination: what the CPU forward gathers,
    kept for the CPU backward (RecIS's aggregation specialised for the
    forward and the backward index structures).

    Attributes:
        keys: the ids' ``unique_index``, sorted by destination (stable).
        scale: their ``id_weight`` in the same order; None when all are 1.
        offsets: ``[num_slots + 1]``: slot ``d`` holds ``keys[offsets[d]:offsets[d + 1]]``.
        slots: the destination of every sorted position; None when it is the
            position itself (one id per slot: a one-hot batch).
    """

    keys: torch.Tensor
    scale: torch.Tensor
    offsets: torch.Tensor
    slots: torch.Tensor

    @classmethod
    def of(cls, unique_index, destination, id_weight, num_slots):
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

    def pool(self, weights, unique_rows):
        """The forward: ``[num_slots, D]`` float32."""
        compact = weights.index_select(0, unique_rows)      # the batch's rows only
        return bag_sums(self.keys, compact, self.offsets, self.scale)

    def row_grads(self, grad_out, num_unique):
        """The backward: ``aggregate_row_grads`` of the same ids."""
        order, offsets = group_by(self.keys, num_unique)
        rows = order if self.slots is None else self.slots.index_select(0, order)
        return bag_sums(rows, grad_out, offsets,
                        None if self.scale is None else self.scale.index_select(0, order))


def pooled_lookup_reference(weights, unique_rows, unique_index, destination,
                            id_weight, num_slots):
    """``[num_slots, D]`` with ``out[destination[i]] += w[row_i] * id_weight[i]``."""
    return DestinationMajor.of(unique_index, destination, id_weight,
                               num_slots).pool(weights, unique_rows)


def pooled_lookup_triton(weights, unique_rows, unique_index, destination, id_weight,
                         num_slots):
    order, offsets = group_by(destination, num_slots)
    rows = unique_rows.index_select(0, unique_index)
    return segment_sum_triton(weights, rows, id_weight, order, offsets)


def pooled_lookup(weights, unique_rows, unique_index, destination, id_weight,
                  num_slots):
    """``pooled_lookup_reference``, as one Triton kernel on CUDA tensors."""
    if use_native(weights, unique_rows, unique_index, destination, id_weight):
        from reckeras.backend_kernels import cpu_native
        return cpu_native.pool_forward(weights, unique_rows, unique_index, destination,
                                       id_weight, num_slots)
    fn = pooled_lookup_triton if use_triton(weights) else pooled_lookup_reference
    return fn(weights, unique_rows, unique_index, destination, id_weight, num_slots)


class PooledLookup(torch.autograd.Function):
    """Pooled lookup whose backward applies the sparse optimizer."""

    @staticmethod
    def forward(ctx, anchor, weights, unique_rows, unique_index, destination,
                id_weight, num_slots, apply_row_grads):
        ctx.save_for_backward(unique_rows, unique_index, destination, id_weight)
        ctx.apply_row_grads = apply_row_grads
        if use_triton(weights) or use_native(weights, unique_rows, unique_index,
                                             destination, id_weight):
            ctx.index = None
            return pooled_lookup(weights, unique_rows, unique_index, destination,
                                 id_weight, num_slots)
        ctx.index = DestinationMajor.of(unique_index, destination, id_weight, num_slots)
        return ctx.index.pool(weights, unique_rows)

    @staticmethod
    def backward(ctx, grad_out):
        unique_rows, unique_index, destination, id_weight = ctx.saved_tensors
        if ctx.index is not None:                # CPU: reuse the forward's index
            row_grads = ctx.index.row_grads(grad_out, unique_rows.numel())
        elif hasattr(ctx.apply_row_grads, "apply_pooled"):
            ctx.apply_row_grads.apply_pooled(unique_rows, grad_out, unique_index,
                                             destination, id_weight)
            return (None,) * 8
        else:
            row_grads = aggregate_row_grads(grad_out, unique_index, destination,
                                            id_weight, unique_rows.numel())
        ctx.apply_row_grads(unique_rows, row_grads)
        return (None,) * 8


# ---- unpooled (sequence) lookup ------------------------------------------------------

def sequence_positions(offsets, num_ids):
    """Bag and position inside its bag of every id of a packed batch."""
    lengths = offsets[1:] - offsets[:-1]
    bag = torch.repeat_interleave(torch.arange(lengths.numel(), device=offsets.device),
                                  lengths, output_size=num_ids)
    position = torch.arange(num_ids, device=offsets.device) - offsets.index_select(0, bag)
    return bag, position


def sequence_lookup_reference(weights, unique_rows, unique_index, offsets, max_len):
    """``[R, max_len, D]`` float32 rows of every bag, zero-padded, and the mask.

    Bag ``r`` holds ids ``offsets[r]:offsets[r + 1]``; position ``p`` of the
    output is its ``p``-th id (ids past ``max_len`` are not looked up).

    Returns:
        ``(values, mask)``: float32 ``[R, max_len, D]`` and bool ``[R, max_len]``
        (True where a position holds an id).
    """
    num_bags, dim = offsets.numel() - 1, weights.shape[1]
    bag, position = sequence_positions(offsets, unique_index.numel())
    kept = (position < max_len).nonzero().squeeze(1)
    slot = bag.index_select(0, kept) * max_len + position.index_select(0, kept)
    rows = unique_rows.index_select(0, unique_index.index_select(0, kept))
    values = torch.zeros(num_bags * max_len, dim, dtype=torch.float32,
                         device=weights.device)
    values.index_copy_(0, slot, weights.index_select(0, rows).float())
    lengths = (offsets[1:] - offsets[:-1]).clamp(max=max_len)
    mask = torch.arange(max_len, device=offsets.device) < lengths.unsqueeze(1)
    return values.view(num_bags, max_len, dim), mask


@kernel(do_not_specialize=("max_len",))
def _sequence_lookup_kernel(weights_ptr, rows_ptr, offsets_ptr, out_ptr, mask_ptr,
                            max_len, dim, BLOCK_L: constexpr, BLOCK_D: constexpr):
    bag = tl.program_id(0).to(tl.int64)
    position = tl.program_id(1) * BLOCK_L + tl.arange(0, BLOCK_L)
    cols = tl.arange(0, BLOCK_D)
    start = tl.load(offsets_ptr + bag)
    length = tl.load(offsets_ptr + bag + 1) - start
    inside = position < max_len
    present = inside & (position < length)
    row = tl.load(rows_ptr + start + position, mask=present, other=0)
    for first in range(0, dim, BLOCK_D):
        c = first + cols
        values = tl.load(weights_ptr + row[:, None] * dim + c[None, :],
                         mask=present[:, None] & (c < dim)[None, :], other=0.0)
        tl.store(out_ptr + (bag * max_len + position)[:, None] * dim + c[None, :],
                 values.to(tl.float32), mask=inside[:, None] & (c < dim)[None, :])
    tl.store(mask_ptr + bag * max_len + position, present.to(tl.int8), mask=inside)


_triton = TritonKernels(globals())


def sequence_lookup_triton(weights, unique_rows, unique_index, offsets, max_len):
    ns = _triton.ready()
    num_bags, dim = offsets.numel() - 1, weights.shape[1]
    values = torch.empty(num_bags, max_len, dim, dtype=torch.float32,
                         device=weights.device)
    mask = torch.empty(num_bags, max_len, dtype=torch.int8, device=weights.device)
    if num_bags and max_len and dim:
        rows = unique_rows.index_select(0, unique_index)
        grid = (num_bags, -(-max_len // BLOCK_L))
        ns["_sequence_lookup_kernel"][grid](
            weights.contiguous(), rows, offsets.contiguous(), values, mask, max_len,
            dim, BLOCK_L=BLOCK_L, BLOCK_D=column_block(dim))
    return values, mask.bool()


def sequence_lookup(weights, unique_rows, unique_index, offsets, max_len):
    if use_triton(weights):
        return sequence_lookup_triton(weights, unique_rows, unique_index, offsets,
                                      max_len)
    return sequence_lookup_reference(weights, unique_rows, unique_index, offsets,
                                     max_len)


class SequenceLookup(torch.autograd.Function):
    """Unpooled lookup ``[R, L, D]`` whose backward applies the sparse optimizer.

    Returns the values and the (non-differentiable) bool ``[R, L]`` mask.
    """

    @staticmethod
    def forward(ctx, anchor, weights, unique_rows, unique_index, offsets, max_len,
                apply_row_grads):
        values, mask = sequence_lookup(weights, unique_rows, unique_index, offsets,
                                       max_len)
        ctx.save_for_backward(unique_rows, unique_index, offsets)
        ctx.max_len = max_len
        ctx.apply_row_grads = apply_row_grads
        ctx.mark_non_differentiable(mask)
        return values, mask

    @staticmethod
    def backward(ctx, grad_values, grad_mask):
        unique_rows, unique_index, offsets = ctx.saved_tensors
        max_len = ctx.max_len
        bag, position = sequence_positions(offsets, unique_index.numel())
        inside = position < max_len
        destination = torch.where(inside, bag * max_len + position, 0)
        row_grads = aggregate_row_grads(
            grad_values.reshape(-1, grad_values.shape[-1]), unique_index, destination,
            inside.float(), unique_rows.numel())
        ctx.apply_row_grads(unique_rows, row_grads)
        return (None,) * 7
