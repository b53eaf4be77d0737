"""Fused feature transforms: one launch per kind over all features at once.

`features.plan.TransformPlan` runs every sparse transform of a batch through
these four entry points. Each takes the values of ALL features of one kind
and the per-feature parameters as small tensors planned once (one entry per
feature), so a batch needs one launch per kind, whatever the number of
features:

* `bucketize(values, boundaries)`: `[F, n]` floats -> the number of
  `boundaries[f]` that are `<= value`; NaN -> the feature's missing bucket,
  one past its last; +inf falls in the last bucket of its feature.
* `cross(columns, members)`: `hashing.hash_combine_reference` of 2 or 3 of
  the `[S, n]` id columns per cross feature.
* `hash_into_buckets(ids, buckets)`: `mix64(id) mod buckets[f]` where
  `buckets[f] > 0`, the id unchanged where it is 0.
* `pack_sequences(flat, lengths, width_offsets, buckets, batch)`: the
  left-aligned `[B, max_len]` rows of all sequence features and their
  lengths -> one packed bag per (feature, example), the positions past each
  row's length dropped and the ids hashed as `hash_into_buckets` does (and
  the rows' per-id weights packed alike).

No id value is reserved: every int64 is an id, and a row's length, never a
padding value, says which positions hold one.

Each is a torch op (`reckeras::bucketize`, ...; `dispatch.register`): CUDA
tensors run the Triton kernels, CPU tensors the torch references; both give
identical integers.
"""

from typing import TYPE_CHECKING

import torch

from reckeras import ragged
from reckeras.backend_kernels.dispatch import blocks, constexpr, kernel, register
from reckeras.backend_kernels.hashing import (
    COMBINE,
    hash_combine_reference,
    mix64_bits,
    mix64_reference,
)

if TYPE_CHECKING:
    # The kernels' `tl`: `dispatch.Kernel.jit` binds it when it jits them, so
    # importing this module imports no triton.
    import triton.language as tl

FLOAT32_MAX = torch.finfo(torch.float32).max
BLOCK = 1024
BLOCK_ROWS = 128           # bucketize: values per program
BLOCK_BOUNDARIES = 16      # bucketize: boundaries per step
BLOCK_L = 128              # sequences: positions per step


# ---- torch references -----------------------------------------------------------

def hash_into_buckets_reference(ids: torch.Tensor, buckets: torch.Tensor) -> torch.Tensor:
    """The torch reference of `hash_into_buckets`: what CPU tensors run.

    Args:
        ids, buckets: as for `hash_into_buckets`.

    Returns:
        What `hash_into_buckets` returns, bit for bit the same on either route.

    Example:

    ```python
    hash_into_buckets_reference(ids, buckets)
    # == hash_into_buckets(ids, buckets)
    ```
    """
    hashed = buckets.nonzero().squeeze(1)        # [F]: a few features, not the ids
    shape = (-1,) + (1,) * (ids.dim() - 1)
    if hashed.numel() == ids.shape[0]:
        return mix64_reference(ids).remainder_(buckets.view(shape))
    modulus = buckets.index_select(0, hashed).view(shape)
    chosen = mix64_reference(ids.index_select(0, hashed)).remainder_(modulus)
    return ids.index_copy(0, hashed, chosen)


def bucketize_reference(values: torch.Tensor, boundaries: torch.Tensor) -> torch.Tensor:
    """The torch reference of `bucketize`: what CPU tensors run.

    Args:
        values, boundaries: as for `bucketize`.

    Returns:
        What `bucketize` returns, bit for bit the same on either route.

    Example:

    ```python
    bucketize_reference(values, boundaries)
    # == bucketize(values, boundaries)
    ```
    """
    # +inf is clamped below the +inf padding of shorter boundary rows.
    buckets = torch.searchsorted(boundaries, values.clamp(max=FLOAT32_MAX).contiguous(),
                                 right=True)
    missing_bucket = (boundaries <= FLOAT32_MAX).sum(dim=1) + 1      # [F]
    shape = (-1,) + (1,) * (values.dim() - 1)
    return torch.where(torch.isnan(values), missing_bucket.view(shape), buckets)


