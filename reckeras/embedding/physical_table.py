"""The device row store: a dynamic key index plus row arrays.

A `PhysicalTable` holds the rows of one physical table (several logical
tables of one dim packed together, see `packing`; their keys are salted so
they never share a row). It is the `"device"` row store (see `row_store`),
every row where the lookup runs, and the host tier (`index`) of a
`cache.HostCachedTable`.

A `PhysicalTable` grows without bound: its key index (`key_index`: an
open-addressing hash map, or the compact bucketized index a table can ask
for) grows as keys arrive, and the row arrays double when full (a large CPU
table grows inside reserved address space, see `host_memory`). A new row's initial
value is a function of its key and the table's seed only, so it is the same
whatever the batch order or the rank that creates it. The table knows nothing
of a cache in front of it: the store that owns both keeps them consistent.

Every `PhysicalTable` also tracks what changed, for delta checkpoints (see
`checkpoint`), and how often each row was trained, in one int32 a row
(`tracking`, 4 bytes):

- its high bits hold the save *generation* in which the row was created or
  last updated by training (`tracking >> COUNT_BITS`), set for the distinct
  rows of each update before it is applied (`mark_written`, which the engine
  calls); `export_changes(since)` returns the rows of generations after
  `since`. Generations start at 1 and advance at every checkpoint and
  serving export (`next_generation`), up to `MAX_GENERATION` (2**20 - 1) in
  one process: past it `next_generation` raises;
- its low `COUNT_BITS` (11) bits count the training steps the row was seen
  in: the same `mark_written` adds one, once per update however often its
  id occurs in the batch (a step whose update is dropped, being non-finite,
  counts for no row). The count *saturates* at `MAX_COUNT` (2047): a row
  seen in more steps reads 2047, and a row loaded with a larger count (from
  a checkpoint saved before counts saturated) is clamped to 2047.
  Checkpoints save the counts (`export`'s int32 `"seen_steps"`), and
  `rk.Model.export_serving(..., min_count=k)` keeps only the rows seen in at
  least `k` steps (`k` at most 2047).

Keys whose rows were freed (`compact`) or replaced (`load`) are kept as
*tombstones* with their generation. A table that packs several logical
tables also keeps each row's logical table (`tags`, the index among the
physical table's tables; -1: unknown), so that a checkpoint can be loaded
into a model whose tables changed.

Rows are stored in the table's `dtype` (float32, float16 or bfloat16: see
`row_dtypes`); the optimizer state is float32 whatever it is. Rows written
from float32 values outside an update (a new row's initial value, a loaded
row of another dtype) are rounded to the nearest (ties to even); an
update rounds stochastically (`backend_kernels.sparse_optimizers`).
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from reckeras._allocator import release_free_memory
from reckeras.backend_kernels.hashing import initial_rows
from reckeras.embedding.host_memory import available_host_bytes, physical_host_bytes, reserve_memory
from reckeras.embedding.key_index import new_index
from reckeras.embedding.row_dtypes import to_numpy, to_torch
from reckeras.embedding.row_store import RowStore

# A CPU table that reaches this many rows keeps its arrays in reserved address
# space, where growing moves nothing (see `PhysicalTable._extended`); below it
# doubling copies cost little.
RESERVE_FROM_ROWS = 2**20




# A row's `tracking` entry is `generation << COUNT_BITS | count` (see the
# module docstring): the count of steps saturates at MAX_COUNT and the
# generation stops at MAX_GENERATION, so that the entry stays a non-negative
# int32.
COUNT_BITS = 11
MAX_COUNT = 2**COUNT_BITS - 1
MAX_GENERATION = 2**(31 - COUNT_BITS) - 1


class PhysicalTable(RowStore):
    """Rows of one dim, found by int64 key: the `"device"` row store.

    Its arrays live on `device`, and the rows it resolves are rows of its own
    arrays (it is its own `index`). It tracks the rows written and the keys
    deleted per save generation (see the module docstring).

    Args:
        dim: row width.
        init_scale: new rows are uniform in `[-init_scale, init_scale]`.
        seed: seed of the initial values.
        device: torch device of the storage.
        name: how errors name the table (its logical tables).
        pin_memory: allocate rows and state in pinned host memory (a host
            tier copied to and from a GPU cache).
        num_tables: logical tables packed into it; with more than one, each
            row's logical table is kept (`tags`) and `resolve` reads tags.
        dtype: the rows' dtype: `torch.float32`, `torch.float16` or
            `torch.bfloat16` (the optimizer state is float32).
        index: the key index, `"hash"` (the fastest) or `"compact"` (about
            7 bytes a key where `"hash"` takes 32 to 64; see `key_index`).

    Example:

    ```python
    table = PhysicalTable(dim=4, init_scale=0.05, seed=1)
    rows = table.find_or_insert(torch.tensor([10, 20, 10]))   # rows 0, 1, 0
    table.find(torch.tensor([20, 99]))                          # rows 1, -1
    ```
    """

    # Arrays of its own (the protocol's are read-only: a store may compute them).
    weights: torch.Tensor
    state: torch.Tensor
    tags: torch.Tensor | None

    def __init__(self, dim: int, init_scale: float = 0.05, seed: int = 0,
                 device: str | torch.device | None = None, name: str | None = None,
                 pin_memory: bool = False, num_tables: int = 1,
                 dtype: torch.dtype = torch.float32, index: str = "hash"):
        self.dim = dim
        self.init_scale = init_scale
        self.seed = seed
        self.device = torch.device(device or "cpu")
        self.name = name or f"dim {dim}"
        self.pin_memory = pin_memory
        self.key_index = new_index(index, self, self.device, pin_memory)
        self.num_rows = 0
        self.keys = torch.empty(1, dtype=torch.int64, device=self.device)
        self.weights = torch.zeros(1, dim, dtype=dtype, device=self.device)
        self.state = torch.zeros(1, 0, device=self.device)
        self.state_init = 0.0
        self.needs_tags = False
        self.tags = None
        if num_tables > 1:
            self.track_tags()
        # Each row's generation and count of steps (see the module
        # docstring): one entry per row of capacity plus a last one that the
        # row -1 (an id without a row) writes into, so marking needs no mask.
        self.tracking = torch.zeros(2, dtype=torch.int32, device=self.device)
        self.generation = 1
        # Tombstones: (int64 keys on the CPU, generation).
        self.deleted: list[tuple[torch.Tensor, int]] = []
        self._reservations: dict[str, torch.Tensor] = {}   # array name -> its reserved memory
        self._rows_written = 0      # the most rows ever held (reserved pages touched)

    # ---- the row store -----------------------------------------------------------

    @property
    def index(self) -> PhysicalTable:
        """The table itself: its rows are the ones lookups use."""
        return self

    @property
    def row_bound(self) -> int:
        """Rows in use: every resolved row is below it."""
        return self.num_rows

    def resolve(self, keys: torch.Tensor, training: bool,
                tags: torch.Tensor | None = None) -> tuple[torch.Tensor, None]:
        """Rows of `keys`, created for new keys while training (see
        `RowStore.resolve`; nothing moves them, so there is no pin).

        Args:
            keys: int64 table keys.
            training: create rows for new keys.
            tags: each key's logical table, kept for new rows where the
                table tracks tags (`needs_tags`), else None.

        Returns:
            `(rows, None)`.
        """
        return self.place(self.rows_of(keys, insert=training, tags=tags), training)

    def locked(self) -> contextlib.AbstractContextManager:
        """Nothing runs beside the step on a device table (no prefetch).

        Returns:
            A context manager that holds nothing.
        """
        return contextlib.nullcontext()

    def place(self, index_rows: torch.Tensor,
              training: bool) -> tuple[torch.Tensor, None]:
        """The index rows are the lookup's rows.

        Args:
            index_rows: int64 rows of this table (-1: none).
            training: the lookup will update the rows (nothing to do here:
                the update marks them, `mark_written`).

        Returns:
            `(index_rows, None)`.
        """
        return index_rows, None

    def configure_state(self, width: int, initial_value: float) -> None:
        """Sets the per-row optimizer state layout (see `RowStore.configure_state`).

        Args:
            width: float32 state values per row.
            initial_value: a new row's state values.
        """
        if self.state.shape[1] != width:
            self.state = self._rows_storage(self.weights.shape[0], width, initial_value)
            # Every row's state reset: a change (the counts stay).
            tracking = self.tracking[:self.num_rows]
            tracking.bitwise_and_(MAX_COUNT).bitwise_or_(self.generation << COUNT_BITS)
        self.state_init = initial_value

    def stats(self) -> dict:
        """Rows and bytes of the table.

        Returns:
            `{"dim", "rows", "bytes", "bytes_by_part"}` (see `memory_by_part`).
        """
        parts = self.memory_by_part()
        return {"dim": self.dim, "rows": self.num_rows, "bytes": sum(parts.values()),
                "bytes_by_part": parts}

    def memory_bytes(self) -> int:
        """Bytes of the index, keys, rows, optimizer state and change tracking.

        Returns:
            The sum of `memory_by_part`.
        """
        return sum(self.memory_by_part().values())

    def memory_by_part(self) -> dict[str, int]:
        """The bytes the table holds, by part.

        An array in reserved memory counts the rows ever written into it
        (its other pages are not committed); any other array its whole
        capacity.

        Returns:
            `{"rows": weights, "optimizer_state": state, "keys": each row's
            key, "tracking": each row's generation and count of steps
            (`tracking`, see the module docstring) and its tag, "index": the
            key index (`key_index`)}`.
        """
        def held(name):
            array = getattr(self, name)
            if array is None:
                return 0
            reserved = self._reservations.get(name)
            rows = array.shape[0]
            if reserved is not None and reserved.data_ptr() == array.data_ptr():
                rows = min(rows, self._rows_written + 1)
            return rows * (array[0].numel() if array.shape[0] else 0) * array.element_size()

        return {"rows": held("weights"), "optimizer_state": held("state"),
                "keys": held("keys"),
                "tracking": held("tracking") + held("tags"),
                "index": self.key_index.memory_bytes()}

    # ---- the row arrays -----------------------------------------------------------------

    def track_tags(self) -> None:
        """Keeps each row's logical table from now on (rows that exist get
        -1, unknown); `resolve` then reads tags."""
        if self.tags is None:
            self.tags = torch.full((self.weights.shape[0],), -1, dtype=torch.int32,
                                   device=self.device)
        self.needs_tags = True

    def _rows_storage(self, rows, width, fill, dtype=torch.float32):
        """A `[rows, width]` array of `dtype` filled with `fill` (left
        uninitialized when `fill` is None), or MemoryError naming the table."""
        size = rows * width * dtype.itemsize
        available = available_host_bytes() if self.device.type == "cpu" else None
        # Refuse before the kernel's OOM killer would end the process silently.
        if available is not None and size > available:
            raise MemoryError(f"embedding table {self.name}: {rows} rows of width "
                              f"{width} need {size} bytes, host memory has {available} "
                              f"bytes available")
        try:
            if fill is None:
                return torch.empty((rows, width), dtype=dtype, device=self.device,
                                   pin_memory=self.pin_memory)
            return torch.full((rows, width), fill, dtype=dtype, device=self.device,
                              pin_memory=self.pin_memory)
        except (RuntimeError, MemoryError) as error:
            raise MemoryError(f"embedding table {self.name}: cannot allocate {size} "
                              f"bytes for {rows} rows of width {width}: {error}") from error

    def _grow_rows(self, needed):
        capacity = self.weights.shape[0]
        if needed <= capacity:
            return
        new_capacity = max(needed, 2 * capacity)
        if self._reservable(new_capacity):
            self._check_available(needed - capacity)
            grow = self._extended
        else:
            grow = self._copied
        # Rows past num_rows are written when they are created, so the new
        # capacity needs no initial fill (filling ~all of it again each time
        # the table doubles showed in the step time).
        self.weights = grow("weights", self.weights, new_capacity)
        self.state = grow("state", self.state, new_capacity)
        self.keys = grow("keys", self.keys, new_capacity)
        # One entry more: the sink row -1 writes into (zeros for new rows).
        self.tracking = grow("tracking", self.tracking, new_capacity + 1, zero_tail=True)
        if self.tags is not None:
            self.tags = grow("tags", self.tags, new_capacity)
        if grow == self._copied:
            release_free_memory()       # the old arrays: freed, never needed again

    def _reservable(self, capacity):
        """Whether this table grows inside reserved address space: a CPU
        table (not pinned) of at least `RESERVE_FROM_ROWS` rows."""
        return self.device.type == "cpu" and not self.pin_memory and \
            capacity >= RESERVE_FROM_ROWS

    def _check_available(self, rows):
        """MemoryError naming the table when `rows` more rows do not fit in
        the host memory available (reserved pages are only committed when
        touched, so the kernel would not refuse them: its OOM killer would
        end the process instead)."""
        needed = rows * self._bytes_per_row()
        available = available_host_bytes()
        if available is not None and needed > available:
            raise MemoryError(f"embedding table {self.name}: {rows} more rows need "
                              f"{needed} bytes, host memory has {available} bytes "
                              f"available")

    def _bytes_per_row(self):
        arrays = [self.weights, self.state, self.keys, self.tracking] + \
            ([] if self.tags is None else [self.tags])
        return sum(a[0].numel() * a.element_size() for a in arrays)

    def _copied(self, name, array, rows, zero_tail=False):
        """`array` with `rows` rows, its first `num_rows` copied."""
        shape = (rows, *array.shape[1:])
        grown = torch.zeros(shape, dtype=array.dtype, device=self.device) if zero_tail \
            else self._rows_storage(rows, shape[1], None, array.dtype) \
            if array.is_floating_point() and array.ndim == 2 \
            else torch.empty(shape, dtype=array.dtype, device=self.device)
        grown[:self.num_rows] = array[:self.num_rows]
        return grown

    def _extended(self, name, array, rows, zero_tail=False):
        """`array` with `rows` rows as a longer view of its reservation: no
        copy, no second array, and no stall however large the table. A
        reservation spans the host's memory; its pages cost nothing until
        rows are written (Linux commits anonymous memory page by page), and
        they come zeroed. An array not in a reservation (the first growth
        past `RESERVE_FROM_ROWS`, or one `load` replaced) moves into a new
        one, its rows copied once."""
        if not array[0].numel():        # no optimizer state yet: nothing to hold
            return array.new_empty((rows, *array.shape[1:]))
        reserved = self._reservations.get(name)
        if reserved is None or reserved.data_ptr() != array.data_ptr() or \
                reserved.shape[0] < rows:
            row_bytes = array[0].numel() * array.element_size()
            reserved = reserve_memory((max(rows, physical_host_bytes() // row_bytes),
                                       *array.shape[1:]), array.dtype)
            reserved[:self.num_rows] = array[:self.num_rows]
            self._reservations[name] = reserved
        elif zero_tail:
            # The old sink entry (row -1's marks) becomes a row: zero it.
            reserved[array.shape[0] - 1:rows].zero_()
        return reserved[:rows]

    def reserve_rows(self, extra: int) -> None:
        """Makes room for `extra` more rows now, so that inserting them
        later neither rehashes the index nor moves the row arrays.

        A loaded table's arrays hold its rows exactly; the first rows
        inserted after a load then move them (into reserved memory for a
        large CPU table): 2.8 s for a 2.6M-row table on a loaded 2-core
        CPU, where a serving delta writing 460k rows in place takes 0.2 s.

        Args:
            extra: rows to make room for, beyond those held.
        """
        self.key_index.reserve(extra, self.num_rows)
        self._grow_rows(self.num_rows + extra)

    def find_or_insert(self, keys: torch.Tensor,
                       tags: torch.Tensor | None = None) -> torch.Tensor:
        """Rows of `keys`, creating (and initializing) rows for new keys.

        Args:
            keys: int64 keys (duplicates allowed).
            tags: each key's logical table, kept for new rows where the
                table tracks tags (None: unknown, -1).

        Returns:
            int64 rows, one per key.
        """
        # Look up first and insert only the absent ids: sizing the index for
        # them (not for the whole batch) keeps it small enough to stay in cache.
        rows = self.find(keys)
        absent = (rows < 0).nonzero().squeeze(1)
        if absent.numel() == 0:
            return rows
        new_keys = keys.index_select(0, absent)
        before = self.num_rows
        new_rows, after = self.key_index.insert(new_keys, before, self._grown_keys)
        rows.index_copy_(0, absent, new_rows)
        if after > before:
            # The index grew the row arrays for the rows it created (`_grown_keys`).
            created = self.keys[before:after]
            self.weights[before:after] = initial_rows(created, self.dim,
                                                      self.init_scale, self.seed)
            self.state[before:after] = self.state_init
            # Creating is a change; a new row was seen in no step yet.
            self.tracking[before:after] = self.generation << COUNT_BITS
            if self.tags is not None:
                self.tags[before:after] = -1
                if tags is not None:
                    self.tags[new_rows] = tags.to(self.device).index_select(
                        0, absent).to(torch.int32)
            self.num_rows = after
            self._rows_written = max(self._rows_written, after)
        return rows

    def _grown_keys(self, rows: int) -> torch.Tensor:
        """The keys array, the row arrays grown to hold at least `rows` rows
        (the index asks, see `key_index`)."""
        self._grow_rows(rows)
        return self.keys

    def find(self, keys: torch.Tensor) -> torch.Tensor:
        """Rows of `keys`; creates nothing.

        Args:
            keys: int64 keys.

        Returns:
            int64 rows, -1 where a key has no row.
        """
        return self.key_index.find(keys, self.keys)

    def rows_of(self, keys: torch.Tensor, insert: bool,
                tags: torch.Tensor | None = None) -> torch.Tensor:
        """`find_or_insert` when `insert`, else `find`.

        Args:
            keys: int64 keys.
            insert: create rows for new keys.
            tags: the keys' logical tables, for new rows (see `find_or_insert`).

        Returns:
            int64 rows (-1: no row, only without `insert`).
        """
        return self.find_or_insert(keys, tags) if insert else self.find(keys)

    # ---- change tracking ---------------------------------------------------------------

    def mark_written(self, rows: torch.Tensor) -> None:
        """Marks rows written in the current generation and counts the step
        that saw them (`RowStore.mark_written`; once per update, on its
        distinct rows): each row's `tracking` becomes the generation and
        its count plus one, saturating at `MAX_COUNT`.

        One gather of the rows' entries (`index_select`), the new entries
        computed from them, and one `index_copy_` back: every entry is read
        before any is written, so a row that occurs several times counts
        once (its copies write the same value), and the row -1 goes to the
        spare last entry (mapped there first: neither op wraps negative
        rows). For 100k sorted distinct rows of a 10M-row table on a shared
        2-core CPU (medians of 60 calls, 4 runs) this took 0.84 to 0.92 ms;
        the two int32 arrays it replaced 2.0 to 2.3 ms (`index_fill_` of
        the generation and `seen_steps[rows] += 1`), and the same
        arithmetic through advanced indexing (`tracking[rows]`,
        `tracking[rows] = new`) 1.5 to 1.8 ms.

        Args:
            rows: int64 rows of this table, -1 allowed.
        """
        rows = torch.where(rows < 0, self.tracking.shape[0] - 1, rows)
        count = self.tracking.index_select(0, rows).bitwise_and_(MAX_COUNT).add_(1)
        count.clamp_(max=MAX_COUNT).bitwise_or_(self.generation << COUNT_BITS)
        self.tracking.index_copy_(0, rows, count)

    def seen_counts(self) -> torch.Tensor:
        """Each row's count of the training steps it was seen in (at most
        `MAX_COUNT`, see the module docstring).

        Returns:
            int32 `[num_rows]`, a new tensor.
        """
        return self.tracking[:self.num_rows] & MAX_COUNT

    def written_generations(self) -> torch.Tensor:
        """The generation in which each row was created or last written.

        Returns:
            int32 `[num_rows]`, a new tensor.
        """
        return self.tracking[:self.num_rows] >> COUNT_BITS

    def next_generation(self) -> int:
        """Ends the current generation (a checkpoint captured it): rows
        written from now on are newer than that checkpoint.

        Returns:
            The generation that ended.

        Raises:
            RuntimeError: the table is at `MAX_GENERATION` (its rows keep
                their generations in `COUNT_BITS` fewer bits than an int32).
        """
        if self.generation >= MAX_GENERATION:
            raise RuntimeError(
                f"embedding table {self.name}: {self.generation} save generations "
                f"(checkpoints and serving exports) in one process, the most a table "
                f"tracks is {MAX_GENERATION} (2**{31 - COUNT_BITS} - 1); a new process "
                f"that loads the latest checkpoint starts again at generation 1")
        self.generation += 1
        return self.generation - 1

    def forget_deleted(self, until: int) -> None:
        """Drops the tombstones of generations up to `until` (no delta will
        be saved against a checkpoint older than that one).

        Args:
            until: a generation that has ended.
        """
        self.deleted = [(keys, generation) for keys, generation in self.deleted
                        if generation > until]

    def _tombstone(self, keys):
        if keys.numel():
            self.deleted.append((keys.to("cpu", copy=True), self.generation))

    # ---- checkpoints and compaction --------------------------------------------------

    def export(self) -> dict[str, np.ndarray]:
        """A copy of the live rows (see `RowStore.export`).

        Returns:
            `{"keys", "weights", "state", "seen_steps"}` numpy arrays
            (`seen_steps` int32, see the module docstring), and `"tags"`
            (int32) where the table tracks them.
        """
        return self._rows(slice(0, self.num_rows))

    def _rows(self, rows):
        # A copy even on the CPU: a snapshot must not follow later updates.
        arrays = {name: to_numpy(values[rows].to("cpu", copy=True)) for name, values in
                  [("keys", self.keys), ("weights", self.weights), ("state", self.state)]}
        # The counts: a new array already.
        arrays["seen_steps"] = (self.tracking[rows] & MAX_COUNT).cpu().numpy()
        if self.tags is not None:
            arrays["tags"] = self.tags[rows].to("cpu", copy=True).numpy()
        return arrays

    def export_changes(self, since: int) -> dict[str, np.ndarray]:
        """The rows written after generation `since` and the keys deleted
        since (see `RowStore.export_changes`).

        Args:
            since: a generation that has ended (`next_generation`).

        Returns:
            `export()`'s arrays for the changed rows, and `"deleted"`.
        """
        # Generation > since, compared on the entries whole (no shifted copy
        # of the table's entries): any count in a generation past `since`
        # is above since's largest entry.
        largest = (since << COUNT_BITS) | MAX_COUNT
        changed = (self.tracking[:self.num_rows] > largest).nonzero().squeeze(1)
        arrays = self._rows(changed)
        recent = [keys for keys, generation in self.deleted if generation > since]
        deleted = torch.unique(torch.cat(recent)) if recent else \
            torch.empty(0, dtype=torch.int64)
        # A key freed and created again holds a row: it is among the changed rows.
        arrays["deleted"] = deleted[self.find(deleted.to(self.device)).cpu() < 0].numpy()
        return arrays

    def load(self, arrays: dict) -> None:
        """Replaces the content with exported arrays (see `RowStore.load`).

        Every loaded row counts as written, and every key held before as
        deleted: a delta against an earlier checkpoint stays exact.

        Args:
            arrays: `{"keys", "weights", "state"}` numpy arrays or tensors,
                and optionally `"tags"` (missing: unknown, -1) and
                `"seen_steps"` (missing: 0, as in an export saved before
                rows were counted; clamped to [0, `MAX_COUNT`], where an
                export saved before counts saturated may hold more).
        """
        keys = _tensor(arrays["keys"], torch.int64, self.device)
        weights = _tensor(arrays["weights"], None, self.device)
        if weights.shape != (keys.numel(), self.dim):
            raise ValueError(f"table of dim {self.dim} cannot load weights of shape "
                             f"{tuple(weights.shape)} for {keys.numel()} keys")
        self._tombstone(self.keys[:self.num_rows])
        tags = arrays.get("tags")
        seen = arrays.get("seen_steps")
        tracking = torch.full((keys.numel(),), self.generation << COUNT_BITS,
                              dtype=torch.int32, device=self.device)
        if seen is not None:
            tracking |= _tensor(seen, torch.int64, self.device).clamp(0, MAX_COUNT).to(
                torch.int32)
        self._replace(keys, weights, _tensor(arrays["state"], None, self.device),
                      None if tags is None else _tensor(tags, torch.int32, self.device),
                      tracking)

    def _replace(self, keys, weights, state, tags, tracking):
        """Rebuilds the index and the arrays from these rows (`tracking`:
        each row's entry, generation and count)."""
        self.key_index.finish()       # a build of rows about to be renumbered
        self.key_index = new_index(self.key_index.kind, self, self.device, self.pin_memory)
        self.key_index.reserve(keys.numel(), 0)
        self.num_rows = 0
        capacity = max(1, keys.numel())
        self.weights = self._rows_storage(capacity, self.dim, 0.0, self.weights.dtype)
        self.keys = torch.empty(capacity, dtype=torch.int64, device=self.device)
        width = state.shape[1] if state.ndim == 2 else self.state.shape[1]
        self.state = self._rows_storage(capacity, width, self.state_init)
        self.tracking = torch.zeros(capacity + 1, dtype=torch.int32, device=self.device)
        if self.tags is not None:
            self.tags = torch.full((capacity,), -1, dtype=torch.int32, device=self.device)
        rows = self.find_or_insert(keys)
        self.weights[rows] = weights.to(self.weights.dtype)
        if state.numel():
            self.state[rows] = state.float()
        self.tracking[rows] = tracking
        if self.tags is not None and tags is not None:
            self.tags[rows] = tags

    def compact(self, keep: torch.Tensor) -> torch.Tensor:
        """Keeps only the rows `keep` (see `RowStore.compact`); the keys of
        the others become tombstones.

        Args:
            keep: int64 ascending rows to keep.

        Returns:
            The new row of each kept row.
        """
        kept = torch.zeros(self.num_rows, dtype=torch.bool, device=self.device)
        kept[keep] = True
        self._tombstone(self.keys[:self.num_rows][~kept])
        keys = self.keys[keep]
        self._replace(keys, self.weights[keep], self.state[keep],
                      None if self.tags is None else self.tags[keep], self.tracking[keep])
        return self.find(keys)


def _tensor(values, dtype, device):
    """Exported arrays arrive as numpy (checkpoints, Keras's store) or as
    tensors (compaction, on the table's own device)."""
    return torch.as_tensor(to_torch(values), dtype=dtype, device=device)
