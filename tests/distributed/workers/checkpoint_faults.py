"""Damages a 2-rank checkpoint for real and loads it on both ranks.

Usage: checkpoint_faults.py <ckpt> <out-prefix>

Trains an epoch, saves, trains another epoch. Then for every fault of
`damage.TABLE_FAULTS`, rank 0 damages the largest table file (kept aside
first), both ranks load and record the error, its message, the seconds it
took and whether the model is unchanged; rank 0 puts the file back. Last,
both ranks load the intact checkpoint, which must give the state of the save.
Writes <out-prefix><rank>.json.
"""

import json
import shutil
import sys
import time

import common
import damage
import numpy as np
import torch.distributed as dist

from reckeras import distributed


def state(model):
    arrays = [v.numpy().copy() for v in model.variables + model.optimizer.variables]
    for layer in model.embedding_layers:
        for table in layer.engine.table_states():
            arrays += [getattr(table, name) for name in ("keys", "weights", "state")]
    return arrays


def same(a, b):
    return len(a) == len(b) and all(
        x.shape == y.shape and np.array_equal(x, y) for x, y in zip(a, b))


world = distributed.init(timeout_s=60)
ckpt = sys.argv[1]
model = common.model()
batch = common.GLOBAL_BATCH // world.size
model.fit(common.data(), batch_size=batch, epochs=1, seed=3, verbose=0)
model.save_checkpoint(ckpt)
at_save = state(model)
model.fit(common.data(seed=1), batch_size=batch, epochs=1, seed=3, verbose=0)
target = damage.largest_table_file(ckpt)
faults = {}
for name, fault in damage.TABLE_FAULTS.items():
    if world.is_main:
        shutil.copy(target, target + ".kept")
        fault(target)
    dist.barrier()
    before = state(model)
    start = time.perf_counter()
    try:
        model.load_checkpoint(ckpt)
        error, message = None, ""
    except Exception as caught:  # noqa: BLE001 -- the test checks which
        error, message = type(caught).__name__, str(caught)
    faults[name] = {"file": target, "error": error, "message": message,
                    "seconds": time.perf_counter() - start,
                    "unchanged": same(before, state(model))}
    dist.barrier()
    if world.is_main:
        shutil.move(target + ".kept", target)
    dist.barrier()
model.load_checkpoint(ckpt)
report = {"faults": faults, "intact_load_restores_the_save": same(at_save, state(model))}
with open(f"{sys.argv[2]}{world.rank}.json", "w") as f:
    json.dump(report, f, indent=1)
