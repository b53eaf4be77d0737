"""The key -> row index of a physical table, of the kind its tables ask for.

`PhysicalTable` keeps each row's key in its `keys` array and finds rows
through one of two indexes (`TableOptions(index=...)`):

* `"hash"` (`HashIndex`, the default): open addressing with linear probing
  (`backend_kernels.hash_table`) at a load under 1/2, so a lookup reads two
  cache lines; 16 bytes a slot, 32 to 64 bytes a key. Grown by rehashing
  into a map twice as large, built in the background for a large CPU table
  (`index_build`): the old and the new map are both held meanwhile.
* `"compact"` (`CompactIndex`): buckets of 128 bytes, 25 one-byte digests
  and int32 rows (`backend_kernels.bucket_index`), the keys read
  from the table's `keys` array; about 7 bytes a key, grown one bucket at a
  time and never copied (a large CPU table's arrays grow in place inside
  reserved address space). A lookup reads a directory entry, one or two
  buckets and the key, where `"hash"` reads about two lines: its kernels
  are about twice as slow (see docs/performance.md, "Compact tables").

Both resolve keys the table holds to its rows and insert absent keys with
the rows `num_rows, num_rows + 1, ...`, writing their keys into the table's
`keys` array, which the table grows when an index asks (`grow(rows)`
returns it holding at least `rows` rows): a hash index after its insert,
knowing how many rows it created; a compact index before, as its kernel
reads and writes that array.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from reckeras._allocator import release_free_memory
from reckeras.backend_kernels import bucket_index, hash_table
from reckeras.embedding.host_memory import physical_host_bytes, reserve_memory
from reckeras.embedding.index_build import IndexBuild
from reckeras.embedding.options import INDEXES

# A CPU hash index of at least this many slots is rebuilt in the background
# (`HashIndex.reserve`, an `IndexBuild`), starting when its keys reach this
# share of its load limit: the build then has the next 2/3 of that limit's
# rows' steps to finish in.
BUILD_AHEAD_FROM_SLOTS = 2**22
BUILD_AHEAD_AT = 0.6

# A CPU compact index that needs this many buckets (~600k keys) moves its
# arrays into reserved address space, where they grow without moving.
RESERVE_FROM_BUCKETS = 2**15


class HashIndex:
    """Open addressing (see the module docstring).

    Args:
        table: the table whose `keys` and `num_rows` a background build reads
            (a weak reference is kept).
        device: where the map lives.
        build_ahead: rebuild a large map in the background (a CPU table).

    Example:

    ```python
    table = PhysicalTable(dim=4)                 # index="hash", the default
    table.find_or_insert(torch.tensor([7, 9]))   # rows 0, 1
    table.key_index.slot_keys.numel()            # 16 slots
    ```
    """

    kind = "hash"

    def __init__(self, table: Any, device: torch.device, build_ahead: bool):
        self._table = weakref.ref(table)
        self.device = device
        self.build_ahead = build_ahead
        self.slot_keys, self.slot_rows = hash_table.new_slots(16, device)
        self._next: IndexBuild | None = None      # a build under way

    def find(self, keys: torch.Tensor, arena: torch.Tensor) -> torch.Tensor:
        """Rows of `keys` (-1: absent).

        Args:
            keys: int64 keys.
            arena: the table's keys array (each row's key).

        Returns:
            int64 rows.
        """
        return hash_table.find(self.slot_keys, self.slot_rows, keys)

    def insert(self, keys: torch.Tensor, num_rows: int,
               grow: Callable[[int], torch.Tensor]) -> tuple[torch.Tensor, int]:
        """Rows of `keys` (absent ones, duplicates allowed), numbered from
        `num_rows` on; their keys written into the table's keys array.

        Args:
            keys: int64 keys the index does not hold.
            num_rows: the table's rows before the call.
            grow: `grow(rows)` returns the table's keys array holding at
                least `rows` rows.

        Returns:
            `(rows, num_rows)`: each key's row and the new row count.
        """
        self.reserve(keys.numel(), num_rows)
        rows, count = hash_table.find_or_insert(self.slot_keys, self.slot_rows, keys,
                                                num_rows)
        if count > num_rows:
            # Every new row's key, from the absent keys that resolved to it.
            created = torch.empty(count - num_rows, dtype=torch.int64, device=keys.device)
            created[rows - num_rows] = keys
            grow(count)[num_rows:count] = created
        return rows, count

    def reserve(self, extra_keys: int, num_rows: int) -> None:
        """Sizes the map for `extra_keys` more keys.

        A large CPU map is rebuilt at twice its size in the background once
        it is `BUILD_AHEAD_AT` of the way to its load limit, while steps go
        on, and keeps taking the keys created meanwhile; when the limit comes
        the new map only takes the last few. Rebuilt in the step instead, a
        10^8-row table's map (4 GB) stalled it for 14 s, most of it faulting
        in the new map's fresh pages.

        Args:
            extra_keys: keys about to be inserted.
            num_rows: the keys it holds.
        """
        needed = num_rows + extra_keys
        capacity = self.slot_keys.numel()
        limit = capacity * hash_table.MAX_LOAD
        if needed > limit:
            self._install(hash_table.capacity_for(needed), num_rows)
        elif self._next is None and num_rows > limit * BUILD_AHEAD_AT and \
                capacity >= BUILD_AHEAD_FROM_SLOTS and self.build_ahead:
            table = self._table()
            self._next = IndexBuild(self.slot_keys, self.slot_rows, 2 * capacity, num_rows,
                                    self._table, table.name if table is not None else "")

    def _install(self, capacity: int, num_rows: int) -> None:
        """Replaces the map by one of at least `capacity` slots: the
        background build when it is large enough, else a rehash now."""
        build, self._next = self._next, None
        built = build.result() if build is not None else None
        table = self._table()
        if build is not None and built is not None and built[0].numel() >= capacity and \
                table is not None:
            slot_keys, slot_rows = built
            # The keys created since the build last caught up, with their
            # rows: all absent from it and distinct, so numbering them from
            # its row count in row order gives each its own row again.
            _, count = hash_table.find_or_insert(
                slot_keys, slot_rows, table.keys[build.rows:num_rows], build.rows)
            if count != num_rows:
                raise RuntimeError(f"embedding table {table.name}: the index built in the "
                                   f"background holds {count} rows, the table {num_rows}")
        else:
            slot_keys, slot_rows = hash_table.rehash(self.slot_keys, self.slot_rows, capacity)
        self.slot_keys, self.slot_rows = slot_keys, slot_rows
        release_free_memory()

    @property
    def building(self) -> IndexBuild | None:
        """The background build under way, if any."""
        return self._next

    def finish(self) -> None:
        """Ends a background build (its rows are about to be renumbered)."""
        if self._next is not None:
            self._next.result()
            self._next = None

    def memory_bytes(self) -> int:
        """Bytes of the map's slots."""
        return self.slot_keys.numel() * 8 + self.slot_rows.numel() * 8


