"""Key -> row index in buckets of two cache lines, grown one bucket at a time.

The index of a table keeps no keys: a slot is one byte of the key's digest
(0: free) and the int32 row + 1 (0: free), and the keys stay in the table's
key array (`arena`, each row's key), read only to confirm a digest match. A
bucket is 128 bytes, two cache lines: 25 digests, its local depth, 2 zero
bytes, then 25 rows (the first 9 in the digests' line). A lookup reads the
directory entry, the bucket and the key. Memory a row is about `row +
state + 8 (the key) + 128 / (25 * load)` and the directory.

Addressing is extendible hashing with two choices. A key's 64-bit
`mix64(key)` gives two 32-bit hashes `a` and `b`; with the index's global
depth `G`, its two buckets are `directory[a >> (32 - G)]` (its first) and
`directory[b >> (32 - G)]`. It is stored in its first bucket while that has
a free slot, else in its second, so most keys are found in the first line
read. When both are full, the one of smaller local depth splits: the
directory doubles (in place, every entry becoming two) when that depth is
`G`, a new bucket is appended, and the bucket's keys whose hash has the
next bit set move into it. So the index grows one bucket at a time, never
holds a second copy of itself, and its arrays grow the way the table's rows
do (inside reserved address space on a large CPU table).

The index's tensors, as `new_index` makes them:

* `buckets`: int32 `[capacity, 32]`, one 128-byte bucket a row: as bytes,
  the digests at 0-24 and the local depth at 25; as int32 words, the rows
  + 1 at 7-31 (`views` gives the three);
* `directory`: int32 `[directory capacity]`, its first `2**G` entries in use;
* `shape`: int64 `[2]` on the CPU: the buckets in use and `G`.

Arrays that come zeroed are an empty index, so fresh pages of reserved
memory need no fill.

`find_or_insert` resolves a batch of keys (duplicates allowed) and numbers
the rows of new keys from `num_rows` on, writing their keys into the arena.
A key that finds no room (the arrays are full: no bucket left to split into,
or the directory cannot double) resolves to -1 and nothing of it is kept;
the caller grows the arrays and calls again (`room_needed`).

* torch reference (CPU tensors): vectorized over keys; the new keys are
  placed in rounds (each key to its first bucket if it has room, else its
  second, keys racing for one bucket in key order), their rows numbered in
  the order they are placed, smaller keys first within a round; the
  buckets that block a round split together.
* Triton (CUDA tensors): one lane a key looks at a bucket's 25 slots at
  once; a new key claims a free slot with `tl.atomic_cas` and then a row
  from a counter; the keys whose buckets are both full are placed again
  after the reference's split.
* native CPU kernel (`cpu_native`): the lookups on torch's threads, the
  inserts in one loop on the calling thread, rows in order of first
  position.

All give the same key -> row mapping up to the numbering of the rows created
by one call and where a key sits (which of its buckets, which slot).
"""

from typing import TYPE_CHECKING

import torch

from reckeras.backend_kernels import cpu_native
from reckeras.backend_kernels.dispatch import blocks, constexpr, kernel, register
from reckeras.backend_kernels.hashing import GOLDEN, mix64, mix64_bits

if TYPE_CHECKING:
    # The kernels' `tl`: `dispatch.Kernel.jit` binds it when it jits them.
    import triton.language as tl

# (buckets, directory, shape)
Index = tuple[torch.Tensor, torch.Tensor, torch.Tensor]

SLOTS = 25              # slots a bucket
WORDS = 32              # int32 words a bucket: 128 bytes
BUCKET_BYTES = 4 * WORDS
DEPTH_BYTE = 25         # the local depth's byte
ROW_WORD = 7            # the first row's word (byte 28)
LANES = 32              # a kernel's lanes over a bucket's slots (a power of two)
MAX_DEPTH = 32          # bits of each of a key's two hashes
BLOCK = 64
LOW_32 = 0xFFFFFFFF


