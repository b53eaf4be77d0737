"""ShardedEmbedding: the Keras face of the embedding engine."""

from __future__ import annotations

import dataclasses
from typing import Any

import keras
import numpy as np

from reckeras import _keras_compat
from reckeras.embedding.engine import EmbeddingEngine
from reckeras.embedding.options import REGULARIZE, TableOptions
from reckeras.embedding.packing import PackingPlan
from reckeras.embedding.table_state import TableState
from reckeras.features.plan import TransformPlan
from reckeras.features.specs import deserialize, serialize

OUTPUT_MODES = ("stacked", "concat", "dict")


@keras.saving.register_keras_serializable(package="reckeras")
class ShardedEmbedding(keras.layers.Layer):
    """Pooled embeddings of every sparse feature, from dynamic hash tables.

    Each table maps int64 ids to rows created the first time an id is seen
    while training (no vocabulary or size is declared; tables grow without
    bound). Tables of equal dim are packed into one physical table and looked
    up together. Sequence features are pooled with their combiner.

    The tables are not Keras variables: Keras's optimizer never touches them.
    They are trained by the `embedding_optimizer` given to
    `rk.Model.compile`, applied inside the backward pass to the rows the
    batch touched only. At inference, ids never seen in training read zeros.
    `model.save` stores the tables (ids, rows and optimizer state).

    Freezing, as in Keras: with `layer.trainable = False` (or
    `model.trainable = False`) a training step looks the tables up as at
    inference: it creates no row (an unseen id reads zeros), updates no row
    and no optimizer state, and counts no step in the rows' lifecycle; the
    other layers still train. Setting it back to True trains the tables
    again (Keras asks to `compile` again after changing `trainable`).

    Regularization, as Keras's `Embedding(embeddings_regularizer=...)`: the
    penalty joins `layer.losses` (so `model.losses` and the loss `fit`
    reports and minimizes) at every call of a trainable layer, and its
    gradient joins the data gradient in the rows' one update. It falls on
    the rows the batch looks up, since a sparse step reads and updates only
    those: with `regularize="distinct"` every looked-up row counts once
    (when a batch looks up every row, this is Keras's dense penalty); with
    `"occurrence"` every lookup counts, over the batch size, so that a row
    is penalized as often as it is seen. On several ranks the penalty counts
    as on one rank with the whole batch. See `docs/regularization.md`.

    Args:
        columns: the `rk.layers.FeatureColumns` whose sparse output this
            layer embeds (or a list of serialized sparse feature specs).
        output: `"stacked"` returns `[B, F, D]` (all features must share
            one dim); `"concat"` returns `[B, sum of dims]`; `"dict"`
            returns `{feature name: [B, D]}`, with `[B, max_len, D]` for
            unpooled sequences (`Sequence(..., combiner=None)`), which only
            `"dict"` supports. Features come in declaration order.
        init_scale: new rows are uniform in `[-init_scale, init_scale]`;
            by default `1 / sqrt(dim)` of their table.
        seed: seed of the rows' initial values (a row's initial value depends
            only on its id, table and seed).
        table_options: `{table name: rk.embedding.TableOptions(...)}` (or
            dicts of its fields) for tables with admission, eviction or
            host storage behind a device cache (`storage="host_cached"`,
            see `docs/caching.md`), or with a regularizer of its own; an
            unknown table name is an error.
        embeddings_regularizer: the penalty of every table's looked-up rows
            (unless its `TableOptions` gives one): a
            `keras.regularizers.Regularizer` (`L1`, `L2`, `L1L2`, or a
            registered subclass that sums a per-row penalty, 0 for a zero
            row), its name (`"l2"`) or its config; None for none.
        regularize: which looked-up rows the penalty counts: `"distinct"`
            (each row the batch looks up, once) or `"occurrence"` (each
            lookup, the sum divided by the batch size).
        **kwargs: base Layer arguments.

    Call arguments:
        sparse: the packed sparse batch `{"ids", "offsets"}` (and
            `"weights"` with weighted sequences) of the FeatureColumns
            (its output, or `FeatureColumns.pack`).
        training: create rows for new ids and train them (only while the
            layer is `trainable`).
        routed: the `RoutedBatch` the pipeline's sparse-dist stage planned
            for this very batch (`EmbeddingEngine.route_ahead`); `rk.Model`'s
            loops pass it, other callers leave it None.

    Example:

    ```python
    dense, sparse = columns(columns.inputs())
    emb = rk.layers.ShardedEmbedding(columns)(sparse)   # [B, F, D]
    regularized = rk.layers.ShardedEmbedding(
        columns, embeddings_regularizer=keras.regularizers.L2(0.05))
    ```
    """

    def __init__(self, columns: Any, output: str = "stacked",
                 init_scale: float | None = None, seed: int = 0,
                 table_options: dict | None = None, embeddings_regularizer: Any = None,
                 regularize: str = "distinct", **kwargs: Any):
        super().__init__(**kwargs)
        specs = columns.specs if hasattr(columns, "specs") else \
            [deserialize(s) for s in columns]
        specs = [s for s in specs if s.sparse]
        if not specs:
            raise ValueError("ShardedEmbedding needs at least one sparse feature")
        self.specs = specs
        plan = TransformPlan(specs)
        if output not in OUTPUT_MODES:
            raise ValueError(f"output must be one of {OUTPUT_MODES}, got {output!r}")
        if regularize not in REGULARIZE:
            raise ValueError(f"ShardedEmbedding {self.name!r}: regularize must be one of "
                             f"{REGULARIZE}, got {regularize!r}")
        self.embeddings_regularizer = self._regularizer(embeddings_regularizer, "")
        self.regularize = regularize
        self.table_options = {
            name: self._table_options(name, options)
            for name, options in (table_options or {}).items()}
        self.packing = PackingPlan(plan.slots, plan.sparse_in_declaration_order,
                                   self.table_options)
        if output == "stacked" and len(self.packing.dims) > 1:
            dims = {s.name: s.dim for s in plan.slots}
            raise ValueError(f"output='stacked' needs one dim for all sparse "
                             f"features, got {dims}; use output='concat'")
        unpooled = [s.name for s in plan.slots if not s.pooled]
        if unpooled and output != "dict":
            raise ValueError(f"unpooled sequence features {unpooled} need "
                             f"output='dict'")
        if init_scale is not None and not init_scale > 0:
            raise ValueError(f"init_scale must be > 0, got {init_scale!r}")
        self.output_mode = output
        self.init_scale = None if init_scale is None else float(init_scale)
        self.seed = int(seed)
        self.engine = EmbeddingEngine(self.packing, self.init_scale, self.seed,
                                      device=_keras_compat.keras_device(),
                                      regularizer=self.embeddings_regularizer,
                                      regularize=regularize)
        layouts = self.packing.layouts
        self._output_shapes: dict[str, tuple[None, int] | tuple[None, int, int]] = {
            **{name: (None, layout.dim) for layout in layouts for name in layout.pooled},
            **{name: (None, max_len, layout.dim) for layout in layouts
               for name, max_len in layout.unpooled}}

    def _table_options(self, name, options):
        """A table's `TableOptions` (or dict of its fields), its regularizer
        resolved."""
        if isinstance(options, TableOptions):
            return dataclasses.replace(options, embeddings_regularizer=self._regularizer(
                options.embeddings_regularizer, f" table {name!r}"))
        return TableOptions(**{**options, "embeddings_regularizer": self._regularizer(
            options.get("embeddings_regularizer"), f" table {name!r}")})

    def _regularizer(self, identifier, where):
        """A Keras regularizer from what a user gave (None stays None)."""
        argument = f"ShardedEmbedding {self.name!r}{where}: embeddings_regularizer"
        if identifier is None:
            return None
        try:
            regularizer = keras.regularizers.get(identifier)
        except (ValueError, TypeError) as error:
            raise ValueError(f"{argument} must be a keras.regularizers.Regularizer, its "
                             f"name (\"l2\") or its config, got {identifier!r}") from error
        if not isinstance(regularizer, keras.regularizers.Regularizer):
            raise ValueError(f"{argument} must be a keras.regularizers.Regularizer (a "
                             f"subclass for a penalty of your own, so that it saves with "
                             f"the model), got {identifier!r}")
        if isinstance(regularizer, keras.regularizers.OrthogonalRegularizer):
            raise ValueError(f"{argument}: OrthogonalRegularizer penalizes a table's rows "
                             f"together, but a sparse step sees only the rows its batch "
                             f"looks up; use a per-row penalty (L1, L2, L1L2)")
        return regularizer

    @property
    def tables(self) -> list:
        """The physical tables, one per distinct dim."""
        return self.engine.tables

    def call(self, sparse: dict, training: bool = False, routed: Any = None) -> Any:
        # `routed`: the routes the pipeline's sparse-dist stage planned for
        # this very batch (`EmbeddingEngine.route_ahead`), or None. A frozen
        # layer looks up as at inference, as Keras's frozen BatchNormalization
        # normalizes as at inference.
        # A frozen layer adds no penalty, as Keras counts the regularizers
        # of trainable weights only.
        regularized = self.trainable and self.engine.regularizes
        looked_up = self.engine.lookup(sparse["ids"], sparse["offsets"],
                                       bool(training) and self.trainable,
                                       routed=routed, weights=sparse.get("weights"),
                                       return_penalty=regularized)
        if isinstance(looked_up, tuple):
            groups, penalty = looked_up
            self.add_loss(penalty)
        else:
            groups = looked_up
        return self.packing.assemble(groups, self.output_mode)

    def compute_output_spec(self, sparse: dict, training: bool = False,
                            routed: Any = None) -> Any:
        shapes = [self._output_shapes[n] for n in self.packing.output_names]
        if self.output_mode == "stacked":
            return keras.KerasTensor((None, len(shapes), shapes[0][1]), dtype="float32")
        if self.output_mode == "concat":
            return keras.KerasTensor((None, sum(s[1] for s in shapes)), dtype="float32")
        return {name: keras.KerasTensor(self._output_shapes[name], dtype="float32")
                for name in self.packing.output_names}

    # ---- time windows ----------------------------------------------------------

    def begin_window(self) -> None:
        """Starts a time window: `end_window` counts the rows from here.

        `rk.Model.fit_windows` calls it before training on each window when
        a table ages out by windows; call it yourself in a loop of your own.

        Example:

        ```python
        layer.begin_window()
        model.fit(day, epochs=1)
        layer.end_window()      # {"rows_added": ..., "rows_evicted": ..., "rows_kept": ...}
        ```
        """
        self.engine.begin_window()

    def end_window(self) -> dict[str, int]:
        """Ends a time window after training on it: tables with
        `rk.embedding.TableOptions(evict_idle_windows=k)` free the rows not
        trained in the last `k` windows (their ids read zeros, and get a
        fresh row when they come back).

        Returns:
            This rank's `{"rows_added", "rows_evicted", "rows_kept"}` since
            `begin_window` (`EmbeddingEngine.end_window`).

        Raises:
            RuntimeError: `begin_window` was not called first.

        Example:

        ```python
        layer.begin_window()
        model.fit(day, epochs=1)
        counts = layer.end_window()
        ```
        """
        return self.engine.end_window()

    @property
    def ages_by_windows(self) -> bool:
        """Whether any of its tables sets `evict_idle_windows`."""
        return any(options.evict_idle_windows for options in self.table_options.values())

    # ---- saving ----------------------------------------------------------------

    def table_states(self) -> list[TableState]:
        """A copy of this rank's tables: keys, rows, optimizer state, each
        row's count of training steps (and its tag and last window where
        the table keeps them).

        Returns:
            One `rk.embedding.TableState` per physical table
            (`EmbeddingEngine.table_states`).
        """
        return self.engine.table_states()

    def load_table_states(self, states: list[TableState]) -> None:
        """Replaces this rank's tables by what `table_states` returned.

        Args:
            states: one `rk.embedding.TableState` per physical table.
        """
        self.engine.load_table_states(states)

    def save_own_variables(self, store: dict) -> None:
        """Writes the tables into a Keras weights store (`model.save`).

        Args:
            store: the layer's store, keyed `table<i>_<array>` for each of a
                `TableState`'s arrays, and `table<i>_window` (the window
                count) where the table ages out by windows.
        """
        for index, state in enumerate(self.table_states()):
            for name, array in state.arrays().items():
                store[f"table{index}_{name}"] = array
            if state.window is not None:
                store[f"table{index}_window"] = np.asarray(state.window)

    def load_own_variables(self, store: dict) -> None:
        """Reads the tables back from a Keras weights store.

        Args:
            store: what `save_own_variables` wrote.
        """
        # A store written before rows had tags, counts or windows lacks
        # them: the rows' tables are unknown, their counts 0, and they count
        # as trained in the current window.
        def saved(index, name):
            key = f"table{index}_{name}"
            return np.asarray(store[key]) if key in store else None

        states = []
        for index, layout in enumerate(self.engine.table_layouts()):
            arrays = {name: saved(index, name) for name in TableState.ARRAYS}
            window = saved(index, "window")
            states.append(TableState(layout, **arrays,
                                     window=None if window is None else int(window)))
        self.load_table_states(states)

    def get_config(self) -> dict:
        return {**super().get_config(),
                "columns": [serialize(s) for s in self.specs],
                "output": self.output_mode, "init_scale": self.init_scale,
                "seed": self.seed,
                "table_options": {name: {**options.get_config(),
                                         "embeddings_regularizer": _serialized(
                                             options.embeddings_regularizer)}
                                  for name, options in self.table_options.items()},
                "embeddings_regularizer": _serialized(self.embeddings_regularizer),
                "regularize": self.regularize}


def _serialized(regularizer):
    return None if regularizer is None else keras.regularizers.serialize(regularizer)
