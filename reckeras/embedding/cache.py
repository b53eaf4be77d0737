"""Tiered storage: every row in host memory, a bounded cache of hot rows on the device.

A table with `storage="host_cached"` is a `HostCachedTable` row store (see
`row_store.RowStore`) made of two tiers. Its host `PhysicalTable` holds every
row and its optimizer state in host memory (pinned when a GPU is present):
the *host tier*, the store's `index`. A `RowCache` is the *device tier*:
fixed `[capacity, dim]` weights (in the table's row dtype, as the host
tier's) and `[capacity, state_width]` float32 state, allocated once at
exactly the configured budget, so it can never grow past it. The host table
knows nothing of the cache; the store keeps the two consistent (writes back
before bulk reads, forgets cached rows when the host rows are replaced).

Per lookup the store resolves keys to host rows as a device table would and
then asks the cache for their slots (`RowCache.resolve`): rows already
cached are hits, the others are loaded from the host, each into the slot of
a victim chosen by the table's policy (LFU: lowest access count, counts
halved every `AGE_EVERY` steps so that old popularity fades; LRU: oldest
last use). A victim that was updated since it was loaded (dirty) is written
back first. The pooled lookup and the sparse optimizer then run on the
cache's tensors (the store's `weights`/`state`), so the step reads and writes
exactly the values an all-device table would hold: a row's newest value is in
the cache while it is cached and in the host tier otherwise.

Every lookup pins the slots it resolved (`Pin`) until its update has been
applied, or dropped (`EmbeddingEngine.deferred_updates`), or, without one,
until its forward has read them: no other lookup of the step, and no
prefetch, may evict them meanwhile.

`prefetch` brings the rows of a later batch in ahead of time, from the
pipeline's thread while the current step runs. It never creates a row (it
only finds keys), never evicts a pinned slot, and never evicts rows an
earlier prefetch brought in for a batch not yet stepped (`fresh`), so it
changes where values live, never what they are. One lock guards the cache's
maps and the host table's index between the threads (`HostCachedTable.locked`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import numpy as np
import torch

from reckeras.backend_kernels.aggregation import unique_rows
from reckeras.embedding.options import TableOptions
from reckeras.embedding.physical_table import PhysicalTable
from reckeras.embedding.row_store import DelegatingStore

AGE_EVERY = 256          # steps between halvings of the LFU counts
FRESH_STEPS = 4          # steps a prefetched row is kept for the batch it came for


class CacheBudgetError(ValueError):
    """The device cache cannot hold one batch's distinct rows."""


class Pin:
    """The slots one lookup uses, kept from eviction until released.

    Args:
        cache: the `RowCache` holding the slots.
        slots: int64 distinct slots of the lookup.
    """

    def __init__(self, cache: RowCache, slots: torch.Tensor):
        self.cache, self.slots = cache, slots
        self.released = False

    def release(self) -> None:
        """Unpins the slots (once: releasing again does nothing)."""
        if not self.released:
            self.released = True
            self.cache.release(self.slots)


