"""Per-table options: a logical table's row lifecycle and its storage tier.

`TableOptions` is what a user passes to `ShardedEmbedding(table_options=...)`
for one logical table. The lifecycle fields (admission, eviction) are read by
`lifecycle.RowLifecycle`; the storage fields (`storage`, the cache budget and
policy) by `cache.HostCachedTable`; `dtype` (the rows' precision) by
`physical_table.PhysicalTable`; the regularization fields
(`embeddings_regularizer`, `regularize`) by `regularization.RowPenalty`. The
engine builds one row store per physical table from the options of the
logical tables packed into it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from reckeras.embedding.row_dtypes import ROW_DTYPES

STORAGES = ("device", "host_cached")
INDEXES = ("hash", "compact")
CACHE_POLICIES = ("lfu", "lru")
REGULARIZE = ("distinct", "occurrence")


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
        evict_idle_windows: free rows not touched while training on the last
            this many time windows (aging out, counted in windows: see
            `rk.Model.fit_windows`, which ends each window after training on
            it, and `docs/continuous.md`).
        storage: `"device"` keeps every row on the device;
            `"host_cached"` keeps every row (and its optimizer state) in
            host memory and a bounded cache of hot rows on the device (see
            `docs/caching.md`). All tables of one dim share one physical
            table, so they must agree on `storage` and `cache_policy`.
        cache_rows: device cache budget in rows (`host_cached` only).
        cache_bytes: device cache budget in bytes, weights plus optimizer
            state (`host_cached` only; give it or `cache_rows`).
        cache_policy: which cached row to replace: `"lfu"` (least
            frequently used, with aging) or `"lru"` (least recently used).
        dtype: how the rows are stored: `"float32"`, or `"float16"` /
            `"bfloat16"` for half the row memory. Optimizer state and every
            update's arithmetic stay float32; an update rounds the new row
            back stochastically (see `docs/caching.md`, "Half-precision
            rows"). Tables of one dim share one physical table, so they
            must agree on it.
        index: how rows are found by key: `"hash"` (an open-addressing
            hash map, the fastest lookups, 32 to 64 bytes a row) or
            `"compact"` (buckets of one-byte digests and int32 rows, about
            7 bytes a row, grown one bucket at a time without a second
            copy; its lookups are about twice as slow, see
            `docs/performance.md`, "Compact tables"). For tables of 10^8
            rows, where the hash map costs as much memory as the rows. Tables
            of one dim share one physical table, so they must agree on it.
        embeddings_regularizer: the table's penalty, overriding the
            `ShardedEmbedding`'s `embeddings_regularizer` (None: the
            layer's). A Keras regularizer (`keras.regularizers.L2(0.05)`),
            its name (`"l2"`) or its config; the layer resolves it (see
            `docs/regularization.md`).
        regularize: which rows of a batch the penalty counts, overriding
            the layer's `regularize` (None: the layer's): `"distinct"`
            (every row the batch looks up, once) or `"occurrence"` (every
            lookup, over the batch size). Tables of one dim share one
            physical table, so they must agree on both regularization
            fields (as resolved with the layer's).

    Example:

    ```python
    emb = rk.layers.ShardedEmbedding(columns, table_options={
        "C1": rk.embedding.TableOptions(admit_after=2, evict_idle_steps=10_000),
        "C3": rk.embedding.TableOptions(evict_idle_windows=3),
        "C2": rk.embedding.TableOptions(storage="host_cached", cache_rows=100_000),
        "C4": rk.embedding.TableOptions(dtype="bfloat16", index="compact"),
        "C5": rk.embedding.TableOptions(embeddings_regularizer=keras.regularizers.L2(0.05))})
    ```
    """

    admit_after: int = 1
    evict_idle_steps: int | None = None
    evict_min_hits: int | None = None
    evict_every: int = 100
    evict_idle_windows: int | None = None
    storage: str = "device"
    cache_rows: int | None = None
    cache_bytes: int | None = None
    cache_policy: str = "lfu"
    dtype: str = "float32"
    index: str = "hash"
    embeddings_regularizer: Any = None
    regularize: str | None = None

    def __post_init__(self):
        for field in ("admit_after", "evict_every"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"TableOptions.{field} must be an int >= 1, got {value!r}")
        for field in ("evict_idle_steps", "evict_min_hits", "evict_idle_windows"):
            value = getattr(self, field)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ValueError(f"TableOptions.{field} must be None or an int >= 1, "
                                 f"got {value!r}")
        if self.dtype not in ROW_DTYPES:
            raise ValueError(f"TableOptions.dtype must be one of {tuple(ROW_DTYPES)}, "
                             f"got {self.dtype!r}")
        if self.index not in INDEXES:
            raise ValueError(f"TableOptions.index must be one of {INDEXES}, got {self.index!r}")
        if self.regularize is not None and self.regularize not in REGULARIZE:
            raise ValueError(f"TableOptions.regularize must be None or one of {REGULARIZE}, "
                             f"got {self.regularize!r}")
        regularizer = self.embeddings_regularizer
        if not (regularizer is None or isinstance(regularizer, (str, dict))
                or callable(regularizer)):
            raise ValueError("TableOptions.embeddings_regularizer must be None, a Keras "
                             "regularizer, its name or its config, got "
                             f"{regularizer!r}")
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
    def uses_lifecycle(self) -> bool:
        """Whether admission or eviction differs from the defaults."""
        return (self.admit_after, self.evict_idle_steps, self.evict_min_hits,
                self.evict_idle_windows) != (1, None, None, None)

    def cache_capacity(self, row_bytes: int) -> int:
        """This table's share of its device cache, in rows (`host_cached` only).

        Args:
            row_bytes: bytes of one cached row (weights and optimizer state).

        Returns:
            `cache_rows`, or the rows of `row_bytes` that `cache_bytes` holds.

        Raises:
            ValueError: the table has no cache (storage `"device"`).
        """
        if self.cache_rows is not None:
            return self.cache_rows
        if self.cache_bytes is None:
            raise ValueError(f"TableOptions(storage={self.storage!r}) has no device cache")
        return self.cache_bytes // row_bytes

    def get_config(self) -> dict:
        """The fields as a dict: `TableOptions(**config)` rebuilds the options.

        Returns:
            `{field name: value}` of every field.
        """
        return dataclasses.asdict(self)
