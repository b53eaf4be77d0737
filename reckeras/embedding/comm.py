"""How ids, rows and gradients move between ranks.

A *route* is planned once per batch and physical table from the batch's
unique keys; it carries the keys to the ranks that own them and then serves
two transfers along the same paths: rows back to the requesters (forward)
and gradients to the owners (backward).

* `FlatRouter`: one all-to-all over all ranks.
* `HierarchicalRouter` (RecIS): ranks are grouped into nodes. Keys first
  move inside the node to the rank whose local index matches the owner's, are
  deduplicated there across the node's ranks, and then cross nodes once per
  unique key per node, among the ranks of one local index. Rows come back the
  same way; gradients go the same way and are summed per unique key on the
  node before they cross.

Both count the bytes they send to other nodes (`internode_bytes`), so the
two can be compared on the same batches.

A route can be planned *ahead* (`route(..., ahead=True)`): the pipeline's
sparse-dist stage plans batch i+1's route on its own thread while step i
runs. Its keys then travel in process groups of their own, because the
collectives of one group must come in the same order on every rank and step
i's row and gradient exchanges run meanwhile; rows and gradients always
travel in the step's groups. `EmbeddingEngine.route_ahead` returns a
batch's routes as a `RoutedBatch`, which travels with the batch to its step.

Each `Exchange` knows who runs its collectives (the training step or the
sparse-dist stage), so a peer that dies or hangs during one gives a
`PeerFailureError` naming that exchange and what it carried.
"""

from __future__ import annotations

import dataclasses
import datetime
import weakref

import torch
import torch.distributed as dist

from reckeras.distributed import collective
from reckeras.embedding.sharding import owner_of

# Who runs an exchange's collectives, as PeerFailureError messages name it.
STEP = "the training step"
SPARSE_DIST = "the sparse-dist stage"


class Exchange:
    """All-to-all with uneven splits inside one process group.

    Args:
        group: the torch process group (None: the default group).
        ranks: the global ranks of the group, in group order.
        my_index: this rank's index in `ranks`.
        node_of_peer: the node of every peer, in group order.
        my_node: this rank's node.
        runner: who runs its collectives, for a `PeerFailureError`'s message
            (`"the training step"` or `"the sparse-dist stage"`).

    Example:

    ```python
    exchange = Exchange(None, [0, 1], rank, [0, 0], 0, "the training step")
    received = exchange.send(rows, send_counts, exchange.counts(send_counts), "rows")
    ```
    """

    def __init__(self, group: dist.ProcessGroup | None, ranks: list[int], my_index: int,
                 node_of_peer: list[int], my_node: int, runner: str):
        self.group = group
        self.runner = runner
        self.ranks = ranks
        self.my_index = my_index
        # Which peers live on another node, for byte accounting.
        self.remote = torch.tensor([node != my_node for node in node_of_peer])
        self.internode_bytes = 0

    @property
    def size(self) -> int:
        """Ranks in the group."""
        return len(self.ranks)

    def counts(self, send_counts: torch.Tensor) -> torch.Tensor:
        """The counts every peer will send here.

        Args:
            send_counts: int64 `[size]`, what this rank sends each peer.

        Returns:
            int64 `[size]`, what each peer sends this rank.

        Raises:
            PeerFailureError: a peer died, hung past the timeout or left.
        """
        recv_counts = torch.empty_like(send_counts)
        if self.size == 1:
            return send_counts.clone()
        with collective(f"{self.runner}'s exchange of embedding id counts"):
            dist.all_to_all_single(recv_counts, send_counts, group=self.group)
        return recv_counts

    def send(self, values: torch.Tensor, send_counts: torch.Tensor,
             recv_counts: torch.Tensor, what: str) -> torch.Tensor:
        """Sends `values` split by `send_counts`; returns what arrives.

        Args:
            values: `[sum(send_counts), ...]`, grouped by destination peer.
            send_counts: int64 `[size]` rows for each peer.
            recv_counts: int64 `[size]` rows from each peer (`counts`).
            what: what `values` are (`"ids"`, `"rows"`, `"gradients"`), for
                a `PeerFailureError`'s message.

        Returns:
            `[sum(recv_counts), ...]`, grouped by source peer.

        Raises:
            PeerFailureError: a peer died, hung past the timeout or left.
        """
        sent, received = send_counts.tolist(), recv_counts.tolist()
        out = values.new_empty((sum(received), *values.shape[1:]))
        row_bytes = values[:1].numel() * values.element_size() if values.numel() else 0
        self.internode_bytes += row_bytes * sum(
            c for c, remote in zip(sent, self.remote.tolist(), strict=True) if remote)
        if self.size == 1:
            out.copy_(values)
        else:
            with collective(f"{self.runner}'s exchange of embedding {what}"):
                dist.all_to_all_single(out, values.contiguous(), received, sent,
                                       group=self.group)
        return out