class RowCache:
    """The device tier of one host-resident physical table.

    It holds copies of some host rows in fixed slots; `HostCachedTable` is the
    row store that uses it.

    Args:
        host: the `PhysicalTable` holding every row (the host tier).
        names: the logical tables packed into it (for messages and stats).
        options: their `TableOptions` (storage `"host_cached"`); the
            budget is the sum of their `cache_rows`/`cache_bytes`.
        device: where the cached rows live.
    """

    def __init__(self, host: PhysicalTable, names: list[str],
                 options: list[TableOptions], device: str | torch.device):
        self.host = host
        self.names = list(names)
        self.options = list(options)
        self.policy = self.options[0].cache_policy
        self.device = torch.device(device)
        self.lock = threading.RLock()
        self.capacity = 0
        self.tick = 0                # step resolutions so far (LRU clock, LFU aging)
        self.counters = dict.fromkeys(
            ("steps", "lookups", "hits", "unique_lookups", "unique_hits", "rows_in",
             "rows_in_prefetched", "rows_out", "prefetches"), 0)
        self.stall_s = 0.0
        self._stream: torch.cuda.Stream | None = None    # side stream of the prefetches
        self.configure(host.state.shape[1])

    # ---- layout -------------------------------------------------------------------

    @property
    def dim(self) -> int:
        """The row width (the host table's)."""
        return self.host.dim

    def row_bytes(self, state_width: int) -> int:
        """Bytes of one cached row: weights (the table's row dtype) and
        float32 optimizer state.

        Args:
            state_width: float32 state values per row.

        Returns:
            `dim * row itemsize + 4 * state_width`.
        """
        return self.dim * self.host.weights.element_size() + 4 * state_width

    def configure(self, state_width: int) -> None:
        """(Re)allocates the device tier for rows of `state_width` state.

        The budget in rows is the sum over the logical tables of
        `cache_rows`, or `cache_bytes // row_bytes`. The cache starts
        empty; callers write dirty rows back first (`write_back`).

        Args:
            state_width: float32 state values per row.

        Raises:
            CacheBudgetError: `cache_bytes` holds no row of this width.
        """
        row_bytes = self.row_bytes(state_width)
        capacity = sum(o.cache_capacity(row_bytes) for o in self.options)
        if capacity < 1:
            raise CacheBudgetError(
                f"table(s) {self.names}: cache_bytes holds no row of {row_bytes} bytes "
                f"(dim {self.dim} of {self.host.weights.dtype} + optimizer state "
                f"{state_width} of float32)")
        with self.lock:
            self.capacity = capacity
            self.weights = torch.zeros(capacity, self.dim, dtype=self.host.weights.dtype,
                                       device=self.device)
            self.state = torch.zeros(capacity, state_width, device=self.device)
            self.slot_row = torch.full((capacity,), -1, dtype=torch.int64)
            self.dirty = torch.zeros(capacity, dtype=torch.bool)
            self.pins = torch.zeros(capacity, dtype=torch.int32)
            self.fresh_until = torch.full((capacity,), -1, dtype=torch.int64)
            self.last_used = torch.zeros(capacity, dtype=torch.int64)
            self.row_slot = torch.full((0,), -1, dtype=torch.int64)
            self.frequency = torch.zeros(0)

    def memory_bytes(self) -> int:
        """Bytes of the device tier (weights and optimizer state).

        Returns:
            The bytes the cache's two arrays hold.
        """
        return sum(t.numel() * t.element_size() for t in (self.weights, self.state))

    def budget_bytes(self) -> int:
        """The budget in bytes: `capacity` rows of the current width.

        Returns:
            `capacity * row_bytes(state width)`.
        """
        return self.capacity * self.row_bytes(self.state.shape[1])

    def _fit_host(self):
        """Extends the per-host-row maps to the host table's capacity."""
        extra = self.host.weights.shape[0] - self.row_slot.numel()
        if extra > 0:
            self.row_slot = torch.cat([self.row_slot,
                                       torch.full((extra,), -1, dtype=torch.int64)])
            self.frequency = torch.cat([self.frequency, torch.zeros(extra)])

    # ---- the step ---------------------------------------------------------------------

    def resolve(self, rows: torch.Tensor, training: bool) -> tuple[torch.Tensor, Pin]:
        """Cache slots of host `rows` for one lookup, pinned until released.

        The caller holds `lock` since it found the rows (the step's thread
        is the only one that changes the host index).

        Args:
            rows: int64 host rows (-1: no row; duplicates allowed).
            training: the step will update its rows (they become dirty).

        Returns:
            `(slots, pin)`: the slot of every row (-1 where it has none), on
            the cache's device, and the `Pin` to release once the rows are
            read and updated.

        Raises:
            CacheBudgetError: other lookups of the step pin too many slots
                to make room (`check_fits` is the caller's, beforehand).
        """
        with self.lock:
            self._fit_host()
            self.tick += 1
            loading = time.perf_counter()
            slots = self._ensure(rows, for_step=True)
            self.stall_s += time.perf_counter() - loading
            pinned = unique_rows(slots[slots >= 0], self.capacity)[0]
            self.pins[pinned] += 1
            if training:
                self.dirty[pinned] = True
            if self.policy == "lfu" and self.tick % AGE_EVERY == 0:
                self.frequency.mul_(0.5)
        return slots.to(self.device), Pin(self, pinned)

    def release(self, slots: torch.Tensor) -> None:
        """Unpins `slots` (distinct) of one lookup.

        Args:
            slots: int64 slots a `Pin` holds.
        """
        with self.lock:
            self.pins[slots] = (self.pins[slots] - 1).clamp(min=0)

    def release_all(self) -> None:
        """Unpins every slot (lookups whose step failed before its update)."""
        with self.lock:
            self.pins.zero_()

    def check_fits(self, keys: torch.Tensor, training: bool) -> None:
        """Raises `CacheBudgetError` if one lookup of `keys` needs more
        distinct rows than the cache holds.

        Call it before the lookup changes anything (it only reads; only the
        step's thread changes the host index).

        Args:
            keys: int64 keys of one lookup.
            training: absent keys may get a row in this step.
        """
        if keys.numel() <= self.capacity:
            return
        keys = keys.to(self.host.device)
        rows = self.host.find(keys)
        present = rows >= 0
        needed = unique_rows(rows[present], max(self.host.num_rows, 1))[0].numel()
        if training:
            needed += torch.unique(keys[~present]).numel()
        if needed > self.capacity:
            raise CacheBudgetError(
                f"table(s) {self.names}: one batch needs {needed} distinct rows on this "
                f"rank but the device cache holds {self.capacity} rows "
                f"({self.budget_bytes()} bytes); raise cache_rows to at least {needed} "
                f"(or cache_bytes to {needed * self.row_bytes(self.state.shape[1])})")

    def _ensure(self, rows, for_step):
        """Slots of `rows` (-1 stays -1), loading the rows not cached.

        A step gets every row (`check_fits` made room certain); a prefetch
        loads what fits without evicting protected slots.
        """
        slots = torch.full_like(rows, -1)
        present = (rows >= 0).nonzero().squeeze(1)
        wanted = rows.index_select(0, present)
        found = self.row_slot.index_select(0, wanted)
        hit = found >= 0
        protected = self.pins > 0
        protected[found[hit]] = True
        missing = torch.unique(wanted[~hit])
        fresh = self.fresh_until >= self.tick        # rows prefetched for a coming batch
        if for_step:
            self._count_lookups(found, hit, fresh.index_select(0, found[hit]),
                                missing.numel())
        else:
            protected |= fresh
        if missing.numel():
            victims = self._victims(missing.numel(), protected,
                                    fresh if for_step else None)
            if for_step and victims.numel() < missing.numel():
                raise CacheBudgetError(
                    f"table(s) {self.names}: a lookup needs {missing.numel()} more rows "
                    f"but only {victims.numel()} of the {self.capacity} cache slots are "
                    f"not in use by other lookups of this step; raise cache_rows")
            missing = missing[:victims.numel()]
            self._evict(victims)
            self._load(victims, missing, for_step)
            found = self.row_slot.index_select(0, wanted)
        slots[present] = found
        if for_step:                     # prefetches pin nothing: a step may evict
            used = found[found >= 0]
            self.fresh_until[used] = -1
            self.last_used[used] = self.tick
            if self.policy == "lfu":
                self.frequency.index_add_(0, wanted, torch.ones(wanted.numel()))
        return slots

    def _count_lookups(self, found, hit, fresh, num_missing):
        """Hits are lookups served by rows cached before this batch asked for
        them; rows a prefetch loaded for this batch count as misses."""
        c = self.counters
        served = hit.clone()
        served[hit.nonzero().squeeze(1)[fresh]] = False
        c["steps"] += 1
        c["lookups"] += found.numel()
        c["hits"] += int(served.sum())
        distinct_hits = unique_rows(found[served], self.capacity)[0].numel()
        distinct_prefetched = unique_rows(found[hit][fresh], self.capacity)[0].numel()
        c["unique_hits"] += distinct_hits
        c["unique_lookups"] += distinct_hits + distinct_prefetched + num_missing

    def _victims(self, count, protected, evict_last):
        """Up to `count` unprotected slots to reuse: free slots first, then
        by policy, slots in `evict_last` (if given) only when needed."""
        if self.policy == "lfu":
            score = self.frequency.index_select(0, self.slot_row.clamp(min=0))
        else:
            score = self.last_used.float()
        score.masked_fill_(self.slot_row < 0, -1.0)
        if evict_last is not None:
            score.masked_fill_(evict_last, 1e30)
        score.masked_fill_(protected, float("inf"))
        available = self.capacity - int(protected.sum())
        return torch.topk(score, min(count, available), largest=False).indices

    def _evict(self, victims):
        old = self.slot_row.index_select(0, victims)
        written = victims[self.dirty.index_select(0, victims) & (old >= 0)]
        if written.numel():
            self._write(written)
        self.row_slot[old[old >= 0]] = -1
        self.slot_row[victims] = -1

    def _write(self, slots):
        rows = self.slot_row.index_select(0, slots)
        device_slots = slots.to(self.device)
        self.host.weights[rows] = self.weights.index_select(0, device_slots).to(
            self.host.device)
        self.host.state[rows] = self.state.index_select(0, device_slots).to(self.host.device)
        # A pinned slot's update is still to come (its lookup's backward, or a
        # deferred apply): it stays dirty, or that update would never reach the host.
        self.dirty[slots] = self.pins.index_select(0, slots) > 0
        self.counters["rows_out"] += slots.numel()

    def _load(self, victims, rows, for_step):
        device_slots = victims.to(self.device)
        self.weights[device_slots] = self.host.weights.index_select(0, rows).to(
            self.device, non_blocking=True)
        self.state[device_slots] = self.host.state.index_select(0, rows).to(
            self.device, non_blocking=True)
        self.slot_row[victims] = rows
        self.row_slot[rows] = victims
        self.dirty[victims] = False
        self.fresh_until[victims] = -1 if for_step else self.tick + FRESH_STEPS
        self.counters["rows_in"] += rows.numel()
        if not for_step:
            self.counters["rows_in_prefetched"] += rows.numel()

    # ---- ahead of the step -----------------------------------------------------------

    def prefetch(self, keys: torch.Tensor) -> None:
        """Loads the existing rows of `keys` that fit without evicting
        protected slots. Creates no row; safe to run beside a step.

        Args:
            keys: int64 keys a coming batch will look up.
        """
        keys = keys.to(self.host.device)
        with self.lock:
            rows = self.host.find(keys)
            self._fit_host()
            if self.device.type != "cuda":
                self._ensure(rows, for_step=False)
            else:
                # Copies on a side stream overlap the step's kernels; the lock is
                # released only once they landed, so a step never reads a slot early.
                if self._stream is None:
                    self._stream = torch.cuda.Stream(self.device)
                stream = self._stream
                # After the updates already queued: a victim's write-back must
                # read its value after the optimizer step that made it dirty.
                stream.wait_stream(torch.cuda.default_stream(self.device))
                with torch.cuda.stream(stream):
                    self._ensure(rows, for_step=False)
                stream.synchronize()
            self.counters["prefetches"] += 1

    # ---- whole-cache operations -----------------------------------------------------

    def write_back(self) -> None:
        """Writes every dirty row to the host tier (checkpoints, compaction)."""
        with self.lock:
            dirty = (self.dirty & (self.slot_row >= 0)).nonzero().squeeze(1)
            if dirty.numel():
                self._write(dirty)

    def clear(self) -> None:
        """Forgets every cached row without writing back (the host rows were
        replaced or renumbered)."""
        with self.lock:
            self.slot_row.fill_(-1)
            self.row_slot = torch.full((0,), -1, dtype=torch.int64)
            self.frequency = torch.zeros(0)
            self.dirty.zero_()
            self.pins.zero_()
            self.fresh_until.fill_(-1)

    def stats(self) -> dict:
        """Hit rates, rows and bytes moved, stall time and budget so far.

        Returns:
            The figures `docs/caching.md` lists, with the raw counters.
        """
        c = dict(self.counters)
        steps = max(c["steps"], 1)
        row_bytes = self.row_bytes(self.state.shape[1])
        return {
            "tables": self.names, "policy": self.policy, "cache_rows": self.capacity,
            "budget_bytes": self.budget_bytes(), "device_bytes": self.memory_bytes(),
            "cached_rows": int((self.slot_row >= 0).sum()),
            "hit_rate": round(c["hits"] / max(c["lookups"], 1), 4),
            "unique_hit_rate": round(c["unique_hits"] / max(c["unique_lookups"], 1), 4),
            "rows_in_per_step": round(c["rows_in"] / steps, 2),
            "rows_out_per_step": round(c["rows_out"] / steps, 2),
            "bytes_per_step": round((c["rows_in"] + c["rows_out"]) * row_bytes / steps, 1),
            "stall_s": round(self.stall_s, 4), **c}


