"""Packing: logical tables of equal dim merged into one physical table.

Planned once, when the embedding layer is built. Every slot (sparse feature)
gets its logical table's salt, its physical table (group), its combiner and
where its rows land in the group's flat output buffer; per batch these are
looked up by slot index in small tensors.

Output layout of a group of dim `D` with `P` pooled features and unpooled
sequences of lengths `L_1..L_k`, for a batch of `B`: one flat
`[B * P + B * L_1 + ... + B * L_k, D]` buffer whose first region is the
pooled `[B, P, D]` block (features in declaration order) followed by one
`[B, L_j, D]` region per unpooled sequence. An id lands at row
`base + example * stride + position` where, per slot, `base` is the
region start, `stride` is `P` (pooled) or `L_j` (unpooled), and
`position` is the feature's index among the pooled features, or the id's
index inside its sequence.
"""

from __future__ import annotations

import torch

from reckeras.backend_kernels.hashing import mix64
from reckeras.embedding.options import TableOptions
from reckeras.features.specs import Sequence

COMBINER_CODES = {"sum": 0, "mean": 1, "sqrtn": 2, None: 0}


def table_salt(table_name: str) -> int:
    """A 64-bit salt of a table name (stable across processes and runs).

    Args:
        table_name: a logical table's name.

    Returns:
        The salt its keys are XORed with (`mix64(id) ^ salt`).
    """
    code = 0
    for byte in table_name.encode("utf-8"):          # build time only
        code = (code * 131 + byte) % (2**61 - 1)
    return int(mix64(torch.tensor(code, dtype=torch.int64)))


class GroupLayout:
    """The output regions of one physical table (one dim).

    Args:
        dim: the row width.
        pooled: names of its pooled features, in declaration order.
        unpooled: `(name, max_len)` of its unpooled sequence features.

    Example:

    ```python
    layout = GroupLayout(8, ["user", "item"], [("history", 20)])
    layout.rows(batch=4)          # 4 * (2 + 20) rows of the flat output
    ```
    """

    def __init__(self, dim: int, pooled: list[str], unpooled: list[tuple[str, int]]):
        self.dim = dim
        self.pooled = pooled                       # feature names
        self.unpooled = unpooled                   # [(name, max_len)]

    def rows(self, batch: int) -> int:
        """Rows of the flat output buffer for a batch of `batch` examples.

        Args:
            batch: examples in the batch.

        Returns:
            `batch * (P + L_1 + ... + L_k)`.
        """
        return batch * (len(self.pooled) + sum(length for _, length in self.unpooled))

    def split(self, flat: torch.Tensor,
              batch: int) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
        """Views of the flat output buffer, region by region.

        Args:
            flat: `[rows(batch), dim]`, the pooled lookup's output.
            batch: examples in the batch.

        Returns:
            `(pooled [B, P, D] or None, {name: [B, L, D]})`.
        """
        start = batch * len(self.pooled)
        # The whole buffer is a view, not a slice: a slice's backward zero-fills
        # and copies the [B * P, D] gradient (~3 ms for the wide shape on CPU).
        whole = flat if start == flat.shape[0] else flat[:start]
        pooled = whole.view(batch, len(self.pooled), self.dim) if self.pooled else None
        sequences = {}
        for name, length in self.unpooled:
            sequences[name] = flat[start:start + batch * length].view(batch, length,
                                                                      self.dim)
            start += batch * length
        return pooled, sequences