def _by_destination(destination, size):
    order = torch.argsort(destination, stable=True)
    counts = torch.bincount(destination, minlength=size)
    return order, counts


def _unpermute(values, order):
    out = torch.empty_like(values)
    out[order] = values
    return out


def _with_tags(keys, tags):
    return keys if tags is None else torch.stack([keys, tags], dim=1)


def _split_tags(received, tags):
    return (received, None) if tags is None else (received[:, 0], received[:, 1])


class FlatRoute:
    """The keys of one batch routed straight to their owners.

    `tags` (optional, one int64 per key, a function of the key) travel with
    the keys and arrive as `owner_tags`. Keys travel in `key_exchange`,
    rows and gradients in `exchange` (the same ranks).

    Args:
        key_exchange: the `Exchange` the keys travel in.
        exchange: the `Exchange` of the rows and gradients.
        keys: int64 distinct keys of this rank's batch.
        world: the world size (owners are `sharding.owner_of(key, world)`).
        tags: int64, one per key, or None.

    Example:

    ```python
    route = FlatRoute(exchange, exchange, unique_keys, world_size)
    rows, _ = store.resolve(route.owner_keys, training=True)
    values = route.rows_to_requesters(store.weights[rows])
    ```
    """

    def __init__(self, key_exchange: Exchange, exchange: Exchange, keys: torch.Tensor,
                 world: int, tags: torch.Tensor | None = None):
        self.exchange = exchange
        self.order, self.send_counts = _by_destination(owner_of(keys, world),
                                                       exchange.size)
        self.recv_counts = key_exchange.counts(self.send_counts)
        received = key_exchange.send(_with_tags(keys, tags)[self.order],
                                     self.send_counts, self.recv_counts, "ids")
        self.owner_keys, self.owner_tags = _split_tags(received, tags)

    def rows_to_requesters(self, owner_rows: torch.Tensor) -> torch.Tensor:
        """Sends the owners' rows back along the route (a collective).

        Args:
            owner_rows: `[len(owner_keys), D]`, one row per received key.

        Returns:
            `[len(keys), D]`, the row of each of this rank's keys.
        """
        back = self.exchange.send(owner_rows, self.recv_counts, self.send_counts, "rows")
        return _unpermute(back, self.order)

    def grads_to_owners(self, grads: torch.Tensor) -> torch.Tensor:
        """Sends this rank's key gradients to the owners (a collective).

        Args:
            grads: `[len(keys), D]`, the gradient of each of this rank's keys.

        Returns:
            `[len(owner_keys), D]`, one gradient per received key.
        """
        return self.exchange.send(grads[self.order], self.send_counts, self.recv_counts,
                                  "gradients")


