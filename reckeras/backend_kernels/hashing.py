"""Stable 64-bit hashes used for ids, strings, crosses and sharding.

Every hash here is defined on signed int64 bit patterns with wrap-around
arithmetic, so the torch reference, the numpy host path and the Triton kernels
give bit-identical results on any device:

* `mix64(x)`: the SplitMix64 finalizer (Steele et al., 2014). It is a
  bijection of the 64-bit space, so hashing never merges two ids of one table.
* `hash_strings(data, offsets)`: FNV-1a 64 over the UTF-8 bytes, then
  `mix64`, then the sign bit cleared, so string ids become non-negative
  int64 ids.
* `hash_combine_reference(columns)`: `mix64(h * K + b)` folded left over
  2-3 columns, starting from `mix64` of the first: the hash of feature
  crosses (`transforms.cross`, whose kernel computes the same fold).
* `initial_rows(keys, dim, scale, seed)`: a new embedding row's initial
  values, uniform in `[-scale, scale]` and a function of its key and the
  seed only (`mix64` of the key, the seed and the column, the top 53 bits
  as a double in [0, 1)), so any rank creates a row with the same values.

`mix64`, `table_keys` and `initial_rows` are torch ops (`reckeras::mix64`,
...; see `dispatch.register`): `mix64` runs a Triton kernel on CUDA tensors
and the torch reference on CPU; `table_keys` and `initial_rows` run the
native CPU kernels where they can be built. Strings are hashed on the host
only (`hash_strings`, numpy).
"""

from typing import TYPE_CHECKING

import numpy as np
import torch

from reckeras.backend_kernels import cpu_native
from reckeras.backend_kernels.dispatch import blocks, constexpr, kernel, register

if TYPE_CHECKING:
    # The kernels' `tl`: `dispatch.Kernel.jit` binds it when it jits them, so
    # importing this module imports no triton.
    import triton.language as tl

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
    """`mix64` with torch ops.

    Args:
        x: an int64 tensor.

    Returns:
        The int64 SplitMix64 finalizer of every element, shaped as `x`.

    Example:

    ```python
    from reckeras.backend_kernels.hashing import mix64_reference

    mix64_reference(torch.tensor([0, 1]))   # two distinct int64 hashes
    ```
    """
    z = x + GOLDEN
    scratch = torch.empty_like(z)       # all in place: a third faster on CPU

    def xor_shift(bits: int) -> None:   # z ^= z >>> bits
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
    """`initial_rows` with torch ops.

    Args:
        keys: int64 `[n]` row keys.
        dim: the row width.
        scale: the rows are uniform in `[-scale, scale]`.
        seed: the seed of the table's initial values.

    Returns:
        float32 `[n, dim]`.

    Example:

    ```python
    from reckeras.backend_kernels.hashing import initial_rows_reference

    rows = initial_rows_reference(torch.tensor([7, 7, 8]), 4, 0.25, seed=0)
    bool((rows[0] == rows[1]).all())   # True: one key, one initial row
    ```
    """
    base = mix64(keys ^ mix64(torch.tensor(seed, dtype=torch.int64)))
    bits = mix64(base.unsqueeze(1) + torch.arange(dim, device=keys.device))
    unit = _shr(bits, 11).double() * 2.0 ** -53
    return ((2.0 * unit - 1.0) * scale).float()


def hash_combine_reference(columns: torch.Tensor) -> torch.Tensor:
    """The cross hash of int64 columns stacked on dim 0, with torch ops.

    `transforms.cross_reference` applies it to each cross's members; the
    `transforms.cross` kernel computes the same fold.

    Args:
        columns: int64 `[k, ...]`, the `k` (2 or 3) columns stacked on dim 0.

    Returns:
        int64 `[...]`, one crossed id per position.

    Example:

    ```python
    from reckeras.backend_kernels.hashing import hash_combine_reference

    hash_combine_reference(torch.tensor([[1, 2], [3, 4]]))   # 2 crossed ids
    ```
    """
    h = mix64_reference(columns[0])
    for column in columns[1:]:          # k is 2 or 3: a fold, not a data loop
        h *= COMBINE
        h += column
        h = mix64_reference(h)
    return h


# ---- Triton kernels -------------------------------------------------------------

@kernel
def _shr_bits(z, bits: constexpr):
    return (z.to(tl.uint64, bitcast=True) >> bits).to(tl.int64, bitcast=True)


@kernel
def mix64_bits(x):
    """`mix64` of an int64 block, as a Triton device function (the
    `transforms` kernels call it too)."""
    z = x + GOLDEN
    z = (z ^ _shr_bits(z, 30)) * MIX_1
    z = (z ^ _shr_bits(z, 27)) * MIX_2
    return z ^ _shr_bits(z, 31)


