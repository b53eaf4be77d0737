"""Peak memory of loading a checkpoint.

Usage: checkpoint_memory.py save <ckpt> <keys>
           every rank inserts the keys of arange(<keys>) it owns, with rows and
           Adagrad state that are functions of the key, and saves
       checkpoint_memory.py load <ckpt> <keys> <out-prefix>
           loads, checks that this rank holds exactly its keys with their
           values, and writes <out-prefix><rank>.json with the peak resident
           memory the load took above the resident memory before it (Linux's
           VmHWM, reset through /proc/self/clear_refs) and the bytes of the
           rows this rank holds
"""

import json
import sys

import reckeras as rk  # first: selects Keras's torch backend
from reckeras import distributed
from reckeras.embedding.sharding import owner_of

import numpy as np  # noqa: E402
import torch  # noqa: E402

DIM = 64


def model():
    columns = rk.layers.FeatureColumns([rk.features.Categorical("a", dim=DIM)])
    inputs = columns.inputs()
    m = rk.Model(inputs, rk.layers.ShardedEmbedding(columns)(columns(inputs)[1]))
    m.compile(loss="mse", embedding_optimizer=rk.optimizers.Adagrad(0.1))
    return m


def values(keys):
    """The row and the state every key is saved with (exact in float32)."""
    weights = keys[:, None].to(torch.float32) + torch.arange(DIM, dtype=torch.float32)
    return weights, -weights


def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024


def peak_growth(run):
    """Bytes of resident memory `run()` took at its peak above the start."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")           # resets VmHWM to the current resident size
    start = status("VmRSS")
    run()
    return status("VmHWM") - start


world = distributed.init(timeout_s=120)
m = model()
table = m.embedding_layers[0].tables[0]
all_keys = torch.arange(int(sys.argv[3]), dtype=torch.int64)
mine = all_keys[owner_of(all_keys, world.size) == world.rank]
if sys.argv[1] == "save":
    rows = table.find_or_insert(mine)
    table.weights[rows], table.state[rows] = values(mine)
    m.save_checkpoint(sys.argv[2])
else:
    load_peak = peak_growth(lambda: m.load_checkpoint(sys.argv[2]))
    (table,) = m.embedding_layers[0].engine.table_states()
    order = np.argsort(table.keys)
    np.testing.assert_array_equal(table.keys[order], mine.numpy())
    weights, state = values(mine)
    np.testing.assert_array_equal(table.weights[order], weights.numpy())
    np.testing.assert_array_equal(table.state[order], state.numpy())
    share = sum(a.nbytes for a in table.arrays().values())
    with open(f"{sys.argv[4]}{world.rank}.json", "w") as f:
        json.dump({"load_peak": load_peak, "share": share}, f)
