"""Stable 64-bit hashes used for ids, strings, crosses and sharding.

Every hash here is defined on signed int64 bit patterns with wrap-around
arithmetic, so the torch reference, the numpy host path and the Triton kernels
give bit-identical results on any device:

* ``mix64(x)``: the SplitMix64 finalizer (Steele et al., 2014). It is a
  bijection of the 64-bit space, so hashing never merges two ids of one table.
* ``hash_strings(values)``: FNV-1a 64 over the UTF-8 bytes, then ``mix64``,
  then the sign bit cleared, so string ids become non-negative int64 ids.
* ``hash_combine(a, b)``: ``mix64(a * K + b)`` folded left over 2-3 columns;
  used for feature crosses.
* ``initial_rows(keys, dim, scale, seed)``: a new embedding row's initial
  values, uniform in ``[-scale, scale]`` and a function of its key and the
  seed only (``mix64`` of the key, the seed and the column, the top 53 bits
  as a double in [0, 1)), so any rank creates a row with the same values.

``mix64``, ``hash_combine`` and ``hash_bytes`` run one Triton kernel on CUDA
tensors and the torch reference elsewhere.
"""

import numpy as np
import torch

from reckeras.backend_kernels.dispatch import (TritonKernels, blocks, constexpr,
                                               kernel, use_native, use_triton)

# 64-bit constants written as their signed int64 values (Triton's interpreter
# rejects integer literals above 2**63 - 1).
GOLDEN = -7046029254386353131          # 0x9E3779B97F4A7C15
MIX_1 = -4658895280553007687           # 0xBF58476D1CE4E5B9
MIX_2 = -7723592293110705685           # 0x94D049BB133111EB
COMBINE = -4417276706812531889         # 0xC2B2AE3D27D4EB4F
FNV_OFFSET = -3750763034362895579      # 0xCBF29CE484222325
FNV_PRIME = 1099511628211              # 0x100000001B3
INT64_MAX = 2**63 - 1

BLOCK = 1024


# ---- torch references --------------------------------------------------------