class HostCachedTable(DelegatingStore):
    """The `"host_cached"` row store: host rows behind a device cache.

    Every row lives in the host `PhysicalTable` it wraps (`inner`, the
    store's `index`); lookups and the optimizer run on the cache's
    `weights`/`state`, whose rows are cache slots. See the module docstring.
    What the cache does not change (`dim`, `name`, `needs_tags`, `index`,
    `num_rows`, ...) is the host table's.

    Args:
        host: the `PhysicalTable` that holds every row (in host memory).
        names: the logical tables packed into it (for messages and stats).
        options: their `TableOptions` (storage `"host_cached"`).
        device: where the cached rows live.

    Example:

    ```python
    store = HostCachedTable(PhysicalTable(8, name="item"), ["item"],
                            [rk.embedding.TableOptions(storage="host_cached",
                                                       cache_rows=1000)], "cuda")
    slots, pin = store.resolve(keys, training=True)   # rows of store.weights
    ```
    """

    inner: PhysicalTable        # the host tier
    cache: RowCache

    def __init__(self, host: PhysicalTable, names: list[str],
                 options: list[TableOptions], device: str | torch.device):
        super().__init__(host)
        self.cache = RowCache(host, names, options, device)

    @property
    def weights(self) -> torch.Tensor:
        """The cached rows, `[cache_rows, dim]`: what lookups read."""
        return self.cache.weights

    @property
    def state(self) -> torch.Tensor:
        """The cached rows' optimizer state."""
        return self.cache.state

    @property
    def row_bound(self) -> int:
        """The cache's slots: every resolved row is a slot below it."""
        return self.cache.capacity

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Holds the cache's lock, counting the wait as the step's stall.

        Returns:
            A context manager (reentrant).
        """
        waited = time.perf_counter()
        with self.cache.lock:
            self.cache.stall_s += time.perf_counter() - waited
            yield

    def resolve(self, keys: torch.Tensor, training: bool,
                tags: torch.Tensor | None = None) -> tuple[torch.Tensor, Pin]:
        """Cache slots of `keys`, their host rows created while training
        (see `RowStore.resolve`).

        Args:
            keys: int64 table keys.
            training: create host rows for new keys; the rows become dirty.
            tags: each key's logical table, kept for new host rows where the
                host tier tracks them (`needs_tags`), else None.

        Returns:
            `(slots, pin)`.
        """
        host = self.inner
        with self.locked():
            rows = host.rows_of(keys.to(host.device), insert=training, tags=tags)
            return self.place(rows, training)

    def place(self, index_rows: torch.Tensor, training: bool) -> tuple[torch.Tensor, Pin]:
        """Cache slots of host rows the caller found (see `RowStore.place`).

        Args:
            index_rows: int64 host rows (-1: none).
            training: the rows become dirty.

        Returns:
            `(slots, pin)`.
        """
        return self.cache.resolve(index_rows, training)

    def mark_written(self, rows: torch.Tensor) -> None:
        """Marks the host rows of pinned cache slots written in the host
        tier (`RowStore.mark_written`: a delta checkpoint saves them).

        Args:
            rows: int64 cache slots a lookup resolved and still pins (-1
                allowed: no row).
        """
        host_rows = torch.where(rows >= 0, self.cache.slot_row[rows.clamp(min=0)], -1)
        self.inner.mark_written(host_rows.to(self.inner.device))

    def check_fits(self, keys: torch.Tensor, training: bool) -> None:
        """Raises `CacheBudgetError` if one lookup of `keys` cannot fit in the cache.

        Args:
            keys: int64 keys of one lookup.
            training: absent keys may get a row in this step.
        """
        self.cache.check_fits(keys, training)

    def prefetch(self, keys: torch.Tensor) -> None:
        """Loads the existing rows of `keys` into the cache (`RowCache.prefetch`).

        Args:
            keys: int64 keys a coming batch will look up.
        """
        self.cache.prefetch(keys)

    def release_pins(self) -> None:
        """Unpins every cached row."""
        self.cache.release_all()

    def configure_state(self, width: int, initial_value: float) -> None:
        """Sets the state layout of both tiers; the cache restarts empty.

        Args:
            width: float32 state values per row.
            initial_value: a new row's state values.
        """
        with self.cache.lock:
            self.cache.write_back()     # the cache's rows reach the host before it resets
            self.inner.configure_state(width, initial_value)
            self.cache.configure(width)

    def export(self) -> dict[str, np.ndarray]:
        """Every row with its newest value (the cache writes back first).

        Returns:
            The host tier's `export()`.
        """
        with self.cache.lock:
            self.cache.write_back()
            return self.inner.export()

    def export_changes(self, since: int) -> dict[str, np.ndarray]:
        """The rows changed after generation `since`, with their newest
        values (the cache writes back first), and the keys deleted since.

        Args:
            since: the generation of the checkpoint the changes are relative to.

        Returns:
            The host tier's `export_changes(since)`.
        """
        with self.cache.lock:
            self.cache.write_back()
            return self.inner.export_changes(since)

    def load(self, arrays: dict) -> None:
        """Replaces every row; the cache empties (its copies are void).

        Args:
            arrays: `{"keys", "weights", "state"}` numpy arrays or tensors.
        """
        with self.cache.lock:
            self.inner.load(arrays)
            self.cache.clear()

    def compact(self, keep: torch.Tensor) -> torch.Tensor:
        """Keeps only host rows `keep`; the cache writes back, then empties.

        Args:
            keep: int64 ascending host rows to keep.

        Returns:
            The new host row of each kept row.
        """
        with self.cache.lock:
            self.cache.write_back()
            rows = self.inner.compact(keep)
            self.cache.clear()
        return rows

    def stats(self) -> dict:
        """Rows and bytes of the host tier, and the cache's figures.

        Returns:
            `{"dim", "rows", "bytes", "bytes_by_part", "cache"}`.
        """
        return {**self.inner.stats(), "cache": self.cache.stats()}
