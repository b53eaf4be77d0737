"""Fused feature transforms: one launch per kind over all features at once.

Every function takes the values of ALL features of one kind stacked on dim 0
(``[F, n]``: feature-major, as ``features.plan`` builds them) and the
per-feature parameters as small tensors (one row per feature), so a batch
needs one launch per kind, whatever the number of features:

* ``hash_into_buckets(ids, buckets)``: ``mix64(id) mod buckets[f]`` where
  ``buckets[f] > 0``, the id unchanged where it is 0.
* ``bucketize(values, boundaries)``: the number of ``boundaries[f]`` that are
  ``<= value`` (``torch.searchsorted(..., right=True)``); rows of
  ``boundaries`` are padded with +inf; NaN -> ``MISSING_ID``.
* ``cross(columns, members)``: ``hash_combine`` of 2 or 3 columns per cross
  feature; ``members[c]`` holds the column indices, -1 past the arity.
* Sequences, as packed bags (``values`` + ``[R + 1]`` offsets, bag ``r``
  of feature ``r // batch``): ``pack_padded`` (``[R, L]`` padded rows -> bags,
  dropping the pad value wherever it is), ``cutoff`` (keep the last
  ``max_len[f]`` ids of every bag: the most recent behaviour) and ``pad``
  (bags -> ``[R, width]`` left-aligned rows).

Triton kernels on CUDA tensors, the torch references elsewhere; both give
identical integers.
"""

import torch

from reckeras import ragged
from reckeras.backend_kernels.dispatch import (TritonKernels, blocks, constexpr,
                                               cumulative_sum, kernel, reduce_sum,
                                               use_triton)
from reckeras.backend_kernels.hashing import (COMBINE, _mix64_bits,
                                              hash_combine_reference, mix64_reference)

MISSING_ID = -1
BLOCK = 1024
BLOCK_ROWS = 128           # bucketize: values per program
BLOCK_BOUNDARIES = 16      # bucketize: boundaries per step
BLOCK_L = 128              # sequences: positions per step


# ---- torch references ---------------------------------------------------------------

def hash_into_buckets_reference(ids, buckets):
    buckets = buckets.view(-1, *([1] * (ids.dim() - 1)))
    hashed = mix64_reference(ids).remainder_(buckets.clamp(min=1))
    if bool((buckets > 0).all()):           # a small tensor: every feature hashes
        return hashed
    return torch.where(buckets > 0, hashed, ids)


def bucketize_reference(values, boundaries):
    buckets = torch.searchsorted(boundaries, values.contiguous(), right=True)
    return torch.where(torch.isnan(values), MISSING_ID, buckets)


def cross_reference(columns, members):
    out = torch.empty(members.shape[0], *columns.shape[1:], dtype=torch.int64,
                      device=columns.device)
    arity = (members >= 0).sum(dim=1)
    for k in (2, 3):                        # a loop over arities, not features
        chosen = (arity == k).nonzero().squeeze(1)
        if chosen.numel():
            picked = columns[members[chosen, :k]]        # [c, k, ...]
            out[chosen] = hash_combine_reference(picked.transpose(0, 1))
    return out


def pack_padded_reference(padded, pad_value=MISSING_ID):
    present = padded != pad_value
    values = padded[present]
    return values, ragged.lengths_to_offsets(present.sum(dim=1))


def _bag_lengths(offsets):
    return offsets[1:] - offsets[:-1]


def cutoff_reference(values, offsets, max_len, batch):
    lengths = _bag_lengths(offsets)
    limit = max_len.repeat_interleave(batch) if batch else max_len[:0]
    kept = torch.minimum(lengths, limit)
    new_offsets = ragged.lengths_to_offsets(kept)
    bag, position = _positions(offsets, values.numel())
    keep = (position >= lengths.index_select(0, bag) - kept.index_select(0, bag))
    return values[keep], new_offsets


def pad_reference(values, offsets, width, pad_value=MISSING_ID):
    num_bags = offsets.numel() - 1
    out = torch.full((num_bags, width), pad_value, dtype=values.dtype,
                     device=values.device)
    bag, position = _positions(offsets, values.numel())
    inside = (position < width).nonzero().squeeze(1)
    out.view(-1)[bag[inside] * width + position[inside]] = values[inside]
    return out


def _positions(offsets, num_ids):
    bag = ragged.bag_of_ids(offsets, num_ids)
    return bag, torch.arange(num_ids, device=offsets.device) - offsets[bag]


# ---- Triton kernels ------------------------------------------------------------------