def new_index(directory_capacity: int = 1, capacity: int = 1,
              device: torch.device | str | None = None) -> Index:
    """An empty index: one bucket, a directory of one entry.

    Args:
        directory_capacity: entries the directory has room for.
        capacity: buckets the arrays have room for.
        device: where the arrays live (`shape` is always on the CPU).

    Returns:
        `(buckets, directory, shape)` (see the module docstring).

    Example:

    ```python
    from reckeras.backend_kernels.bucket_index import new_index

    buckets, directory, shape = new_index(64, 8)
    shape   # tensor([1, 0]): one bucket, global depth 0
    ```
    """
    return (torch.zeros(capacity, WORDS, dtype=torch.int32, device=device),
            torch.zeros(directory_capacity, dtype=torch.int32, device=device),
            torch.tensor([1, 0], dtype=torch.int64))


def views(buckets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The parts of the buckets, as views that write through.

    Args:
        buckets: the index's int32 `[capacity, 32]` buckets.

    Returns:
        `(digests, rows, depths)`: uint8 `[capacity, 25]`, int32
        `[capacity, 25]` (row + 1, 0: free) and uint8 `[capacity]`.

    Example:

    ```python
    from reckeras.backend_kernels.bucket_index import new_index, views

    digests, rows, depths = views(new_index(capacity=4)[0])
    digests.shape, rows.shape, depths.shape   # [4, 25], [4, 25], [4]
    ```
    """
    raw = buckets.view(torch.uint8)
    return raw[:, :SLOTS], buckets[:, ROW_WORD:], raw[:, DEPTH_BYTE]


def room_needed(shape: torch.Tensor, new_keys: int) -> tuple[int, int]:
    """The capacities that let `new_keys` more keys in without running out.

    Enough in practice: a new bucket for every 6 new keys (buckets hold
    17-19 keys on average) and 8 more, and a directory two doublings past
    the depth those buckets need. Should the splits need more, the keys
    that found no room resolve to -1 and the caller grows the arrays again.

    Args:
        shape: the index's `shape`.
        new_keys: the keys about to be inserted.

    Returns:
        `(bucket capacity, directory capacity)`.

    Example:

    ```python
    from reckeras.backend_kernels.bucket_index import new_index, room_needed

    room_needed(new_index()[2], 1000)   # (175, 1024)
    ```
    """
    buckets = int(shape[0]) + new_keys // 6 + 8
    depth = max(int(shape[1]), (buckets - 1).bit_length()) + 2
    return buckets, 2 ** min(depth, MAX_DEPTH)


def with_room(index: Index, new_keys: int) -> Index:
    """The index, its arrays copied into larger zeroed ones where they lack
    the room `room_needed` asks for (at least doubling them).

    For an index whose arrays are not kept elsewhere in reserved memory (a
    large CPU table grows its own in place, see `embedding.key_index`).

    Args:
        index: `(buckets, directory, shape)`.
        new_keys: the keys about to be inserted.

    Returns:
        The index with room; arrays that had it are the same tensors.

    Example:

    ```python
    from reckeras.backend_kernels.bucket_index import new_index, with_room

    index = with_room(new_index(), 1000)
    index[0].shape, index[1].shape   # (torch.Size([175, 32]), torch.Size([1024]))
    ```
    """
    buckets, directory, shape = index
    needed, entries = room_needed(shape, new_keys)
    if needed > buckets.shape[0]:
        buckets = _zero_extended(buckets, max(needed, 2 * buckets.shape[0]))
    if entries > directory.shape[0]:
        directory = _zero_extended(directory, max(entries, 2 * directory.shape[0]))
    return buckets, directory, shape


def _zero_extended(array: torch.Tensor, rows: int) -> torch.Tensor:
    grown = array.new_zeros((rows, *array.shape[1:]))
    grown[:array.shape[0]] = array
    return grown


def load(shape: torch.Tensor, num_rows: int) -> float:
    """The share of the index's slots in use.

    Args:
        shape: the index's `shape`.
        num_rows: the keys it holds.

    Returns:
        `num_rows / (buckets * SLOTS)`.

    Example:

    ```python
    from reckeras.backend_kernels.bucket_index import load, new_index

    load(new_index()[2], 5)   # 0.2
    ```
    """
    return num_rows / (int(shape[0]) * SLOTS)


# ---- torch reference ------------------------------------------------------------

def _hashes(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each key's two 32-bit hashes (int64) and its digest (uint8, never 0)."""
    mixed = mix64(keys)
    first = (mixed >> 32) & LOW_32
    second = mixed & LOW_32
    digest = ((keys * GOLDEN) >> 56) & 0xFF
    return first, second, torch.where(digest == 0, 1, digest).to(torch.uint8)


def _buckets(directory: torch.Tensor, hashes: torch.Tensor, depth: int) -> torch.Tensor:
    """The bucket (int64) of each hash's directory entry."""
    return directory.index_select(0, hashes >> (MAX_DEPTH - depth)).long()


def _look(buckets: torch.Tensor, arena: torch.Tensor, which: torch.Tensor,
          keys: torch.Tensor, digest: torch.Tensor, rows: torch.Tensor) -> None:
    """Fills `rows` (-1 where unknown) of the keys found in buckets `which`."""
    digests, slots, _ = views(buckets)
    match_key, match_slot = (digests.index_select(0, which) == digest[:, None]).nonzero(
        as_tuple=True)
    row = slots[which.index_select(0, match_key), match_slot].long() - 1
    hit = arena.index_select(0, row) == keys.index_select(0, match_key)
    rows.index_copy_(0, match_key[hit], row[hit])


def _find(index: Index, arena: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    buckets, directory, shape = index
    depth = int(shape[1])
    first, second, digest = _hashes(keys)
    rows = torch.full_like(keys, -1)
    _look(buckets, arena, _buckets(directory, first, depth), keys, digest, rows)
    _look(buckets, arena, _buckets(directory, second, depth), keys, digest, rows)
    return rows


def _fill(buckets: torch.Tensor, which: torch.Tensor) -> torch.Tensor:
    return (views(buckets)[0].index_select(0, which) != 0).sum(1)


def split(buckets: torch.Tensor, directory: torch.Tensor, shape: torch.Tensor,
          arena: torch.Tensor, victims: torch.Tensor) -> bool:
    """Splits distinct non-empty buckets at once (torch ops, any device).

    Doubles the directory first if one of them has the global depth. Each
    bucket's keys whose hash (the one whose entry led there) has the next
    bit set move to a new bucket appended after the others.

    Args:
        buckets, directory, shape: the index, updated in place.
        arena: int64 each row's key.
        victims: int64 distinct buckets, each holding at least one key.

    Returns:
        Whether they were split; False (nothing changed) when the arrays
        have no room for the new buckets or the doubled directory.

    Example:

    ```python
    from reckeras.backend_kernels import bucket_index

    index = bucket_index.new_index(8, 4)
    arena = torch.empty(10, dtype=torch.int64)
    rows, _ = bucket_index.find_or_insert(*index, arena, torch.arange(10), 0)
    bucket_index.split(*index, arena, torch.tensor([0]))   # True
    index[2]                                     # tensor([2, 1]): 2 buckets, depth 1
    bucket_index.find(*index, arena, torch.arange(10))     # the same rows
    ```
    """
    count, depth = (int(v) for v in shape.tolist())
    if count + victims.numel() > buckets.shape[0]:
        return False
    digests, slots, depths = views(buckets)
    local = depths.index_select(0, victims).long()
    if bool((local == depth).any()):
        if depth == MAX_DEPTH or 2 ** (depth + 1) > directory.shape[0]:
            return False
        directory[:2 ** (depth + 1)] = directory[:2 ** depth].repeat_interleave(2)
        depth += 1
    span = 2 ** (depth - local)
    half = span // 2
    member_slots = slots.index_select(0, victims).long() - 1             # [k, SLOTS]
    member_keys = arena.index_select(0, member_slots.clamp(min=0).flatten()).view(
        member_slots.shape)
    first, second, _ = _hashes(member_keys.flatten())
    first = (first >> (MAX_DEPTH - depth)).view(member_slots.shape)
    second = (second >> (MAX_DEPTH - depth)).view(member_slots.shape)
    # The bucket's directory range, from the hash that led its first member here.
    occupied = digests.index_select(0, victims) != 0
    member = occupied.int().argmax(1, keepdim=True)
    entry = first.gather(1, member).squeeze(1)
    entry = torch.where(directory.index_select(0, entry).long() == victims, entry,
                        second.gather(1, member).squeeze(1))
    start = entry & ~(span - 1)
    fresh = torch.arange(count, count + victims.numel(), device=victims.device)
    upper = torch.repeat_interleave(start + half, half)
    upper += torch.arange(upper.numel(), device=victims.device) - torch.repeat_interleave(
        torch.cumsum(half, 0) - half, half)
    directory.index_copy_(0, upper, torch.repeat_interleave(fresh, half).int())
    buckets[fresh] = 0
    depths.index_copy_(0, victims, (local + 1).to(torch.uint8))
    depths.index_copy_(0, fresh, (local + 1).to(torch.uint8))
    # Each member's entry through the hash that led it here; those in the
    # upper half of the range move.
    by_first = (first >= start[:, None]) & (first < (start + span)[:, None])
    entry = torch.where(by_first, first, second)
    moves = occupied & (entry >= (start + half)[:, None])
    source, position = moves.nonzero(as_tuple=True)
    target = (moves.cumsum(1) - 1)[source, position]
    from_bucket, to_bucket = victims[source], fresh[source]
    digests[to_bucket, target] = digests[from_bucket, position]
    slots[to_bucket, target] = slots[from_bucket, position]
    digests[from_bucket, position] = 0
    slots[from_bucket, position] = 0
    shape.copy_(torch.tensor([count + victims.numel(), depth]))
    return True


def _place_round(index: Index, arena: torch.Tensor,
                 keys: torch.Tensor, num_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Places what it can of distinct absent `keys` (ascending) in one round.

    Returns:
        `(rows, blocked)`: each key's new row (`num_rows` on, in key order;
        -1: not placed this round) and whether its two buckets were both
        full.
    """
    buckets, directory, shape = index
    digests, slots, _ = views(buckets)
    depth = int(shape[1])
    first, second, digest = _hashes(keys)
    first, second = _buckets(directory, first, depth), _buckets(directory, second, depth)
    fill_first, fill_second = _fill(buckets, first), _fill(buckets, second)
    # The first bucket while it has room: most keys are then found in it.
    use_first = fill_first < SLOTS
    target = torch.where(use_first, first, second)
    free = SLOTS - torch.where(use_first, fill_first, fill_second)
    # Each key's rank among the keys of its target bucket, in key order.
    order = torch.sort(target, stable=True).indices
    grouped = target.index_select(0, order)
    starts = torch.ones_like(grouped, dtype=torch.bool)
    starts[1:] = grouped[1:] != grouped[:-1]
    index_in_order = torch.arange(grouped.numel(), device=keys.device)
    group_start = torch.cummax(torch.where(starts, index_in_order, 0), 0).values
    rank = torch.empty_like(order).scatter_(0, order, index_in_order - group_start)
    placed = rank < free
    chosen = placed.nonzero().squeeze(1)
    into = target.index_select(0, chosen)
    empty = digests.index_select(0, into) == 0
    position = ((empty.cumsum(1) == (rank.index_select(0, chosen) + 1)[:, None]) & empty
                ).int().argmax(1)
    rows = torch.arange(num_rows, num_rows + chosen.numel(), device=keys.device)
    digests[into, position] = digest.index_select(0, chosen)
    slots[into, position] = (rows + 1).int()
    arena[rows] = keys.index_select(0, chosen)
    return torch.full_like(keys, -1).index_copy_(0, chosen, rows), free == 0


def _find_or_insert(index: Index, arena: torch.Tensor, keys: torch.Tensor,
                    num_rows: int, place_round) -> tuple[torch.Tensor, int]:
    """`find_or_insert` with `place_round` placing the keys (see `_place_round`)."""
    rows = _find(index, arena, keys)
    absent = (rows < 0).nonzero().squeeze(1)
    if not absent.numel():
        return rows, num_rows
    distinct, inverse = torch.unique(keys.index_select(0, absent), return_inverse=True)
    new_rows = torch.full_like(distinct, -1)
    # As many as the arena has rows for (and int32 slots can number).
    pending = distinct[:max(min(arena.shape[0], 2**31 - 1) - num_rows, 0)]
    position = torch.arange(pending.numel(), device=keys.device)
    buckets, directory, shape = index
    depths = views(buckets)[2]
    while pending.numel():
        placed_rows, blocked = place_round(index, arena, pending, num_rows)
        placed = placed_rows >= 0
        new_rows.index_copy_(0, position[placed], placed_rows[placed])
        num_rows += int(placed.sum())
        if bool(blocked.any()):
            depth = int(shape[1])
            first, second, _ = _hashes(pending[blocked])
            first = _buckets(directory, first, depth)
            second = _buckets(directory, second, depth)
            # Of each blocked key's two buckets, the one of smaller local depth.
            victims = torch.where(depths.index_select(0, second) < depths.index_select(
                0, first), second, first)
            if not split(*index, arena=arena, victims=torch.unique(victims)):
                break                                      # no room: the rest stay -1
        pending, position = pending[~placed], position[~placed]
    rows.index_copy_(0, absent, new_rows.index_select(0, inverse))
    return rows, num_rows


def find_or_insert_reference(buckets: torch.Tensor, directory: torch.Tensor,
                             shape: torch.Tensor, arena: torch.Tensor, keys: torch.Tensor,
                             num_rows: int) -> tuple[torch.Tensor, int]:
    """`find_or_insert` with torch ops (deterministic numbering).

    Args:
        buckets, directory, shape, arena, keys, num_rows: as for
            `find_or_insert`.

    Returns:
        What `find_or_insert` returns.

    Example:

    ```python
    from reckeras.backend_kernels import bucket_index

    index = bucket_index.new_index(64, 8)
    arena = torch.empty(8, dtype=torch.int64)
    bucket_index.find_or_insert_reference(*index, arena, torch.tensor([9, 4, 9]), 0)
    # (tensor([1, 0, 1]), 2): 4 < 9 is numbered first
    ```
    """
    return _find_or_insert((buckets, directory, shape), arena, keys, num_rows, _place_round)


def find_reference(buckets: torch.Tensor, directory: torch.Tensor, shape: torch.Tensor,
                   arena: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """`find` with torch ops.

    Args:
        buckets, directory, shape, arena, keys: as for `find`.

    Returns:
        int64 `[n]` rows, -1 for keys not in the index.

    Example:

    ```python
    from reckeras.backend_kernels import bucket_index

    index = bucket_index.new_index(8)
    bucket_index.find_reference(*index, torch.empty(0, dtype=torch.int64),
                                torch.tensor([3]))   # tensor([-1])
    ```
    """
    return _find((buckets, directory, shape), arena, keys)


# ---- Triton kernels ----------------------------------------------------------------

@kernel
def _hashes_bits(key, depth):
    """A key's two directory entries and its digest (int32), in a kernel."""
    mixed = mix64_bits(key).to(tl.uint64, bitcast=True)
    shift = (MAX_DEPTH - depth).to(tl.uint64)
    first = ((mixed >> 32) >> shift).to(tl.int64)
    second = ((mixed & LOW_32) >> shift).to(tl.int64)
    digest = (((key * GOLDEN).to(tl.uint64, bitcast=True) >> 56) & 0xFF).to(tl.int32)
    return first, second, tl.where(digest == 0, 1, digest)


@kernel
def _row_in(bytes_ptr, words_ptr, arena_ptr, bucket, key, digest, live,
            SLOTS: constexpr, LANES: constexpr, WORDS: constexpr, ROW_WORD: constexpr):
    """Each lane's row in its bucket, -1 where its key is not there."""
    columns = tl.arange(0, LANES)[None, :]
    slot = live[:, None] & (columns < SLOTS)
    digests = tl.load(bytes_ptr + bucket[:, None] * (4 * WORDS) + columns, mask=slot, other=0)
    match = slot & (digests.to(tl.int32) == digest[:, None])
    row = tl.load(words_ptr + bucket[:, None] * WORDS + ROW_WORD + columns, mask=match,
                  other=0).to(tl.int64) - 1
    hit = match & (tl.load(arena_ptr + row, mask=match, other=0) == key[:, None])
    return tl.max(tl.where(hit, row, -1), 1)


@kernel(do_not_specialize=("n", "depth"))
def _find_kernel(bytes_ptr, words_ptr, directory_ptr, arena_ptr, keys_ptr, rows_ptr, n,
                 depth, BLOCK: constexpr, SLOTS: constexpr, LANES: constexpr,
                 WORDS: constexpr, ROW_WORD: constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = offs < n
    key = tl.load(keys_ptr + offs, mask=live, other=0)
    first, second, digest = _hashes_bits(key, depth)
    first = tl.load(directory_ptr + first, mask=live, other=0).to(tl.int64)
    second = tl.load(directory_ptr + second, mask=live, other=0).to(tl.int64)
    row = _row_in(bytes_ptr, words_ptr, arena_ptr, first, key, digest, live, SLOTS, LANES,
                  WORDS, ROW_WORD)
    # The second bucket only for the keys not in their first.
    row = tl.where(row >= 0, row,
                   _row_in(bytes_ptr, words_ptr, arena_ptr, second, key, digest,
                           live & (row < 0) & (second != first), SLOTS, LANES, WORDS,
                           ROW_WORD))
    tl.store(rows_ptr + offs, row, mask=live)


@kernel(do_not_specialize=("n", "depth"))
def _place_kernel(bytes_ptr, words_ptr, directory_ptr, arena_ptr, counter_ptr, keys_ptr,
                  rows_ptr, n, depth, BLOCK: constexpr, SLOTS: constexpr, LANES: constexpr,
                  WORDS: constexpr, ROW_WORD: constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = offs < n
    key = tl.load(keys_ptr + offs, mask=live, other=0)
    first, second, digest = _hashes_bits(key, depth)
    first = tl.load(directory_ptr + first, mask=live, other=0).to(tl.int64)
    second = tl.load(directory_ptr + second, mask=live, other=0).to(tl.int64)
    columns = tl.arange(0, LANES)[None, :]
    row = tl.full([BLOCK], -1, tl.int64)
    pending = live
    while tl.sum(pending.to(tl.int32), 0) > 0:
        # A slot is taken once its row is claimed (-1) or written: rows, not
        # digests, tell, as the digest is written after the claim. The lanes
        # past the 25 slots read as taken.
        slot = pending[:, None] & (columns < SLOTS)
        taken_first = tl.load(words_ptr + first[:, None] * WORDS + ROW_WORD + columns,
                              mask=slot, other=1) != 0
        taken_second = tl.load(words_ptr + second[:, None] * WORDS + ROW_WORD + columns,
                               mask=slot, other=1) != 0
        free_first = tl.sum((~taken_first).to(tl.int32), 1)
        free_second = tl.sum((~taken_second).to(tl.int32), 1)
        # The first bucket while it has room, as the other kernels place.
        use_first = free_first > 0
        bucket = tl.where(use_first, first, second)
        taken = tl.where(use_first[:, None], taken_first, taken_second)
        pending = pending & (use_first | (free_second > 0))   # both full: after a split
        # The first free slot (taken slots weigh more than any position).
        position = tl.argmin(taken.to(tl.int32) * LANES + columns, 1).to(tl.int64)
        cell = bucket * WORDS + ROW_WORD + position
        # atomic_cas takes no mask: the other lanes compare with -2, which no
        # slot holds, and so write nothing.
        old = tl.atomic_cas(words_ptr + cell, tl.where(pending, 0, -2).to(tl.int32),
                            tl.where(pending, -1, -2).to(tl.int32))
        won = pending & (old == 0)
        claimed = tl.atomic_add(counter_ptr + tl.zeros([BLOCK], tl.int64), 1, mask=won)
        tl.store(words_ptr + cell, (claimed + 1).to(tl.int32), mask=won)
        tl.store(bytes_ptr + bucket * (4 * WORDS) + position, digest.to(tl.uint8), mask=won)
        tl.store(arena_ptr + claimed, key, mask=won)
        row = tl.where(won, claimed, row)
        pending = pending & ~won
    tl.store(rows_ptr + offs, row, mask=live)


def _layout() -> dict:
    """The kernels' constexpr arguments: the bucket layout."""
    return {"BLOCK": BLOCK, "SLOTS": SLOTS, "LANES": LANES, "WORDS": WORDS,
            "ROW_WORD": ROW_WORD}


def find_triton(buckets: torch.Tensor, directory: torch.Tensor, shape: torch.Tensor,
                arena: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """`find` with the Triton kernel (CUDA tensors).

    Args:
        buckets, directory, shape, arena, keys: as for `find`.

    Returns:
        int64 `[n]` rows, -1 for keys not in the index.

    Example:

    ```python
    from reckeras.backend_kernels import bucket_index

    index = bucket_index.new_index(8, device="cuda")
    bucket_index.find_triton(*index, torch.empty(0, dtype=torch.int64, device="cuda"),
                             torch.tensor([3], device="cuda"))   # [-1]
    ```
    """
    keys = keys.contiguous()
    rows = torch.empty_like(keys)
    if keys.numel():
        _find_kernel[(blocks(keys.numel(), BLOCK),)](
            buckets.view(torch.uint8), buckets, directory, arena, keys, rows, keys.numel(),
            int(shape[1]), **_layout())
    return rows


def _place_triton(index: Index, arena: torch.Tensor, keys: torch.Tensor,
                  num_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`_place_round` with the Triton kernel: every key claims a slot at
    once, its row numbered in the order the claims took a row; the keys
    left are those whose two buckets are full."""
    buckets, directory, shape = index
    rows = torch.empty_like(keys)
    counter = torch.tensor([num_rows], dtype=torch.int64, device=keys.device)
    _place_kernel[(blocks(keys.numel(), BLOCK),)](
        buckets.view(torch.uint8), buckets, directory, arena, counter, keys, rows,
        keys.numel(), int(shape[1]), **_layout())
    return rows, rows < 0


def find_or_insert_triton(buckets: torch.Tensor, directory: torch.Tensor, shape: torch.Tensor,
                          arena: torch.Tensor, keys: torch.Tensor,
                          num_rows: int) -> tuple[torch.Tensor, int]:
    """`find_or_insert` with the Triton kernels (CUDA tensors).

    The new keys are numbered in the order their claims took a row.

    Args:
        buckets, directory, shape, arena, keys, num_rows: as for
            `find_or_insert`.

    Returns:
        What `find_or_insert` returns.

    Example:

    ```python
    from reckeras.backend_kernels import bucket_index

    index = bucket_index.new_index(64, 8, device="cuda")
    arena = torch.empty(8, dtype=torch.int64, device="cuda")
    bucket_index.find_or_insert_triton(*index, arena,
                                       torch.tensor([9, 4, 9], device="cuda"), 0)
    ```
    """
    return _find_or_insert((buckets, directory, shape), arena, keys, num_rows, _place_triton)


# ---- the torch ops (dispatch.register) ------------------------------------------------

def _count_as_tensor(fn):
    """`fn` of the find-or-insert signature, its row count returned as a 0-dim
    int64 CPU tensor (an op returns tensors: a data-dependent int would
    defeat its fake implementation)."""
    def counted(*args):
        rows, count = fn(*args)
        return rows, torch.tensor(count)
    return counted


def _find_native(buckets, directory, shape, arena, keys):
    return cpu_native.bucket_find_or_insert(buckets, directory, shape, arena, keys,
                                            _arena_rows(arena), insert=False)[0]


def _arena_rows(arena: torch.Tensor) -> int:
    # A find reads rows through slots the index itself wrote; any row of the
    # arena (up to what int32 slots number) is one it may hold.
    return min(arena.shape[0], 2**31 - 1)


def _native_usable(*tensors) -> bool:
    return all(t.is_cpu and t.is_contiguous() for t in tensors
               if isinstance(t, torch.Tensor)) and cpu_native.available()


_find_or_insert_op = register(
    "bucket_find_or_insert(Tensor(a!) buckets, Tensor(b!) directory, Tensor(c!) shape, "
    "Tensor(d!) arena, Tensor keys, int num_rows) -> (Tensor, Tensor)",
    reference=_count_as_tensor(find_or_insert_reference),
    triton=_count_as_tensor(find_or_insert_triton),
    native=_count_as_tensor(cpu_native.bucket_find_or_insert), native_usable=_native_usable,
    fake=lambda *args: (torch.empty_like(args[4]), torch.empty((), dtype=torch.int64)))
_find_op = register(
    "bucket_find(Tensor buckets, Tensor directory, Tensor shape, Tensor arena, "
    "Tensor keys) -> Tensor",
    reference=find_reference, triton=find_triton, native=_find_native,
    native_usable=_native_usable, fake=lambda *args: torch.empty_like(args[4]))


# ---- public entry points --------------------------------------------------------------

def find_or_insert(buckets: torch.Tensor, directory: torch.Tensor, shape: torch.Tensor,
                   arena: torch.Tensor, keys: torch.Tensor,
                   num_rows: int) -> tuple[torch.Tensor, int]:
    """Resolves `keys` to rows, inserting the absent ones (in place).

    The rows of the new keys are `num_rows, num_rows + 1, ...`, in an order
    that depends on the kernel that runs, and their keys are written to
    `arena`. A key that finds no room (no arena row left, or no room in the
    arrays for the splits it needs: size them with `room_needed`) resolves
    to -1 and nothing of it is kept.

    Args:
        buckets, directory, shape: the index (see the module docstring),
            updated in place.
        arena: int64 `[row capacity]`, each row's key.
        keys: int64 `[n]`, duplicates allowed.
        num_rows: the rows the arena holds before the call.

    Returns:
        `(rows, num_rows)`: int64 rows aligned with `keys` and the new count.

    Example:

    ```python
    from reckeras.backend_kernels import bucket_index

    index = bucket_index.new_index(64, 8)
    arena = torch.empty(8, dtype=torch.int64)
    rows, count = bucket_index.find_or_insert(*index, arena, torch.tensor([9, 4, 9]), 0)
    count                                                                 # 2
    bool((bucket_index.find(*index, arena, torch.tensor([9, 4])) == rows[:2]).all())  # True
    ```
    """
    rows, count = _find_or_insert_op(buckets, directory, shape, arena, keys, num_rows)
    return rows, int(count)


def find(buckets: torch.Tensor, directory: torch.Tensor, shape: torch.Tensor,
         arena: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Rows of `keys`, -1 for keys not in the index; nothing changes.

    Args:
        buckets, directory, shape: the index.
        arena: int64 each row's key.
        keys: int64 `[n]`.

    Returns:
        int64 `[n]` rows.

    Example:

    ```python
    from reckeras.backend_kernels import bucket_index

    index = bucket_index.new_index(8)
    bucket_index.find(*index, torch.empty(0, dtype=torch.int64), torch.tensor([3]))  # [-1]
    ```
    """
    return _find_op(buckets, directory, shape, arena, keys)
