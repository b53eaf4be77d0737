"""Per-table options, and the row lifecycle: admission and eviction, off by default.

``TableOptions`` also carries a table's storage tier (see ``cache``); the
lifecycle below ignores it.

* **Admission** (``admit_after=k``): an id gets a row only once it has
  appeared in ``k`` training steps (several occurrences in one step count
  once, so the rule does not depend on how a step's batch is split across
  ranks). Until then it reads a zero vector and gets no update; its count
  lives in a small key -> count map beside the table.
* **Eviction** (``evict_idle_steps=n`` and/or ``evict_min_hits=h``): every
  ``evict_every`` training steps, rows not touched in the last ``n`` steps,
  or touched fewer than ``h`` times since the previous pass, are freed; the
  table is compacted, so freed slots are reused by the next new ids. A freed
  id that comes back gets a fresh row at its initial value (its admission
  count is kept, so it is admitted at once).

Eviction runs at the start of a training step, before the step resolves any
row, so no step ever sees rows move under it.
"""

import dataclasses

import torch

from reckeras.backend_kernels import hash_table

NEVER = 2**62
STORAGES = ("device", "host_cached")
CACHE_POLICIES = ("lfu", "lru")


@dataclasses.dataclass(frozen=True)
class TableOptions:
    """Lifecycle and storage options of one logical table.

    Args:
        admit_after: training steps an id must appear in before it gets a row
            (1: at first sight).
        evict_idle_steps: free rows idle for more than this many steps.
        evict_min_hits: free rows touched fewer times than this between two
            eviction passes.
        evict_every: training steps between eviction passes.
        storage: ``"device"`` keeps every row on the device;
            ``"host_cached"`` keeps every row (and its optimizer state) in
            host memory and a bounded cache of hot rows on the device (see
            ``docs/caching.md``). All tables of one dim share one physical
            table, so they must agree on ``storage`` and ``cache_policy``.
        cache_rows: device cache budget in rows (``host_cached`` only).
        cache_bytes: device cache budget in bytes, weights plus optimizer
            state (``host_cached`` only; give it or ``cache_rows``).
        cache_policy: which cached row to replace: ``"lfu"`` (least
            frequently used, with aging) or ``"lru"`` (least recently used).

    Example:
        >>> rk.layers.ShardedEmbedding(columns, table_options={
        ...     "C1": rk.embedding.TableOptions(admit_after=2, evict_idle_steps=10_000),
        ...     "C2": rk.embedding.TableOptions(storage="host_cached", cache_rows=100_000)})
    """

    admit_after: int = 1
    evict_idle_steps: int = None
    evict_min_hits: int = None
    evict_every: int = 100
    storage: str = "device"
    cache_rows: int = None
    cache_bytes: int = None
    cache_policy: str = "lfu"

    def __post_init__(self):
        for field in ("admit_after", "evict_every"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"TableOptions.{field} must be an int >= 1, got {value!r}")
        for field in ("evict_idle_steps", "evict_min_hits"):
            value = getattr(self, field)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ValueError(f"TableOptions.{field} must be None or an int >= 1, "
                                 f"got {value!r}")
        self._check_storage()

    def _check_storage(self):
        if self.storage not in STORAGES:
            raise ValueError(f"TableOptions.storage must be one of {STORAGES}, "
                             f"got {self.storage!r}")
        if self.cache_policy not in CACHE_POLICIES:
            raise ValueError(f"TableOptions.cache_policy must be one of {CACHE_POLICIES}, "
                             f"got {self.cache_policy!r}")
        budgets = [f for f in ("cache_rows", "cache_bytes") if getattr(self, f) is not None]
        if self.storage == "device":
            if budgets:
                raise ValueError(f"TableOptions.{budgets[0]} needs storage='host_cached'")
            return
        if len(budgets) != 1:
            raise ValueError("storage='host_cached' needs exactly one of cache_rows and "
                             f"cache_bytes, got {budgets or 'neither'}")
        value = getattr(self, budgets[0])
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"TableOptions.{budgets[0]} must be an int >= 1, got {value!r}")

    @property
    def uses_lifecycle(self):
        """Whether admission or eviction differs from the defaults."""
        return (self.admit_after, self.evict_idle_steps, self.evict_min_hits) != (1, None, None)

    def get_config(self):
        return dataclasses.asdict(self)