def cross_reference(columns: torch.Tensor, members: torch.Tensor) -> torch.Tensor:
    """The torch reference of `cross`: what CPU tensors run.

    Args:
        columns, members: as for `cross`.

    Returns:
        What `cross` returns, bit for bit the same on either route.

    Example:

    ```python
    cross_reference(columns, members)
    # == cross(columns, members)
    ```
    """
    out = torch.empty(members.shape[0], *columns.shape[1:], dtype=torch.int64,
                      device=columns.device)
    arity = (members >= 0).sum(dim=1)
    for k in (2, 3):                        # a loop over arities, not features
        chosen = (arity == k).nonzero().squeeze(1)
        if chosen.numel():
            picked = columns[members[chosen, :k]]        # [c, k, ...]
            out[chosen] = hash_combine_reference(picked.transpose(0, 1))
    return out


def pack_sequences_reference(flat: torch.Tensor, lengths: torch.Tensor,
                             width_offsets: torch.Tensor, buckets: torch.Tensor,
                             batch: int, weights: torch.Tensor | None = None
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The torch reference of `pack_sequences`: what CPU tensors run.

    Args:
        flat, lengths, width_offsets, buckets, batch, weights: as for
            `pack_sequences`.

    Returns:
        What `pack_sequences` returns, bit for bit the same on either route.

    Example:

    ```python
    pack_sequences_reference(flat, lengths, width_offsets, buckets, batch)
    # == pack_sequences(flat, lengths, width_offsets, buckets, batch)
    ```
    """
    widths = (width_offsets[1:] - width_offsets[:-1]).repeat_interleave(batch)
    row_starts = ragged.lengths_to_offsets(widths)
    # The position of every element in its row, against the row's length.
    position = torch.arange(flat.numel(), device=flat.device) \
        - row_starts[:-1].repeat_interleave(widths, output_size=flat.numel())
    present = position < lengths.repeat_interleave(widths, output_size=flat.numel())
    ids = flat[present]
    offsets = ragged.lengths_to_offsets(lengths)
    if bool((buckets > 0).any()):               # [F]: a few features, not the ids
        feature_ids = offsets[::batch].diff() if batch else torch.zeros_like(buckets)
        modulus = buckets.repeat_interleave(feature_ids, output_size=ids.numel())
        ids = torch.where(modulus > 0,
                          mix64_reference(ids).remainder_(modulus.clamp(min=1)), ids)
    return ids, offsets, None if weights is None else weights[present]


# ---- Triton kernels -----------------------------------------------------------------

@kernel
def _into_buckets(ids, buckets):
    modulus = tl.maximum(buckets, 1)
    hashed = mix64_bits(ids) % modulus
    hashed = tl.where(hashed < 0, hashed + modulus, hashed)   # floor, not C, mod
    return tl.where(buckets > 0, hashed, ids)


@kernel(do_not_specialize=("per_feature", "total"))
def _hash_into_buckets_kernel(ids_ptr, buckets_ptr, out_ptr, per_feature, total,
                              BLOCK: constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = offs < total
    ids = tl.load(ids_ptr + offs, mask=live, other=0)
    buckets = tl.load(buckets_ptr + offs // per_feature, mask=live, other=0)
    tl.store(out_ptr + offs, _into_buckets(ids, buckets), mask=live)


@kernel(do_not_specialize=("per_feature", "total", "width"))
def _bucketize_kernel(values_ptr, boundaries_ptr, out_ptr, per_feature, total, width,
                      BLOCK_ROWS: constexpr, BLOCK_BOUNDARIES: constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    live = offs < total
    value = tl.load(values_ptr + offs, mask=live, other=0.0)
    finite = tl.where(value > FLOAT32_MAX, FLOAT32_MAX, value)   # NaN stays NaN
    row = (offs // per_feature) * width
    count = tl.full([BLOCK_ROWS], 0, tl.int64)
    real = tl.full([BLOCK_ROWS], 0, tl.int64)          # boundaries that are not padding
    for first in range(0, width, BLOCK_BOUNDARIES):
        k = first + tl.arange(0, BLOCK_BOUNDARIES)
        valid = live[:, None] & (k < width)[None, :]
        bound = tl.load(boundaries_ptr + row[:, None] + k[None, :], mask=valid,
                        other=float("inf"))
        count += tl.sum((valid & (bound <= finite[:, None])).to(tl.int64), 1)
        real += tl.sum((bound <= FLOAT32_MAX).to(tl.int64), 1)
    count = tl.where(value != value, real + 1, count)             # NaN: missing bucket
    tl.store(out_ptr + offs, count, mask=live)


@kernel(do_not_specialize=("n", "total"))
def _cross_kernel(columns_ptr, members_ptr, out_ptr, n, total, BLOCK: constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = offs < total
    feature = offs // n
    item = offs - feature * n
    first = tl.load(members_ptr + feature * 3, mask=live, other=0)
    second = tl.load(members_ptr + feature * 3 + 1, mask=live, other=0)
    third = tl.load(members_ptr + feature * 3 + 2, mask=live, other=-1)
    h = mix64_bits(tl.load(columns_ptr + first * n + item, mask=live, other=0))
    h = mix64_bits(h * COMBINE + tl.load(columns_ptr + second * n + item, mask=live,
                                           other=0))
    has_third = live & (third >= 0)
    last = tl.load(columns_ptr + third * n + item, mask=has_third, other=0)
    h = tl.where(has_third, mix64_bits(h * COMBINE + last), h)
    tl.store(out_ptr + offs, h, mask=live)


@kernel
def _sequence_row(width_offsets_ptr, row, batch):
    """Feature, first position in `flat` and width of padded row `row`."""
    feature = row // batch
    first_column = tl.load(width_offsets_ptr + feature)
    width = tl.load(width_offsets_ptr + feature + 1) - first_column
    return feature, batch * first_column + (row - feature * batch) * width, width


@kernel(do_not_specialize=("batch",))
def _pack_sequences_kernel(flat_ptr, lengths_ptr, width_offsets_ptr, buckets_ptr,
                           offsets_ptr, out_ptr, weights_ptr, weights_out_ptr, batch,
                           HAS_WEIGHTS: constexpr, BLOCK_L: constexpr):
    row = tl.program_id(0).to(tl.int64)
    feature, start, _ = _sequence_row(width_offsets_ptr, row, batch)
    buckets = tl.load(buckets_ptr + feature)
    length = tl.load(lengths_ptr + row)
    destination = tl.load(offsets_ptr + row)
    for first in range(0, length, BLOCK_L):
        position = first + tl.arange(0, BLOCK_L)
        present = position < length
        value = tl.load(flat_ptr + start + position, mask=present, other=0)
        tl.store(out_ptr + destination + position, _into_buckets(value, buckets),
                 mask=present)
        if HAS_WEIGHTS:
            weight = tl.load(weights_ptr + start + position, mask=present, other=0.0)
            tl.store(weights_out_ptr + destination + position, weight, mask=present)


def hash_into_buckets_triton(ids: torch.Tensor, buckets: torch.Tensor) -> torch.Tensor:
    """The Triton kernel of `hash_into_buckets`: what CUDA tensors run.

    Args:
        ids, buckets: as for `hash_into_buckets`.

    Returns:
        What `hash_into_buckets` returns, bit for bit the same on either route.

    Example:

    ```python
    hash_into_buckets_triton(ids, buckets)
    # == hash_into_buckets(ids, buckets)
    ```
    """
    flat = ids.contiguous().view(-1)
    out = torch.empty_like(flat)
    if flat.numel():
        per_feature = flat.numel() // ids.shape[0]
        _hash_into_buckets_kernel[(blocks(flat.numel(), BLOCK),)](
            flat, buckets.contiguous(), out, per_feature, flat.numel(), BLOCK=BLOCK)
    return out.view(ids.shape)


def bucketize_triton(values: torch.Tensor, boundaries: torch.Tensor) -> torch.Tensor:
    """The Triton kernel of `bucketize`: what CUDA tensors run.

    Args:
        values, boundaries: as for `bucketize`.

    Returns:
        What `bucketize` returns, bit for bit the same on either route.

    Example:

    ```python
    bucketize_triton(values, boundaries)
    # == bucketize(values, boundaries)
    ```
    """
    flat = values.contiguous().view(-1)
    out = torch.empty(flat.shape, dtype=torch.int64, device=values.device)
    if flat.numel():
        per_feature = flat.numel() // values.shape[0]
        _bucketize_kernel[(blocks(flat.numel(), BLOCK_ROWS),)](
            flat, boundaries.contiguous(), out, per_feature, flat.numel(),
            boundaries.shape[1], BLOCK_ROWS=BLOCK_ROWS, BLOCK_BOUNDARIES=BLOCK_BOUNDARIES)
    return out.view(values.shape)


def cross_triton(columns: torch.Tensor, members: torch.Tensor) -> torch.Tensor:
    """The Triton kernel of `cross`: what CUDA tensors run.

    Args:
        columns, members: as for `cross`.

    Returns:
        What `cross` returns, bit for bit the same on either route.

    Example:

    ```python
    cross_triton(columns, members)
    # == cross(columns, members)
    ```
    """
    flat = columns.contiguous().view(columns.shape[0], -1)
    n = flat.shape[1]
    out = torch.empty(members.shape[0], n, dtype=torch.int64, device=columns.device)
    if out.numel():
        _cross_kernel[(blocks(out.numel(), BLOCK),)](
            flat, members.contiguous(), out, n, out.numel(), BLOCK=BLOCK)
    return out.view(members.shape[0], *columns.shape[1:])


def pack_sequences_triton(flat: torch.Tensor, lengths: torch.Tensor,
                          width_offsets: torch.Tensor, buckets: torch.Tensor,
                          batch: int, weights: torch.Tensor | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """`pack_sequences` on CUDA tensors: one program per row.

    Args:
        flat, lengths, width_offsets, buckets, batch, weights: as for
            `pack_sequences`.

    Returns:
        What `pack_sequences` returns, bit for bit the same on either route.

    Example:

    ```python
    pack_sequences_triton(flat, lengths, width_offsets, buckets, batch)
    # == pack_sequences(flat, lengths, width_offsets, buckets, batch)
    ```
    """
    flat, lengths = flat.contiguous(), lengths.contiguous()
    offsets = ragged.lengths_to_offsets(lengths)
    values = torch.empty(int(offsets[-1]), dtype=torch.int64, device=flat.device)
    packed_weights = None if weights is None else \
        torch.empty(values.numel(), dtype=weights.dtype, device=flat.device)
    if values.numel():
        _pack_sequences_kernel[(lengths.numel(),)](
            flat, lengths, width_offsets.contiguous(), buckets.contiguous(), offsets,
            values, flat if weights is None else weights.contiguous(),
            values if weights is None else packed_weights, batch,
            HAS_WEIGHTS=weights is not None, BLOCK_L=BLOCK_L)
    return values, offsets, packed_weights


# ---- the torch ops (dispatch.register) ----------------------------------------------

def _packed_fake(flat, lengths, width_offsets, buckets, batch, weights):
    ids = flat.new_empty(torch.library.get_ctx().new_dynamic_size())
    return (ids, lengths.new_empty(lengths.shape[0] + 1),
            None if weights is None else weights.new_empty(ids.shape))


_hash_into_buckets = register(
    "hash_into_buckets(Tensor ids, Tensor buckets) -> Tensor",
    reference=hash_into_buckets_reference, triton=hash_into_buckets_triton,
    fake=lambda ids, buckets: torch.empty_like(ids))
_bucketize = register(
    "bucketize(Tensor values, Tensor boundaries) -> Tensor",
    reference=bucketize_reference, triton=bucketize_triton,
    fake=lambda values, boundaries: torch.empty_like(values, dtype=torch.int64))
_cross = register(
    "cross(Tensor columns, Tensor members) -> Tensor",
    reference=cross_reference, triton=cross_triton,
    fake=lambda columns, members: columns.new_empty((members.shape[0],
                                                     *columns.shape[1:])))
_pack_sequences = register(
    "pack_sequences(Tensor flat, Tensor lengths, Tensor width_offsets, Tensor buckets, "
    "int batch, Tensor? weights) -> (Tensor, Tensor, Tensor?)",
    reference=pack_sequences_reference, triton=pack_sequences_triton, fake=_packed_fake)


# ---- public entry points -------------------------------------------------------------

def hash_into_buckets(ids: torch.Tensor, buckets: torch.Tensor) -> torch.Tensor:
    """Hashes the ids of every feature into its own number of buckets.

    Args:
        ids: int64 `[F, ...]`, the ids of feature `f` in row `f`.
        buckets: int64 `[F]`, the bucket count of every feature; 0 keeps
            its ids unchanged.

    Returns:
        int64 like `ids`: `mix64(id) mod buckets[f]` (a floor mod, in
        `[0, buckets[f])`, for any int64 id) where `buckets[f] > 0`.

    Example:

    ```python
    ids = torch.tensor([[5, -1], [5, -1]])
    hash_into_buckets(ids, torch.tensor([0, 10]))   # [[5, -1], [h5, h-1]], h in [0, 10)
    ```
    """
    return _hash_into_buckets(ids, buckets)


def bucketize(values: torch.Tensor, boundaries: torch.Tensor) -> torch.Tensor:
    """Bucketizes the values of every feature by its own sorted boundaries.

    Args:
        values: float32 `[F, ...]`, the values of feature `f` in row `f`.
        boundaries: float32 `[F, W]`, the strictly increasing finite
            boundaries of every feature, padded with +inf to the longest.

    Returns:
        int64 like `values`: the number of boundaries of the feature that
        are `<= value` (`torch.searchsorted(..., right=True)`), so
        `len(boundaries[f]) + 1` buckets; +inf is in the last one, -inf in
        bucket 0 and NaN in the missing bucket `len(boundaries[f]) + 1`.

    Example:

    ```python
    boundaries = torch.tensor([[0.0, 1.0], [5.0, float("inf")]])
    bucketize(torch.tensor([[-3.0, 1.0], [float("nan"), float("inf")]]), boundaries)
    # [[0, 2], [2, 1]]
    ```
    """
    return _bucketize(values, boundaries)


def cross(columns: torch.Tensor, members: torch.Tensor) -> torch.Tensor:
    """The crossed ids of several cross features at once.

    Args:
        columns: int64 `[S, ...]`, the id columns the crosses read.
        members: int64 `[C, 3]`, the rows of `columns` crossed by every
            cross feature, -1 after the second for a cross of 2.

    Returns:
        int64 `[C, ...]`: `hashing.hash_combine_reference` of the members of
        every cross feature, in their order.

    Example:

    ```python
    columns = torch.tensor([[1, 2], [3, 4], [5, 6]])
    cross(columns, torch.tensor([[0, 2, -1], [2, 1, 0]]))
    # [hash_combine_reference(columns[[0, 2]]),
    #  hash_combine_reference(columns[[2, 1, 0]])]
    ```
    """
    return _cross(columns, members)


def pack_sequences(flat: torch.Tensor, lengths: torch.Tensor, width_offsets: torch.Tensor,
                   buckets: torch.Tensor, batch: int, weights: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Packs the left-aligned rows of several sequence features into bags.

    Feature `f` holds `batch` rows of `w_f` positions; row `r` holds ids at
    its first `lengths[r]` positions, and whatever the others hold is not
    read (no id value is reserved). The features' `[batch, w_f]` blocks are
    flattened and concatenated, feature after feature, into `flat`.

    Args:
        flat: int64 `[batch * sum(w_f)]`, the rows of all features.
        lengths: int64 `[F * batch]`, the length of every row, each in
            `[0, w_f]` (the caller checks).
        width_offsets: int64 `[F + 1]`, `w_f = width_offsets[f + 1] -
            width_offsets[f]` (so the block of feature `f` starts at
            `batch * width_offsets[f]`).
        buckets: int64 `[F]`, as for `hash_into_buckets`.
        batch: rows per feature.
        weights: float32 like `flat`, a weight per position, or None.

    Returns:
        `(values, offsets, packed_weights)`: int64 `[N]`, the first
        `lengths[r]` ids of every row, in order, hashed as
        `hash_into_buckets` does; int64 `[F * batch + 1]` offsets (bag
        `f * batch + b`, row `b` of feature `f`, holds
        `values[offsets[f * batch + b]:offsets[f * batch + b + 1]]`); and
        the weights of those positions (None without `weights`).

    Example:

    ```python
    # Feature 0: rows of width 2; feature 1: rows of width 3; batch 2.
    flat = torch.tensor([4, 5, 0, 0,   7, 0, 0, 8, 9, -6])
    values, offsets, _ = pack_sequences(flat, torch.tensor([2, 0, 1, 3]),
                                        torch.tensor([0, 2, 5]),
                                        torch.tensor([0, 0]), batch=2)
    # values [4, 5, 7, 8, 9, -6], offsets [0, 2, 2, 3, 6]
    ```
    """
    return _pack_sequences(flat, lengths, width_offsets, buckets, batch, weights)
