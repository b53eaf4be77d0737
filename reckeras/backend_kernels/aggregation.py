"""Backward aggregation: pooled gradients -> one gradient per unique row.

The forward pass keeps, for every id of the batch, its position among the
unique rows (`unique_index`), the output slot its bag writes to
(`destination`) and its pooling scale (`id_weight`). The backward groups
the ids by unique row (a CSR, `group_by`: ids sorted by unique row, plus one
offset per row), so that every row's gradient is one segment sum and no two
writers ever touch one row: no atomics, and a result that does not depend on
scheduling. The pooled forward is the same segment sum with groups = output
slots and sources = table rows.

* Triton (CUDA tensors): `_segment_sum_kernel`. A program sums GROUPS
  segments at once, BLOCK_N ids of each per step, over a block of columns
  (a `[GROUPS, BLOCK_N, BLOCK_D]` tile of gathered rows); BLOCK_N follows
  the mean segment length, so one-hot bags and long sequences both fill the
  tile. Segments much longer than the mean (the hot rows of a Zipf batch)
  are first cut into pieces whose sums a second pass adds, so that no program
  walks a segment thousands of ids long while the others idle.
* torch reference (CPU tensors): the same CSR fed to `embedding_bag` with
  `per_sample_weights`, which is one fused gather + scale + segment sum.
* native CPU kernels (`cpu_native`), where they can be built, for
  `aggregate_row_grads` and `unique_rows`.

Both entry points are torch ops (`reckeras::aggregate_row_grads`,
`reckeras::unique_rows`; `dispatch.register`).

`group_by` avoids the sort when the keys are a permutation (a one-hot
forward: one id per output slot) and otherwise sorts int32 keys, which torch
sorts about twice as fast as int64 on CPU.
"""

from typing import TYPE_CHECKING

import torch

from reckeras import ragged
from reckeras.backend_kernels import cpu_native
from reckeras.backend_kernels.dispatch import constexpr, kernel, next_power_of_2, register

if TYPE_CHECKING:
    # The kernels' `tl`: `dispatch.Kernel.jit` binds it when it jits them, so
    # importing this module imports no triton.
    import triton.language as tl

TILE = 2048           # elements of one program's [GROUPS, BLOCK_N, BLOCK_D] tile
MAX_BLOCK_N = 16      # ids per step of a segment
MAX_GROUPS = 128      # segments per program
PIECE_STEPS = 8       # longest segment (in steps) before it is cut into pieces


def column_block(dim: int) -> int:
    """Columns per program: the whole row up to 256, else blocks of 256.

    Args:
        dim: the row width.

    Returns:
        BLOCK_D, a power of two of at most 256.

    Example:

    ```python
    from reckeras.backend_kernels.aggregation import column_block

    column_block(24), column_block(1000)   # (32, 256)
    ```
    """
    return min(next_power_of_2(dim), 256)