class PackingPlan:
    """Which physical table and output rows each slot uses.

    Args:
        slots: sparse feature specs in slot order (see `features.plan`).
        declaration_order: the same specs in the order the user declared them,
            which is the order of the output features.
        table_options: `{logical table name: options.TableOptions}` for
            the tables that use admission, eviction or host storage.

    Raises:
        ValueError: an unknown table name, or tables of one dim (one physical
            table) that disagree on `storage` or `cache_policy`.
    """

    def __init__(self, slots: list, declaration_order: list,
                 table_options: dict[str, TableOptions] | None = None):
        self.slots = list(slots)
        self.dims = sorted({s.dim for s in self.slots})
        self.tables: dict[str, int] = {}     # logical table -> dim
        for spec in self.slots:
            self.tables.setdefault(spec.table, spec.dim)
        table_options = dict(table_options or {})
        unknown = sorted(set(table_options) - set(self.tables))
        if unknown:
            raise ValueError(f"table_options names unknown table(s) {unknown}; the "
                             f"tables are {sorted(self.tables)}")
        # A slot's tag: its logical table's index among its group's tables.
        self.group_tables = [[t for t, dim in self.tables.items() if dim == d]
                             for d in self.dims]
        self.group_options = [[table_options.get(t, TableOptions()) for t in tables]
                              for tables in self.group_tables]
        for dim, tables, options in zip(self.dims, self.group_tables, self.group_options,
                                        strict=True):
            # One physical table has one storage: its logical tables must agree.
            kinds = {(o.storage, o.cache_policy) for o in options}
            if len(kinds) > 1:
                described = {t: f"{o.storage}/{o.cache_policy}"
                             for t, o in zip(tables, options, strict=True)}
                raise ValueError(
                    f"tables of dim {dim} are packed into one physical table, so they "
                    f"need one storage and cache policy; got {described}. Give them "
                    f"the same TableOptions storage/cache_policy, or different dims")
        self.slot_tag = torch.tensor([self.group_tables[self.dims.index(s.dim)]
                                      .index(s.table) for s in self.slots])
        self.output_names = [s.name for s in declaration_order]
        self.layouts = [GroupLayout(
            dim,
            [s.name for s in declaration_order if s.dim == dim and s.pooled],
            [(s.name, s.max_len) for s in declaration_order
             if s.dim == dim and not s.pooled]) for dim in self.dims]
        self.slot_group = torch.tensor([self.dims.index(s.dim) for s in self.slots])
        self.slot_salt = torch.tensor([table_salt(s.table) for s in self.slots],
                                      dtype=torch.int64)
        self.slot_combiner = torch.tensor(
            [COMBINER_CODES[s.combiner] if isinstance(s, Sequence) else 0
             for s in self.slots])
        self.slot_unpooled = torch.tensor([not s.pooled for s in self.slots])
        base, stride, position = [], [], []
        for spec in self.slots:                          # build time only
            layout = self.layouts[self.dims.index(spec.dim)]
            if spec.pooled:
                base.append(0)
                stride.append(len(layout.pooled))
                position.append(layout.pooled.index(spec.name))
            else:
                names = [name for name, _ in layout.unpooled]
                index = names.index(spec.name)
                base.append(len(layout.pooled) + sum(
                    length for _, length in layout.unpooled[:index]))
                stride.append(spec.max_len)
                position.append(0)
        # `base` is in units of the batch size: row = base * B + ...
        self.slot_base = torch.tensor(base)
        self.slot_stride = torch.tensor(stride)
        self.slot_position = torch.tensor(position)
        self.has_sequences = any(isinstance(s, Sequence) for s in self.slots)
        self.has_unpooled = bool(self.slot_unpooled.any())

    def host_cached(self, group: int) -> bool:
        """Whether physical table `group` keeps its rows in host memory.

        Args:
            group: the physical table's index (its dim's place in `dims`).

        Returns:
            True for `storage="host_cached"`.
        """
        return self.group_options[group][0].storage == "host_cached"

    @property
    def num_slots(self) -> int:
        """Sparse features (slots) of the packed batch."""
        return len(self.slots)

    def assemble(self, groups: list, output: str) -> torch.Tensor | dict:
        """The embedding layer's output from the engine's per-table lookups.

        Args:
            groups: `EmbeddingEngine.lookup`'s `(pooled, sequences)` per
                physical table.
            output: `"stacked"` (`[B, F, D]`, one dim), `"concat"`
                (`[B, sum of dims]`) or `"dict"` (`{feature: [B, D]}`, with
                `[B, max_len, D]` for unpooled sequences), the features in
                declaration order.

        Returns:
            A tensor, or a dict of tensors for `"dict"`.

        Example:

        ```python
        out = packing.assemble(engine.lookup(ids, offsets, training=False), "concat")
        ```
        """
        if output == "stacked":
            return groups[0][0]
        if output == "concat" and len(groups) == 1:
            pooled = groups[0][0]
            return pooled.reshape(pooled.shape[0], -1)
        by_name = {}
        for layout, (pooled, sequences) in zip(self.layouts, groups, strict=True):
            for index, name in enumerate(layout.pooled):   # a few dims: views
                by_name[name] = pooled[:, index]
            by_name.update(sequences)
        if output == "dict":
            return {name: by_name[name] for name in self.output_names}
        return torch.cat([by_name[n] for n in self.output_names], dim=1)
