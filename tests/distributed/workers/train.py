"""Trains the common model for a few steps; rank 0 saves weights and tables
(and, with host_cached tables, every rank's cache stats beside them; with
RK_TEST_PIPELINE=0|1, fit's pipeline switch and its stats)."""

import json
import os
import sys

import common  # noqa: E402  (adds nothing to sys.path; sits beside this file)

import reckeras as rk  # noqa: F401
from reckeras import distributed

out_path, epochs = sys.argv[1], int(sys.argv[2])
world = distributed.init(timeout_s=60)
model = common.model()
pipeline = {"0": False, "1": True}.get(os.environ.get("RK_TEST_PIPELINE"), "auto")
model.fit(common.data(), batch_size=common.GLOBAL_BATCH // world.size, epochs=epochs,
          shuffle=True, seed=3, verbose=0, pipeline=pipeline)
if pipeline != "auto":
    # predict() on every rank through the same pipeline: rank 0 keeps its
    # own shard's predictions (the metrics of save_all cover evaluate()).
    predictions = model.predict(common.data(rows=128), batch_size=16, pipeline=pipeline)
    if world.is_main:
        with open(f"{out_path}.pipeline.json", "w") as f:
            json.dump({**model.pipeline_stats, "predictions": predictions.tolist()}, f)
if any(model.embedding_layers[0].engine.caches):
    stats = model.embedding_stats()             # a collective: every rank calls it
    if world.is_main:
        with open(f"{out_path}.cache.json", "w") as f:
            json.dump(stats, f)
common.save_all(model, out_path)               # ends with a barrier: ranks exit together