class HierarchicalRoute:
    """Keys routed inside the node first, deduplicated, then across nodes.

    Args:
        router: the `HierarchicalRouter` whose exchanges it uses.
        keys: int64 distinct keys of this rank's batch.
        tags: int64, one per key, or None.
        ahead: send the keys in the router's groups for planning ahead.

    Example:

    ```python
    route = router.route(unique_keys)          # a HierarchicalRoute
    values = route.rows_to_requesters(owner_rows)
    ```
    """

    def __init__(self, router: HierarchicalRouter, keys: torch.Tensor,
                 tags: torch.Tensor | None = None, ahead: bool = False):
        intra, inter = (router.intra_ahead, router.inter_ahead) if ahead \
            else (router.intra, router.inter)
        owner = owner_of(keys, router.world)
        self.intra, self.inter = router.intra, router.inter
        self.order_a, self.counts_a = _by_destination(owner % router.local_world,
                                                      intra.size)
        self.recv_a = intra.counts(self.counts_a)
        node_keys, node_tags = _split_tags(intra.send(
            _with_tags(keys, tags)[self.order_a], self.counts_a, self.recv_a, "ids"), tags)
        unique_keys, self.inverse = torch.unique(node_keys, return_inverse=True)
        unique_tags = None if tags is None else \
            torch.empty_like(unique_keys).scatter_(0, self.inverse, node_tags)
        owner_node = torch.div(owner_of(unique_keys, router.world), router.local_world,
                               rounding_mode="floor")
        self.order_b, self.counts_b = _by_destination(owner_node, inter.size)
        self.recv_b = inter.counts(self.counts_b)
        self.num_unique = unique_keys.numel()
        received = inter.send(_with_tags(unique_keys, unique_tags)[self.order_b],
                              self.counts_b, self.recv_b, "ids")
        self.owner_keys, self.owner_tags = _split_tags(received, tags)

    def rows_to_requesters(self, owner_rows: torch.Tensor) -> torch.Tensor:
        """Sends the owners' rows back across nodes, then inside the node.

        Args:
            owner_rows: `[len(owner_keys), D]`, one row per received key.

        Returns:
            `[len(keys), D]`, the row of each of this rank's keys.
        """
        node_rows = _unpermute(self.inter.send(owner_rows, self.recv_b, self.counts_b,
                                               "rows"), self.order_b)
        back = self.intra.send(node_rows[self.inverse], self.recv_a, self.counts_a, "rows")
        return _unpermute(back, self.order_a)

    def grads_to_owners(self, grads: torch.Tensor) -> torch.Tensor:
        """Sends the key gradients inside the node, sums them per key, then
        sends the sums across nodes to the owners.

        Args:
            grads: `[len(keys), D]`, the gradient of each of this rank's keys.

        Returns:
            `[len(owner_keys), D]`, one gradient per received key.
        """
        node_grads = self.intra.send(grads[self.order_a], self.counts_a, self.recv_a,
                                     "gradients")
        summed = grads.new_zeros((self.num_unique, *grads.shape[1:]))
        summed.index_add_(0, self.inverse, node_grads)
        return self.inter.send(summed[self.order_b], self.counts_b, self.recv_b, "gradients")


# The routers' process groups, by (runner, ranks, timeout), for the default
# group `_groups_world` refers to. Every router (one per embedding layer: one per
# model built) shares them: a group of its own would hold sockets and gloo
# threads that nothing closes, so each model built under torchrun would leak
# them. Weak values: torch's registry keeps the groups until the default
# group is destroyed, and this cache must not keep one past that (a gloo
# group freed while the interpreter shuts down can abort the process).
_groups: weakref.WeakValueDictionary[tuple, dist.ProcessGroup] = \
    weakref.WeakValueDictionary()
_not_member: set[tuple] = set()       # keys of groups this rank is not in (no group object)
_groups_world: weakref.ref | None = None


def _shared_group(ranks, timeout_s, runner):
    """The process group of `ranks` for `runner`'s exchanges, created on
    first use (a collective: every rank asks for the same groups in the same
    order, as every rank builds the same routers at the same points)."""
    global _groups_world
    world = dist.group.WORLD
    if _groups_world is None or _groups_world() is not world:    # a new default group
        _groups.clear()
        _not_member.clear()
        _groups_world = weakref.ref(world)
    key = (runner, tuple(ranks), timeout_s)
    if key in _not_member:
        return dist.GroupMember.NON_GROUP_MEMBER
    group = _groups.get(key)
    if group is None:
        group = dist.new_group(ranks, timeout=datetime.timedelta(seconds=timeout_s))
        if isinstance(group, dist.ProcessGroup):
            _groups[key] = group
        else:                     # torch's value for a group without this rank
            _not_member.add(key)
    return group


