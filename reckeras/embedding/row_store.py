"""The row-store protocol: what the engine and the table states use of a table's rows.

Several logical tables of one dim are packed into one physical table (see
`packing`); on each rank a physical table's rows live in one *row store*.
`RowStore` is the one interface its callers use (the engine's lookup and
update, the sparse optimizers through `weights`/`state`, the cache prefetch,
the table states that checkpoints, `model.save` and the serving export read):

* `physical_table.PhysicalTable` (storage `"device"`): a dynamic hash index
  plus row arrays, every row where the lookup runs.
* `cache.HostCachedTable` (storage `"host_cached"`): every row in a host
  `PhysicalTable`, the lookup and the optimizer on a bounded device cache
  of the hot ones.
* `lifecycle.RowLifecycle`: wraps either to admit and evict rows.

A capability only some stores have is a protocol member with a default that
says "none here" (`cache` is None, `evicted` is 0, `end_window` frees
nothing), so no caller asks which class a store is. A store that wraps
another (`DelegatingStore`) hands it every member it does not override:
adding a member to the protocol adds it to every wrapper.
"""

from __future__ import annotations

import abc
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

import torch

# The protocol names the parts of a store by what its callers use of them,
# not by the classes that implement them (`physical_table`, `cache`): those
# import this module.


class RowIndex(Protocol):
    """What a store's callers use of its `index` (a `PhysicalTable`): every
    row this rank holds, found by key."""

    @property
    def device(self) -> torch.device:
        """Where its arrays live."""

    @property
    def num_rows(self) -> int:
        """Rows it holds."""

    @property
    def weights(self) -> torch.Tensor:
        """Its rows, `[capacity, dim]`."""

    @property
    def tags(self) -> torch.Tensor | None:
        """Each row's logical table (int32), None where it does not track them."""

    def find(self, keys: torch.Tensor) -> torch.Tensor:
        """Rows of keys, without creating any.

        Args:
            keys: int64 table keys.

        Returns:
            int64 rows, -1 where a key has none.
        """

    def find_or_insert(self, keys: torch.Tensor,
                       tags: torch.Tensor | None = None) -> torch.Tensor:
        """Rows of keys, created for new keys.

        Args:
            keys: int64 table keys.
            tags: each key's logical table, kept for new rows (or None).

        Returns:
            int64 rows.
        """

    def reserve_rows(self, extra: int) -> None:
        """Makes room for `extra` more rows now (no move when they come).

        Args:
            extra: rows beyond those held.
        """

    def track_tags(self) -> None:
        """Keeps each row's logical table from now on."""

    def next_generation(self) -> int:
        """Ends the save generation.

        Returns:
            The generation ended.
        """

    def forget_deleted(self, until: int) -> None:
        """Drops the deleted keys recorded up to a generation.

        Args:
            until: the last generation whose deleted keys are dropped.
        """


class Pin(Protocol):
    """What keeps the rows of one lookup in place until its update ran (a
    device cache's slots, `cache.Pin`)."""

    def release(self) -> None:
        """Lets the rows move again (once: releasing again does nothing)."""


class DeviceCache(Protocol):
    """The device tier of a `host_cached` store (`cache.RowCache`)."""

    def stats(self) -> dict:
        """Its hit rates, rows and bytes moved, stall time and budget so far."""


