"""A two-tower trained at one global batch (64 rows: 64 // size a rank),
then rk.retrieval.evaluate over the whole corpus (candidates sliced over the
ranks); rank 0 writes the metrics and the corpus embeddings as JSON. Then
a two-tower of sampled negatives only (`in_batch_negatives=False`, the
cosine contrastive loss) trained the same way: its corpus embeddings too.

The 1,280 rows make 20 whole global batches: with a partial last one, 2
ranks would skip it (every rank takes the steps all can take) where 1 rank
trains on it."""

import json
import sys

import reckeras as rk  # first: selects Keras's torch backend
from reckeras import distributed

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import torch.distributed as dist  # noqa: E402

USERS, ITEMS = 128, 120

out_path = sys.argv[1]
world = distributed.init(timeout_s=60)
rng = np.random.default_rng(0)
seen = np.stack([rng.choice(ITEMS, 10, replace=False) for _ in range(USERS)])
relevant = np.stack([rng.choice(ITEMS, 4, replace=False) for _ in range(USERS)])
relevant[(relevant[:, :, None] == seen[:, None, :]).any((1, 2))] = -1   # users with none
train = pa.table({"user": np.repeat(np.arange(USERS), 10), "item": seen.reshape(-1)})

keras.utils.set_random_seed(0)
columns = rk.layers.FeatureColumns([rk.features.Categorical("user", dim=8),
                                    rk.features.Categorical("item", dim=8)])
model = rk.models.two_tower(columns, ["user"], ["item"], query_units=(8,))
model.compile(optimizer=keras.optimizers.Adam(0.01),
              embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.05))
model.fit(train, batch_size=64 // world.size, epochs=2, verbose=0)
results = rk.retrieval.evaluate(
    model, {"user": np.arange(USERS)}, np.arange(ITEMS), relevant, seen,
    metrics=[rk.metrics.RecallAtK(10), rk.metrics.NDCGAtK(10), rk.metrics.MRR()],
    batch_size=40, chunk_size=32)
corpus = model.candidate_embeddings(np.arange(ITEMS))

# Each rank draws its own negatives (its rank is the sampler's stream); with
# all of the sampler's mass on one item every rank draws the same ids, so
# 2 ranks at batch 32 must train as 1 rank at 64.
keras.utils.set_random_seed(0)
columns = rk.layers.FeatureColumns([rk.features.Categorical("user", dim=8),
                                    rk.features.Categorical("item", dim=8)])
sampler = rk.retrieval.NegativeSampler(np.arange(ITEMS), 5, counts=np.eye(ITEMS)[7])
sampled = rk.models.two_tower(columns, ["user"], ["item"], query_units=(8,),
                              loss="cosine_contrastive", margin=0.2, negative_weight=2.0,
                              negatives=sampler, in_batch_negatives=False)
sampled.compile(optimizer=keras.optimizers.Adam(0.01),
                embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.05))
history = sampled.fit(train, batch_size=64 // world.size, epochs=2, verbose=0)
sampled_corpus = sampled.candidate_embeddings(np.arange(ITEMS))
if world.is_main:
    with open(out_path, "w") as f:
        json.dump({"results": results, "corpus": corpus.tolist(),
                   "sampled_corpus": sampled_corpus.tolist(),
                   "sampled_loss": history.history["loss"]}, f)
if world.size > 1:
    dist.barrier()
