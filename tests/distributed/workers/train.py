"""Trains the common model for a few steps; rank 0 saves weights and tables."""

import sys

import common  # noqa: E402  (adds nothing to sys.path; sits beside this file)

import reckeras as rk  # noqa: F401
from reckeras import distributed

out_path, epochs = sys.argv[1], int(sys.argv[2])
world = distributed.init(timeout_s=60)
model = common.model()
model.fit(common.data(), batch_size=common.GLOBAL_BATCH // world.size, epochs=epochs,
          shuffle=True, seed=3, verbose=0)
common.save_all(model, out_path)