class FlatRouter:
    """Routes over one all-to-all of all ranks.

    Creates the process group of the routes planned ahead, or reuses the one
    an earlier router created (a collective: every rank constructs its router
    at the same point).

    Args:
        world: the world size.
        rank: this rank.
        local_world: ranks per node (for the inter-node byte count only).
        timeout_s: the timeout of the new process group.

    Example:

    ```python
    router = FlatRouter(world.size, world.rank, world.ranks_per_node, 60.0)
    route = router.route(unique_keys)
    ```
    """

    def __init__(self, world: int, rank: int, local_world: int, timeout_s: float):
        node_of = [r // local_world for r in range(world)]
        self.world = world
        ranks = list(range(world))
        self.exchange = Exchange(None, ranks, rank, node_of, node_of[rank], STEP)
        self.ahead = Exchange(_shared_group(ranks, timeout_s, SPARSE_DIST), ranks, rank,
                              node_of, node_of[rank], SPARSE_DIST)

    def route(self, keys: torch.Tensor, tags: torch.Tensor | None = None,
              ahead: bool = False) -> FlatRoute:
        """The route of `keys` to their owners (its key exchange runs now).

        Args:
            keys: int64 distinct keys of this rank's batch.
            tags: int64, one per key, to travel with them; or None.
            ahead: planned beside a running step (keys travel in groups of
                their own).

        Returns:
            The `FlatRoute`.
        """
        return FlatRoute(self.ahead if ahead else self.exchange, self.exchange, keys,
                         self.world, tags)

    @property
    def internode_bytes(self) -> int:
        """Bytes this rank sent to other nodes so far."""
        return self.exchange.internode_bytes + self.ahead.internode_bytes


class HierarchicalRouter:
    """Routes through a node-local exchange, then an inter-node one.

    Ranks are numbered node-major (`rank = node * local_world + local`), as
    torchrun numbers them. Creates its process groups, or reuses those an
    earlier router created (collectives: every rank constructs its router at
    the same point).

    Args:
        world: the world size (a multiple of `local_world`).
        rank: this rank.
        local_world: ranks per node.
        timeout_s: the timeout of the new process groups.

    Example:

    ```python
    router = HierarchicalRouter(world.size, world.rank, world.ranks_per_node, 60.0)
    route = router.route(unique_keys)
    ```
    """

    def __init__(self, world: int, rank: int, local_world: int, timeout_s: float):
        if world % local_world:
            raise ValueError(f"world size {world} is not a multiple of "
                             f"{local_world} ranks per node")
        self.world, self.local_world = world, local_world
        nodes = world // local_world
        node, local = divmod(rank, local_world)
        # Every rank must create every group, in the same order.
        self.intra, self.intra_ahead = [
            self._exchange([node * local_world + i for i in range(local_world)],
                           local, [node] * local_world, node, timeout_s,
                           [[n * local_world + i for i in range(local_world)]
                            for n in range(nodes)], runner)
            for runner in (STEP, SPARSE_DIST)]
        self.inter, self.inter_ahead = [
            self._exchange([n * local_world + local for n in range(nodes)], node,
                           list(range(nodes)), node, timeout_s,
                           [[n * local_world + i for n in range(nodes)]
                            for i in range(local_world)], runner)
            for runner in (STEP, SPARSE_DIST)]

    @staticmethod
    def _exchange(ranks, my_index, node_of_peer, my_node, timeout_s, all_groups, runner):
        """This rank's Exchange among `ranks`, creating every group of
        `all_groups` (each rank must create them all, in the same order)."""
        group = None
        for members in all_groups:
            created = _shared_group(members, timeout_s, runner) if len(members) > 1 \
                else None
            if members == ranks:
                group = created
        return Exchange(group, ranks, my_index, node_of_peer, my_node, runner)

    def route(self, keys: torch.Tensor, tags: torch.Tensor | None = None,
              ahead: bool = False) -> HierarchicalRoute:
        """The route of `keys` to their owners (its key exchanges run now).

        Args:
            keys: int64 distinct keys of this rank's batch.
            tags: int64, one per key, to travel with them; or None.
            ahead: planned beside a running step (keys travel in groups of
                their own).

        Returns:
            The `HierarchicalRoute`.
        """
        return HierarchicalRoute(self, keys, tags, ahead)

    @property
    def internode_bytes(self) -> int:
        """Bytes this rank sent to other nodes so far."""
        return sum(e.internode_bytes for e in (self.intra, self.inter, self.intra_ahead,
                                               self.inter_ahead))


@dataclasses.dataclass
class RoutedBatch:
    """The routes `EmbeddingEngine.route_ahead` planned for one batch.

    Args:
        engine: the engine that planned them (and must look the batch up;
            compared by identity only).
        ids: the batch's ids tensor (the very object `lookup` receives).
        offsets: its offsets tensor (likewise).
        training: whether the lookup trains.
        keys: int64 table keys of the ids.
        routes: per physical table, `(unique_index, route)`: each key's
            position among the batch's unique keys, and their route.
    """

    engine: object
    ids: torch.Tensor
    offsets: torch.Tensor
    training: bool
    keys: torch.Tensor
    routes: list
