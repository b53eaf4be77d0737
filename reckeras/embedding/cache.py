"""Tiered storage: every row in host memory, a bounded cache of hot rows on the device.

A table with ``storage="host_cached"`` keeps all its rows and their optimizer
state in its ``PhysicalTable`` in host memory (pinned when a GPU is present),
the *host tier*. A ``RowCache`` beside it is the *device tier*: fixed
``[capacity, dim]`` weights and ``[capacity, state_width]`` state, allocated
once at exactly the configured budget, so it can never grow past it.

Per batch the engine resolves keys to host rows as usual and then asks the
cache for their slots (``resolve``): rows already cached are hits, the others
are loaded from the host, each into the slot of a victim chosen by the
table's policy (LFU: lowest access count, counts halved every ``AGE_EVERY``
steps so that old popularity fades; LRU: oldest last use). A victim that was
updated since it was loaded (dirty) is written back first. The pooled lookup
and the sparse optimizer then run on the cache's tensors, so the step reads
and writes exactly the values an all-device table would hold: a row's newest
value is in the cache while it is cached and in the host tier otherwise.

Every lookup pins the slots it resolved (``pins``) until its backward has
applied the update (or, without one, until its forward has read them): no
other lookup of the step, and no prefetch, may evict them meanwhile.

``prefetch`` brings the rows of a later batch in ahead of time, from the
pipeline's thread while the current step runs. It never creates a row (it
only finds keys), never evicts a pinned slot, and never evicts rows an
earlier prefetch brought in for a batch not yet stepped (``fresh``), so it
changes where values live, never what they are. One lock guards the cache's
maps and the host table's index between the threads.
"""

import threading
import time

import torch

from reckeras.backend_kernels.aggregation import unique_rows

AGE_EVERY = 256          # steps between halvings of the LFU counts
FRESH_STEPS = 4          # steps a prefetched row is kept for the batch it came for


class CacheBudgetError(ValueError):
    """The device cache cannot hold one batch's distinct rows."""


class Pin:
    """The slots one lookup uses; ``release`` (idempotent) frees them."""

    def __init__(self, cache, slots):
        self.cache, self.slots = cache, slots
        self.released = False

    def release(self):
        if not self.released:
            self.released = True
            self.cache.release(self.slots)


