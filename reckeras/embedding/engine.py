"""The embedding engine: from a packed sparse batch to pooled embeddings.

One engine serves one ShardedEmbedding layer. Per batch it (1) derives each
id's slot, example and pooling weight from the offsets, (2) turns ids into
table keys (`mix64(id) ^ salt(table)`), (3) resolves keys to rows of the
physical tables (creating rows for new ids while training), (4) dedups the
rows, and (5) runs the fused pooled lookup, whose backward aggregates one
gradient per unique row and applies the sparse optimizer to those rows.

Step (3) is where rows live. In one process it is a local hash lookup. With
several ranks, every row is owned by the rank `sharding.owner_of(key)`: the
batch's unique keys are routed to their owners (`comm`), the owners resolve
and send back the rows, and in backward the gradients travel the same route
to the owners, which sum them over all ranks, divide by the world size (each
rank's loss is a mean over its own examples) and run the optimizer
(`owned_rows`).

Every physical table's rows live in one row store, used only through the
`row_store.RowStore` protocol: a `PhysicalTable` on the device, or a
`cache.HostCachedTable` whose rows live in host memory and whose lookups and
optimizer run on a device cache of the hot ones (on the owner side in
distributed mode: each rank caches the rows it owns); a
`lifecycle.RowLifecycle` wraps either to admit and evict rows. The engine
builds them (`_store`) and otherwise only resolves keys to rows of a store
and runs the lookup and the optimizer on its `weights`/`state`. `prefetch`
loads a later batch's rows into the caches ahead of its step. Where each id
goes (its table, output row and pooling weight) is `id_layout.IdLayout`'s.

With several ranks, `route_ahead` plans a coming batch's routes (its keys'
dedup and their exchange to the owners) beside the running step (the
pipeline's sparse-dist stage) and returns them as a `RoutedBatch`, which
travels with its batch (`comm.RoutedBatch`): the step passes it to
`lookup(..., routed=...)`.
The keys' owners resolve them to rows only in the step, so training is the
same either way.

With a regularizer (`regularization`), `lookup(..., return_penalty=True)`
also returns the penalty of the rows read, whose gradient joins the rows'
data gradient in the one update backward applies.

Inside `deferred_updates`, backward applies nothing: each lookup's update
waits in an `updates.DeferredUpdates` until the caller has checked that the
step is finite, and then runs, or is dropped.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from reckeras import distributed
from reckeras.backend_kernels.aggregation import unique_rows
from reckeras.backend_kernels.hashing import table_keys
from reckeras.backend_kernels.pooling import PooledLookup
from reckeras.backend_kernels.sparse_optimizers import rounding_seed
from reckeras.embedding.cache import HostCachedTable
from reckeras.embedding.comm import FlatRouter, HierarchicalRouter, RoutedBatch
from reckeras.embedding.id_layout import IdLayout
from reckeras.embedding.lifecycle import RowLifecycle
from reckeras.embedding.local_row_update import LocalRowUpdate
from reckeras.embedding.owned_rows import OwnedRows
from reckeras.embedding.packing import PackingPlan
from reckeras.embedding.physical_table import PhysicalTable
from reckeras.embedding.regularization import RowPenalty, group_penalties
from reckeras.embedding.row_dtypes import row_dtype
from reckeras.embedding.row_store import DeviceCache, RowStore
from reckeras.embedding.sharding import owner_of
from reckeras.embedding.table_state import TableLayout, TableState, layout_of, load_arrays
from reckeras.embedding.updates import DeferredUpdates, all_finite

if TYPE_CHECKING:
    from reckeras.optimizers import SparseOptimizer


class EmbeddingEngine:
    """Tables and the per-batch lookup of one embedding layer (this rank's share).

    `tables` holds one `row_store.RowStore` per physical table (distinct
    dim, in `packing.dims` order); `step` counts training lookups;
    `lookup_device` is the device of the latest lookup's ids.

    Args:
        packing: the `PackingPlan` of the layer's features.
        init_scale: new rows are uniform in `[-init_scale, init_scale]`;
            None means `1 / sqrt(dim)` of each table.
        seed: seed of the rows' initial values and of the stochastic
            rounding of half-precision rows.
        device: the device the lookups run on: where `"device"` tables keep
            their rows and `host_cached` tables their caches (their host
            rows stay in CPU memory). Default: CUDA when available, else CPU.
        regularizer, regularize: the penalty of the rows a lookup reads, and
            `"distinct"` or `"occurrence"`, for tables whose `TableOptions`
            give none (see `regularization`); None: no penalty.

    Example:

    ```python
    from reckeras.features.plan import TransformPlan

    plan = TransformPlan(specs)
    engine = EmbeddingEngine(PackingPlan(plan.slots, plan.sparse_in_declaration_order))
    engine.set_optimizer(rk.optimizers.RowWiseAdagrad(0.05))
    sparse = plan.packed_sparse(raw_inputs)
    with engine.deferred_updates() as updates:
        (pooled, _), = engine.lookup(sparse["ids"], sparse["offsets"], training=True)
        loss = model_loss(pooled)
        loss.backward()                      # queues the table updates
        if bool(torch.isfinite(loss) & updates.finite()):
            updates.apply()                  # else they are dropped on exit
    ```
    """

    def __init__(self, packing: PackingPlan, init_scale: float | None = None,
                 seed: int = 0, device: str | torch.device | None = None,
                 regularizer: Any = None, regularize: str = "distinct"):
        self.packing = packing
        self.seed = seed
        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        # One row store per physical table (distinct dim), in packing order.
        self.tables: list[RowStore] = [self._store(group, init_scale, seed, device)
                                       for group in range(len(packing.dims))]
        self.id_layout = IdLayout(packing, any(store.needs_tags for store in self.tables))
        # One RowPenalty (or None) per physical table.
        self.penalties: list[RowPenalty | None] = group_penalties(
            packing.group_tables, packing.group_options, packing.dims, regularizer,
            regularize)
        self.step = 0          # training lookups so far (the lifecycle's clock)
        self.optimizer: SparseOptimizer | None = None
        # The tables are not autograd leaves; this empty tensor is, so that
        # backward reaches PooledLookup even in a model with no dense weights.
        self.anchor = torch.zeros(0, requires_grad=True)
        self._router: FlatRouter | HierarchicalRouter | None = None
        self.world: distributed.World | None = None
        self.requests = 0      # unique keys this rank's tables served, all batches
        self._deferred: DeferredUpdates | None = None     # the open one, see deferred_updates
        self.lookup_device = torch.device("cpu")     # of the latest lookup's ids
        self._window_start: tuple[int, int] | None = None   # (rows, evicted) at begin_window
        self._delta_bases: dict[str, int] = {}     # checkpoint id -> the generation it ended
        self._export: tuple[str, int] | None = None    # latest serving export, its generation

    def _store(self, group, init_scale, seed, device):
        """The row store of one physical table, as its tables' options ask."""
        plan = self.packing
        dim, names = plan.dims[group], plan.group_tables[group]
        options = plan.group_options[group]
        for field, what in (("dtype", "row dtype"), ("index", "key index")):
            values = {name: getattr(o, field) for name, o in zip(names, options, strict=True)}
            if len(set(values.values())) > 1:
                raise ValueError(f"tables {names} share one physical table (dim {dim}) and "
                                 f"need one {what}; got {values}. Give them the same "
                                 f"TableOptions {field}, or different dims")
        cached = plan.host_cached(group)
        table = PhysicalTable(dim, init_scale or dim ** -0.5, seed,
                              device="cpu" if cached else device,
                              name=f"{names} (dim {dim})",
                              pin_memory=cached and device.type == "cuda",
                              num_tables=len(names), dtype=row_dtype(options[0].dtype),
                              index=options[0].index)
        store = HostCachedTable(table, names, options, device) if cached else table
        if any(o.uses_lifecycle for o in options):
            store = RowLifecycle(store, options)
        return store

    # ---- tables -------------------------------------------------------------------

    @property
    def regularizes(self) -> bool:
        """Whether any physical table has a penalty (only then has
        `lookup(..., return_penalty=True)` one to return)."""
        return any(penalty is not None for penalty in self.penalties)

    @property
    def has_host_cached(self) -> bool:
        """Whether any physical table is `host_cached` (only then has
        `prefetch` anything to do)."""
        return any(store.cache is not None for store in self.tables)

    @property
    def caches(self) -> list[DeviceCache | None]:
        """The device tier (`cache.RowCache`) of each `host_cached` table,
        None for the others: to inspect a cache (tests, benchmarks)."""
        return [store.cache for store in self.tables]

    def table_layouts(self) -> list[TableLayout]:
        """Every physical table's layout (no rows copied).

        Returns:
            One `TableLayout` per physical table, in `tables` order.
        """
        return [layout_of(store, group)
                for store, group in zip(self.tables, self.packing.group_tables, strict=True)]

    def table_states(self) -> list[TableState]:
        """A copy of every physical table this rank holds.

        A `host_cached` table writes its cache back first, so the states hold
        every row's newest value.

        Returns:
            One `TableState` per physical table, in `tables` order.

        Example:

        ```python
        snapshot = engine.table_states()
        ...                                  # train on
        engine.load_table_states(snapshot)   # the tables as they were
        ```
        """
        return [TableState(layout, **store.export())
                for store, layout in zip(self.tables, self.table_layouts(), strict=True)]

    def changed_since(self, checkpoint: str) -> list[TableState]:
        """The rows changed since a checkpoint, and the keys deleted since.

        Args:
            checkpoint: the id of a checkpoint `mark_saved` recorded since
                the last full one (`delta_bases`), or `exported`.

        Returns:
            One `TableState` per physical table: the rows created or
            trained since, with `deleted` set.

        Raises:
            KeyError: `checkpoint` is neither in `delta_bases` nor `exported`.
        """
        generation = self._export[1] if self._export and checkpoint == self._export[0] \
            else self._delta_bases[checkpoint]
        return [TableState(layout, **store.export_changes(generation))
                for store, layout in zip(self.tables, self.table_layouts(), strict=True)]

    @property
    def delta_bases(self) -> frozenset[str]:
        """The checkpoints `changed_since` can compare with: those marked
        saved (`mark_saved`) since the last full one, that one included."""
        return frozenset(self._delta_bases)

    def mark_saved(self, checkpoint: str | None, full: bool) -> None:
        """Records that the tables now equal a checkpoint (just saved, or
        loaded): rows written from now on are newer than it.

        Ends the tables' save generation. After a full checkpoint no delta
        reaches further back: older bases and the keys deleted before are
        forgotten.

        Args:
            checkpoint: the checkpoint's id; None when the tables equal no
                checkpoint (a warm start loaded them): no delta can be
                based on them.
            full: a full checkpoint, or a load.

        Example:

        ```python
        states = engine.changed_since(base_id)     # what a delta writes
        engine.mark_saved(new_id, full=False)
        ```
        """
        ended = [store.index.next_generation() for store in self.tables]
        if full:
            self._delta_bases = {}
            for store, generation in zip(self.tables, ended, strict=True):
                # The next serving delta needs the keys deleted since its base.
                store.index.forget_deleted(generation if self._export is None
                                           else min(generation, self._export[1]))
        if checkpoint is not None and ended:
            # The tables of one engine advance together: one generation.
            self._delta_bases[checkpoint] = ended[0]

    @property
    def exported(self) -> str | None:
        """The latest serving export's version (`mark_exported`), or None."""
        return None if self._export is None else self._export[0]

    def mark_exported(self, version: str) -> None:
        """Records that the export `version` captured the tables now (the
        next serving delta is `changed_since(version)`; checkpoints keep it).

        Args:
            version: the export's version (its manifest's `"version"`).
        """
        ended = [store.index.next_generation() for store in self.tables]
        self._export = (version, ended[0] if ended else 0)

    def load_table_states(self, states: list[TableState]) -> None:
        """Replaces every physical table by the rows of `states` (what
        `table_states` returned, or a checkpoint's).

        A `host_cached` table's cache empties (its copies are void). Every
        loaded row counts as written since the last checkpoint, and every
        key held before as deleted; the delta bases are kept (the caller
        says what the tables equal, `mark_saved`).

        Args:
            states: one `TableState` per physical table, in `tables` order.

        Raises:
            ValueError: a count or row width that is not this engine's; no
                table is changed then.
        """
        if len(states) != len(self.tables):
            raise ValueError(f"{len(states)} tables given, the embedding layer has "
                             f"{len(self.tables)} (one per distinct dim)")
        for store, state in zip(self.tables, states, strict=True):
            shape = np.shape(state.weights)
            if len(shape) != 2 or shape[1] != store.dim:
                raise ValueError(f"table {store.name} cannot load weights of shape "
                                 f"{shape}: its rows have {store.dim} values")
        for store, state in zip(self.tables, states, strict=True):
            store.load(load_arrays(state))

    # ---- time windows -------------------------------------------------------------

    def begin_window(self) -> None:
        """Starts counting a time window's rows (see `end_window`).

        Example:

        ```python
        engine.begin_window()
        ...                                  # train on the window
        counts = engine.end_window()         # {"rows_added": ..., ...}
        ```
        """
        self._window_start = (self.num_rows, self._evicted())

    def end_window(self) -> dict[str, int]:
        """Ends a time window after training on it: tables with
        `TableOptions(evict_idle_windows=k)` free the rows not trained in
        the last `k` windows (`RowStore.end_window`).

        Counts this rank's rows since `begin_window`: the rows created
        while training (new ids, and freed ids that came back), the rows
        freed (by step-counted eviction during the window and by aging out
        at its end) and the rows held now, so that `rows_kept` is the rows
        held at `begin_window` plus `rows_added` minus `rows_evicted`.

        Returns:
            `{"rows_added", "rows_evicted", "rows_kept"}`, ints, over every
            physical table of this rank.

        Raises:
            RuntimeError: `begin_window` was not called first.
        """
        if self._window_start is None:
            raise RuntimeError("end_window() without begin_window(): call begin_window() "
                               "before training on the window")
        for store in self.tables:
            store.end_window()
        rows_before, evicted_before = self._window_start
        self._window_start = None
        evicted = self._evicted() - evicted_before
        kept = self.num_rows
        return {"rows_added": kept - rows_before + evicted, "rows_evicted": evicted,
                "rows_kept": kept}

    @property
    def num_rows(self) -> int:
        """Rows this rank's tables hold."""
        return sum(store.num_rows for store in self.tables)

    def _evicted(self):
        return sum(store.evicted for store in self.tables)

    # ---- setup --------------------------------------------------------------------

    def connect(self) -> FlatRouter | HierarchicalRouter | None:
        """Joins the world once: checks that all ranks declare the same tables
        and plans the routes.

        Returns:
            The router (None in one process).
        """
        if self.world is None:
            world = self.world = distributed.world()
            if world.size > 1:
                distributed.check_same_on_all_ranks(
                    "the embedding layer's feature/table configuration",
                    repr([(s.name, s.table, s.dim) for s in self.packing.slots]))
                kind = HierarchicalRouter if world.hierarchical else FlatRouter
                self._router = kind(world.size, world.rank, world.ranks_per_node,
                                    world.timeout_s)
        return self._router

    def set_optimizer(self, optimizer: SparseOptimizer) -> None:
        """Sets the sparse optimizer and lays out every row's state for it.

        Args:
            optimizer: an `rk.optimizers.SparseOptimizer`.
        """
        self.optimizer = optimizer
        initial = getattr(optimizer, "initial_accumulator_value", 0.0)
        for store in self.tables:
            store.configure_state(optimizer.state_width(store.dim), initial)

    def _checked_optimizer(self) -> SparseOptimizer:
        if self.optimizer is None:
            raise RuntimeError("the embedding tables have no optimizer: compile the "
                               "model with embedding_optimizer=... before training")
        return self.optimizer

    # ---- the step -----------------------------------------------------------------

    def lookup(self, ids: torch.Tensor, offsets: torch.Tensor, training: bool,
               routed: RoutedBatch | None = None,
               weights: torch.Tensor | None = None,
               return_penalty: bool = False) -> list | tuple[list, torch.Tensor]:
        """Embeddings of a packed batch, per physical table (dim).

        While training, the backward of the outputs updates the rows they
        read (now, or inside `deferred_updates` when the caller applies);
        the outputs of a lookup that does not train have no backward.

        Args:
            ids: int64 `[N]` transformed ids.
            offsets: int64 `[S * B + 1]` bag offsets.
            training: create rows for new ids (else unseen ids read zeros).
            routed: the `RoutedBatch` that `route_ahead` returned for this
                very batch (the same `ids` and `offsets` tensors and
                `training`), or None to route the keys here.
            weights: float32 `[N]`, every id's weight (weighted sequences;
                the combiners weigh by them), or None for weights of 1.
            return_penalty: also return the tables' penalty on the rows
                this lookup reads (see `regularization`); its backward
                joins the rows' update while training.

        Returns:
            One `(pooled, sequences)` per physical table: `pooled` is
            `[B, P, D]` (or None) and `sequences` maps each unpooled
            sequence feature to `[B, L, D]` (see `packing.GroupLayout`).
            With `return_penalty`, `(that list, penalty)`: the penalty a
            0-d float32 tensor (0 where no table is regularized).

        Raises:
            RuntimeError: `routed` was planned for another batch, layer or
                training flag (before any row is created).
        """
        plan = self.packing
        if routed is not None:
            self._check_routed(routed, ids, offsets, training)
        self.lookup_device = ids.device
        batch, slot_ids, per_id = self.id_layout.slots_of(ids, offsets)
        keys = routed.keys if routed else \
            table_keys(ids, plan.slot_salt.to(ids.device), slot_ids)
        if self.has_host_cached and self.connect() is None:
            # Before any row is created or moved: a batch too large for a cache
            # fails whole. (With several ranks the owners check what they receive.)
            for group, store in enumerate(self.tables):
                store.check_fits(keys if len(self.tables) == 1 else
                                 keys[per_id(plan.slot_group) == group], training)
        if training:
            self.step += 1
            for store in self.tables:
                store.begin_step(self.step)
        outputs = []
        total_penalty = torch.zeros((), device=ids.device) if return_penalty else None
        for layout, (group, (chosen, group_tags, group_weight, group_destination)) in zip(
                plan.layouts,
                enumerate(self.id_layout.groups(offsets, batch, per_id, ids, weights)),
                strict=True):
            # One iteration per distinct dim.
            group_keys = keys if chosen is None else keys.index_select(0, chosen)
            # The step's update rounds half rows with bits of its own (and the
            # same on every rank, so world size does not change them).
            round_seed = rounding_seed(self.seed, self.step, group)
            penalty = self.penalties[group] if return_penalty else None
            if self.connect() is None:
                rows, pin = self.tables[group].resolve(group_keys, training, group_tags)
                values, unique, unique_index, apply = self._local_rows(
                    self.tables[group], rows, pin, round_seed)
                penalized = (values, unique)
            else:
                unique_index, route = routed.routes[group] if routed else \
                    self._route(group, group_keys, group_tags, training, ahead=False)
                assert self.world is not None      # connect() made the router of it
                owned = OwnedRows(self.tables[group], route, training, penalty,
                                  self.world.size, round_seed, self._update,
                                  self._apply_row_grads)
                self.requests += owned.requests
                values, unique, apply, pin = owned.values, owned.unique, owned, owned.pin
                penalized = owned.penalized
            # An inference lookup is not tied to the anchor: its backward
            # (a frozen layer in a training step) must update no row.
            flat = PooledLookup.apply(
                self.anchor if training else self.anchor.detach(), values, unique,
                unique_index, group_destination,
                group_weight, layout.rows(batch), apply,
                None if penalty is None else penalized)
            if penalty is not None:
                assert total_penalty is not None    # return_penalty made it
                flat, penalized_rows = flat
                total_penalty = total_penalty + penalty(
                    penalized_rows, unique_index, batch, self.world.size if self.world else 1)
            if pin is not None and not (training and flat.requires_grad):
                pin.release()           # no backward will update the cached rows
            outputs.append(layout.split(flat, batch))
        return outputs if total_penalty is None else (outputs, total_penalty)

    @contextlib.contextmanager
    def deferred_updates(self) -> Iterator[DeferredUpdates]:
        """Holds back the table updates of the backward passes run inside it.

        Inside the block, the backward of this engine's lookups queues each
        update (the optimizer step on the rows, and with several ranks the
        gradient exchange to the owners before it) and changes no row, no
        optimizer state and nothing on another rank. The caller checks
        `finite()`, agrees with the other ranks, and then `apply()`s (every
        rank, in the same order, since the exchanges are collectives) or
        `discard()`s. Leaving the block discards what is still queued and
        unpins the cached rows it held. Outside the block updates run inside
        backward, as plain torch loops expect.

        For a finite step, deferred updates give the same rows and state,
        bit for bit, as immediate ones: no backward reads a table row.

        Returns:
            A context manager yielding the `DeferredUpdates`.

        Raises:
            RuntimeError: a deferral is already open on this engine.

        Example:

        ```python
        with engine.deferred_updates() as updates:
            loss.backward()
            ok = torch.isfinite(loss) & updates.finite()   # no host sync yet
            if world_size > 1:                              # every rank agrees
                ok = ok.to(torch.int32)
                torch.distributed.all_reduce(ok, op=torch.distributed.ReduceOp.MIN)
            if bool(ok):
                updates.apply()
        ```
        """
        if self._deferred is not None:
            raise RuntimeError("deferred_updates is already open on this embedding "
                               "engine; apply or discard the open one first")
        updates = DeferredUpdates(lambda: self.lookup_device)
        self._deferred = updates
        try:
            yield updates
        finally:
            self._deferred = None
            updates.discard()

    def _update(self, checked, update, pin):
        """Runs a lookup's `update` now, or queues it in the open deferral
        with the finiteness of `checked` (the gradients it would apply)."""
        self._checked_optimizer()           # fail in backward, as without deferral
        deferred = self._deferred
        if deferred is None:
            update()
            if pin is not None:
                pin.release()
        else:
            deferred.queue(all_finite(checked), update, pin)

    def _apply_row_grads(self, store, rows, grads, round_seed):
        store.mark_written(rows)
        self._checked_optimizer().apply(store.weights, store.state, rows, grads, round_seed)

    def _apply_pooled_grads(self, store, rows, grad_out, unique_index, destination,
                            id_weight, round_seed):
        store.mark_written(rows)
        # The store's arrays are read now: they may have grown since the lookup.
        self._checked_optimizer().apply_pooled(store.weights, store.state, rows, grad_out,
                                               unique_index, destination, id_weight,
                                               round_seed)

    def route_ahead(self, ids: torch.Tensor, offsets: torch.Tensor,
                    training: bool) -> RoutedBatch:
        """Plans the routes of a coming batch (several ranks only).

        Runs on the pipeline's sparse-dist thread while an earlier step runs:
        dedups the batch's keys per table and sends them to their owners (in
        process groups of its own). Every rank must plan the same batches in
        the same order; the step hands the result to `lookup` of the same
        batch (`routed=`).

        Args:
            ids: int64 `[N]` transformed ids of the coming batch.
            offsets: int64 `[S * B + 1]` its bag offsets.
            training: whether its lookup trains (lifecycle tags travel).

        Returns:
            The `RoutedBatch` to pass to `lookup(ids, offsets, training,
            routed=...)` with these same `ids` and `offsets` tensors.

        Raises:
            RuntimeError: in one process (there is nothing to route).
        """
        if self.connect() is None:
            raise RuntimeError("route_ahead needs several ranks")
        batch, slot_ids, per_id = self.id_layout.slots_of(ids, offsets)
        keys = table_keys(ids, self.packing.slot_salt.to(ids.device), slot_ids)
        routes = []
        for group, (chosen, tags, _, _) in enumerate(
                self.id_layout.groups(offsets, batch, per_id, ids)):
            group_keys = keys if chosen is None else keys.index_select(0, chosen)
            routes.append(self._route(group, group_keys, tags, training, ahead=True))
        return RoutedBatch(self, ids, offsets, training, keys, routes)

    def _check_routed(self, routed, ids, offsets, training):
        # Identity, not equality: the planned batch is the looked-up one
        # object for object (comparing the ids would cost a pass per step).
        if routed.engine is not self or routed.ids is not ids \
                or routed.offsets is not offsets or routed.training != training:
            raise RuntimeError(
                "the embedding lookup received routes the sparse-dist stage planned "
                "for another batch (or another layer, or training flag): pass each "
                "lookup the RoutedBatch that route_ahead returned for its own ids "
                "and offsets tensors")

    def release_pins(self) -> None:
        """Unpins every cached row: lookups whose step failed before its
        update would otherwise keep their rows from being evicted."""
        for store in self.tables:
            store.release_pins()

    def prefetch(self, ids: torch.Tensor, offsets: torch.Tensor) -> None:
        """Loads the rows a coming batch will read into the device caches.

        Runs beside the current step (a pipeline thread): it creates no row
        and evicts no row the step uses, so training gives the same result
        with or without it. With several ranks it loads only this rank's own
        rows among the batch's (other ranks' requests load in their step).

        Args:
            ids: int64 `[N]` transformed ids of the coming batch.
            offsets: int64 `[S * B + 1]` its bag offsets.
        """
        if not self.has_host_cached or ids.numel() == 0:
            return
        plan = self.packing
        _, slot_ids, per_id = self.id_layout.slots_of(ids, offsets)
        keys = table_keys(ids, plan.slot_salt.to(ids.device), slot_ids)
        group_of = per_id(plan.slot_group)
        world = self.world or distributed.world()
        for group, store in enumerate(self.tables):
            chosen = keys[group_of == group] if len(self.tables) > 1 else keys
            if world.size > 1:
                chosen = chosen[owner_of(chosen, world.size) == world.rank]
            store.prefetch(chosen)

    def _local_rows(self, store, rows, pin, round_seed):
        """`(values, unique, unique_index, apply)` for the pooled lookup.

        Ids without a row (unseen at inference, not admitted yet) read an
        extra zero row appended after the unique rows, and get no update.
        """
        missing = rows < 0
        if not bool(missing.any()):
            unique, unique_index = unique_rows(rows, store.row_bound)
            self.requests += unique.numel()
            update = LocalRowUpdate(
                self._update, pin,
                functools.partial(self._apply_row_grads, store, round_seed=round_seed),
                functools.partial(self._apply_pooled_grads, store, round_seed=round_seed))
            return store.weights, unique, unique_index, update
        present = (~missing).nonzero().squeeze(1)
        unique, position = unique_rows(rows[present], store.row_bound)
        self.requests += unique.numel()
        unique_index = torch.full_like(rows, unique.numel())
        unique_index[present] = position
        values = torch.cat([store.weights[unique],
                            store.weights.new_zeros(1, store.dim)])
        apply = functools.partial(self._update_dropping_last, store, unique, pin, round_seed)
        return values, torch.arange(values.shape[0], device=values.device), unique_index, \
            apply

    def _update_dropping_last(self, store, rows, pin, round_seed, _, grads,
                              penalized_grads=None):
        if penalized_grads is not None:     # the penalty of the same rows
            grads = grads + penalized_grads
        grads = grads[:-1]              # the zero row of the ids without one
        self._update(grads, functools.partial(self._apply_row_grads, store, rows, grads,
                                              round_seed), pin)

    def _route(self, group, keys, tags, training, ahead):
        """`(unique_index, route)`: the keys deduplicated, and the route of
        the unique ones to their owners."""
        unique_keys, unique_index = torch.unique(keys, return_inverse=True)
        unique_tags = torch.empty_like(unique_keys).scatter_(0, unique_index, tags) \
            if training and self.tables[group].needs_tags else None
        return unique_index, self._router.route(unique_keys, unique_tags, ahead=ahead)

    def stats(self) -> dict:
        """This rank's tables: rows, bytes held, and requests served so far.

        Returns:
            `{"requests": int, "tables": [RowStore.stats() per table]}`;
            `host_cached` tables add their cache's figures
            (`RowCache.stats`) under `"cache"`.
        """
        return {"requests": self.requests,
                "tables": [store.stats() for store in self.tables]}

