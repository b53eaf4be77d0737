"""Exact top-K over candidates sharded by rank (rank::size), merged with
all_gather_top_k, and an rk.Model evaluated with the retrieval metrics;
rank 0 writes both as JSON."""

import json
import sys

import reckeras as rk  # first: selects Keras's torch backend
from reckeras import distributed

import keras  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

out_path = sys.argv[1]
world = distributed.init(timeout_s=60)
rng = np.random.default_rng(0)
items = rng.integers(-3, 4, (501, 6)).astype(np.float32)     # ties on purpose
queries = rng.integers(-3, 4, (64, 6)).astype(np.float32)
seen = rng.integers(-1, 501, (64, 5))
mine = np.arange(world.rank, len(items), world.size)
local = rk.retrieval.exact_top_k(torch.from_numpy(queries), torch.from_numpy(items[mine]),
                                 25, exclude=torch.from_numpy(seen), chunk_size=40,
                                 positions=torch.from_numpy(mine))
scores, top = rk.retrieval.all_gather_top_k(*local, 25)

keras.utils.set_random_seed(1)
columns = rk.layers.FeatureColumns([rk.features.Categorical("user", dim=6),
                                    rk.features.Numeric("seen", shape=(5,))])
inputs = columns.inputs()
dense, sparse = columns(inputs)
query = rk.layers.ShardedEmbedding(columns, output="concat")(sparse)
top_k = rk.retrieval.BruteForceTopK(10, num_candidates=len(items), name="top_k")
# Keras evaluates only a model with a loss: the top-K output has none, a
# score output carries one.
model = rk.Model(inputs, {"top_k": top_k(query, exclude=dense), "score": keras.layers.Dense(
    1, activation="sigmoid", name="score")(query)})
top_k.set_candidates(items)
model.compile(loss={"score": "binary_crossentropy", "top_k": None},
              metrics={"top_k": [rk.metrics.RecallAtK(10), rk.metrics.NDCGAtK(10),
                                 rk.metrics.HitRateAtK(5), rk.metrics.MRR()]},
              embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.1))
users = np.arange(64)
relevant = rng.integers(-1, 501, (64, 30)).astype(np.float32)
logs = model.evaluate({"user": users, "seen": seen.astype(np.float32)},
                      {"top_k": relevant, "score": np.ones(64, np.float32)},
                      batch_size=32 // world.size, verbose=0, return_dict=True)
if world.is_main:
    with open(out_path, "w") as f:
        json.dump({"scores": scores.tolist(), "top": top.tolist(), "evaluate": logs}, f)
if world.size > 1:
    dist.barrier()
