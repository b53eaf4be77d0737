"""Open-addressing id -> row hash map with linear probing.

The map is two int64 arrays of a power-of-two capacity `2**bits`:
`slot_keys` (EMPTY where free) and `slot_rows`. A key's probe sequence
starts at its home slot, the top `bits` bits of `key * GOLDEN` (Fibonacci
multiply-shift hashing: two integer ops where `mix64` takes ten, and it
spreads keys that differ in any bits), and walks one slot at a time; keys are
never removed, so a probe that reaches a free slot proves the key absent.

`find_or_insert` resolves a whole batch of keys (duplicates allowed) at once
and numbers the rows of the new keys `num_rows, num_rows + 1, ...`; the
caller owns the row storage.

* Triton (CUDA tensors): one program lane per key walks its probe sequence
  and claims a free slot with `tl.atomic_cas`; copies of a new key find the
  winner's key on their next look. The new rows are then numbered in the
  order of the claiming positions.
* torch reference (CPU tensors): every round, each unresolved key looks at
  one slot, vectorized over keys (the loop runs over probe rounds, never over
  keys). Keys that reach a free slot are absent; the distinct absent keys are
  then inserted most frequent first (ties: smaller key first), which is also
  the order of their new rows, so the reference is deterministic.
* native CPU kernels (`cpu_native`), where they can be built: one C loop
  over the keys.

All give the same key -> row mapping up to the numbering of the rows created
by one call; everything above the map only relies on that mapping.
"""

from typing import TYPE_CHECKING

import torch

from reckeras.backend_kernels import cpu_native
from reckeras.backend_kernels.cpu_native import EMPTY  # one free-slot key for C, torch, Triton
from reckeras.backend_kernels.dispatch import blocks, constexpr, kernel, register
from reckeras.backend_kernels.hashing import GOLDEN

if TYPE_CHECKING:
    # The kernels' `tl`: `dispatch.Kernel.jit` binds it when it jits them, so
    # importing this module imports no triton.
    import triton.language as tl

# A key equal to EMPTY (-2**63) is stored as EMPTY + 1.
MAX_LOAD = 0.5
BLOCK = 256


