"""Where each id of a packed batch goes: its slot, its physical table, its
tag, its pooling weight and the output row it is pooled into.

The engine reads these off the batch's offsets once per lookup (and once per
batch size for a batch without sequence features, where every bag holds one
id), with no Python loop over features or ids: per-slot values are expanded
to per-id values by one `repeat_interleave` per tensor (see `IdLayout.slots_of`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from reckeras import ragged
from reckeras.backend_kernels.ragged_layout import bag_of_ids
from reckeras.embedding.packing import COMBINER_CODES, PackingPlan

MEAN, SQRTN = COMBINER_CODES["mean"], COMBINER_CODES["sqrtn"]


class IdLayout:
    """The per-id layout of the packed batches of one embedding engine.

    Args:
        packing: the engine's `PackingPlan`.
        with_tags: whether some row store reads its keys' tags
            (`RowStore.needs_tags`): only then are tags computed.

    Example:

    ```python
    layout = IdLayout(packing, with_tags=False)
    batch, slot_ids, per_id = layout.slots_of(ids, offsets)
    for chosen, tags, weight, destination in layout.groups(offsets, batch, per_id, ids):
        ...                         # one entry per physical table (distinct dim)
    ```
    """

    def __init__(self, packing: PackingPlan, with_tags: bool):
        self.packing = packing
        self.with_tags = with_tags
        self._cached = (None, None)     # (key, groups), see _one_id_per_bag

    def slots_of(self, ids: torch.Tensor, offsets: torch.Tensor
                 ) -> tuple[int, torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
        """`(batch, ids per slot, per_id)` of a packed batch.

        Ids are slot-major: slot s holds ids offsets[s * B]:offsets[(s + 1) * B].
        `per_id` expands per-slot values once per slot, never gathering per
        id (on CPU, `t[slot]` over 614k ids costs ~2 ms, the expansion 0.1 ms).

        Args:
            ids: int64 `[N]` transformed ids.
            offsets: int64 `[S * B + 1]` bag offsets.

        Returns:
            The batch size, int64 `[S]` ids per slot, and a function from a
            per-slot tensor `[S]` to its per-id expansion `[N]`.
        """
        plan = self.packing
        batch = ragged.batch_size(offsets, plan.num_slots)
        slot_ids = offsets[::batch].diff() if batch else \
            torch.zeros(plan.num_slots, dtype=torch.int64, device=ids.device)

        def per_id(values):             # the plan's tensors live on the CPU
            return values.to(ids.device).repeat_interleave(slot_ids,
                                                           output_size=ids.numel())

        return batch, slot_ids, per_id

    def groups(self, offsets: torch.Tensor, batch: int,
               per_id: Callable[[torch.Tensor], torch.Tensor], ids: torch.Tensor,
               weights: torch.Tensor | None = None) -> list[tuple]:
        """Per physical table: `(chosen, tags, weight, destination)` of its ids.

        `chosen` indexes the table's ids in the batch (None: every id);
        `tags` their logical tables (None where no store reads tags),
        `weight` their pooling weights and `destination` the output row
        each id is pooled into (its example, slot and, for an unpooled
        sequence, position).

        Args:
            offsets: int64 `[S * B + 1]` bag offsets.
            batch: the batch size (`slots_of`).
            per_id: the batch's per-slot expansion (`slots_of`).
            ids: int64 `[N]` transformed ids.
            weights: float32 `[N]` id weights (weighted sequences), or None.

        Returns:
            One tuple per physical table, in `packing.dims` order.
        """
        # Without sequences a bag holds one id or none (a missing value):
        # N == S * B tells that every bag holds one.
        if self.packing.has_sequences:
            return self._id_groups(offsets, batch, per_id, ids.numel(), ids.device,
                                   weights)
        every_bag = self._one_id_per_bag(batch, ids.device)
        if ids.numel() == batch * self.packing.num_slots:
            return every_bag
        return self._present_bags(every_bag, offsets, ids.numel())

    def _id_groups(self, offsets, batch, per_id, num_ids, device, weights=None):
        plan = self.packing
        if offsets is not None:
            bag = bag_of_ids(offsets, num_ids)
            example = bag - per_id(torch.arange(plan.num_slots, device=device) * batch)
        else:
            bag = None
            example = torch.arange(batch, device=device).repeat(plan.num_slots)
        tags = per_id(plan.slot_tag) if self.with_tags else None
        weight = self._pooling_weight(offsets, bag, per_id, num_ids, device, weights)
        destination = example * per_id(plan.slot_stride)
        destination += per_id(plan.slot_base * batch + plan.slot_position)
        if plan.has_unpooled:
            position = torch.arange(num_ids, device=device) \
                - offsets.index_select(0, bag)
            destination += torch.where(per_id(plan.slot_unpooled), position, 0)
        if len(plan.layouts) == 1:
            return [(None, tags, weight, destination)]
        groups = []
        group_of = per_id(plan.slot_group)
        for group in range(len(plan.layouts)):      # one iteration per distinct dim
            chosen = (group_of == group).nonzero().squeeze(1)
            groups.append((chosen, None if tags is None else tags.index_select(0, chosen),
                           weight.index_select(0, chosen),
                           destination.index_select(0, chosen)))
        return groups

    def _one_id_per_bag(self, batch, device):
        """`_id_groups` of a batch without sequence features: every slot
        then holds exactly one id per example, so the layout depends on the
        batch size only and is built once per size (rebuilding it for every
        batch cost ~5 ms of a ~58 ms dlrm training step on CPU)."""
        key = (batch, device)
        cached_key, groups = self._cached     # one tuple: the stage thread reads it too
        if cached_key != key:
            def per_bag(values):        # every slot holds `batch` bags
                return values.to(device).repeat_interleave(batch)

            groups = self._id_groups(None, batch, per_bag,
                                     batch * self.packing.num_slots, device)
            self._cached = (key, groups)
        return groups

    @staticmethod
    def _present_bags(every_bag, offsets, num_ids):
        """The groups of a batch without sequence features whose missing
        values left some bags empty: each id is the one id of a non-empty
        bag, so its layout is that bag's entry in the every-bag layout (a
        gather, where `_id_groups` expands every per-slot value again).
        The ids' bags come from `bag_of_ids` (one native pass on CPU, where
        `nonzero` of the non-empty bags took ~2 ms on a `wide` batch)."""
        present = bag_of_ids(offsets, num_ids)
        if len(every_bag) == 1:
            _, tags, weight, destination = every_bag[0]
            return [(None, None if tags is None else tags.index_select(0, present),
                     weight[:present.numel()], destination.index_select(0, present))]
        # chosen: positions among the present bags, which are the ids' positions.
        id_of_bag = torch.full_like(offsets[1:], -1)
        id_of_bag.index_copy_(0, present, torch.arange(present.numel(), device=present.device))
        groups = []
        for chosen, tags, weight, destination in every_bag:   # one per distinct dim
            ids = id_of_bag.index_select(0, chosen)
            kept = (ids >= 0).nonzero().squeeze(1)
            groups.append((ids.index_select(0, kept),
                           None if tags is None else tags.index_select(0, kept),
                           weight[:kept.numel()], destination.index_select(0, kept)))
        return groups

    def _pooling_weight(self, offsets, bag, per_id, num_ids, device, weights):
        """Every id's scale: its weight (1 unweighted) over its bag's `"mean"`
        or `"sqrtn"` denominator."""
        if not self.packing.has_sequences:
            return torch.ones(num_ids, device=device)
        combiner = per_id(self.packing.slot_combiner)     # unpooled: weight 1
        if weights is None:
            length = (offsets[1:] - offsets[:-1]).index_select(0, bag).float()
            return torch.where(combiner == MEAN, 1.0 / length,
                               torch.where(combiner == SQRTN, length.rsqrt(), 1.0))
        weights = weights.float()
        bags = offsets.numel() - 1
        total = weights.new_zeros(bags).index_add_(0, bag, weights).index_select(0, bag)
        squares = weights.new_zeros(bags).index_add_(0, bag, weights * weights) \
            .index_select(0, bag)
        # A bag whose denominator is 0 pools to zeros (TensorFlow's rule).
        scale = torch.where(combiner == MEAN, total,
                            torch.where(combiner == SQRTN, squares.sqrt(), 1.0))
        return torch.where(scale != 0, weights / scale, 0.0)