class CompactIndex:
    """Buckets of digests and int32 rows (see the module docstring).

    Args:
        device: where the index lives.
        reservable: whether its arrays may move into reserved address space
            once large (a CPU table not in pinned memory).

    Example:

    ```python
    table = PhysicalTable(dim=4, index="compact")
    table.find_or_insert(torch.arange(1000))     # rows 0 .. 999
    table.memory_by_part()["index"]              # ~7 bytes a key, and the directory
    ```
    """

    kind = "compact"

    def __init__(self, device: torch.device, reservable: bool):
        self.device = device
        self.reservable = reservable
        self.arrays: bucket_index.Index = bucket_index.new_index(device=device)
        self._reserved = False

    def find(self, keys: torch.Tensor, arena: torch.Tensor) -> torch.Tensor:
        """Rows of `keys` (-1: absent).

        Args:
            keys: int64 keys.
            arena: the table's keys array (each row's key).

        Returns:
            int64 rows.
        """
        return bucket_index.find(*self.arrays, arena, keys)

    def insert(self, keys: torch.Tensor, num_rows: int,
               grow: Callable[[int], torch.Tensor]) -> tuple[torch.Tensor, int]:
        """Rows of `keys` (absent ones, duplicates allowed), numbered from
        `num_rows` on; their keys written into the table's keys array.

        Args:
            keys: int64 keys the index does not hold.
            num_rows: the table's rows before the call.
            grow: `grow(rows)` returns the table's keys array holding at
                least `rows` rows.

        Returns:
            `(rows, num_rows)`: each key's row and the new row count.
        """
        rows = torch.empty_like(keys)
        pending, room = torch.arange(keys.numel(), device=keys.device), keys.numel()
        while pending.numel():
            self.reserve(room, num_rows)
            arena = grow(num_rows + pending.numel())
            found, num_rows = bucket_index.find_or_insert(*self.arrays, arena,
                                                          keys[pending], num_rows)
            rows[pending] = found
            # Keys that found no room (rare: see bucket_index) go again, with more.
            pending, room = pending[found < 0], 2 * room
        return rows, num_rows

    def reserve(self, extra_keys: int, num_rows: int) -> None:
        """Makes room for `extra_keys` more keys (`bucket_index.room_needed`).

        Args:
            extra_keys: keys about to be inserted.
            num_rows: the keys it holds (unused: the buckets tell).
        """
        array, directory, shape = self.arrays
        buckets, entries = bucket_index.room_needed(shape, extra_keys)
        if buckets <= array.shape[0] and entries <= directory.shape[0]:
            return
        if self._reserved or (self.reservable and buckets >= RESERVE_FROM_BUCKETS):
            self._move_to_reserved(buckets, entries)
        else:
            self.arrays = bucket_index.with_room(self.arrays, extra_keys)

    def _move_to_reserved(self, buckets: int, entries: int) -> None:
        """Arrays in reserved memory, sized for all the buckets the host's
        memory could hold: growing them later moves nothing. Their fresh
        pages read zeros (an empty index) and cost nothing until written."""
        array, directory, shape = self.arrays
        if self._reserved and buckets <= array.shape[0] and entries <= directory.shape[0]:
            return
        if self._reserved:
            raise MemoryError(f"a compact index of {buckets} buckets and {entries} "
                              f"directory entries exceeds the host's memory")
        most = max(buckets, physical_host_bytes() // bucket_index.BUCKET_BYTES)
        used, in_use = int(shape[0]), 2 ** int(shape[1])
        moved = []
        for old, rows, count in ((array, most, used),
                                 (directory, max(entries, 4 * most), in_use)):
            reserved = reserve_memory((rows, *old.shape[1:]), old.dtype)
            reserved[:count] = old[:count]
            moved.append(reserved)
        self.arrays = (*moved, shape)    # type: ignore[assignment]
        self._reserved = True
        release_free_memory()

    def finish(self) -> None:
        """Nothing runs in the background."""

    def memory_bytes(self) -> int:
        """Bytes of the index: its whole arrays, or, in reserved memory, the
        buckets and directory entries in use (its other pages are not
        committed)."""
        array, directory, shape = self.arrays
        buckets = int(shape[0]) if self._reserved else array.shape[0]
        entries = 2 ** int(shape[1]) if self._reserved else directory.shape[0]
        return buckets * bucket_index.BUCKET_BYTES + entries * 4


def new_index(kind: str, table: Any, device: torch.device,
              pin_memory: bool) -> HashIndex | CompactIndex:
    """An empty index of `kind` for `table`.

    Args:
        kind: `"hash"` or `"compact"`.
        table: the `PhysicalTable` (a background hash build reads its keys).
        device: where the index lives.
        pin_memory: whether the table's arrays are pinned (a compact index
            then stays out of reserved memory, as its rows do).

    Returns:
        The index.

    Raises:
        ValueError: for another `kind`.

    Example:

    ```python
    index = new_index("compact", table, torch.device("cpu"), pin_memory=False)
    ```
    """
    on_cpu = device.type == "cpu"
    if kind == "hash":
        return HashIndex(table, device, build_ahead=on_cpu)
    if kind == "compact":
        return CompactIndex(device, reservable=on_cpu and not pin_memory)
    raise ValueError(f"an embedding table's index must be one of {INDEXES}, got {kind!r}")
