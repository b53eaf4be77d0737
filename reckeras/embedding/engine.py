"""The embedding engine: from a packed sparse batch to pooled embeddings.

One engine serves one ShardedEmbedding layer. Per batch it (1) derives each
id's slot, example and pooling weight from the offsets, (2) turns ids into
table keys (``mix64(id) ^ salt(table)``), (3) resolves keys to rows of the
physical tables (creating rows for new ids while training), (4) dedups the
rows, and (5) runs the fused pooled lookup, whose backward aggregates one
gradient per unique row and applies the sparse optimizer to those rows.

Step (3) is where rows live. In one process it is a local hash lookup. With
several ranks, every row is owned by the rank ``sharding.owner_of(key)``: the
batch's unique keys are routed to their owners (``comm``), the owners resolve
and send back the rows, and in backward the gradients travel the same route
to the owners, which sum them over all ranks, divide by the world size (each
rank's loss is a mean over its own examples) and run the optimizer.
"""

import functools

import torch

from reckeras import distributed, ragged
from reckeras.backend_kernels.aggregation import unique_rows
from reckeras.backend_kernels.hashing import table_keys
from reckeras.backend_kernels.pooling import PooledLookup
from reckeras.embedding.comm import FlatRouter, HierarchicalRouter
from reckeras.embedding.lifecycle import RowLifecycle
from reckeras.embedding.table import PhysicalTable

MEAN, SQRTN = 1, 2