class KeyCounter:
    """How many times each not-yet-admitted key was seen."""

    def __init__(self):
        self.slot_keys, self.slot_rows = hash_table.new_slots(16)
        self.size = 0
        self.counts = torch.zeros(16, dtype=torch.int64)

    def add(self, keys):
        """Counts one step's sighting of each distinct key; returns each key's total."""
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


class RowLifecycle:
    """Admission and eviction for one physical table.

    Args:
        table: the PhysicalTable.
        options: TableOptions per logical table index (tag).
    """

    def __init__(self, table, options):
        self.table = table
        self.admit_after = torch.tensor([o.admit_after for o in options])
        self.idle_limit = torch.tensor([o.evict_idle_steps or NEVER for o in options])
        self.min_hits = torch.tensor([o.evict_min_hits or 0 for o in options])
        self.evict_every = min(o.evict_every for o in options)
        self.evicts = any(o.evict_idle_steps or o.evict_min_hits for o in options)
        self.pending = KeyCounter()
        self.last_step = torch.zeros(0, dtype=torch.int64)
        self.hits = torch.zeros(0, dtype=torch.int64)
        self.tag = torch.zeros(0, dtype=torch.int64)
        self.evicted = 0

    def _fit_rows(self):
        capacity = self.table.weights.shape[0]
        if self.last_step.numel() < capacity:
            extra = capacity - self.last_step.numel()
            self.last_step = torch.cat([self.last_step, torch.zeros(extra, dtype=torch.int64)])
            self.hits = torch.cat([self.hits, torch.zeros(extra, dtype=torch.int64)])
            self.tag = torch.cat([self.tag, torch.zeros(extra, dtype=torch.int64)])

    def resolve(self, keys, tags, step):
        """Training rows of ``keys``; -1 for ids not admitted yet."""
        table = self.table
        rows = table.find(keys)
        absent = (rows < 0).nonzero().squeeze(1)
        if absent.numel():
            seen = self.pending.add(keys[absent])
            admitted = absent[seen >= self.admit_after[tags[absent]]]
            if admitted.numel():
                before = table.num_rows
                rows[admitted] = table.find_or_insert(keys[admitted])
                self._fit_rows()
                self.tag[before:table.num_rows] = 0
                self.tag[rows[admitted]] = tags[admitted]
        self._fit_rows()
        live = rows[rows >= 0]
        self.last_step[live] = step
        self.hits.index_add_(0, live, torch.ones_like(live))
        return rows

    def maybe_evict(self, step):
        """Runs an eviction pass when one is due; returns rows freed."""
        if not self.evicts or step == 0 or step % self.evict_every:
            return 0
        table = self.table
        table.sync()                 # rows are read below: a device cache writes back
        n = table.num_rows
        tag = self.tag[:n]
        stale = (step - self.last_step[:n]) > self.idle_limit[tag]
        stale |= self.hits[:n] < self.min_hits[tag]
        freed = int(stale.sum())
        if freed:
            keep = (~stale).nonzero().squeeze(1)
            arrays = {"keys": table.keys[keep], "weights": table.weights[keep],
                      "state": table.state[keep]}
            last_step, tag = self.last_step[keep], self.tag[keep]
            table.load(arrays)
            rows = table.find(arrays["keys"])
            self.last_step = torch.zeros(table.weights.shape[0], dtype=torch.int64)
            self.tag = torch.zeros_like(self.last_step)
            self.last_step[rows], self.tag[rows] = last_step, tag
            self.evicted += freed
        self.hits = torch.zeros(table.weights.shape[0], dtype=torch.int64)
        return freed