class RowStore(abc.ABC):
    """The rows of one physical table on this rank, as the engine uses them.

    A lookup resolves its keys to rows (`resolve`, creating rows while
    training), reads `weights[rows]`, and its backward hands the rows'
    gradients to the sparse optimizer, which updates `weights[rows]` and
    `state[rows]` in place. `weights` and `state` are read when they are used
    (a store may replace them as it grows), so an update queued for later
    still lands in the current arrays. Rows stay valid until the next
    training step begins (`begin_step`, where a lifecycle may renumber them)
    and, in a store with a device cache, until the lookup's `pin` is released.

    The engine marks the distinct rows of each training update written
    (`mark_written`) before it applies the update: they are the only rows
    a step can change, so `export_changes` finds every changed row.

    Attributes every store has:

    * `dim` (int): the row width; `name` (str): how errors name the table.
    * `needs_tags` (bool): whether `resolve` reads the keys' tags (each key's
      logical table among the physical table's); the engine computes and
      routes tags only for a store that needs them.
    * `index` (`PhysicalTable`): every row this rank holds, found by key
      (the host tier of a `host_cached` store); it also keeps the save
      generations and each row's tag. Its row numbers are the ones
      `compact` and `place` take.
    * `weights`, `state` (`torch.Tensor`): `[row_bound or more, dim]` and
      `[..., state width]`, the arrays lookups read and the optimizer updates.
    * `row_bound` (int): every row `resolve` returns is below it.
    * `num_rows` (int): rows this store holds.

    And, with a default for the stores without the capability:

    * `cache` (`cache.RowCache` or None): the device tier of a
      `host_cached` store; None: the lookup reads `index`'s own rows.
    * `evicted` (int): rows a lifecycle freed so far; 0 without one.
    * `ages_by_windows` (bool): whether rows age out by time windows
      (`end_window`); then `export` adds each row's last window.

    Methods with a body here are what a store without the capability does
    (nothing).

    Example:

    ```python
    rows, pin = store.resolve(keys, training=True)
    values = store.weights[rows]              # the lookup's forward
    store.mark_written(unique_rows)
    optimizer.apply(store.weights, store.state, unique_rows, grads)
    if pin is not None:
        pin.release()
    ```
    """

    dim: int
    name: str
    needs_tags: bool
    if TYPE_CHECKING:
        # Read-only to the callers, as properties tell the type checker: a
        # store may compute them (a cached store's arrays are its cache's).
        # At run time they are annotations like the others (`protocol_members`).
        @property
        def index(self) -> RowIndex: ...
        @property
        def weights(self) -> torch.Tensor: ...
        @property
        def state(self) -> torch.Tensor: ...
        @property
        def row_bound(self) -> int: ...
    else:
        index: RowIndex
        weights: torch.Tensor
        state: torch.Tensor
        row_bound: int
    num_rows: int
    cache: DeviceCache | None = None
    evicted: int = 0
    ages_by_windows: bool = False

    # ---- the step ----------------------------------------------------------------

    @abc.abstractmethod
    def resolve(self, keys: torch.Tensor, training: bool,
                tags: torch.Tensor | None = None) -> tuple[torch.Tensor, Pin | None]:
        """Rows of `weights`/`state` for one lookup of `keys`.

        Args:
            keys: int64 table keys (duplicates allowed).
            training: create rows for new keys (a lifecycle: only the ones it
                admits) and mark them for update; else find only.
            tags: int64, each key's logical table (its index among the
                physical table's); read only where `needs_tags`, else None.

        Returns:
            `(rows, pin)`: each key's row (-1 where it has none) and what
            keeps the rows in place until the lookup's update ran (None when
            nothing can move them).
        """

    @abc.abstractmethod
    def mark_written(self, rows: torch.Tensor) -> None:
        """Marks rows that an update is about to change (in `index`'s
        `tracking`: the generation written and the steps seen, see
        `physical_table`).

        The engine calls it once per update with the update's distinct rows,
        after the step was found finite and before the optimizer runs.

        Args:
            rows: int64 rows of `weights` as `resolve` returned them (-1
                allowed: no row).
        """

    # The empty bodies below are the defaults of a store without the
    # capability (B027 asks for abstract methods).
    def check_fits(self, keys: torch.Tensor, training: bool) -> None:  # noqa: B027
        """Raises before anything changes if one lookup of `keys` cannot
        fit (a device cache's budget); a store without a cache always fits.

        Args:
            keys: int64 keys of one lookup.
            training: the lookup may create rows for keys not seen yet.
        """

    def begin_step(self, step: int) -> None:  # noqa: B027
        """A training step begins, before it resolves any row (a lifecycle
        runs its eviction pass here when one is due; other stores do nothing).

        Args:
            step: the training step, counted from 1.
        """

    def end_window(self) -> int:
        """Ends a time window after training on it (a lifecycle whose rows
        age out by windows frees the stale ones; other stores free nothing).

        Returns:
            The number of rows freed.
        """
        return 0

    def prefetch(self, keys: torch.Tensor) -> None:  # noqa: B027
        """Brings the existing rows of `keys` close to the lookup ahead of
        time (a device cache); creates no row, changes no value. A store
        without a cache has nothing to bring.

        Args:
            keys: int64 keys a coming batch will look up.
        """

    def release_pins(self) -> None:  # noqa: B027
        """Unpins every row (lookups whose step failed before its update);
        a store without a cache pins nothing."""

    @abc.abstractmethod
    def configure_state(self, width: int, initial_value: float) -> None:
        """Sets the per-row optimizer state layout.

        State already of this width (for example loaded from a checkpoint) is
        kept; otherwise every row starts at `initial_value`.

        Args:
            width: float32 state values per row.
            initial_value: a new row's state values.
        """

    # ---- table states --------------------------------------------------------------

    @abc.abstractmethod
    def export(self) -> dict[str, Any]:
        """A copy of every row this store holds, with its newest value.

        Returns:
            `{"keys": int64 [n], "weights": [n, dim] in the table's dtype
            (`row_dtypes.numpy_dtype`), "state": float32 [n, width],
            "seen_steps": int32 [n]}` (the training steps each row was seen
            in, at most 2047: see `physical_table`), `"tags"` (int32 [n])
            where `index` tracks them, and where rows age out by windows
            `"last_window"` (int32 [n]) and `"window"` (int, the windows
            ended so far): the fields of a `table_state.TableState`.
        """

    @abc.abstractmethod
    def export_changes(self, since: int) -> dict[str, Any]:
        """A copy of the rows changed after save generation `since`, and the
        keys deleted since.

        Args:
            since: the generation of the checkpoint the changes are relative to.

        Returns:
            `export()`'s arrays for the rows written in a later generation,
            plus `"deleted"`: int64 keys that had a row then or since and
            have none now.
        """

    @abc.abstractmethod
    def load(self, arrays: dict) -> None:
        """Replaces every row by exported arrays (the inverse of `export`).

        Args:
            arrays: `{"keys", "weights", "state"}` numpy arrays or tensors
                (and `"seen_steps"`, 0 where missing, `"tags"`,
                `"last_window"`, `"window"`); weights of another dtype than
                the table's are converted (rounded to the nearest).

        Raises:
            ValueError: the weights' shape does not match the keys and `dim`.
        """

    @abc.abstractmethod
    def stats(self) -> dict:
        """This store's figures for `EmbeddingEngine.stats`.

        Returns:
            `{"dim", "rows", "bytes", "bytes_by_part"}` (rows held, bytes of
            `index`), plus `"cache"` (`RowCache.stats`) where there is a cache.
        """

    # ---- what a wrapper uses of the store it wraps -----------------------------

    @abc.abstractmethod
    def locked(self) -> AbstractContextManager:
        """Holds what keeps a concurrent `prefetch` off the store's index.

        A wrapper that changes the index itself (a lifecycle admitting keys)
        holds it around its change and `place`.

        Returns:
            A context manager (reentrant).
        """

    @abc.abstractmethod
    def place(self, index_rows: torch.Tensor,
              training: bool) -> tuple[torch.Tensor, Pin | None]:
        """`resolve` for keys whose rows of `index` the caller found.

        Call it inside `locked`, with the index rows found inside it too.

        Args:
            index_rows: int64 rows of `index` (-1: none).
            training: the lookup will update the rows.

        Returns:
            `(rows, pin)` as `resolve` returns them.
        """

    @abc.abstractmethod
    def compact(self, keep: torch.Tensor) -> torch.Tensor:
        """Keeps only some rows of `index`, values and state unchanged; the
        keys of the others are deleted (tombstones for `export_changes`).

        Rows are renumbered, so no lookup may hold rows meanwhile (a
        lifecycle compacts at `begin_step` or `end_window`).

        Args:
            keep: int64 ascending rows of `index` to keep.

        Returns:
            The new row of each kept row, in the order of `keep`.
        """


