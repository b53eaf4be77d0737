"""The tables' learning rate follows the dense optimizer's.

In Keras one optimizer trains every weight, so `ReduceLROnPlateau`,
`LearningRateScheduler` or a line setting `model.optimizer.learning_rate`
slows the embeddings down with the rest. In reckeras the tables have their
own optimizer (`compile(embedding_optimizer=...)`); to keep that habit, the
tables' rate is scaled by the same factor as the dense optimizer's whenever
the latter is set:

    tables' rate = anchor_tables * dense rate now / anchor_dense

The anchors are the two rates at `compile`. Setting
`model.embedding_optimizer.learning_rate` directly moves the anchors: the
value set is kept, and later changes of the dense rate scale it. A dense
optimizer with a `LearningRateSchedule` (no settable rate) is not followed.

Because the anchors are the compiled rates, a checkpoint that restores the
dense optimizer's rate (it is one of its variables) restores the tables'
rate with it.
"""

from __future__ import annotations

import keras

from reckeras.optimizers import SparseOptimizer


class TableRate:
    """Scales a sparse optimizer's learning rate with a Keras optimizer's.

    `rk.Model.compile` makes one; `rk.Model.train_step` calls `follow`
    before each step (a host read of the dense rate, one scalar).

    Args:
        dense: the Keras optimizer of the dense weights.
        tables: the tables' sparse optimizer.

    Example:

    ```python
    dense = keras.optimizers.Adam(1e-3)
    tables = rk.optimizers.SGD(0.1)
    rate = TableRate(dense, tables)
    dense.learning_rate = 1e-4
    rate.follow()
    tables.learning_rate     # 0.01 (0.1 * 1e-4 / 1e-3, in float32)
    ```
    """

    def __init__(self, dense: keras.optimizers.Optimizer, tables: SparseOptimizer):
        self.dense = dense
        self.tables = tables
        # A schedule's rate is a tensor computed per step, not a variable a
        # callback sets: there is nothing to follow then.
        self.followed = isinstance(dense.learning_rate, keras.Variable)
        self.anchor_dense = self._dense_rate() if self.followed else 0.0
        self.anchor_tables = tables.learning_rate
        self.last_set = tables.learning_rate

    def _dense_rate(self) -> float:
        return float(keras.ops.convert_to_numpy(self.dense.learning_rate))

    def follow(self) -> None:
        """Sets the tables' rate from the dense rate now (see the module)."""
        if not self.followed:
            return
        dense = self._dense_rate()
        if self.tables.learning_rate != self.last_set or self.anchor_dense <= 0.0:
            # Set by the user (or anchored at a zero dense rate): start again
            # from the rates as they are.
            self.anchor_dense, self.anchor_tables = dense, self.tables.learning_rate
        elif dense == self.anchor_dense:
            self.tables.learning_rate = self.anchor_tables
        else:
            self.tables.learning_rate = self.anchor_tables * (dense / self.anchor_dense)
        self.last_set = self.tables.learning_rate
