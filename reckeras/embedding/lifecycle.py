"""The row lifecycle: admission and eviction, off by default.

A `RowLifecycle` wraps the row store of a physical table whose logical
tables set lifecycle fields in their `TableOptions` (see `options`):

* **Admission** (`admit_after=k`): an id gets a row only once it has
  appeared in `k` training steps (several occurrences in one step count
  once, so the rule does not depend on how a step's batch is split across
  ranks). Until then it reads a zero vector and gets no update; its count
  lives in a small key -> count map beside the table.
* **Eviction** (`evict_idle_steps=n` and/or `evict_min_hits=h`): every
  `evict_every` training steps, rows not touched in the last `n` steps,
  or touched fewer than `h` times since the previous pass, are freed; the
  table is compacted, so freed slots are reused by the next new ids. A freed
  id that comes back gets a fresh row at its initial value (its admission
  count is kept, so it is admitted at once).
* **Aging out** (`evict_idle_windows=k`): rows not touched while training
  on the last `k` time windows are freed when a window ends (`end_window`,
  which `rk.Model.fit_windows` calls after training on each window), the
  same way: compaction, and tombstones for delta checkpoints. Each row's
  last window and the window count are exported with the rows (`export`:
  checkpoints save them) and restored by `load`, so a job that restarts from a
  checkpoint ages rows out as one that never stopped.

Eviction runs at the start of a training step (`begin_step`), before the
step resolves any row, or between windows (`end_window`), so no step ever
sees rows move under it. The
lifecycle counts per row of the wrapped store's `index` and changes that
index only inside the store's `locked`, so a `host_cached` store's prefetch
never runs beside it. Each row's logical table (which limits apply to it) is
the index's `tags`, kept by the index itself (and saved in checkpoints).
Freed rows become the index's tombstones, so a delta checkpoint deletes
them too.
"""

from __future__ import annotations

from typing import Any

import torch

from reckeras.backend_kernels import hash_table
from reckeras.embedding.options import TableOptions
from reckeras.embedding.row_store import DelegatingStore, Pin, RowStore

NEVER = 2**62


class KeyCounter:
    """How many training steps each not-yet-admitted key was seen in.

    Example:

    ```python
    counter = KeyCounter()
    counter.add(torch.tensor([7, 9]))   # [1, 1]
    counter.add(torch.tensor([7]))      # [2]
    ```
    """

    def __init__(self):
        self.slot_keys, self.slot_rows = hash_table.new_slots(16)
        self.size = 0
        self.counts = torch.zeros(16, dtype=torch.int64)

    def add(self, keys: torch.Tensor) -> torch.Tensor:
        """Counts one step's sighting of each distinct key.

        Args:
            keys: int64 keys seen in one step (duplicates count once).

        Returns:
            Each key's total count of steps.
        """
        needed = self.size + keys.numel()
        if needed > self.slot_keys.numel() * hash_table.MAX_LOAD:
            self.slot_keys, self.slot_rows = hash_table.rehash(
                self.slot_keys, self.slot_rows, hash_table.capacity_for(needed))
        index, self.size = hash_table.find_or_insert(self.slot_keys, self.slot_rows,
                                                     keys, self.size)
        if self.size > self.counts.numel():
            grown = torch.zeros(max(self.size, 2 * self.counts.numel()), dtype=torch.int64)
            grown[:self.counts.numel()] = self.counts
            self.counts = grown
        seen = torch.zeros(self.counts.numel(), dtype=torch.bool)
        seen[index] = True
        self.counts += seen
        return self.counts[index]