def group_by(keys: torch.Tensor, num_groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The CSR of `keys`: their positions grouped by key.

    Args:
        keys: int64 `[n]`, in `[0, num_groups)`.
        num_groups: the number of groups.

    Returns:
        `(order, offsets)`: the positions of `keys` sorted by key (stable),
        and int64 `[num_groups + 1]` offsets of each key's run in `order`.

    Example:

    ```python
    from reckeras.backend_kernels.aggregation import group_by

    order, offsets = group_by(torch.tensor([2, 0, 2, 1]), 3)
    order     # tensor([1, 3, 0, 2])
    offsets   # tensor([0, 1, 2, 4])
    ```
    """
    counts = torch.bincount(keys, minlength=num_groups)
    if is_permutation(keys, counts):
        # One item per group: the inverse permutation, without a sort.
        every = torch.arange(num_groups + 1, device=keys.device)
        return torch.empty_like(keys).scatter_(0, keys, every[:-1]), every
    return sorted_groups(keys, counts)


def is_permutation(keys: torch.Tensor, counts: torch.Tensor) -> bool:
    """Whether `keys` holds every group once.

    It is checked on CPU tensors only (on CUDA it would be a device sync),
    so it is always False for CUDA tensors.

    Args:
        keys: int64 `[n]` group keys.
        counts: `torch.bincount(keys, minlength=num_groups)`.

    Returns:
        Whether `keys` is a permutation of `range(num_groups)`.

    Example:

    ```python
    from reckeras.backend_kernels.aggregation import is_permutation

    keys = torch.tensor([2, 0, 1])
    is_permutation(keys, torch.bincount(keys, minlength=3))   # True
    ```
    """
    return not keys.is_cuda and keys.numel() == counts.numel() and \
        (not counts.numel() or int(counts.max()) == 1)


def sorted_groups(keys: torch.Tensor,
                  counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`group_by` through a stable sort, given the keys' `bincount`.

    Args:
        keys: int64 `[n]` group keys.
        counts: `torch.bincount(keys, minlength=num_groups)`.

    Returns:
        `(order, offsets)`, as `group_by`.

    Example:

    ```python
    from reckeras.backend_kernels.aggregation import sorted_groups

    keys = torch.tensor([2, 0, 2, 1])
    order, offsets = sorted_groups(keys, torch.bincount(keys, minlength=3))
    ```
    """
    offsets = torch.zeros(counts.numel() + 1, dtype=torch.int64, device=keys.device)
    torch.cumsum(counts, dim=0, out=offsets[1:])
    narrow = keys.int() if counts.numel() < 2**31 else keys
    return torch.sort(narrow, stable=True).indices, offsets


def unit_scale(scale: torch.Tensor) -> torch.Tensor | None:
    """`None` when every scale is 1 (one-hot bags), else `scale` as float32.

    Args:
        scale: float `[n]` scales.

    Returns:
        `None` or float32 `[n]`.

    Example:

    ```python
    from reckeras.backend_kernels.aggregation import unit_scale

    unit_scale(torch.ones(3))                # None
    unit_scale(torch.tensor([1.0, 0.5]))     # tensor([1.0000, 0.5000])
    ```
    """
    if scale.numel():
        low, high = torch.aminmax(scale)
        if float(low) == float(high) == 1.0:
            return None
    return scale.float()


def bag_sums(indices: torch.Tensor, source: torch.Tensor, offsets: torch.Tensor,
             scale: torch.Tensor | None) -> torch.Tensor:
    """Sums of scaled source rows by bag: `embedding_bag`'s fused sum.

    `out[g]` is the sum of `source[indices[j]] * scale[j]` over
    `offsets[g] <= j < offsets[g + 1]`: one fused gather, scale and segment
    sum (`embedding_bag` with `per_sample_weights`).

    Args:
        indices: int64 `[n]`, the source row of every item, bag after bag.
        source: float `[S, D]` rows.
        offsets: int64 `[num_groups + 1]` bag offsets.
        scale: float32 `[n]` scales, or `None` for 1.

    Returns:
        float32 `[num_groups, D]`, zeros for empty groups.

    Example:

    ```python
    from reckeras.backend_kernels.aggregation import bag_sums

    source = torch.arange(6.0).view(3, 2)
    bag_sums(torch.tensor([0, 2, 1]), source, torch.tensor([0, 2, 3]), None)
    # tensor([[4., 6.], [2., 3.]])
    ```
    """
    num_groups = offsets.numel() - 1
    if not indices.numel() or not num_groups:
        return torch.zeros(num_groups, source.shape[1], dtype=torch.float32,
                           device=source.device)
    return torch.nn.functional.embedding_bag(
        indices, source.float().contiguous(), offsets[:-1], mode="sum",
        per_sample_weights=scale)


def segment_sum_reference(source: torch.Tensor, source_row: torch.Tensor,
                          scale: torch.Tensor, order: torch.Tensor,
                          offsets: torch.Tensor) -> torch.Tensor:
    """Per-group sums of scaled source rows, with the torch reference.

    `out[g]` is the sum of `source[source_row[j]] * scale[j]` over the
    items `j` of group `g`.

    Args:
        source: float `[S, D]` rows to gather from.
        source_row: int64 `[n]`, the source row of every item.
        scale: float `[n]`, every item's scale.
        order: the items sorted by group (the CSR of `group_by`).
        offsets: int64 `[num_groups + 1]`, each group's run in `order`.

    Returns:
        float32 `[num_groups, D]`; zeros for empty groups.

    Example:

    ```python
    from reckeras.backend_kernels.aggregation import group_by, segment_sum_reference

    source = torch.arange(6.0).view(3, 2)
    order, offsets = group_by(torch.tensor([1, 0, 1]), 2)   # items' groups
    segment_sum_reference(source, torch.tensor([2, 0, 1]),
                          torch.tensor([1.0, 0.5, 2.0]), order, offsets)
    # tensor([[0.0, 0.5], [8.0, 11.0]])
    ```
    """
    unit_or_scale = unit_scale(scale)
    return bag_sums(source_row.index_select(0, order), source, offsets,
                    None if unit_or_scale is None else unit_or_scale.index_select(0, order))


@kernel
def segment_tile(source_ptr, source_row_ptr, scale_ptr, order_ptr, starts, ends, cols,
                  in_row, dim, INDIRECT: constexpr, BLOCK_N: constexpr,
                  GROUPS: constexpr, BLOCK_D: constexpr):
    """`[GROUPS, BLOCK_D]` float32 sums of the segments `[starts, ends)`.

    INDIRECT: item `j` of a segment is `source[source_row[order[j]]] *
    scale[order[j]]`; else it is `source[j]`.
    """
    acc = tl.full([GROUPS, BLOCK_D], 0.0, tl.float32)
    longest = tl.max(ends - starts, 0)
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
        acc += tl.sum(values.to(tl.float32) * scale[:, :, None], 1)
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
    acc = segment_tile(source_ptr, source_row_ptr, scale_ptr, order_ptr, starts, ends,
                        cols, in_row, dim, INDIRECT, BLOCK_N, GROUPS, BLOCK_D)
    tl.store(out_ptr + groups[:, None] * dim + cols[None, :], acc,
             mask=valid[:, None] & in_row[None, :])


def ids_per_step(num_items: int, num_groups: int) -> int:
    """BLOCK_N: the mean segment length, rounded up to a power of two.

    Args:
        num_items: the number of items in all segments.
        num_groups: the number of segments.

    Returns:
        A power of two of at most `MAX_BLOCK_N`.

    Example:

    ```python
    from reckeras.backend_kernels.aggregation import ids_per_step

    ids_per_step(1000, 100), ids_per_step(100, 100)   # (16, 1)
    ```
    """
    mean = -(-num_items // max(num_groups, 1))
    return min(next_power_of_2(max(mean, 1)), MAX_BLOCK_N)


def groups_per_program(block_n: int, block_d: int) -> int:
    """GROUPS: as many segments as keep a program's tile near `TILE` elements.

    Args:
        block_n: ids per step (BLOCK_N).
        block_d: columns per program (BLOCK_D).

    Returns:
        An int in `[1, MAX_GROUPS]`.

    Example:

    ```python
    from reckeras.backend_kernels.aggregation import groups_per_program

    groups_per_program(1, 16), groups_per_program(16, 256)   # (128, 1)
    ```
    """
    return max(1, min(MAX_GROUPS, TILE // (block_n * block_d)))


def split_segments(
        starts: torch.Tensor, ends: torch.Tensor, block_n: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Cuts segments longer than `PIECE_STEPS * block_n` ids into pieces.

    A program walks its segments in steps of `block_n` ids; pieces bound the
    steps of the longest (a hot row of a Zipf batch) so one program cannot
    hold up the kernel.

    Args:
        starts: int64 `[G]`, where each segment starts.
        ends: int64 `[G]`, where each segment ends (exclusive).
        block_n: ids per step.

    Returns:
        `None` when no segment is that long, else
        `(piece_starts, piece_ends, piece_offsets)`: each segment's pieces
        are `piece_offsets[g]:piece_offsets[g + 1]`.

    Example:

    ```python
    from reckeras.backend_kernels.aggregation import split_segments

    # Pieces of 8 * 4 = 32 ids: the second segment (197 ids) gets 7.
    starts, ends, offsets = split_segments(torch.tensor([0, 3]),
                                           torch.tensor([3, 200]), 4)
    offsets   # tensor([0, 1, 8])
    ```
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


def segment_sums(source: torch.Tensor, source_row: torch.Tensor, scale: torch.Tensor,
                 order: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor,
                 indirect: bool, block_n: int) -> torch.Tensor:
    """The Triton segment sums of `[starts, ends)` (see `_segment_tile`).

    Args:
        source: float `[S, D]` rows (CUDA).
        source_row: int64 `[n]`, the source row of every item (indirect).
        scale: float `[n]`, every item's scale (indirect).
        order: the items sorted by segment (indirect).
        starts: int64 `[G]`, where each segment starts in `order`.
        ends: int64 `[G]`, where each segment ends (exclusive).
        indirect: whether item `j` is `source[source_row[order[j]]] *
            scale[order[j]]`; otherwise it is `source[j]` (the other
            arguments but `source` are then unused).
        block_n: ids per step (see `ids_per_step`).

    Returns:
        float32 `[G, D]`.

    Example:

    ```python
    from reckeras.backend_kernels.aggregation import segment_sums

    source = torch.arange(6.0, device="cuda").view(3, 2)
    bounds = torch.tensor([0, 2, 3], device="cuda")
    segment_sums(source, source, source, source, bounds[:-1], bounds[1:],
                 False, 2)   # rows 0 + 1, then row 2: [[2., 4.], [4., 5.]]
    ```
    """
    num_groups, dim = starts.numel(), source.shape[1]
    out = torch.empty(num_groups, dim, dtype=torch.float32, device=source.device)
    if num_groups and dim:
        block_d = column_block(dim)
        groups = groups_per_program(block_n, block_d)
        grid = (-(-num_groups // groups), -(-dim // block_d))
        _segment_sum_kernel[grid](
            source.contiguous(), source_row.contiguous(), scale.contiguous(),
            order.contiguous(), starts, ends, out, num_groups, dim,
            INDIRECT=indirect, BLOCK_N=block_n, GROUPS=groups, BLOCK_D=block_d)
    return out


def segment_sum_triton(source: torch.Tensor, source_row: torch.Tensor,
                       scale: torch.Tensor, order: torch.Tensor,
                       offsets: torch.Tensor) -> torch.Tensor:
    """`segment_sum_reference` with the Triton kernel (CUDA tensors).

    Segments much longer than the mean are summed in pieces first (see
    `split_segments`).

    Args:
        source: float `[S, D]` rows to gather from.
        source_row: int64 `[n]`, the source row of every item.
        scale: float `[n]`, every item's scale.
        order: the items sorted by group (the CSR of `group_by`).
        offsets: int64 `[num_groups + 1]`, each group's run in `order`.

    Returns:
        float32 `[num_groups, D]`; zeros for empty groups.

    Example:

    ```python
    from reckeras.backend_kernels.aggregation import group_by, segment_sum_triton

    source = torch.arange(6.0, device="cuda").view(3, 2)
    order, offsets = group_by(torch.tensor([1, 0, 1], device="cuda"), 2)
    segment_sum_triton(source, torch.tensor([2, 0, 1], device="cuda"),
                       torch.tensor([1.0, 0.5, 2.0], device="cuda"), order, offsets)
    ```
    """
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


def aggregate_row_grads_reference(grad_out: torch.Tensor, unique_index: torch.Tensor,
                                  destination: torch.Tensor, id_weight: torch.Tensor,
                                  num_unique: int) -> torch.Tensor:
    """`aggregate_row_grads` with the torch reference.

    Args:
        grad_out: `[num_slots, D]` gradient of the pooled output.
        unique_index: int64 `[n]`, each id's position among the unique rows.
        destination: int64 `[n]`, each id's output slot.
        id_weight: float `[n]`, each id's pooling scale.
        num_unique: number of unique rows.

    Returns:
        float32 `[num_unique, D]`.

    Example:

    ```python
    from reckeras.backend_kernels.aggregation import aggregate_row_grads_reference

    grads = aggregate_row_grads_reference(
        torch.ones(2, 4), torch.tensor([0, 1, 0]), torch.tensor([0, 0, 1]),
        torch.ones(3), 2)   # [[2.0] * 4, [1.0] * 4]
    ```
    """
    order, offsets = group_by(unique_index, num_unique)
    return segment_sum_reference(grad_out, destination, id_weight, order, offsets)


def aggregate_row_grads_triton(grad_out: torch.Tensor, unique_index: torch.Tensor,
                               destination: torch.Tensor, id_weight: torch.Tensor,
                               num_unique: int) -> torch.Tensor:
    """`aggregate_row_grads` with the Triton kernel (CUDA tensors).

    Args:
        grad_out: `[num_slots, D]` gradient of the pooled output.
        unique_index: int64 `[n]`, each id's position among the unique rows.
        destination: int64 `[n]`, each id's output slot.
        id_weight: float `[n]`, each id's pooling scale.
        num_unique: number of unique rows.

    Returns:
        float32 `[num_unique, D]`.

    Example:

    ```python
    from reckeras.backend_kernels.aggregation import aggregate_row_grads_triton

    cuda = dict(device="cuda")
    grads = aggregate_row_grads_triton(
        torch.ones(2, 4, **cuda), torch.tensor([0, 1, 0], **cuda),
        torch.tensor([0, 0, 1], **cuda), torch.ones(3, **cuda), 2)
    ```
    """
    order, offsets = group_by(unique_index, num_unique)
    return segment_sum_triton(grad_out, destination, id_weight, order, offsets)


# ---- the torch ops (dispatch.register) ----------------------------------------------

_aggregate_row_grads = register(
    "aggregate_row_grads(Tensor grad_out, Tensor unique_index, Tensor destination, "
    "Tensor id_weight, int num_unique) -> Tensor",
    reference=aggregate_row_grads_reference, triton=aggregate_row_grads_triton,
    native=cpu_native.aggregate,
    native_usable=lambda grad_out, unique_index, destination, id_weight, num_unique:
        cpu_native.usable(grad_out, unique_index, destination, id_weight),
    fake=lambda grad_out, unique_index, destination, id_weight, num_unique:
        grad_out.new_empty((num_unique, grad_out.shape[1]), dtype=torch.float32))


def aggregate_row_grads(grad_out: torch.Tensor, unique_index: torch.Tensor,
                        destination: torch.Tensor, id_weight: torch.Tensor,
                        num_unique: int) -> torch.Tensor:
    """Sums `grad_out[destination[i]] * id_weight[i]` per `unique_index[i]`.

    Runs the Triton kernel on CUDA tensors, the native kernel on CPU tensors
    where it can be built, else the torch reference.

    Args:
        grad_out: `[num_slots, D]` gradient of the pooled output.
        unique_index: int64 `[n]`, each id's position among the unique rows.
        destination: int64 `[n]`, each id's output slot.
        id_weight: float `[n]`, each id's pooling scale.
        num_unique: number of unique rows.

    Returns:
        float32 `[num_unique, D]`.

    Example:

    ```python
    from reckeras.backend_kernels.aggregation import aggregate_row_grads

    # Ids 0 and 2 are row 0 and pool into slots 0 and 1 (scales 1 and 0.5).
    grad_out = torch.tensor([[1.0, 1.0], [10.0, 10.0]])
    aggregate_row_grads(grad_out, torch.tensor([0, 1, 0]), torch.tensor([0, 0, 1]),
                        torch.tensor([1.0, 1.0, 0.5]), 2)
    # tensor([[6., 6.], [1., 1.]])
    ```
    """
    return _aggregate_row_grads(grad_out, unique_index, destination, id_weight, num_unique)


def unique_rows(rows: torch.Tensor, num_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Dedup of row indices by marking, `O(n + num_rows)` with no sort.

    Rows are small dense integers (`0 <= row < num_rows`), so a mark array
    replaces `torch.unique`'s sort, which dominates the CPU step.

    Args:
        rows: int64 `[n]` row indices.
        num_rows: an upper bound of the rows (the table's row count).

    Returns:
        `(unique, unique_index)`: the distinct rows (sorted; in order of
        first appearance with the native CPU kernels) and, for each input,
        its position in `unique`.

    Example:

    ```python
    from reckeras.backend_kernels.aggregation import unique_rows

    unique, index = unique_rows(torch.tensor([5, 2, 5, 7]), 8)
    unique[index]   # tensor([5, 2, 5, 7])
    ```
    """
    return _unique_rows(rows, num_rows)


def unique_rows_reference(rows: torch.Tensor,
                          num_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`unique_rows` with torch ops (CPU without the native kernels, and CUDA).

    Args:
        rows, num_rows: as for `unique_rows`.

    Returns:
        What `unique_rows` returns, the distinct rows sorted.

    Example:

    ```python
    from reckeras.backend_kernels.aggregation import unique_rows_reference

    unique_rows_reference(torch.tensor([5, 2, 5, 7]), 8)   # ([2, 5, 7], [1, 0, 1, 2])
    ```
    """
    size = max(num_rows, 1)
    mark = torch.zeros(size, dtype=torch.bool, device=rows.device)
    mark.index_fill_(0, rows, True)
    unique = mark.nonzero().squeeze(1)
    position = torch.empty(size, dtype=torch.int64, device=rows.device)
    position.index_copy_(0, unique, torch.arange(unique.numel(), device=rows.device))
    return unique, position.index_select(0, rows)


_unique_rows = register(
    "unique_rows(Tensor rows, int num_rows) -> (Tensor, Tensor)",
    reference=unique_rows_reference, native=cpu_native.unique_rows,
    native_usable=lambda rows, num_rows: cpu_native.usable(rows),
    fake=lambda rows, num_rows: (
        rows.new_empty(torch.library.get_ctx().new_dynamic_size()), torch.empty_like(rows)))
