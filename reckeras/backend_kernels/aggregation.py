"""Backward aggregation: pooled gradients -> one gradient per unique row.

The forward pass keeps, for every id of the batch, its position among the
unique rows (``unique_index``), the output slot its bag writes to
(``destination``) and its pooling scale (``id_weight``). The backward groups
the ids by unique row (a CSR, ``group_by``: ids sorted by unique row, plus one
offset per row), so that every row's gradient is one segment sum and no two
writers ever touch one row: no atomics, and a result that does not depend on
scheduling. The pooled forward is the same segment sum with groups = output
slots and sources = table rows.

* Triton (CUDA tensors): ``_segment_sum_kernel``. A program sums GROUPS
  segments at once, BLOCK_N ids of each per step, over a block of columns
  (a ``[GROUPS, BLOCK_N, BLOCK_D]`` tile of gathered rows); BLOCK_N follows
  the mean segment length, so one-hot bags and long sequences both fill the
  tile. Segments much longer than the mean (the hot rows of a Zipf batch)
  are first cut into pieces whose sums a second pass adds, so that no program
  walks a segment thousands of ids long while the others idle.
* torch reference (CPU tensors): the same CSR fed to ``embedding_bag`` with
  ``per_sample_weights``, which is one fused gather + scale + segment sum.

``group_by`` avoids the sort when the keys are a permutation (a one-hot
forward: one id per output slot) and otherwise sorts int32 keys, which torch
sorts about twice as fast as int64 on CPU.
"""

import torch

from reckeras import ragged
from reckeras.backend_kernels.dispatch import (TritonKernels, constexpr, kernel,
                                               next_power_of_2, reduce_max, reduce_sum,
                                               use_native, use_triton)

TILE = 2048           # elements of one program's [GROUPS, BLOCK_N, BLOCK_D] tile
MAX_BLOCK_N = 16      # ids per step of a segment
MAX_GROUPS = 128      # segments per program
PIECE_STEPS = 8       # longest segment (in steps) before it is cut into pieces


def column_block(dim):
    """Columns per program: the whole row up to 256, else blocks of 256."""
    return min(next_power_of_2(dim), 256)


def group_by(keys, num_groups):
    """CSR of ``keys`` (int64 in ``[0, num_groups)``).

    Returns:
        ``(order, offsets)``: the positions of ``keys`` sorted by key (stable),
        and int64 ``[num_groups + 1]`` offsets of each key's run in ``order``.
    """
    counts = torch.bincount(keys, minlength=num_groups)
    if is_permutation(keys, counts):
        # One item per group: the inverse permutation, without a sort.
        every = torch.arange(num_groups + 1, device=keys.device)
        return torch.empty_like(keys).scatter_(0, keys, every[:-1]), every
    return sorted_groups(keys, counts)


def is_permutation(keys, counts):
    """Whether ``keys`` holds every group once (checked on CPU only: a sync)."""
    return not keys.is_cuda and keys.numel() == counts.numel() and \
        (not counts.numel() or int(counts.max()) == 1)


def sorted_groups(keys, counts):
    """``group_by`` through a stable sort, given the keys' ``bincount``."""
    offsets = torch.zeros(counts.numel() + 1, dtype=torch.int64, device=keys.device)
    torch.cumsum(counts, dim=0, out=offsets[1:])
    narrow = keys.int() if counts.numel() < 2**31 else keys
    return torch.sort(narrow, stable=True).indices, offsets


def unit_scale(scale):
    """None when every scale is 1 (one-hot bags), else ``scale`` as float32."""
    if scale.numel():
        low, high = torch.aminmax(scale)
        if float(low) == float(high) == 1.0:
            return None
    return scale.float()


def bag_sums(indices, source, offsets, scale):
    """``out[g] = sum of source[indices[j]] * scale[j], offsets[g] <= j < offsets[g + 1]``.

    ``embedding_bag`` (sum, ``per_sample_weights``): one fused gather, scale and
    segment sum. ``scale`` None means 1. Returns float32 ``[num_groups, D]``,
    zeros for empty groups.
    """
    num_groups = offsets.numel() - 1
    if not indices.numel() or not num_groups:
        return torch.zeros(num_groups, source.shape[1], dtype=torch.float32,
                           device=source.device)
    return torch.nn.functional.embedding_bag(
        indices, source.float().contiguous(), offsets[:-1], mode="sum",
        per_sample_weights=scale)