def new_slots(capacity: int,
              device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """An empty map.

    Args:
        capacity: the number of slots, a power of two.
        device: where the map lives.

    Returns:
        `(slot_keys, slot_rows)`: int64 `[capacity]` arrays of `EMPTY` keys
        and -1 rows.

    Raises:
        ValueError: when `capacity` is not a power of two.

    Example:

    ```python
    from reckeras.backend_kernels.hash_table import capacity_for, new_slots

    slot_keys, slot_rows = new_slots(capacity_for(1000))   # 2048 slots
    ```
    """
    if capacity & (capacity - 1):
        raise ValueError(f"capacity must be a power of two, got {capacity}")
    keys = torch.full((capacity,), EMPTY, dtype=torch.int64, device=device)
    rows = torch.full((capacity,), -1, dtype=torch.int64, device=device)
    return keys, rows


def capacity_for(num_keys: int) -> int:
    """The smallest power-of-two capacity that keeps `num_keys` under `MAX_LOAD`.

    Args:
        num_keys: the number of keys the map must hold.

    Returns:
        A power of two, at least 16.

    Example:

    ```python
    from reckeras.backend_kernels.hash_table import capacity_for

    capacity_for(1000)   # 2048
    ```
    """
    capacity = 16
    while num_keys > capacity * MAX_LOAD:
        capacity *= 2
    return capacity


def _storable(keys: torch.Tensor) -> torch.Tensor:
    # EMPTY is the smallest int64: one reduction tells whether a key equals it.
    if keys.numel() and int(keys.min()) == EMPTY:
        return torch.where(keys == EMPTY, keys + 1, keys)
    return keys


# ---- torch reference ------------------------------------------------------------

def _walk(slot_keys: torch.Tensor, keys: torch.Tensor,
          slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Walks every key from `slots` to its own slot or the first free one.

    Returns:
        `(slots, found)`: where each key stopped, and whether the key is
        stored there (else the slot is free and the key absent).
    """
    mask = slot_keys.numel() - 1
    seen = slot_keys.index_select(0, slots)
    found = seen == keys
    stopped = found | (seen == EMPTY)
    if bool(stopped.all()):
        return slots, found
    pending = (~stopped).nonzero().squeeze(1)
    slots, found = slots.clone(), found.clone()
    walk_keys = keys.index_select(0, pending)
    walk_slots = (slots.index_select(0, pending) + 1) & mask
    while pending.numel():
        seen = slot_keys.index_select(0, walk_slots)
        here = seen == walk_keys
        stop = here | (seen == EMPTY)
        slots.index_copy_(0, pending, walk_slots)
        found.index_copy_(0, pending, here)
        go = (~stop).nonzero().squeeze(1)
        pending = pending.index_select(0, go)
        walk_keys = walk_keys.index_select(0, go)
        walk_slots = (walk_slots.index_select(0, go) + 1) & mask
    return slots, found


def _claim(slot_keys: torch.Tensor, keys: torch.Tensor,
           slots: torch.Tensor) -> torch.Tensor:
    """Stores distinct absent `keys`, each walking on from its free slot.

    Keys racing for one free slot: the first in `keys` order wins, as one
    compare-and-swap would let exactly one win; the others walk on.

    Returns:
        int64 slot of every key.
    """
    mask = slot_keys.numel() - 1
    placed = torch.empty_like(slots)
    pending = torch.arange(keys.numel(), device=keys.device)
    while pending.numel():
        seen = slot_keys.index_select(0, slots)
        free = (seen == EMPTY).nonzero().squeeze(1)
        contested, order = torch.sort(slots.index_select(0, free), stable=True)
        first = torch.ones_like(contested, dtype=torch.bool)
        first[1:] = contested[1:] != contested[:-1]
        winners = free.index_select(0, order[first])
        won_slots = slots.index_select(0, winners)
        slot_keys.index_copy_(0, won_slots, keys.index_select(0, winners))
        placed.index_copy_(0, pending.index_select(0, winners), won_slots)
        lost = torch.ones_like(slots, dtype=torch.bool)
        lost[winners] = False
        go = lost.nonzero().squeeze(1)
        pending = pending.index_select(0, go)
        keys = keys.index_select(0, go)
        slots = (slots.index_select(0, go) + 1) & mask
    return placed


def _home(keys: torch.Tensor, capacity: int) -> torch.Tensor:
    bits = capacity.bit_length() - 1
    if not bits:
        return torch.zeros_like(keys)
    # Arithmetic shift, then the mask keeps the top `bits` bits: a logical shift.
    return (keys * GOLDEN >> (64 - bits)) & (capacity - 1)


def find_or_insert_reference(slot_keys: torch.Tensor, slot_rows: torch.Tensor,
                             keys: torch.Tensor, num_rows: int) -> tuple[torch.Tensor, int]:
    """`find_or_insert` with torch ops (deterministic numbering).

    The new keys are numbered most frequent first (ties: smaller key first).

    Args:
        slot_keys: int64 `[capacity]`, the map's keys, updated in place.
        slot_rows: int64 `[capacity]`, the map's rows, updated in place.
        keys: int64 `[n]`, duplicates allowed.
        num_rows: the number of rows before the call.

    Returns:
        `(rows, num_rows)`: int64 rows aligned with `keys` and the new count.

    Example:

    ```python
    from reckeras.backend_kernels.hash_table import find_or_insert_reference, new_slots

    slot_keys, slot_rows = new_slots(16)
    rows, count = find_or_insert_reference(slot_keys, slot_rows,
                                           torch.tensor([9, 4, 9]), 0)
    rows, count   # (tensor([0, 1, 0]), 2): 9 is the more frequent
    ```
    """
    keys = _storable(keys)
    slots, found = _walk(slot_keys, keys, _home(keys, slot_keys.numel()))
    if not bool(found.all()):
        absent = (~found).nonzero().squeeze(1)
        distinct, inverse, counts = torch.unique(
            keys.index_select(0, absent), return_inverse=True, return_counts=True)
        # Frequent keys first: they win contested slots and so mostly sit at
        # their home slot, where later batches find them in one look.
        order = torch.sort(counts, descending=True, stable=True).indices
        rank = torch.empty_like(order).scatter_(
            0, order, torch.arange(order.numel(), device=keys.device))
        inverse = rank.index_select(0, inverse)
        # Copies of one key stopped at the same free slot.
        start = torch.empty_like(order).scatter_(0, inverse,
                                                 slots.index_select(0, absent))
        placed = _claim(slot_keys, distinct.index_select(0, order), start)
        slot_rows.index_copy_(0, placed, torch.arange(
            num_rows, num_rows + order.numel(), device=keys.device))
        slots = slots.index_copy(0, absent, placed.index_select(0, inverse))
        num_rows += order.numel()
    return slot_rows.index_select(0, slots), num_rows


def find_reference(slot_keys: torch.Tensor, slot_rows: torch.Tensor,
                   keys: torch.Tensor) -> torch.Tensor:
    """`find` with torch ops.

    Args:
        slot_keys: int64 `[capacity]`, the map's keys.
        slot_rows: int64 `[capacity]`, the map's rows.
        keys: int64 `[n]`.

    Returns:
        int64 `[n]` rows, -1 for keys not in the map.

    Example:

    ```python
    from reckeras.backend_kernels.hash_table import (find_or_insert_reference,
                                                     find_reference, new_slots)

    slot_keys, slot_rows = new_slots(16)
    find_or_insert_reference(slot_keys, slot_rows, torch.tensor([9]), 0)
    find_reference(slot_keys, slot_rows, torch.tensor([9, 5]))   # tensor([ 0, -1])
    ```
    """
    keys = _storable(keys)
    slots, found = _walk(slot_keys, keys, _home(keys, slot_keys.numel()))
    return torch.where(found, slot_rows.index_select(0, slots), -1)


def _place_reference(slot_keys: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Slots of distinct keys absent from the map, which are stored there."""
    slots, _ = _walk(slot_keys, keys, _home(keys, slot_keys.numel()))
    return _claim(slot_keys, keys, slots)


# ---- Triton kernels ----------------------------------------------------------------

@kernel
def _home_slot(key, mask, shift):
    hashed = (key * GOLDEN).to(tl.uint64, bitcast=True) >> shift
    return hashed.to(tl.int64, bitcast=True) & mask


@kernel(do_not_specialize=("n", "mask", "shift"))
def _insert_kernel(slot_keys_ptr, keys_ptr, slots_ptr, claimed_ptr, n, mask, shift,
                   BLOCK: constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = offs < n
    key = tl.load(keys_ptr + offs, mask=live, other=0)
    key = tl.where(key == EMPTY, key + 1, key)
    slot = _home_slot(key, mask, shift)
    claimed = tl.full([BLOCK], 0, tl.int1)
    pending = live
    while tl.sum(pending.to(tl.int32), 0) > 0:
        seen = tl.load(slot_keys_ptr + slot, mask=pending, other=0)
        attempt = pending & (seen == EMPTY)
        # atomic_cas takes no mask: the other lanes swap EMPTY for EMPTY,
        # which never changes the map.
        old = tl.atomic_cas(slot_keys_ptr + slot, tl.full([BLOCK], EMPTY, tl.int64),
                            tl.where(attempt, key, EMPTY))
        won = attempt & (old == EMPTY)
        stop = won | (pending & ((seen == key) | (attempt & (old == key))))
        claimed = claimed | won
        slot = tl.where(pending & ~stop, (slot + 1) & mask, slot)
        pending = pending & ~stop
    tl.store(slots_ptr + offs, slot, mask=live)
    tl.store(claimed_ptr + offs, claimed.to(tl.int8), mask=live)


@kernel(do_not_specialize=("n", "mask", "shift"))
def _find_kernel(slot_keys_ptr, slot_rows_ptr, keys_ptr, rows_ptr, n, mask, shift,
                 BLOCK: constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = offs < n
    key = tl.load(keys_ptr + offs, mask=live, other=0)
    key = tl.where(key == EMPTY, key + 1, key)
    slot = _home_slot(key, mask, shift)
    found = tl.full([BLOCK], 0, tl.int1)
    pending = live
    while tl.sum(pending.to(tl.int32), 0) > 0:
        seen = tl.load(slot_keys_ptr + slot, mask=pending, other=EMPTY)
        hit = pending & (seen == key)
        found = found | hit
        stop = hit | (seen == EMPTY)
        slot = tl.where(pending & ~stop, (slot + 1) & mask, slot)
        pending = pending & ~stop
    rows = tl.load(slot_rows_ptr + slot, mask=found, other=-1)
    tl.store(rows_ptr + offs, rows, mask=live)


def _mask_and_shift(slot_keys: torch.Tensor) -> tuple[int, int]:
    capacity = slot_keys.numel()
    return capacity - 1, min(63, 64 - (capacity.bit_length() - 1))


def _insert_triton(slot_keys: torch.Tensor,
                   keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Slot of every key and whether this lane stored it (int8)."""
    keys = keys.contiguous()
    n = keys.numel()
    slots = torch.empty_like(keys)
    claimed = torch.empty(n, dtype=torch.int8, device=keys.device)
    if n:
        _insert_kernel[(blocks(n, BLOCK),)](
            slot_keys, keys, slots, claimed, n, *_mask_and_shift(slot_keys), BLOCK=BLOCK)
    return slots, claimed


def find_or_insert_triton(slot_keys: torch.Tensor, slot_rows: torch.Tensor,
                          keys: torch.Tensor, num_rows: int) -> tuple[torch.Tensor, int]:
    """`find_or_insert` with the Triton kernel (CUDA tensors).

    The new keys are numbered in the order of the positions that claimed
    their slots.

    Args:
        slot_keys: int64 `[capacity]`, the map's keys, updated in place.
        slot_rows: int64 `[capacity]`, the map's rows, updated in place.
        keys: int64 `[n]`, duplicates allowed.
        num_rows: the number of rows before the call.

    Returns:
        `(rows, num_rows)`: int64 rows aligned with `keys` and the new count.

    Example:

    ```python
    from reckeras.backend_kernels.hash_table import find_or_insert_triton, new_slots

    slot_keys, slot_rows = new_slots(16, device="cuda")
    rows, count = find_or_insert_triton(
        slot_keys, slot_rows, torch.tensor([9, 4, 9], device="cuda"), 0)
    ```
    """
    slots, claimed = _insert_triton(slot_keys, keys)
    new = claimed.nonzero().squeeze(1)
    new_rows = torch.arange(num_rows, num_rows + new.numel(), device=keys.device)
    slot_rows.index_copy_(0, slots.index_select(0, new), new_rows)
    return slot_rows.index_select(0, slots), num_rows + new.numel()


def find_triton(slot_keys: torch.Tensor, slot_rows: torch.Tensor,
                keys: torch.Tensor) -> torch.Tensor:
    """`find` with the Triton kernel (CUDA tensors).

    Args:
        slot_keys: int64 `[capacity]`, the map's keys.
        slot_rows: int64 `[capacity]`, the map's rows.
        keys: int64 `[n]`.

    Returns:
        int64 `[n]` rows, -1 for keys not in the map.

    Example:

    ```python
    from reckeras.backend_kernels.hash_table import find_triton, new_slots

    slot_keys, slot_rows = new_slots(16, device="cuda")
    find_triton(slot_keys, slot_rows, torch.tensor([9], device="cuda"))   # [-1]
    ```
    """
    keys = keys.contiguous()
    rows = torch.empty_like(keys)
    if keys.numel():
        _find_kernel[(blocks(keys.numel(), BLOCK),)](
            slot_keys, slot_rows, keys, rows, keys.numel(), *_mask_and_shift(slot_keys),
            BLOCK=BLOCK)
    return rows


# ---- the torch ops (dispatch.register) ------------------------------------------------

def _rehashed(slot_keys: torch.Tensor, slot_rows: torch.Tensor, capacity: int,
              rows_below: int | None, place) -> tuple[torch.Tensor, torch.Tensor]:
    """`rehash` of the moving keys, `place(new_keys, keys)` storing them."""
    occupied = slot_keys != EMPTY
    if rows_below is not None:
        occupied &= (slot_rows >= 0) & (slot_rows < rows_below)
    occupied = occupied.nonzero().squeeze(1)
    keys, rows = slot_keys.index_select(0, occupied), slot_rows.index_select(0, occupied)
    new_keys, new_rows = new_slots(capacity, slot_keys.device)
    new_rows.index_copy_(0, place(new_keys, keys), rows)
    return new_keys, new_rows


def rehash_reference(slot_keys: torch.Tensor, slot_rows: torch.Tensor, capacity: int,
                     rows_below: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`rehash` with torch ops.

    Args:
        slot_keys, slot_rows, capacity, rows_below: as for `rehash`.

    Returns:
        What `rehash` returns.

    Example:

    ```python
    from reckeras.backend_kernels.hash_table import new_slots, rehash_reference

    slot_keys, slot_rows = rehash_reference(*new_slots(16), 64)   # an empty map of 64
    ```
    """
    return _rehashed(slot_keys, slot_rows, capacity, rows_below, _place_reference)


def rehash_triton(slot_keys: torch.Tensor, slot_rows: torch.Tensor, capacity: int,
                  rows_below: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`rehash` with the Triton insert kernel (CUDA tensors).

    Args:
        slot_keys, slot_rows, capacity, rows_below: as for `rehash`.

    Returns:
        What `rehash` returns.

    Example:

    ```python
    from reckeras.backend_kernels.hash_table import new_slots, rehash_triton

    slot_keys, slot_rows = rehash_triton(*new_slots(16, device="cuda"), 64)
    ```
    """
    return _rehashed(slot_keys, slot_rows, capacity, rows_below,
                     lambda new_keys, keys: _insert_triton(new_keys, keys)[0])


def _rehash_native(slot_keys, slot_rows, capacity, rows_below):
    return cpu_native.rehash(slot_keys, slot_rows, capacity,
                             *(() if rows_below is None else (rows_below,)))


def _count_as_tensor(fn):
    """`fn` of the find-or-insert signature, its row count returned as a 0-dim
    int64 CPU tensor (an op returns tensors: a data-dependent int would
    defeat its fake implementation)."""
    def counted(slot_keys, slot_rows, keys, num_rows):
        rows, count = fn(slot_keys, slot_rows, keys, num_rows)
        return rows, torch.tensor(count)
    return counted


def _find_native(slot_keys, slot_rows, keys):
    return cpu_native.find_or_insert(slot_keys, slot_rows, keys, 0, insert=False)[0]


def _map_usable(slot_keys, slot_rows, *rest):
    return cpu_native.usable(slot_keys, slot_rows,
                             *(r for r in rest if isinstance(r, torch.Tensor)))


_find_or_insert = register(
    "find_or_insert(Tensor(a!) slot_keys, Tensor(b!) slot_rows, Tensor keys, int num_rows)"
    " -> (Tensor, Tensor)",
    reference=_count_as_tensor(find_or_insert_reference),
    triton=_count_as_tensor(find_or_insert_triton),
    native=_count_as_tensor(cpu_native.find_or_insert), native_usable=_map_usable,
    fake=lambda slot_keys, slot_rows, keys, num_rows: (
        torch.empty_like(keys), torch.empty((), dtype=torch.int64)))
_find = register(
    "find(Tensor slot_keys, Tensor slot_rows, Tensor keys) -> Tensor",
    reference=find_reference, triton=find_triton, native=_find_native,
    native_usable=_map_usable, fake=lambda slot_keys, slot_rows, keys: torch.empty_like(keys))
_rehash = register(
    "rehash(Tensor slot_keys, Tensor slot_rows, int capacity, int? rows_below) "
    "-> (Tensor, Tensor)",
    reference=rehash_reference, triton=rehash_triton, native=_rehash_native,
    native_usable=_map_usable,
    fake=lambda slot_keys, slot_rows, capacity, rows_below: (
        slot_keys.new_empty(capacity), slot_rows.new_empty(capacity)))


# ---- public entry points --------------------------------------------------------------

def find_or_insert(slot_keys: torch.Tensor, slot_rows: torch.Tensor,
                   keys: torch.Tensor, num_rows: int) -> tuple[torch.Tensor, int]:
    """Resolves `keys` to rows, inserting the absent ones (in place).

    The caller must ensure capacity for every new key (see `capacity_for`).
    The rows of the new keys are `num_rows, num_rows + 1, ...`, in an order
    that depends on the kernel that runs.

    Args:
        slot_keys: int64 `[capacity]`, the map's keys, updated in place.
        slot_rows: int64 `[capacity]`, the map's rows, updated in place.
        keys: int64 `[n]`, duplicates allowed.
        num_rows: the number of rows before the call.

    Returns:
        `(rows, num_rows)`: int64 rows aligned with `keys` and the new count.

    Example:

    ```python
    from reckeras.backend_kernels.hash_table import find, find_or_insert, new_slots

    slot_keys, slot_rows = new_slots(16)
    rows, count = find_or_insert(slot_keys, slot_rows, torch.tensor([9, 4, 9]), 0)
    count                                                # 2
    bool((find(slot_keys, slot_rows, torch.tensor([9, 4, 9])) == rows).all())   # True
    ```
    """
    rows, count = _find_or_insert(slot_keys, slot_rows, keys, num_rows)
    return rows, int(count)


def find(slot_keys: torch.Tensor, slot_rows: torch.Tensor,
         keys: torch.Tensor) -> torch.Tensor:
    """Rows of `keys`, -1 for keys not in the map; the map is not changed.

    Args:
        slot_keys: int64 `[capacity]`, the map's keys.
        slot_rows: int64 `[capacity]`, the map's rows.
        keys: int64 `[n]`.

    Returns:
        int64 `[n]` rows.

    Example:

    ```python
    from reckeras.backend_kernels.hash_table import find, new_slots

    slot_keys, slot_rows = new_slots(16)
    find(slot_keys, slot_rows, torch.tensor([3]))   # tensor([-1])
    ```
    """
    return _find(slot_keys, slot_rows, keys)


def rehash(slot_keys: torch.Tensor, slot_rows: torch.Tensor, capacity: int,
           rows_below: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A new map of `capacity` holding the same key -> row pairs.

    With `rows_below`, only the keys whose row is below it move: on the CPU
    the old map may then grow on another thread during the call (its rows
    numbered from `rows_below` on), and the caller inserts those newer keys
    afterwards.

    Args:
        slot_keys: int64 `[old capacity]`, the map's keys.
        slot_rows: int64 `[old capacity]`, the map's rows.
        capacity: the new capacity, a power of two (see `capacity_for`).
        rows_below: move the keys of rows `[0, rows_below)` only (None:
            every key).

    Returns:
        `(slot_keys, slot_rows)` of the new map, on the same device.

    Example:

    ```python
    from reckeras.backend_kernels.hash_table import find, find_or_insert, new_slots, rehash

    slot_keys, slot_rows = new_slots(16)
    rows, _ = find_or_insert(slot_keys, slot_rows, torch.arange(8), 0)
    slot_keys, slot_rows = rehash(slot_keys, slot_rows, 64)
    bool((find(slot_keys, slot_rows, torch.arange(8)) == rows).all())   # True
    ```
    """
    return _rehash(slot_keys, slot_rows, capacity, rows_below)
