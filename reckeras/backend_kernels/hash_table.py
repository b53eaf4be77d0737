"""Open-addressing id -> row hash map (linear probing), torch reference.

The map is two int64 arrays of a power-of-two capacity: ``slot_keys`` (EMPTY
where free) and ``slot_rows``. ``find_or_insert`` resolves a whole batch of
keys at once: every round, each unresolved key looks at one slot; a key found
there is resolved, a free slot is claimed (when several keys race for one free
slot, the lowest position wins, as an atomic compare-and-swap would let exactly
one win), and a slot holding another key sends the key one slot further. The
loop runs over probe rounds, never over keys. Duplicate keys in the batch are
fine: the copies that lose a race find the winner's key in the next round.

Rows are numbered in the order keys are first inserted, starting at
``num_rows``; the caller owns the row storage.
"""

import torch

from reckeras.backend_kernels.hashing import mix64

EMPTY = -(2**63)          # a key equal to EMPTY is stored as EMPTY + 1
MAX_LOAD = 0.5


def _slot_of(keys: torch.Tensor, capacity: int) -> torch.Tensor:
    return mix64(keys) & (capacity - 1)


def new_slots(capacity: int, device=None):
    """Empty ``(slot_keys, slot_rows)`` of ``capacity`` (a power of two)."""
    if capacity & (capacity - 1):
        raise ValueError(f"capacity must be a power of two, got {capacity}")
    keys = torch.full((capacity,), EMPTY, dtype=torch.int64, device=device)
    rows = torch.full((capacity,), -1, dtype=torch.int64, device=device)
    return keys, rows


def capacity_for(num_keys: int) -> int:
    """Smallest power-of-two capacity that keeps ``num_keys`` under MAX_LOAD."""
    capacity = 16
    while num_keys > capacity * MAX_LOAD:
        capacity *= 2
    return capacity


def _probe(slot_keys, slot_rows, keys, num_rows, insert):
    keys = torch.where(keys == EMPTY, keys + 1, keys)
    capacity = slot_keys.numel()
    result = torch.full_like(keys, -1)
    pending = torch.arange(keys.numel(), device=keys.device)
    slots = _slot_of(keys, capacity)
    next_row = num_rows
    while pending.numel():
        probe_keys = keys[pending]
        probe_slots = slots[pending]
        seen = slot_keys[probe_slots]
        found = seen == probe_keys
        result[pending[found]] = slot_rows[probe_slots[found]]
        free = seen == EMPTY
        if insert and bool(free.any()):
            claimants = pending[free]
            claim_slots = probe_slots[free]
            winner = torch.full((capacity,), keys.numel(), dtype=torch.int64,
                                device=keys.device)
            winner.scatter_reduce_(0, claim_slots, claimants, reduce="amin")
            won = winner[claim_slots] == claimants
            won_slots = claim_slots[won]
            new_rows = next_row + torch.arange(int(won.sum()), device=keys.device)
            slot_keys[won_slots] = keys[claimants[won]]
            slot_rows[won_slots] = new_rows
            result[claimants[won]] = new_rows
            next_row += new_rows.numel()
            # Losers look at the same slot again: it may now hold their key.
            done = found.clone()
            done[free.nonzero().squeeze(1)[won]] = True
            moving = ~found & ~free
        else:
            done = found | free          # find-only: a free slot means absent
            moving = ~done
        slots[pending[moving]] = (probe_slots[moving] + 1) & (capacity - 1)
        pending = pending[~done]
    return result, next_row


def find_or_insert(slot_keys, slot_rows, keys, num_rows):
    """Resolves ``keys`` to rows, inserting the absent ones (in place).

    The caller must ensure capacity for every new key (see ``capacity_for``).

    Returns:
        ``(rows, num_rows)``: int64 rows aligned with ``keys`` and the new count.
    """
    return _probe(slot_keys, slot_rows, keys, num_rows, insert=True)


def find(slot_keys, slot_rows, keys):
    """Rows of ``keys``, -1 for keys not in the map; the map is not changed."""
    rows, _ = _probe(slot_keys, slot_rows, keys, 0, insert=False)
    return rows


def rehash(slot_keys, slot_rows, capacity):
    """A new map of ``capacity`` holding the same key -> row pairs."""
    occupied = slot_keys != EMPTY
    new_keys, new_rows = new_slots(capacity, slot_keys.device)
    keys, rows = slot_keys[occupied], slot_rows[occupied]
    provisional, _ = _probe(new_keys, new_rows, keys, 0, insert=True)
    # Reinsertion numbers rows 0..n-1 in claim order; map them back.
    real_row = torch.empty_like(rows)
    real_row[provisional] = rows
    filled = new_rows >= 0
    new_rows[filled] = real_row[new_rows[filled]]
    return new_keys, new_rows