def segment_sum_reference(source, source_row, scale, order, offsets):
    """``out[g] = sum over j in group g of source[source_row[j]] * scale[j]``.

    Args:
        source: float ``[S, D]`` rows to gather from.
        source_row: int64 ``[n]``, the source row of every item.
        scale: float ``[n]``, every item's scale.
        order, offsets: the CSR of the items' groups (see ``group_by``).

    Returns:
        float32 ``[num_groups, D]``; zeros for empty groups.
    """
    scale = unit_scale(scale)
    return bag_sums(source_row.index_select(0, order), source, offsets,
                    None if scale is None else scale.index_select(0, order))


@kernel
def _segment_tile(source_ptr, source_row_ptr, scale_ptr, order_ptr, starts, ends, cols,
                  in_row, dim, INDIRECT: constexpr, BLOCK_N: constexpr,
                  GROUPS: constexpr, BLOCK_D: constexpr):
    """``[GROUPS, BLOCK_D]`` float32 sums of the segments ``[starts, ends)``.

    INDIRECT: item ``j`` of a segment is ``source[source_row[order[j]]] *
    scale[order[j]]``; else it is ``source[j]``.
    """
    acc = tl.full([GROUPS, BLOCK_D], 0.0, tl.float32)
    longest = reduce_max(ends - starts, 0)
    for first in range(0, longest, BLOCK_N):
        j = starts[:, None] + first + tl.arange(0, BLOCK_N)[None, :]
        live = j < ends[:, None]
        if INDIRECT:
            item = tl.load(order_ptr + j, mask=live, other=0)
            row = tl.load(source_row_ptr + item, mask=live, other=0)
            scale = tl.load(scale_ptr + item, mask=live, other=0.0).to(tl.float32)
        else:
            row = j
            scale = live.to(tl.float32)
        values = tl.load(source_ptr + row[:, :, None] * dim + cols[None, None, :],
                         mask=live[:, :, None] & in_row[None, None, :], other=0.0)
        acc += reduce_sum(values.to(tl.float32) * scale[:, :, None], 1)
    return acc


@kernel(do_not_specialize=("num_groups",))
def _segment_sum_kernel(source_ptr, source_row_ptr, scale_ptr, order_ptr, starts_ptr,
                        ends_ptr, out_ptr, num_groups, dim, INDIRECT: constexpr,
                        BLOCK_N: constexpr, GROUPS: constexpr, BLOCK_D: constexpr):
    groups = tl.program_id(0).to(tl.int64) * GROUPS + tl.arange(0, GROUPS)
    valid = groups < num_groups
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    in_row = cols < dim
    starts = tl.load(starts_ptr + groups, mask=valid, other=0)
    ends = tl.load(ends_ptr + groups, mask=valid, other=0)
    acc = _segment_tile(source_ptr, source_row_ptr, scale_ptr, order_ptr, starts, ends,
                        cols, in_row, dim, INDIRECT, BLOCK_N, GROUPS, BLOCK_D)
    tl.store(out_ptr + groups[:, None] * dim + cols[None, :], acc,
             mask=valid[:, None] & in_row[None, :])


_triton = TritonKernels(globals())


