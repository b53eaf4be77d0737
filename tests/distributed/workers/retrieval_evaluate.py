"""rk.retrieval.evaluate of a two-tower over the whole corpus (candidates
sliced over the ranks); rank 0 writes the metrics and the corpus embeddings
as JSON.

One epoch of fit creates the table rows, at a learning rate that leaves the
weights at their initial values: two_tower's fit on 2 ranks does not yet
take exactly 1 rank's steps (its trained weights differ by ~1e-2 after an
epoch), and this worker tests the evaluation, not the training."""

import json
import sys

import reckeras as rk  # first: selects Keras's torch backend
from reckeras import distributed

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import torch.distributed as dist  # noqa: E402

USERS, ITEMS = 150, 120

out_path = sys.argv[1]
world = distributed.init(timeout_s=60)
rng = np.random.default_rng(0)
seen = np.stack([rng.choice(ITEMS, 10, replace=False) for _ in range(USERS)])
relevant = np.stack([rng.choice(ITEMS, 4, replace=False) for _ in range(USERS)])
relevant[(relevant[:, :, None] == seen[:, None, :]).any((1, 2))] = -1   # not relevant
train = pa.table({"user": np.repeat(np.arange(USERS), 10), "item": seen.reshape(-1)})

keras.utils.set_random_seed(0)
columns = rk.layers.FeatureColumns([rk.features.Categorical("user", dim=8),
                                    rk.features.Categorical("item", dim=8)])
model = rk.models.two_tower(columns, ["user"], ["item"], query_units=(8,))
model.compile(optimizer=keras.optimizers.SGD(1e-9),
              embedding_optimizer=rk.optimizers.SGD(1e-9))
model.fit(train, batch_size=64 // world.size, epochs=1, verbose=0)
results = rk.retrieval.evaluate(
    model, {"user": np.arange(USERS)}, np.arange(ITEMS), relevant, seen,
    metrics=[rk.metrics.RecallAtK(10), rk.metrics.NDCGAtK(10), rk.metrics.MRR()],
    batch_size=40, chunk_size=32)
corpus = model.candidate_embeddings(np.arange(ITEMS))
if world.is_main:
    with open(out_path, "w") as f:
        json.dump({"results": results, "corpus": corpus.tolist()}, f)
if world.size > 1:
    dist.barrier()