@kernel(do_not_specialize=("n",))
def _mix64_kernel(ids_ptr, out_ptr, n, BLOCK: constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = offs < n
    x = tl.load(ids_ptr + offs, mask=live, other=0)
    tl.store(out_ptr + offs, mix64_bits(x), mask=live)


def mix64_triton(x: torch.Tensor) -> torch.Tensor:
    """`mix64` with the Triton kernel (CUDA tensors).

    Args:
        x: an int64 tensor.

    Returns:
        The int64 hashes, shaped as `x`.

    Example:

    ```python
    from reckeras.backend_kernels.hashing import mix64_triton

    mix64_triton(torch.arange(4, device="cuda"))
    ```
    """
    flat = x.contiguous().view(-1)
    out = torch.empty_like(flat)
    if flat.numel():
        _mix64_kernel[(blocks(flat.numel(), BLOCK),)](flat, out, flat.numel(), BLOCK=BLOCK)
    return out.view(x.shape)


def table_keys_reference(ids: torch.Tensor, salt: torch.Tensor,
                         slot_counts: torch.Tensor) -> torch.Tensor:
    """`table_keys` with torch ops (`mix64` runs its Triton kernel on CUDA).

    Args:
        ids, salt, slot_counts: as for `table_keys`.

    Returns:
        What `table_keys` returns.

    Example:

    ```python
    from reckeras.backend_kernels.hashing import table_keys_reference

    table_keys_reference(torch.tensor([5, 6, 5]), torch.tensor([0, 99]),
                         torch.tensor([2, 1]))
    ```
    """
    keys = mix64(ids)
    keys ^= salt.repeat_interleave(slot_counts, output_size=ids.numel())
    return keys


# ---- the torch ops (dispatch.register) ----------------------------------------------

_mix64 = register("mix64(Tensor x) -> Tensor", reference=mix64_reference,
                  triton=mix64_triton, fake=torch.empty_like)
_table_keys = register(
    "table_keys(Tensor ids, Tensor salt, Tensor slot_counts) -> Tensor",
    reference=table_keys_reference, native=cpu_native.table_keys,
    native_usable=lambda ids, salt, slot_counts: cpu_native.usable(ids, salt, slot_counts),
    fake=lambda ids, salt, slot_counts: torch.empty_like(ids))
_initial_rows = register(
    "initial_rows(Tensor keys, int dim, float scale, int seed) -> Tensor",
    reference=initial_rows_reference, native=cpu_native.initial_rows,
    native_usable=lambda keys, dim, scale, seed: cpu_native.usable(keys),
    fake=lambda keys, dim, scale, seed: keys.new_empty((keys.shape[0], dim),
                                                       dtype=torch.float32))


# ---- public entry points ----------------------------------------------------------

def mix64(x: torch.Tensor) -> torch.Tensor:
    """The SplitMix64 finalizer of an int64 tensor (bijective, wraps).

    Args:
        x: an int64 tensor.

    Returns:
        The int64 hashes, shaped as `x`.

    Example:

    ```python
    from reckeras.backend_kernels.hashing import mix64, mix64_numpy

    hashed = mix64(torch.tensor([0, 1, 2]))
    bool((hashed.numpy() == mix64_numpy(np.array([0, 1, 2]))).all())   # True
    ```
    """
    return _mix64(x)


def table_keys(ids: torch.Tensor, salt: torch.Tensor,
               slot_counts: torch.Tensor) -> torch.Tensor:
    """`mix64(ids) ^ salt` of each id's slot, for a slot-major packed batch.

    Args:
        ids: int64 `[N]`.
        salt: int64 `[S]`, one salt per slot.
        slot_counts: int64 `[S]`, ids per slot (summing to `N`).

    Returns:
        int64 `[N]` table keys.

    Example:

    ```python
    from reckeras.backend_kernels.hashing import table_keys

    # Slot 0 holds ids 5, 6; slot 1 holds id 5 again, under another salt.
    keys = table_keys(torch.tensor([5, 6, 5]), torch.tensor([0, 99]),
                      torch.tensor([2, 1]))
    bool(keys[0] != keys[2])   # True
    ```
    """
    return _table_keys(ids, salt, slot_counts)


def initial_rows(keys: torch.Tensor, dim: int, scale: float, seed: int) -> torch.Tensor:
    """The initial values of new rows, a function of their keys and the seed.

    Args:
        keys: int64 `[n]` row keys.
        dim: the row width.
        scale: the rows are uniform in `[-scale, scale]`.
        seed: the seed of the table's initial values.

    Returns:
        float32 `[n, dim]`.

    Example:

    ```python
    from reckeras.backend_kernels.hashing import initial_rows

    rows = initial_rows(torch.tensor([7, 8]), 16, 0.25, seed=0)   # [2, 16]
    ```
    """
    return _initial_rows(keys, dim, scale, seed)


def mix64_numpy(x: np.ndarray) -> np.ndarray:
    """`mix64` on a numpy array (the same bits as the torch version).

    Args:
        x: an int64 or uint64 array.

    Returns:
        The int64 hashes, shaped as `x`.

    Example:

    ```python
    from reckeras.backend_kernels.hashing import mix64_numpy

    mix64_numpy(np.arange(3, dtype=np.int64))
    ```
    """
    z = x.astype(np.uint64, copy=False) + np.uint64(GOLDEN % 2**64)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(MIX_1 % 2**64)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(MIX_2 % 2**64)
    return (z ^ (z >> np.uint64(31))).view(np.int64)


def hash_strings(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Hashes strings given as one UTF-8 byte buffer plus offsets (host side).

    Args:
        data: uint8 array, the concatenated UTF-8 bytes of all strings.
        offsets: int array of `n + 1` offsets into `data`.

    Returns:
        int64 array of `n` non-negative ids.

    Example:

    ```python
    from reckeras.backend_kernels.hashing import hash_strings

    data = np.frombuffer("ab€".encode(), dtype=np.uint8)
    hash_strings(data, np.array([0, 2, 5]))   # ids of "ab" and "€"
    ```
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