def ids_per_step(num_items, num_groups):
    """BLOCK_N: the mean segment length, rounded up to a power of two."""
    mean = -(-num_items // max(num_groups, 1))
    return min(next_power_of_2(max(mean, 1)), MAX_BLOCK_N)


def groups_per_program(block_n, block_d):
    """GROUPS: as many segments as keep a program's tile near TILE elements."""
    return max(1, min(MAX_GROUPS, TILE // (block_n * block_d)))


def split_segments(starts, ends, block_n):
    """Cuts segments longer than ``PIECE_STEPS * block_n`` ids into pieces.

    A program walks its segments in steps of ``block_n`` ids; pieces bound the
    steps of the longest (a hot row of a Zipf batch) so one program cannot
    hold up the kernel. Returns None when no segment is that long, else
    ``(piece_starts, piece_ends, piece_offsets)``: each segment's pieces are
    ``piece_offsets[g]:piece_offsets[g + 1]``.
    """
    piece = PIECE_STEPS * block_n
    lengths = ends - starts
    if not lengths.numel() or int(lengths.max()) <= piece:
        return None
    pieces = ((lengths + piece - 1) // piece).clamp(min=1)
    piece_offsets = ragged.lengths_to_offsets(pieces)
    total = int(piece_offsets[-1])
    group = torch.repeat_interleave(torch.arange(lengths.numel(), device=starts.device),
                                    pieces, output_size=total)
    rank = torch.arange(total, device=starts.device) - piece_offsets.index_select(0, group)
    piece_starts = starts.index_select(0, group) + rank * piece
    piece_ends = torch.minimum(piece_starts + piece, ends.index_select(0, group))
    return piece_starts, piece_ends, piece_offsets


def segment_sums(source, source_row, scale, order, starts, ends, indirect, block_n):
    """The Triton segment sums of ``[starts, ends)`` (see ``_segment_tile``)."""
    num_groups, dim = starts.numel(), source.shape[1]
    out = torch.empty(num_groups, dim, dtype=torch.float32, device=source.device)
    if num_groups and dim:
        block_d = column_block(dim)
        groups = groups_per_program(block_n, block_d)
        grid = (-(-num_groups // groups), -(-dim // block_d))
        ns = _triton.ready()
        ns["_segment_sum_kernel"][grid](
            source.contiguous(), source_row.contiguous(), scale.contiguous(),
            order.contiguous(), starts, ends, out, num_groups, dim,
            INDIRECT=indirect, BLOCK_N=block_n, GROUPS=groups, BLOCK_D=block_d)
    return out


def segment_sum_triton(source, source_row, scale, order, offsets):
    starts, ends = offsets[:-1], offsets[1:]
    block_n = ids_per_step(order.numel(), starts.numel())
    pieces = split_segments(starts, ends, block_n)
    if pieces is None:
        return segment_sums(source, source_row, scale, order, starts, ends, True,
                            block_n)
    piece_starts, piece_ends, piece_offsets = pieces
    partial = segment_sums(source, source_row, scale, order, piece_starts, piece_ends,
                           True, block_n)
    return segment_sums(partial, partial, partial, partial, piece_offsets[:-1],
                        piece_offsets[1:], False, MAX_BLOCK_N)


def aggregate_row_grads_reference(grad_out, unique_index, destination, id_weight,
                                  num_unique):
    order, offsets = group_by(unique_index, num_unique)
    return segment_sum_reference(grad_out, destination, id_weight, order, offsets)


def aggregate_row_grads_triton(grad_out, unique_index, destination, id_weight,
                               num_unique):
    order, offsets = group_by(unique_index, num_unique)
    return segment_sum_triton(grad_out, destination, id_weight, order, offsets)


def aggregate_row_grads(grad_out, unique_index, destination, id_weight,
                        num_unique):
    """Sums ``grad_out[destination[i]] * id_weight[i]`` per ``unique_index[i]``.

    Args:
        grad_out: ``[num_slots, D]`` gradient of the pooled output.
        unique_index: int64 ``[n]``, each id's position among the unique rows.
        destination: int64 ``[n]``, each id's output slot.
        id_weight: float ``[n]``, each id's pooling scale.
        num_unique: number of unique rows.

    Returns:
        float32 ``[num_unique, D]``.
    """
    if use_native(grad_out, unique_index, destination, id_weight):
        from reckeras.backend_kernels import cpu_native
        return cpu_native.aggregate(grad_out, unique_index, destination, id_weight,
                                    num_unique)
    fn = aggregate_row_grads_triton if use_triton(grad_out) \
        else aggregate_row_grads_reference
    return fn(grad_out, unique_index, destination, id_weight, num_unique)


def unique_rows(rows, num_rows):
    """Dedup of row indices by marking, ``O(n + num_rows)`` with no sort.

    Rows are small dense integers (``0 <= row < num_rows``), so a mark array
    replaces ``torch.unique``'s sort, which dominates the CPU step.

    Returns:
        ``(unique, unique_index)``: the distinct rows (sorted; in order of
        first appearance with the native CPU kernels) and, for each input,
        its position in ``unique``.
    """
    if use_native(rows):
        from reckeras.backend_kernels import cpu_native
        return cpu_native.unique_rows(rows, num_rows)
    size = max(num_rows, 1)
    mark = torch.zeros(size, dtype=torch.bool, device=rows.device)
    mark.index_fill_(0, rows, True)
    unique = mark.nonzero().squeeze(1)
    position = torch.empty(size, dtype=torch.int64, device=rows.device)
    position.index_copy_(0, unique, torch.arange(unique.numel(), device=rows.device))
    return unique, position.index_select(0, rows)
