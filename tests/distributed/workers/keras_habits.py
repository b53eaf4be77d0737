"""Trains with a Keras habit on any number of ranks; rank 0 saves weights,
tables and metrics (`common.save_all`). argv: out path, habit:
`subclassed` (a subclassed rk.Model, as common.model() but written with
call()), `frozen` (common.model(), its tables frozen for a second epoch,
the sparse-dist stage on), or `py_dataset` (common.model() fit on a
keras.utils.PyDataset per rank, giving the rank its slice of each global
batch as Keras users shard their own sources)."""

import sys

import common  # noqa: E402  (adds nothing to sys.path; sits beside this file)

import keras  # noqa: E402

import reckeras as rk  # noqa: E402
from reckeras import distributed  # noqa: E402


class Ranker(rk.Model):
    def __init__(self, columns):
        super().__init__()
        self.columns = columns
        self.embedding = rk.layers.ShardedEmbedding(columns)
        self.bottom = rk.layers.MLP([8, 4])
        self.interaction = rk.layers.DotInteraction()
        self.top = rk.layers.MLP([8, 1], output_activation="sigmoid")

    def call(self, inputs):
        dense, sparse = self.columns(inputs)
        return self.top(self.interaction([self.bottom(dense), self.embedding(sparse)]))


class RankSlices(keras.utils.PyDataset):
    """This rank's slice of each global batch of `table`: `(x, y)`."""

    def __init__(self, table, rank, size):
        super().__init__()
        self.table, self.rank, self.size = table, rank, size

    def __len__(self):
        return self.table.num_rows // common.GLOBAL_BATCH

    def __getitem__(self, index):
        local = common.GLOBAL_BATCH // self.size
        rows = self.table.slice(index * common.GLOBAL_BATCH + self.rank * local, local)
        return rows.drop_columns(["label"]), rows.column("label").to_numpy()


def compile_(model):
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.1),
                  metrics=[rk.metrics.AUC(), rk.metrics.GAUC(group="c")])


out_path, habit = sys.argv[1], sys.argv[2]
world = distributed.init(timeout_s=60)
batch_size = common.GLOBAL_BATCH // world.size
if habit == "subclassed":
    keras.utils.set_random_seed(1)
    model = Ranker(common.model().feature_columns)   # the same features
    compile_(model)
    model.fit(common.data(), batch_size=batch_size, epochs=2, shuffle=True, seed=3,
              verbose=0)
elif habit == "py_dataset":
    model = common.model()
    model.fit(RankSlices(common.data(), world.rank, world.size), epochs=2, shuffle=False,
              verbose=0, pipeline=True)
else:
    model = common.model()
    model.fit(common.data(), batch_size=batch_size, shuffle=True, seed=3, verbose=0,
              pipeline=True)
    model.embedding_layers[0].trainable = False
    compile_(model)
    model.fit(common.data(seed=1), batch_size=batch_size, shuffle=True, seed=4,
              verbose=0, pipeline=True)
common.save_all(model, out_path)
