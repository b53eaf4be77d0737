"""Table states: what an engine's physical tables hold, copied out of it.

One type serves every reader and writer of a rank's rows: `get_weights` /
`set_weights`, Keras's `model.save` (`ShardedEmbedding.save_own_variables`),
checkpoints (`reckeras.checkpoint`) and the serving export. A
`TableLayout` describes a physical table without its rows (what a loader
needs to check and allocate); a `TableState` is a layout plus this rank's
rows, whole (`EmbeddingEngine.table_states`) or only those changed since a
checkpoint (`EmbeddingEngine.changed_since`, which adds the keys deleted
since).

The engine also keeps the history a delta needs
(`EmbeddingEngine.mark_saved`): the checkpoints its tables equal, each at
the save generation that ended with it (the tables mark each row written
with the current generation, see `physical_table`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from reckeras.embedding.row_dtypes import dtype_name
from reckeras.embedding.row_store import RowStore


@dataclasses.dataclass(frozen=True)
class TableLayout:
    """One physical table of an engine, without its rows.

    Args:
        name: how errors name the table (its logical tables and dim).
        tables: the logical tables packed into it, in tag order (a row's
            tag is its logical table's position here).
        dim: values per row.
        dtype: the rows' dtype name (`"float32"`, `"float16"`, `"bfloat16"`).
        state_width: float32 optimizer state values per row (0 before the
            sparse optimizer is set).
        tracks_tags: whether each row's logical table is kept (the table
            packs several).
        ages_by_windows: whether rows age out by time windows (their last
            window and the window count are part of the state).

    Example:

    ```python
    [layout.dim for layout in engine.table_layouts()]     # [16, 8]
    ```
    """

    name: str
    tables: tuple[str, ...]
    dim: int
    dtype: str
    state_width: int
    tracks_tags: bool
    ages_by_windows: bool


@dataclasses.dataclass
class TableState:
    """One physical table's rows on this rank (a copy: it does not follow
    later training).

    Args:
        layout: the table's `TableLayout`.
        keys: int64 `[n]`, the rows' table keys.
        weights: `[n, dim]` in the table's row dtype
            (`row_dtypes.numpy_dtype`; another dtype converts on load).
        state: float32 `[n, state width]`, the sparse optimizer's state.
        seen_steps: int32 `[n]`, the training steps each row was seen in,
            saturating at 2047 (`physical_table.MAX_COUNT`; larger counts
            load as 2047; None on load: 0).
        tags: int32 `[n]`, each row's logical table (-1: unknown), where
            the layout tracks tags (None on load: unknown).
        last_window: int32 `[n]`, the window each row was last trained in,
            where the table ages out by windows (-1 or None on load: the
            current window).
        window: the table's window count, where it ages out by windows
            (None on load: kept).
        deleted: int64 keys deleted since the checkpoint a change set is
            relative to (`EmbeddingEngine.changed_since` only).

    Example:

    ```python
    state, = layer.table_states()
    state.keys[state.seen_steps >= 2]        # ids seen in two steps or more
    ```
    """

    layout: TableLayout
    keys: np.ndarray
    weights: np.ndarray
    state: np.ndarray
    seen_steps: np.ndarray | None = None
    tags: np.ndarray | None = None
    last_window: np.ndarray | None = None
    window: int | None = None
    deleted: np.ndarray | None = None

    # The array fields, in the order `arrays` gives them.
    ARRAYS = ("keys", "weights", "state", "seen_steps", "tags", "last_window", "deleted")

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays this state holds, by field name (absent ones left out).

        Returns:
            `{"keys", "weights", "state", ...}`: the per-row arrays, and
            `"deleted"` in a change set.
        """
        return {name: getattr(self, name) for name in self.ARRAYS
                if getattr(self, name) is not None}


def layout_of(store: RowStore, tables: list[str]) -> TableLayout:
    """The layout of one of an engine's row stores.

    Args:
        store: the physical table's row store.
        tables: the logical tables packed into it.

    Returns:
        Its `TableLayout`.
    """
    return TableLayout(name=store.name, tables=tuple(tables), dim=store.dim,
                       dtype=dtype_name(store.weights.dtype),
                       state_width=store.state.shape[1],
                       tracks_tags=store.index.tags is not None,
                       ages_by_windows=store.ages_by_windows)


def load_arrays(state: TableState) -> dict[str, Any]:
    """What `RowStore.load` takes for a state.

    Args:
        state: the rows to load.

    Returns:
        The state's arrays, with `"window"` where it has one.
    """
    arrays: dict[str, Any] = state.arrays()
    if state.window is not None:
        arrays["window"] = state.window
    return arrays