class RowLifecycle(DelegatingStore):
    """Admission and eviction around the row store of one physical table.

    It is itself a `RowStore`: what it does not change (the arrays, the
    cache, `mark_written`, ...) is the wrapped store's (`inner`).

    Args:
        store: the wrapped `PhysicalTable` or `cache.HostCachedTable`.
        options: `TableOptions` per logical table index (tag).

    Example:

    ```python
    store = RowLifecycle(PhysicalTable(8), [rk.embedding.TableOptions(admit_after=2)])
    store.begin_step(1)
    rows, _ = store.resolve(keys, training=True, tags=torch.zeros_like(keys))
    # rows are -1 until a key was seen in 2 steps
    ```
    """

    needs_tags = True

    def __init__(self, store: RowStore, options: list[TableOptions]):
        super().__init__(store)
        self.admit_after = torch.tensor([o.admit_after for o in options])
        self.idle_limit = torch.tensor([o.evict_idle_steps or NEVER for o in options])
        self.min_hits = torch.tensor([o.evict_min_hits or 0 for o in options])
        self.evict_every = min(o.evict_every for o in options)
        self.evicts = any(o.evict_idle_steps or o.evict_min_hits for o in options)
        self.idle_windows = torch.tensor([o.evict_idle_windows or NEVER for o in options])
        self.ages_by_windows = any(o.evict_idle_windows for o in options)
        self.pending = KeyCounter()
        # Per row of the index: the step and the window it was last trained
        # in, and its hits since the last eviction pass.
        self.last_step = torch.zeros(0, dtype=torch.int64)
        self.last_window = torch.zeros(0, dtype=torch.int64)
        self.hits = torch.zeros(0, dtype=torch.int64)
        if len(options) > 1:          # per-table limits: the index keeps each row's table
            store.index.track_tags()
        self.evicted = 0
        self.step = 0
        self.window = 0        # windows ended so far: the window that trains now

    # ---- what the lifecycle changes ---------------------------------------------------

    def begin_step(self, step: int) -> None:
        """Runs an eviction pass when one is due (see the module docstring).

        Args:
            step: the training step that begins, counted from 1.
        """
        self.inner.begin_step(step)
        self.step = step
        if not self.evicts or step % self.evict_every:
            return
        with self.inner.locked():
            n = self.index.num_rows
            tag = self._tags(n)
            stale = (step - self.last_step[:n]) > self.idle_limit[tag]
            stale |= self.hits[:n] < self.min_hits[tag]
            freed = int(stale.sum())
            if freed:
                self.compact((~stale).nonzero().squeeze(1))
                self.evicted += freed
            self.hits = torch.zeros(self.index.weights.shape[0], dtype=torch.int64)

    def end_window(self) -> int:
        """Ends the current time window: frees the rows of tables with
        `evict_idle_windows=k` that were not trained in it or the `k - 1`
        windows before it, and starts the next window.

        Rows loaded (`load`) without their windows (anything but a
        checkpoint) count as trained in the window that was current when
        they were loaded.

        Returns:
            The number of rows freed.

        Example:

        ```python
        store = RowLifecycle(PhysicalTable(8),
                             [rk.embedding.TableOptions(evict_idle_windows=2)])
        ...                          # train on window 0, touching some keys
        store.end_window()           # 0: window 0 trained them
        store.end_window()           # 0: window 0 is one of the last 2
        store.end_window()           # windows 1 and 2 touched nothing: those rows go
        ```
        """
        freed = 0
        if self.ages_by_windows:
            with self.inner.locked():
                n = self.index.num_rows
                stale = (self.window - self.last_window[:n]) >= self.idle_windows[self._tags(n)]
                freed = int(stale.sum())
                if freed:
                    self.compact((~stale).nonzero().squeeze(1))
                    self.evicted += freed
        self.window += 1
        return freed

    def resolve(self, keys: torch.Tensor, training: bool,
                tags: torch.Tensor | None = None) -> tuple[torch.Tensor, Pin | None]:
        """Rows of `keys`; while training only admitted keys get one.

        Args:
            keys: int64 table keys.
            training: admit keys seen often enough, and count the use of
                every row (inference finds rows only).
            tags: int64 logical table of each key (needed while training).

        Returns:
            `(rows, pin)` of the wrapped store; -1 for ids not admitted yet.
        """
        if not training:
            return self.inner.resolve(keys, training)
        if tags is None:
            raise ValueError(f"table {self.name}: a training lookup needs the keys' tags "
                             f"(its store needs_tags)")
        index = self.index
        with self.inner.locked():
            rows = self._admitted_rows(keys.to(index.device), tags.to(index.device))
            return self.inner.place(rows, training)

    def _tags(self, n):
        """The logical table of the index's first `n` rows (0 where unknown:
        rows loaded without tags)."""
        tags = self.index.tags
        if tags is None:
            return torch.zeros(n, dtype=torch.int64)
        return tags[:n].to("cpu", torch.int64).clamp(min=0)

    def _admitted_rows(self, keys, tags):
        index = self.index
        rows = index.find(keys)
        absent = (rows < 0).nonzero().squeeze(1)
        if absent.numel():
            seen = self.pending.add(keys[absent])
            admitted = absent[seen >= self.admit_after[tags[absent]]]
            if admitted.numel():
                rows[admitted] = index.find_or_insert(keys[admitted], tags[admitted])
        self._fit_rows()
        live = rows[rows >= 0]
        self.last_step[live] = self.step
        if self.ages_by_windows:
            self.last_window[live] = self.window
        self.hits.index_add_(0, live, torch.ones_like(live))
        return rows

    def _fit_rows(self, fill_window=0):
        """Grows the per-row counters to the index's capacity; rows that
        come get `fill_window` as their last window (set again when trained)."""
        capacity = self.index.weights.shape[0]
        if self.last_step.numel() < capacity:
            extra = capacity - self.last_step.numel()
            self.last_step = torch.cat([self.last_step, torch.zeros(extra, dtype=torch.int64)])
            self.last_window = torch.cat([self.last_window,
                                          torch.full((extra,), fill_window)])
            self.hits = torch.cat([self.hits, torch.zeros(extra, dtype=torch.int64)])

    # ---- what the lifecycle adds to the wrapped store's table state -------------------

    def export(self) -> dict[str, Any]:
        """The wrapped store's rows, and each row's last window where rows
        age out by windows (admission counts, step ages and hits are not in
        it: a restarted job counts them afresh).

        Returns:
            `RowStore.export`'s arrays; with `ages_by_windows`, also
            `"last_window"` (int32, one per row) and `"window"` (the
            windows ended so far).
        """
        return self._with_windows(self.inner.export())

    def export_changes(self, since: int) -> dict[str, Any]:
        """The wrapped store's changes: rows it admitted or updated after
        generation `since`, and the keys it freed since (tombstones).

        Args:
            since: the generation of the checkpoint the changes are relative to.

        Returns:
            `RowStore.export_changes`'s arrays, with the windows as `export`.
        """
        return self._with_windows(self.inner.export_changes(since))

    def _with_windows(self, arrays):
        """`arrays` with each row's last window (as `end_window` counts
        them) and the window count, where rows age out by windows."""
        if self.ages_by_windows:
            index = self.index
            rows = index.find(torch.from_numpy(arrays["keys"]).to(index.device)).cpu()
            arrays["last_window"] = self.last_window[rows].to(torch.int32).numpy()
            arrays["window"] = self.window
        return arrays

    def load(self, arrays: dict) -> None:
        """Loads the wrapped store.

        The loaded rows are numbered anew and start without step ages or
        hits, as in a process that loads the same export fresh. Where rows
        age out by windows, each row keeps the window it was last trained
        in when the arrays have it (a checkpoint's `"last_window"`, -1:
        unknown), else it counts as trained in the current window;
        `"window"` (a checkpoint's window count) sets the current window
        first. Admission counts (per key) are kept; the rows' tables come
        with the export's tags.

        Args:
            arrays: `{"keys", "weights", "state"}` numpy arrays or tensors
                (and `"tags"`, `"seen_steps"`, `"last_window"`, `"window"`).
        """
        self.inner.load(arrays)
        if arrays.get("window") is not None:
            self.window = int(arrays["window"])
        self.last_step, self.last_window, self.hits = (
            torch.zeros(0, dtype=torch.int64) for _ in range(3))
        self._fit_rows(fill_window=self.window)
        last = arrays.get("last_window")
        if self.ages_by_windows and last is not None:
            last = torch.as_tensor(last, dtype=torch.int64).cpu()
            rows = self.index.find(torch.as_tensor(arrays["keys"], dtype=torch.int64)
                                   .to(self.index.device)).cpu()
            self.last_window[rows] = torch.where(last < 0, self.window, last)

    def compact(self, keep: torch.Tensor) -> torch.Tensor:
        """The wrapped store's `compact`; row ages (in steps and windows)
        and hits move with their rows (tags move in the index).

        Args:
            keep: int64 ascending rows of `index` to keep.

        Returns:
            The new row of each kept row.
        """
        kept = [values[keep] for values in (self.last_step, self.last_window, self.hits)]
        rows = self.inner.compact(keep)
        capacity = self.index.weights.shape[0]
        self.last_step, self.last_window, self.hits = (
            torch.zeros(capacity, dtype=torch.int64) for _ in range(3))
        for values, old in zip((self.last_step, self.last_window, self.hits), kept,
                               strict=True):
            values[rows] = old
        return rows