@kernel(do_not_specialize=("per_feature", "total"))
def _hash_into_buckets_kernel(ids_ptr, buckets_ptr, out_ptr, per_feature, total,
                              BLOCK: constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = offs < total
    ids = tl.load(ids_ptr + offs, mask=live, other=0)
    buckets = tl.load(buckets_ptr + offs // per_feature, mask=live, other=0)
    modulus = tl.maximum(buckets, 1)
    hashed = _mix64_bits(ids) % modulus
    hashed = tl.where(hashed < 0, hashed + modulus, hashed)   # floor, not C, mod
    tl.store(out_ptr + offs, tl.where(buckets > 0, hashed, ids), mask=live)


@kernel(do_not_specialize=("per_feature", "total", "width"))
def _bucketize_kernel(values_ptr, boundaries_ptr, out_ptr, per_feature, total, width,
                      BLOCK_ROWS: constexpr, BLOCK_BOUNDARIES: constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    live = offs < total
    value = tl.load(values_ptr + offs, mask=live, other=0.0)
    row = (offs // per_feature) * width
    count = tl.full([BLOCK_ROWS], 0, tl.int64)
    for first in range(0, width, BLOCK_BOUNDARIES):
        k = first + tl.arange(0, BLOCK_BOUNDARIES)
        valid = live[:, None] & (k < width)[None, :]
        bound = tl.load(boundaries_ptr + row[:, None] + k[None, :], mask=valid, other=0.0)
        count += reduce_sum((valid & (bound <= value[:, None])).to(tl.int64), 1)
    count = tl.where(value != value, _MISSING_ID, count)          # NaN
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
    h = _mix64_bits(tl.load(columns_ptr + first * n + item, mask=live, other=0))
    h = _mix64_bits(h * _COMBINE + tl.load(columns_ptr + second * n + item, mask=live,
                                           other=0))
    has_third = live & (third >= 0)
    last = tl.load(columns_ptr + third * n + item, mask=has_third, other=0)
    h = tl.where(has_third, _mix64_bits(h * _COMBINE + last), h)
    tl.store(out_ptr + offs, h, mask=live)


@kernel(do_not_specialize=("width", "pad_value"))
def _pack_padded_kernel(padded_ptr, offsets_ptr, out_ptr, width, pad_value,
                        BLOCK_L: constexpr):
    row = tl.program_id(0).to(tl.int64)
    destination = tl.load(offsets_ptr + row)
    for first in range(0, width, BLOCK_L):
        position = first + tl.arange(0, BLOCK_L)
        value = tl.load(padded_ptr + row * width + position, mask=position < width,
                        other=pad_value)
        present = value != pad_value
        rank = cumulative_sum(present.to(tl.int64), 0) - 1
        tl.store(out_ptr + destination + rank, value, mask=present)
        destination += reduce_sum(present.to(tl.int64), 0)


@kernel
def _copy_bags_kernel(values_ptr, offsets_ptr, skip_ptr, new_offsets_ptr, out_ptr,
                      BLOCK_L: constexpr):
    bag = tl.program_id(0).to(tl.int64)
    source = tl.load(offsets_ptr + bag) + tl.load(skip_ptr + bag)
    start = tl.load(new_offsets_ptr + bag)
    length = tl.load(new_offsets_ptr + bag + 1) - start
    for first in range(0, length, BLOCK_L):
        position = first + tl.arange(0, BLOCK_L)
        inside = position < length
        value = tl.load(values_ptr + source + position, mask=inside)
        tl.store(out_ptr + start + position, value, mask=inside)


@kernel(do_not_specialize=("width", "pad_value"))
def _pad_kernel(values_ptr, offsets_ptr, out_ptr, width, pad_value, BLOCK_L: constexpr):
    bag = tl.program_id(0).to(tl.int64)
    start = tl.load(offsets_ptr + bag)
    length = tl.load(offsets_ptr + bag + 1) - start
    for first in range(0, width, BLOCK_L):
        position = first + tl.arange(0, BLOCK_L)
        value = tl.load(values_ptr + start + position, mask=position < length,
                        other=pad_value)
        tl.store(out_ptr + bag * width + position, value, mask=position < width)


_triton = TritonKernels(globals(), {"_MISSING_ID": MISSING_ID, "_COMBINE": COMBINE})


def hash_into_buckets_triton(ids, buckets):
    ns = _triton.ready()
    flat = ids.contiguous().view(-1)
    out = torch.empty_like(flat)
    if flat.numel():
        per_feature = flat.numel() // ids.shape[0]
        ns["_hash_into_buckets_kernel"][(blocks(flat.numel(), BLOCK),)](
            flat, buckets.contiguous(), out, per_feature, flat.numel(), BLOCK=BLOCK)
    return out.view(ids.shape)


def bucketize_triton(values, boundaries):
    ns = _triton.ready()
    flat = values.contiguous().view(-1)
    out = torch.empty(flat.shape, dtype=torch.int64, device=values.device)
    if flat.numel():
        per_feature = flat.numel() // values.shape[0]
        ns["_bucketize_kernel"][(blocks(flat.numel(), BLOCK_ROWS),)](
            flat, boundaries.contiguous(), out, per_feature, flat.numel(),
            boundaries.shape[1], BLOCK_ROWS=BLOCK_ROWS, BLOCK_BOUNDARIES=BLOCK_BOUNDARIES)
    return out.view(values.shape)


def cross_triton(columns, members):
    ns = _triton.ready()
    flat = columns.contiguous().view(columns.shape[0], -1)
    n = flat.shape[1]
    padded = torch.full((members.shape[0], 3), -1, dtype=torch.int64,
                        device=members.device)
    padded[:, :members.shape[1]] = members
    out = torch.empty(members.shape[0], n, dtype=torch.int64, device=columns.device)
    if out.numel():
        ns["_cross_kernel"][(blocks(out.numel(), BLOCK),)](
            flat, padded, out, n, out.numel(), BLOCK=BLOCK)
    return out.view(members.shape[0], *columns.shape[1:])


def pack_padded_triton(padded, pad_value=MISSING_ID):
    ns = _triton.ready()
    padded = padded.contiguous()
    offsets = ragged.lengths_to_offsets((padded != pad_value).sum(dim=1))
    values = torch.empty(int(offsets[-1]), dtype=padded.dtype, device=padded.device)
    if padded.shape[0] and padded.shape[1]:
        ns["_pack_padded_kernel"][(padded.shape[0],)](
            padded, offsets, values, padded.shape[1], pad_value, BLOCK_L=BLOCK_L)
    return values, offsets


def cutoff_triton(values, offsets, max_len, batch):
    ns = _triton.ready()
    lengths = _bag_lengths(offsets)
    limit = max_len.repeat_interleave(batch) if batch else max_len[:0]
    kept = torch.minimum(lengths, limit)
    new_offsets = ragged.lengths_to_offsets(kept)
    out = torch.empty(int(new_offsets[-1]), dtype=values.dtype, device=values.device)
    if lengths.numel():
        ns["_copy_bags_kernel"][(lengths.numel(),)](
            values.contiguous(), offsets.contiguous(), (lengths - kept).contiguous(),
            new_offsets, out, BLOCK_L=BLOCK_L)
    return out, new_offsets


def pad_triton(values, offsets, width, pad_value=MISSING_ID):
    ns = _triton.ready()
    num_bags = offsets.numel() - 1
    out = torch.empty(num_bags, width, dtype=values.dtype, device=values.device)
    if num_bags and width:
        ns["_pad_kernel"][(num_bags,)](values.contiguous(), offsets.contiguous(), out,
                                       width, pad_value, BLOCK_L=BLOCK_L)
    return out


# ---- public entry points -----------------------------------------------------------

def hash_into_buckets(ids, buckets):
    """``[F, ...]`` int64 ids, ``[F]`` bucket counts (0: keep the id)."""
    if use_triton(ids):
        return hash_into_buckets_triton(ids, buckets)
    return hash_into_buckets_reference(ids, buckets)


def bucketize(values, boundaries):
    """``[F, ...]`` float values, ``[F, W]`` sorted boundaries padded with +inf."""
    if use_triton(values):
        return bucketize_triton(values, boundaries)
    return bucketize_reference(values, boundaries)


def cross(columns, members):
    """``[S, ...]`` int64 columns, ``[C, 2 or 3]`` member indices (-1: none)."""
    if use_triton(columns):
        return cross_triton(columns, members)
    return cross_reference(columns, members)


def pack_padded(padded, pad_value=MISSING_ID):
    """``[R, L]`` rows -> ``(values, offsets)``, dropping ``pad_value`` entries."""
    if use_triton(padded):
        return pack_padded_triton(padded, pad_value)
    return pack_padded_reference(padded, pad_value)


def cutoff(values, offsets, max_len, batch):
    """Keeps the last ``max_len[r // batch]`` ids of every bag ``r``."""
    if use_triton(values):
        return cutoff_triton(values, offsets, max_len, batch)
    return cutoff_reference(values, offsets, max_len, batch)


def pad(values, offsets, width, pad_value=MISSING_ID):
    """Bags -> ``[R, width]`` rows, left-aligned, ids past ``width`` dropped."""
    if use_triton(values):
        return pad_triton(values, offsets, width, pad_value)
    return pad_reference(values, offsets, width, pad_value)
