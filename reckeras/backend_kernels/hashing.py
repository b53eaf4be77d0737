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
"""

import numpy as np
import torch

# 64-bit constants written as their signed int64 values (Triton's interpreter
# rejects integer literals above 2**63 - 1).
GOLDEN = -7046029254386353131          # 0x9E3779B97F4A7C15
MIX_1 = -4658895280553007687           # 0xBF58476D1CE4E5B9
MIX_2 = -7723592293110705685           # 0x94D049BB133111EB
COMBINE = -4417276706812531889         # 0xC2B2AE3D27D4EB4F
FNV_OFFSET = -3750763034362895579      # 0xCBF29CE484222325
FNV_PRIME = 1099511628211              # 0x100000001B3
INT64_MAX = 2**63 - 1


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (torch's >> is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def mix64(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64 finalizer of int64 tensor ``x`` (bijective, wraps)."""
    z = x + GOLDEN
    z = (z ^ _shr(z, 30)) * MIX_1
    z = (z ^ _shr(z, 27)) * MIX_2
    return z ^ _shr(z, 31)


def hash_combine(columns: torch.Tensor) -> torch.Tensor:
    """Hash of several int64 columns stacked on dim 0: ``[k, ...] -> [...]``."""
    h = mix64(columns[0])
    for column in columns[1:]:          # k is 2 or 3: a fold, not a data loop
        h = mix64(h * COMBINE + column)
    return h


def mix64_numpy(x: np.ndarray) -> np.ndarray:
    """``mix64`` on a numpy int64/uint64 array (same bits as the torch version)."""
    z = x.astype(np.uint64, copy=False) + np.uint64(GOLDEN % 2**64)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(MIX_1 % 2**64)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(MIX_2 % 2**64)
    return (z ^ (z >> np.uint64(31))).view(np.int64)


def hash_strings(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Hashes strings given as one UTF-8 byte buffer plus offsets.

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
