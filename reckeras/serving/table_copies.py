"""The served tables twice over, so that a delta is written in place in its own time.

A predictor keeps two copies of every embedding layer's tables (`TableCopy`).
Requests read one; a delta is written into the other in place (its rows
found or inserted in the hash index and overwritten, its removed ids' rows
zeroed), the predictor swaps to it, waits until no request reads the first
copy any more and writes the same delta there. Applying a delta so costs
time in the delta's size, not the table's: rebuilding a 2.6M-row table
for a delta of 460k rows took 1.3 s, writing it in place 0.2 s.

A removed id keeps its row, zeroed: it reads exactly what an id that was
never seen reads (zeros, in every combiner), and a later delta that brings
the id back overwrites the row. Such dead rows are counted per table, and a
copy whose table holds more than `COMPACT_AT` of them is rebuilt from its
live rows once no request reads it (after the swap, so never while a delta
waits to be served), which bounds the memory over any number of deltas.
Nothing here imports Keras.
"""

from __future__ import annotations

import numpy as np
import torch

from reckeras.embedding.engine import EmbeddingEngine
from reckeras.embedding.packing import PackingPlan
from reckeras.embedding.table_state import TableState

# The share of a table's rows that may be dead (removed ids' zeroed rows)
# before the copy is rebuilt from its live rows.
COMPACT_AT = 0.25

# Room made in each table when it is loaded, as a share of its rows: the
# rows deltas add then need no move of the arrays (see
# `PhysicalTable.reserve_rows`; a large table's arrays move into reserved
# memory there, where they grow in place from then on).
HEADROOM = 0.5

# One delta's rows of one table: `(keys [n], float32 rows [n, dim], removed keys [m])`.
TableChange = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def new_engine(packing: PackingPlan, states: list[TableState] | None = None
               ) -> EmbeddingEngine:
    """Plain tables (admission, eviction and caching are training matters)
    on the host, where requests arrive, holding `states` if given.

    Args:
        packing: the embedding layer's packing.
        states: one `TableState` per physical table, or None for empty tables.

    Returns:
        An `EmbeddingEngine` on the CPU, with room for `HEADROOM` more rows
        in each table.
    """
    engine = EmbeddingEngine(packing, device="cpu")
    if states is not None:
        engine.load_table_states(states)
        for store in engine.tables:
            store.index.reserve_rows(int(HEADROOM * store.num_rows))
    return engine


class TableCopy:
    """One copy of every embedding layer's tables, written in place by deltas.

    Only the predictor writes it, and only while no request reads it.

    Args:
        layers: per embedding layer, `(packing, engine, output mode)`.

    Example:

    ```python
    copy = TableCopy([(packing, new_engine(packing, states), "stack")])
    copy.write([[(keys, rows, removed)]])     # one layer, one table
    copy.compact()                           # rebuilt if too many rows are dead
    ```
    """

    def __init__(self, layers: list[tuple]):
        self.layers = layers
        # Per layer, per physical table: True for each row a removed id left.
        self.dead = [self._no_dead_rows(engine) for _, engine, _ in layers]

    @staticmethod
    def _no_dead_rows(engine):
        return [torch.zeros(store.num_rows, dtype=torch.bool) for store in engine.tables]

    def write(self, changes: list[list[TableChange] | None]) -> None:
        """Writes a delta's rows and removals, in place.

        Args:
            changes: per embedding layer, one `TableChange` per physical
                table, or None where the delta leaves the layer alone.
        """
        for (_, engine, _), dead, layer in zip(self.layers, self.dead, changes, strict=True):
            if layer is None:
                continue
            for table, (store, (keys, rows, removed)) in enumerate(
                    zip(engine.tables, layer, strict=True)):
                index = store.index
                gone = index.find(removed)
                gone = gone[gone >= 0]
                written = index.find_or_insert(keys)
                weights = index.weights       # read after the insert: it may have grown
                weights[gone] = 0
                weights[written] = rows.to(weights.dtype)
                mask = dead[table]
                if mask.numel() < index.num_rows:
                    mask = dead[table] = torch.cat(
                        [mask, torch.zeros(index.num_rows - mask.numel(), dtype=torch.bool)])
                mask[gone] = True
                mask[written] = False

    def dead_rows(self) -> list[list[int]]:
        """Rows removed ids left, per layer and physical table."""
        return [[int(mask.sum()) for mask in layer] for layer in self.dead]

    def compact(self) -> None:
        """Rebuilds each layer one of whose tables holds more than
        `COMPACT_AT` dead rows from its live rows (a new engine)."""
        for position, ((packing, engine, output), dead) in enumerate(
                zip(self.layers, self.dead, strict=True)):
            if not any(int(mask.sum()) > COMPACT_AT * max(store.num_rows, 1)
                       for store, mask in zip(engine.tables, dead, strict=True)):
                continue
            engine = new_engine(packing, _live_states(engine, dead))
            self.layers[position] = (packing, engine, output)
            self.dead[position] = self._no_dead_rows(engine)

    @classmethod
    def of_live_rows(cls, other: TableCopy) -> TableCopy:
        """A new copy holding the live rows of `other` (which requests may
        read meanwhile: this only reads it).

        Args:
            other: the copy to take the rows of.

        Returns:
            A copy with new engines and no dead rows.
        """
        return cls([(packing, new_engine(packing, _live_states(engine, dead)), output)
                    for (packing, engine, output), dead in zip(other.layers, other.dead,
                                                               strict=True)])


def _live_states(engine: EmbeddingEngine, dead: list[torch.Tensor]) -> list[TableState]:
    """The `TableState` of each physical table's live rows."""
    states = []
    for layout, store, mask in zip(engine.table_layouts(), engine.tables, dead, strict=True):
        live = ~mask.numpy()
        rows = store.export()
        states.append(TableState(layout, rows["keys"][live], rows["weights"][live],
                                 np.zeros((int(live.sum()), 0), np.float32)))
    return states