class EmbeddingEngine:
    """Tables and the per-batch lookup of one embedding layer (one process).

    Args:
        packing: the ``PackingPlan`` of the layer's features.
        init_scale: new rows are uniform in ``[-init_scale, init_scale]``;
            None means ``1 / sqrt(dim)`` of each table.
        seed: seed of the rows' initial values.
    """

    def __init__(self, packing, init_scale=None, seed=0):
        self.packing = packing
        self.tables = [PhysicalTable(dim, init_scale or dim ** -0.5, seed)
                       for dim in packing.dims]
        self.lifecycles = [
            None if all(o.is_default for o in options) else RowLifecycle(table, options)
            for table, options in zip(self.tables, packing.group_options)]
        self.step = 0          # training lookups so far (the lifecycle's clock)
        self.optimizer = None
        # The tables are not autograd leaves; this empty tensor is, so that
        # backward reaches PooledLookup even in a model with no dense weights.
        self.anchor = torch.zeros(0, requires_grad=True)
        self._router = None
        self.world = None
        self.requests = 0      # unique keys this rank's tables served, all batches

    def connect(self):
        """Joins the world once: checks that all ranks declare the same tables
        and plans the routes. Returns the router (None in one process)."""
        if self.world is None:
            self.world = distributed.world()
            if self.world.size > 1:
                distributed.check_same_on_all_ranks(
                    "the embedding layer's feature/table configuration",
                    repr([(s.name, s.table, s.dim) for s in self.packing.slots]))
                kind = HierarchicalRouter if self.world.hierarchical else FlatRouter
                self._router = kind(self.world.size, self.world.rank,
                                    self.world.ranks_per_node)
        return self._router

    def set_optimizer(self, optimizer):
        self.optimizer = optimizer
        initial = getattr(optimizer, "initial_accumulator_value", 0.0)
        for table in self.tables:
            table.configure_state(optimizer.state_width(table.dim), initial)

    def _checked_optimizer(self):
        if self.optimizer is None:
            raise RuntimeError("the embedding tables have no optimizer: compile the "
                               "model with embedding_optimizer=... before training")
        return self.optimizer

    def _apply_row_grads(self, table, rows, grads):
        self._checked_optimizer().apply(table.weights, table.state, rows, grads)

    def lookup(self, ids, offsets, training):
        """Embeddings of a packed batch, per physical table (dim).

        Args:
            ids: int64 ``[N]`` transformed ids.
            offsets: int64 ``[S * B + 1]`` bag offsets.
            training: create rows for new ids (else unseen ids read zeros).

        Returns:
            One ``(pooled, sequences)`` per physical table: ``pooled`` is
            ``[B, P, D]`` (or None) and ``sequences`` maps each unpooled
            sequence feature to ``[B, L, D]`` (see ``packing.GroupLayout``).
        """
        plan = self.packing
        batch = ragged.batch_size(offsets, plan.num_slots)
        num_ids = ids.numel()
        # Ids are slot-major: slot s holds ids offsets[s * B]:offsets[(s + 1) * B].
        # Per-slot values are expanded once per slot, never gathered per id
        # (on CPU, ``t[slot]`` over 614k ids costs ~2 ms, the expansion 0.1 ms).
        slot_ids = offsets[::batch].diff() if batch else \
            torch.zeros(plan.num_slots, dtype=torch.int64, device=ids.device)

        def per_id(values):
            return values.repeat_interleave(slot_ids, output_size=num_ids)

        if plan.has_sequences:
            bag = ragged.bag_of_ids(offsets, num_ids)
            example = bag - per_id(torch.arange(plan.num_slots, device=ids.device) * batch)
        else:
            bag = None
            example = torch.arange(batch, device=ids.device).repeat(plan.num_slots)
        keys = table_keys(ids, plan.slot_salt, slot_ids)
        tags = per_id(plan.slot_tag)
        if training:
            self.step += 1
            for lifecycle in self.lifecycles:
                if lifecycle is not None:
                    lifecycle.maybe_evict(self.step)
        weight = self._pooling_weight(offsets, bag, per_id, num_ids)
        destination = example * per_id(plan.slot_stride)
        destination += per_id(plan.slot_base * batch + plan.slot_position)
        if plan.has_unpooled:
            position = torch.arange(num_ids, device=ids.device) \
                - offsets.index_select(0, bag)
            destination += torch.where(per_id(plan.slot_unpooled), position, 0)
        outputs = []
        for group, (table, layout) in enumerate(zip(self.tables, plan.layouts)):
            if len(self.tables) > 1:            # one iteration per distinct dim
                chosen = (per_id(plan.slot_group) == group).nonzero().squeeze(1)
                group_keys = keys.index_select(0, chosen)
                group_tags = tags.index_select(0, chosen)
                group_weight = weight.index_select(0, chosen)
                group_destination = destination.index_select(0, chosen)
            else:
                group_keys, group_tags, group_weight, group_destination = \
                    keys, tags, weight, destination
            lifecycle = self.lifecycles[group] if training else None
            if self.connect() is None:
                rows = lifecycle.resolve(group_keys, group_tags, self.step) \
                    if lifecycle else table.rows_of(group_keys, insert=training)
                values, unique, unique_index, apply = self._local_rows(table, rows)
            else:
                values, unique, unique_index, apply = \
                    self._remote_rows(table, lifecycle, group_keys, group_tags, training)
            flat = PooledLookup.apply(
                self.anchor, values, unique, unique_index, group_destination,
                group_weight, layout.rows(batch), apply)
            outputs.append(layout.split(flat, batch))
        return outputs

    def _local_rows(self, table, rows):
        """``(values, unique, unique_index, apply)`` for the pooled lookup.

        Ids without a row (unseen at inference, not admitted yet) read an
        extra zero row appended after the unique rows, and get no update.
        """
        missing = rows < 0
        if not bool(missing.any()):
            unique, unique_index = unique_rows(rows, table.num_rows)
            self.requests += unique.numel()
            return table.weights, unique, unique_index, _RowUpdate(self, table)
        present = (~missing).nonzero().squeeze(1)
        unique, position = unique_rows(rows[present], table.num_rows)
        self.requests += unique.numel()
        unique_index = torch.full_like(rows, unique.numel())
        unique_index[present] = position
        values = torch.cat([table.weights[unique],
                            table.weights.new_zeros(1, table.dim)])
        apply = functools.partial(self._apply_row_grads_dropping_last, table, unique)
        return values, torch.arange(values.shape[0]), unique_index, apply

    def _apply_row_grads_dropping_last(self, table, rows, _, grads):
        self._apply_row_grads(table, rows, grads[:-1])

    def _remote_rows(self, table, lifecycle, keys, tags, training):
        unique_keys, unique_index = torch.unique(keys, return_inverse=True)
        unique_tags = torch.empty_like(unique_keys).scatter_(0, unique_index, tags) \
            if lifecycle else None
        route = self._router.route(unique_keys, unique_tags)
        owner_rows = lifecycle.resolve(route.owner_keys, route.owner_tags, self.step) \
            if lifecycle else table.rows_of(route.owner_keys, insert=training)
        self.requests += owner_rows.numel()
        # Ids without a row (unseen at inference, not admitted) read zeros.
        owner_values = torch.where((owner_rows >= 0).unsqueeze(1),
                                   table.weights[owner_rows.clamp(min=0)], 0.0)
        values = route.rows_to_requesters(owner_values)
        apply = functools.partial(self._apply_remote_grads, table, route, owner_rows)
        return values, torch.arange(values.shape[0]), unique_index, apply

    def _apply_remote_grads(self, table, route, owner_rows, _, grads):
        owner_grads = route.grads_to_owners(grads) / self.world.size
        present = (owner_rows >= 0).nonzero().squeeze(1)
        unique, position = unique_rows(owner_rows[present], table.num_rows)
        summed = owner_grads.new_zeros(unique.numel(), owner_grads.shape[1])
        summed.index_add_(0, position, owner_grads[present])
        self._apply_row_grads(table, unique, summed)

    def _pooling_weight(self, offsets, bag, per_id, num_ids):
        if not self.packing.has_sequences:
            return torch.ones(num_ids, device=offsets.device)
        length = (offsets[1:] - offsets[:-1]).index_select(0, bag).float()
        combiner = per_id(self.packing.slot_combiner)     # unpooled: weight 1
        return torch.where(combiner == MEAN, 1.0 / length,
                           torch.where(combiner == SQRTN, length.rsqrt(), 1.0))

    def stats(self):
        """This rank's tables: rows, bytes held, and requests served so far."""
        return {"requests": self.requests,
                "tables": [{"dim": t.dim, "rows": t.num_rows, "bytes": t.memory_bytes()}
                           for t in self.tables]}


class _RowUpdate:
    """PooledLookup's backward hook for the rows of one local table.

    ``apply_pooled`` hands the pooled gradient to the optimizer, which (on
    CUDA, or with the native CPU kernels) aggregates it per row and updates
    the rows in one pass.
    """

    def __init__(self, engine, table):
        self.engine, self.table = engine, table

    def __call__(self, rows, grads):
        self.engine._apply_row_grads(self.table, rows, grads)

    def apply_pooled(self, rows, grad_out, unique_index, destination, id_weight):
        self.engine._checked_optimizer().apply_pooled(
            self.table.weights, self.table.state, rows, grad_out, unique_index,
            destination, id_weight)
