"""Serving deltas written on several ranks.

Usage: serving_deltas.py <dir>
           trains on common.data(seed=0), writes the full export <dir>/v1,
           trains on common.data(seed=1), writes the delta <dir>/v2 (base:
           v1), then the full export <dir>/full of the same state
"""

import sys

import common

from reckeras import distributed

world = distributed.init(timeout_s=60)
model = common.model()
root = sys.argv[1]
for seed, path, base in ((0, "v1", None), (1, "v2", "v1")):
    model.fit(common.data(seed=seed), batch_size=common.GLOBAL_BATCH // world.size,
              epochs=1, shuffle=False, verbose=0)
    model.export_serving(f"{root}/{path}", base=None if base is None else f"{root}/{base}")
model.export_serving(f"{root}/full")
