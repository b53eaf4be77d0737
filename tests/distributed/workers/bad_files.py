"""Reads parquet files with on_bad_file="skip" on every rank and trains on them.

Usage: bad_files.py DATA_DIR OUT_PREFIX. Each rank writes OUT_PREFIX.<rank>.json:
the files it kept, the files it skipped, the keys of its shard's batches (all
columns read), its batch count against `num_batches`, and the steps and losses
of a short `fit` on the same data.
"""

import json
import sys

import reckeras as rk  # first: selects Keras's torch backend
from reckeras import distributed

import keras  # noqa: E402

data_dir, out_prefix = sys.argv[1], sys.argv[2]
world = distributed.init(timeout_s=30)
data = rk.datasets.from_parquet(data_dir, on_bad_file="skip")
batches = list(data.batches(32, shuffle=True, seed=7, shard_index=world.rank,
                            num_shards=world.size))

keras.utils.set_random_seed(1)
columns = rk.layers.FeatureColumns([rk.features.Numeric("n"),
                                    rk.features.Categorical("a", dim=4)])
model = rk.models.dlrm(columns, bottom_units=(4,), top_units=(4, 1),
                       dropout=0.0, embedding_l2=0.0)
model.compile(optimizer="adam", loss="binary_crossentropy",
              embedding_optimizer=rk.optimizers.SGD(0.1))
history = model.fit(data, batch_size=32, epochs=2, shuffle=True, seed=7, verbose=0)

with open(f"{out_prefix}.{world.rank}.json", "w") as file:
    json.dump({
        "files": data.files,
        "skipped": [[s.path, s.when, s.reason] for s in data.skipped_files],
        "keys": [key for batch in batches for key in batch["key"].to_pylist()],
        "batches": len(batches),
        "num_batches": data.num_batches(32, shard_index=world.rank,
                                        num_shards=world.size),
        "fit_steps": model.pipeline_stats["step"]["items"],
        "loss": history.history["loss"],
    }, file)
