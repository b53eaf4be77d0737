"""ShardedEmbedding: the Keras face of the embedding engine."""

import keras
import numpy as np

from reckeras.embedding.engine import EmbeddingEngine
from reckeras.embedding.packing import PackingPlan
from reckeras.features.plan import TransformPlan
from reckeras.features.specs import deserialize, serialize

OUTPUT_MODES = ("stacked", "concat")


@keras.saving.register_keras_serializable(package="reckeras")
class ShardedEmbedding(keras.layers.Layer):
    """Pooled embeddings of every sparse feature, from dynamic hash tables.

    Each table maps int64 ids to rows created the first time an id is seen
    while training (no vocabulary or size is declared; tables grow without
    bound). Tables of equal dim are packed into one physical table and looked
    up together. Sequence features are pooled with their combiner.

    The tables are not Keras variables: Keras's optimizer never touches them.
    They are trained by the ``embedding_optimizer`` given to
    ``rk.Model.compile``, applied inside the backward pass to the rows the
    batch touched only. At inference, ids never seen in training read zeros.
    ``model.save`` stores the tables (ids, rows and optimizer state).

    Args:
        columns: the ``rk.layers.FeatureColumns`` whose sparse output this
            layer embeds (or a list of serialized sparse feature specs).
        output: ``"stacked"`` returns ``[B, F, D]`` (all features must share
            one dim); ``"concat"`` returns ``[B, sum of dims]``. Features come
            in declaration order.
        init_scale: new rows are uniform in ``[-init_scale, init_scale]``;
            by default ``1 / sqrt(dim)`` of their table.
        seed: seed of the rows' initial values (a row's initial value depends
            only on its id, table and seed).
        **kwargs: base Layer arguments.

    Example:
        >>> dense, sparse = columns(columns.inputs())
        >>> emb = rk.layers.ShardedEmbedding(columns)(sparse)   # [B, F, D]
    """

    def __init__(self, columns, output="stacked", init_scale=None, seed=0, **kwargs):
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
        self.packing = PackingPlan(plan.slots, plan.sparse_in_declaration_order)
        if output == "stacked" and len(self.packing.dims) > 1:
            dims = {s.name: s.dim for s in plan.slots}
            raise ValueError(f"output='stacked' needs one dim for all sparse "
                             f"features, got {dims}; use output='concat'")
        if init_scale is not None and not init_scale > 0:
            raise ValueError(f"init_scale must be > 0, got {init_scale!r}")
        self.output_mode = output
        self.init_scale = None if init_scale is None else float(init_scale)
        self.seed = int(seed)
        self.engine = EmbeddingEngine(self.packing, self.init_scale, self.seed)
        feature_dim = {s.name: s.dim for s in plan.slots}
        self._feature_dims = [feature_dim[n] for n in self.packing.output_names]

    @property
    def tables(self):
        """The physical tables, one per distinct dim."""
        return self.engine.tables

    def call(self, sparse, training=False):
        pooled = self.engine.lookup(sparse["ids"], sparse["offsets"], bool(training))
        if self.output_mode == "stacked":
            return pooled[0]
        return self._concat(pooled)

    def _concat(self, pooled):
        if len(pooled) == 1:
            return pooled[0].reshape(pooled[0].shape[0], -1)
        by_name = {}
        for names, block in zip(self.packing.group_outputs, pooled):
            for i, name in enumerate(names):          # a few dims: cheap views
                by_name[name] = block[:, i]
        return keras.ops.concatenate([by_name[n] for n in self.packing.output_names],
                                     axis=1)

    def compute_output_spec(self, sparse, training=False):
        if self.output_mode == "stacked":
            return keras.KerasTensor((None, len(self._feature_dims),
                                      self._feature_dims[0]), dtype="float32")
        return keras.KerasTensor((None, sum(self._feature_dims)), dtype="float32")

    # ---- saving ----------------------------------------------------------------

    def save_own_variables(self, store):
        for index, table in enumerate(self.engine.tables):
            for key, array in table.export().items():
                store[f"table{index}_{key}"] = array

    def load_own_variables(self, store):
        for index, table in enumerate(self.engine.tables):
            table.load({key: np.asarray(store[f"table{index}_{key}"])
                        for key in ("keys", "weights", "state")})

    def get_config(self):
        return {**super().get_config(),
                "columns": [serialize(s) for s in self.specs],
                "output": self.output_mode, "init_scale": self.init_scale,
                "seed": self.seed}
