"""Trains a two-output model (per-output AUC and GAUC) on the common data;
rank 0 writes the history and evaluate's logs as JSON."""

import json
import sys

import common  # noqa: E402  (sits beside this file)

import reckeras as rk
from reckeras import distributed

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import torch.distributed as dist  # noqa: E402

out_path = sys.argv[1]
world = distributed.init(timeout_s=60)
table = common.data()
second = table.column("label").to_numpy() * (table.column("a").to_numpy() % 2)
table = table.append_column("conv", pa.array(second.astype(np.float32)))

keras.utils.set_random_seed(1)
columns = rk.layers.FeatureColumns([rk.features.Numeric("n"),
                                    rk.features.Categorical("a", dim=4),
                                    rk.features.Categorical("c", dim=4)])
inputs = columns.inputs()
dense, sparse = columns(inputs)
shared = keras.layers.Dense(8, activation="relu")(keras.layers.Concatenate()(
    [dense, rk.layers.ShardedEmbedding(columns, output="concat")(sparse)]))
# Output layers named after their keys: Keras 3.10 matches a metrics dict
# by output layer names, later releases by the dict's keys.
model = rk.Model(inputs, {
    "click": keras.layers.Dense(1, activation="sigmoid", name="click")(shared),
    "conv": keras.layers.Dense(1, activation="sigmoid", name="conv")(shared)})
model.compile(optimizer=keras.optimizers.Adam(0.01),
              loss={"click": "binary_crossentropy", "conv": "binary_crossentropy"},
              metrics={"click": [rk.metrics.AUC()],
                       "conv": [rk.metrics.AUC(), rk.metrics.GAUC("a", name="conv_gauc")]},
              embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.1))
labels = {"click": "label", "conv": "conv"}
history = model.fit(table, labels=labels, batch_size=common.GLOBAL_BATCH // world.size,
                    epochs=2, shuffle=True, seed=3, verbose=0)
logs = model.evaluate(table, labels=labels, batch_size=common.GLOBAL_BATCH // world.size,
                      verbose=0, return_dict=True)
if world.is_main:
    with open(out_path, "w") as f:
        json.dump({"history": history.history, "evaluate": logs}, f)
if world.size > 1:
    dist.barrier()                          # ranks exit together