def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (torch's >> is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def mix64_reference(x: torch.Tensor) -> torch.Tensor:
    z = x + GOLDEN
    scratch = torch.empty_like(z)       # all in place: a third faster on CPU

    def xor_shift(bits):                # z ^= z >>> bits
        torch.bitwise_right_shift(z, bits, out=scratch)
        scratch.bitwise_and_((1 << (64 - bits)) - 1)
        z.bitwise_xor_(scratch)

    xor_shift(30)
    z *= MIX_1
    xor_shift(27)
    z *= MIX_2
    xor_shift(31)
    return z


def initial_rows_reference(keys: torch.Tensor, dim: int, scale: float,
                           seed: int) -> torch.Tensor:
    base = mix64(keys ^ mix64(torch.tensor(seed, dtype=torch.int64)))
    bits = mix64(base.unsqueeze(1) + torch.arange(dim, device=keys.device))
    unit = _shr(bits, 11).double() * 2.0 ** -53
    return ((2.0 * unit - 1.0) * scale).float()


def hash_combine_reference(columns: torch.Tensor) -> torch.Tensor:
    h = mix64_reference(columns[0])
    for column in columns[1:]:          # k is 2 or 3: a fold, not a data loop
        h *= COMBINE
        h += column
        h = mix64_reference(h)
    return h


def hash_bytes_reference(data: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    starts = offsets[:-1]
    lengths = offsets[1:] - starts
    h = torch.full_like(lengths, FNV_OFFSET)
    # Loop over byte positions (ids are short), vectorized over all strings.
    for position in range(int(lengths.max()) if lengths.numel() else 0):
        live = (lengths > position).nonzero().squeeze(1)
        byte = data[starts[live] + position].long()
        h[live] = (h[live] ^ byte) * FNV_PRIME
    return mix64_reference(h) & INT64_MAX


# ---- Triton kernels -------------------------------------------------------------

@kernel
def _shr_bits(z, bits: constexpr):
    return (z.to(tl.uint64, bitcast=True) >> bits).to(tl.int64, bitcast=True)


@kernel
def _mix64_bits(x):
    z = x + _GOLDEN
    z = (z ^ _shr_bits(z, 30)) * _MIX_1
    z = (z ^ _shr_bits(z, 27)) * _MIX_2
    return z ^ _shr_bits(z, 31)


@kernel(do_not_specialize=("n",))
def _mix64_kernel(ids_ptr, out_ptr, n, BLOCK: constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = offs < n
    x = tl.load(ids_ptr + offs, mask=live, other=0)
    tl.store(out_ptr + offs, _mix64_bits(x), mask=live)


@kernel(do_not_specialize=("n",))
def _combine_kernel(columns_ptr, out_ptr, n, K: constexpr, BLOCK: constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = offs < n
    h = _mix64_bits(tl.load(columns_ptr + offs, mask=live, other=0))
    for k in tl.static_range(1, K):
        column = tl.load(columns_ptr + k * n + offs, mask=live, other=0)
        h = _mix64_bits(h * _COMBINE + column)
    tl.store(out_ptr + offs, h, mask=live)


@kernel(do_not_specialize=("n", "max_len"))
def _fnv_kernel(data_ptr, offsets_ptr, out_ptr, n, max_len, BLOCK: constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = offs < n
    start = tl.load(offsets_ptr + offs, mask=live, other=0)
    length = tl.load(offsets_ptr + offs + 1, mask=live, other=0) - start
    h = tl.full([BLOCK], _FNV_OFFSET, tl.int64)
    for position in range(0, max_len):
        inside = position < length
        byte = tl.load(data_ptr + start + position, mask=inside, other=0).to(tl.int64)
        h = tl.where(inside, (h ^ byte) * _FNV_PRIME, h)
    tl.store(out_ptr + offs, _mix64_bits(h) & _INT64_MAX, mask=live)


_triton = TritonKernels(globals(), {
    "_GOLDEN": GOLDEN, "_MIX_1": MIX_1, "_MIX_2": MIX_2, "_COMBINE": COMBINE,
    "_FNV_OFFSET": FNV_OFFSET, "_FNV_PRIME": FNV_PRIME, "_INT64_MAX": INT64_MAX})


def mix64_triton(x: torch.Tensor) -> torch.Tensor:
    ns = _triton.ready()
    flat = x.contiguous().view(-1)
    out = torch.empty_like(flat)
    if flat.numel():
        ns["_mix64_kernel"][(blocks(flat.numel(), BLOCK),)](flat, out, flat.numel(),
                                                            BLOCK=BLOCK)
    return out.view(x.shape)


def hash_combine_triton(columns: torch.Tensor) -> torch.Tensor:
    ns = _triton.ready()
    k = columns.shape[0]
    flat = columns.contiguous().view(k, -1)
    out = torch.empty(flat.shape[1], dtype=torch.int64, device=columns.device)
    if out.numel():
        ns["_combine_kernel"][(blocks(out.numel(), BLOCK),)](
            flat, out, out.numel(), K=k, BLOCK=BLOCK)
    return out.view(columns.shape[1:])


def hash_bytes_triton(data: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    ns = _triton.ready()
    n = offsets.numel() - 1
    out = torch.empty(n, dtype=torch.int64, device=offsets.device)
    if n:
        max_len = int((offsets[1:] - offsets[:-1]).max())
        ns["_fnv_kernel"][(blocks(n, BLOCK),)](data, offsets.contiguous(), out, n,
                                               max_len, BLOCK=BLOCK)
    return out


# ---- public entry points ----------------------------------------------------------

def mix64(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64 finalizer of int64 tensor ``x`` (bijective, wraps)."""
    return mix64_triton(x) if use_triton(x) else mix64_reference(x)


def table_keys(ids: torch.Tensor, salt: torch.Tensor,
               slot_counts: torch.Tensor) -> torch.Tensor:
    """``mix64(ids) ^ salt`` of each id's slot, for a slot-major packed batch.

    Args:
        ids: int64 ``[N]``.
        salt: int64 ``[S]``, one salt per slot.
        slot_counts: int64 ``[S]``, ids per slot (summing to ``N``).
    """
    if use_native(ids, salt, slot_counts):
        from reckeras.backend_kernels import cpu_native
        return cpu_native.table_keys(ids, salt, slot_counts)
    keys = mix64(ids)
    keys ^= salt.repeat_interleave(slot_counts, output_size=ids.numel())
    return keys


def initial_rows(keys: torch.Tensor, dim: int, scale: float, seed: int) -> torch.Tensor:
    """Initial values ``[n, dim]`` (float32) of new rows with int64 ``keys``."""
    if use_native(keys):
        from reckeras.backend_kernels import cpu_native
        return cpu_native.initial_rows(keys, dim, scale, seed)
    return initial_rows_reference(keys, dim, scale, seed)


def hash_combine(columns: torch.Tensor) -> torch.Tensor:
    """Hash of several int64 columns stacked on dim 0: ``[k, ...] -> [...]``."""
    if use_triton(columns):
        return hash_combine_triton(columns)
    return hash_combine_reference(columns)


def hash_bytes(data: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``hash_strings`` on tensors: uint8 ``data`` and int64 ``[n + 1]`` offsets."""
    if use_triton(offsets):
        return hash_bytes_triton(data, offsets)
    return hash_bytes_reference(data, offsets)


def mix64_numpy(x: np.ndarray) -> np.ndarray:
    """``mix64`` on a numpy int64/uint64 array (same bits as the torch version)."""
    z = x.astype(np.uint64, copy=False) + np.uint64(GOLDEN % 2**64)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(MIX_1 % 2**64)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(MIX_2 % 2**64)
    return (z ^ (z >> np.uint64(31))).view(np.int64)


def hash_strings(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Hashes strings given as one UTF-8 byte buffer plus offsets (host side).

    Args:
        data: uint8 array, the concatenated UTF-8 bytes of all strings.
        offsets: int array of ``n + 1`` offsets into ``data``.

    Returns:
        int64 array of ``n`` non-negative ids.
    """
    offsets = offsets.astype(np.int64, copy=False)
    starts, lengths = offsets[:-1], np.diff(offsets)
    h = np.full(len(lengths), FNV_OFFSET % 2**64, dtype=np.uint64)
    prime = np.uint64(FNV_PRIME)
    # Loop over byte positions (ids are short), vectorized over all strings.
    for position in range(int(lengths.max(initial=0))):
        live = lengths > position
        byte = data[starts[live] + position].astype(np.uint64)
        h[live] = (h[live] ^ byte) * prime
    return mix64_numpy(h) & INT64_MAX