class RowCache:
    """The device tier of one host-resident physical table.

    Args:
        host: the ``PhysicalTable`` holding every row (the host tier).
        names: the logical tables packed into it (for messages and stats).
        options: their ``TableOptions`` (storage ``"host_cached"``); the
            budget is the sum of their ``cache_rows``/``cache_bytes``.
        device: where the cached rows live.
    """

    def __init__(self, host, names, options, device):
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
        self._stream = None          # CUDA side stream of the prefetches
        host.cache = self
        self.configure(host.state.shape[1])

    # ---- layout -------------------------------------------------------------------

    @property
    def dim(self):
        return self.host.dim

    @property
    def num_rows(self):
        """Slots: what row indices into ``weights``/``state`` range over."""
        return self.capacity

    def row_bytes(self, state_width):
        return 4 * (self.dim + state_width)

    def configure(self, state_width):
        """(Re)allocates the device tier for rows of ``state_width`` state.

        The budget in rows is the sum over the logical tables of
        ``cache_rows``, or ``cache_bytes // row_bytes``. The cache starts
        empty; callers write dirty rows back first (``write_back``).
        """
        row_bytes = self.row_bytes(state_width)
        capacity = sum(o.cache_rows if o.cache_rows is not None else o.cache_bytes // row_bytes
                       for o in self.options)
        if capacity < 1:
            raise CacheBudgetError(
                f"table(s) {self.names}: cache_bytes holds no row of {row_bytes} bytes "
                f"(dim {self.dim} + optimizer state {state_width}, float32)")
        with self.lock:
            self.capacity = capacity
            self.weights = torch.zeros(capacity, self.dim, device=self.device)
            self.state = torch.zeros(capacity, state_width, device=self.device)
            self.slot_row = torch.full((capacity,), -1, dtype=torch.int64)
            self.dirty = torch.zeros(capacity, dtype=torch.bool)
            self.pins = torch.zeros(capacity, dtype=torch.int32)
            self.fresh_until = torch.full((capacity,), -1, dtype=torch.int64)
            self.last_used = torch.zeros(capacity, dtype=torch.int64)
            self.row_slot = torch.full((0,), -1, dtype=torch.int64)
            self.frequency = torch.zeros(0)

    def memory_bytes(self):
        """Bytes of the device tier (weights and optimizer state)."""
        return sum(t.numel() * t.element_size() for t in (self.weights, self.state))

    def budget_bytes(self):
        return self.capacity * self.row_bytes(self.state.shape[1])

    def _fit_host(self):
        """Extends the per-host-row maps to the host table's capacity."""
        extra = self.host.weights.shape[0] - self.row_slot.numel()
        if extra > 0:
            self.row_slot = torch.cat([self.row_slot,
                                       torch.full((extra,), -1, dtype=torch.int64)])
            self.frequency = torch.cat([self.frequency, torch.zeros(extra)])

    # ---- the step ---------------------------------------------------------------------

    def resolve(self, keys, host_rows, training):
        """Cache slots of ``keys`` for one lookup, pinned until released.

        Args:
            keys: int64 keys of this table (duplicates allowed).
            host_rows: ``keys -> host rows`` (may create rows while training).
            training: the step will update its rows (they become dirty).

        Returns:
            ``(slots, pin)``: the slot of every key (-1 where it has no row),
            and the ``Pin`` to release once the rows are read and updated.

        Raises:
            CacheBudgetError: other lookups of the step pin too many slots
                to make room (``check_fits`` is the caller's, beforehand).
        """
        keys = keys.to(self.host.device)
        waited = time.perf_counter()
        with self.lock:
            started = time.perf_counter()
            rows = host_rows(keys)
            self._fit_host()
            self.tick += 1
            loading = time.perf_counter()
            slots = self._ensure(rows, for_step=True)
            self.stall_s += (started - waited) + (time.perf_counter() - loading)
            pinned = unique_rows(slots[slots >= 0], self.capacity)[0]
            self.pins[pinned] += 1
            if training:
                self.dirty[pinned] = True
            if self.policy == "lfu" and self.tick % AGE_EVERY == 0:
                self.frequency.mul_(0.5)
        return slots.to(self.device), Pin(self, pinned)

    def release(self, slots):
        """Unpins ``slots`` (distinct) of one lookup."""
        with self.lock:
            self.pins[slots] = (self.pins[slots] - 1).clamp(min=0)

    def release_all(self):
        """Unpins every slot (lookups whose step failed before its backward)."""
        with self.lock:
            self.pins.zero_()

    def check_fits(self, keys, training):
        """Raises ``CacheBudgetError`` if one lookup of ``keys`` needs more
        distinct rows than the cache holds. Call it before the lookup changes
        anything (it only reads; only the step's thread changes the host index).
        """
        if keys.numel() <= self.capacity:
            return
        keys = keys.to(self.host.device)
        rows = self.host.find(keys)
        present = rows >= 0
        needed = unique_rows(rows[present], max(self.host.num_rows, 1))[0].numel()
        if training:                     # absent keys may get a row in this step
            needed += torch.unique(keys[~present]).numel()
        if needed > self.capacity:
            raise CacheBudgetError(
                f"table(s) {self.names}: one batch needs {needed} distinct rows on this "
                f"rank but the device cache holds {self.capacity} rows "
                f"({self.budget_bytes()} bytes); raise cache_rows to at least {needed} "
                f"(or cache_bytes to {needed * self.row_bytes(self.state.shape[1])})")

    def _ensure(self, rows, for_step):
        """Slots of ``rows`` (-1 stays -1), loading the rows not cached.

        A step gets every row (``check_fits`` made room certain); a prefetch
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
        """Up to ``count`` unprotected slots to reuse: free slots first, then
        by policy, slots in ``evict_last`` (if given) only when needed."""
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
        self.dirty[slots] = False
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

    def prefetch(self, keys):
        """Loads the existing rows of ``keys`` that fit without evicting
        protected slots. Creates no row; safe to run beside a step."""
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
                # After the updates already queued: a victim's write-back must
                # read its value after the optimizer step that made it dirty.
                self._stream.wait_stream(torch.cuda.default_stream(self.device))
                with torch.cuda.stream(self._stream):
                    self._ensure(rows, for_step=False)
                self._stream.synchronize()
            self.counters["prefetches"] += 1

    # ---- whole-cache operations -----------------------------------------------------

    def write_back(self):
        """Writes every dirty row to the host tier (checkpoints, compaction)."""
        with self.lock:
            dirty = (self.dirty & (self.slot_row >= 0)).nonzero().squeeze(1)
            if dirty.numel():
                self._write(dirty)

    def clear(self):
        """Forgets every cached row without writing back (the host rows were
        replaced or renumbered)."""
        with self.lock:
            self.slot_row.fill_(-1)
            self.row_slot = torch.full((0,), -1, dtype=torch.int64)
            self.frequency = torch.zeros(0)
            self.dirty.zero_()
            self.pins.zero_()
            self.fresh_until.fill_(-1)

    def stats(self):
        """Hit rates, rows and bytes moved, stall time and budget so far."""
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