def protocol_members() -> tuple[str, ...]:
    """The names of `RowStore`'s members: its attributes and methods.

    Returns:
        The names, attributes first, in definition order.

    Example:

    ```python
    "resolve" in protocol_members()     # True
    ```
    """
    methods = [name for name, value in vars(RowStore).items()
               if callable(value) and not name.startswith("_")]
    return tuple(RowStore.__annotations__) + tuple(methods)


class _Forwarded:
    """A `DelegatingStore` member read from its `inner` store.

    A non-data descriptor: an attribute that the wrapper sets on itself, or
    a member its class defines, takes precedence.
    """

    def __init__(self, name):
        self.name = name
        self.__doc__ = f"The inner store's `{name}` (see `RowStore.{name}`)."

    def __get__(self, store, owner=None):
        if store is None:
            return self
        return getattr(store.inner, self.name)


class DelegatingStore(RowStore):
    """A row store around another that hands it every protocol member it
    does not override itself.

    Subclasses define only the members where they add behaviour; every other
    `RowStore` member (attribute or method) is the inner store's. A wrapper
    may also set a protocol attribute on itself (`self.evicted = 0`).

    Args:
        inner: the wrapped `RowStore`.

    Example:

    ```python
    class CountingStore(DelegatingStore):
        def __init__(self, inner):
            super().__init__(inner)
            self.lookups = 0

        def resolve(self, keys, training, tags=None):
            self.lookups += 1
            return self.inner.resolve(keys, training, tags)

    store = CountingStore(PhysicalTable(8))
    store.dim                                  # 8, the inner table's
    ```
    """

    def __init__(self, inner: RowStore):
        self.inner = inner


for _member in protocol_members():
    setattr(DelegatingStore, _member, _Forwarded(_member))
# The type checker cannot see the members set just above: the class is concrete now.
abc.update_abstractmethods(DelegatingStore)  # type: ignore[type-abstract]
del _member
