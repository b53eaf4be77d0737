"""Trains the common model with every table regularized (RK_TEST_REGULARIZE=
distinct|occurrence); rank 0 saves weights, tables and evaluation metrics
(common.save_all) and fit's per-epoch losses (reduced over the ranks)."""

import json
import sys

import common  # noqa: E402  (adds nothing to sys.path; sits beside this file)

import reckeras as rk  # noqa: F401
from reckeras import distributed

out_path, epochs = sys.argv[1], int(sys.argv[2])
world = distributed.init(timeout_s=60)
model = common.model()
history = model.fit(common.data(), batch_size=common.GLOBAL_BATCH // world.size,
                    epochs=epochs, shuffle=True, seed=3, verbose=0)
if world.is_main:
    with open(f"{out_path}.losses.json", "w") as f:
        json.dump(history.history["loss"], f)
common.save_all(model, out_path)               # ends with a barrier: ranks exit together
