"""Delta chains across world sizes.

Usage: checkpoint_chain.py save <dir>
           trains three epochs (the lifecycle frees rows between saves), with
           a full checkpoint <dir>/full1 after the first, deltas <dir>/delta2
           (base full1) and <dir>/delta3 (base delta2) and a full <dir>/full3
           after the third
       checkpoint_chain.py extend <chain> <dir>
           loads the chain ending at <chain>, trains an epoch and saves a
           delta <dir>/delta4 (base <chain>) and a full <dir>/full4
       checkpoint_chain.py truncated <chain> <out-prefix>
           trains an epoch; rank 0 truncates the last table file of <chain>
           (a delta); every rank loads it and writes <out-prefix><rank>.json
           with the error, its message and whether the model is unchanged
       checkpoint_chain.py compare <chain> <full> <out.json>
           loads <chain>, gathers every rank's rows (each key on one rank
           only) and the dense weights; loads <full>, gathers again; rank 0
           writes whether the two are equal, bit for bit, with the rows compared
"""

import json
import os
import sys

import torch.distributed as dist

import common
import numpy as np

from reckeras import distributed

os.environ["RK_TEST_LIFECYCLE"] = "1"
world = distributed.init(timeout_s=60)
model = common.model()
batch = common.GLOBAL_BATCH // world.size


def fit(seed):
    model.fit(common.data(seed=seed), batch_size=batch, epochs=1, seed=3, verbose=0)


def snapshot():
    tables = common.gathered_tables(model)
    dense = [v.numpy().copy() for v in model.variables + model.optimizer.variables]
    return tables, dense


mode = sys.argv[1]
if mode == "save":
    root = sys.argv[2]
    fit(0)
    model.save_checkpoint(f"{root}/full1")
    fit(1)
    model.save_checkpoint(f"{root}/delta2", base=f"{root}/full1")
    fit(2)
    model.save_checkpoint(f"{root}/delta3", base=f"{root}/delta2")
    model.save_checkpoint(f"{root}/full3")
elif mode == "extend":
    chain, root = sys.argv[2], sys.argv[3]
    model.load_checkpoint(chain)
    fit(3)
    model.save_checkpoint(f"{root}/delta4", base=chain)
    model.save_checkpoint(f"{root}/full4")
elif mode == "truncated":
    chain, out = sys.argv[2:4]
    fit(4)
    index = json.load(open(f"{chain}/index.json"))
    target = f"{chain}/{index['table_files'][-1]}"
    if world.is_main:
        os.truncate(target, os.path.getsize(target) * 2 // 3)
    dist.barrier()
    before = snapshot()
    try:
        model.load_checkpoint(chain)
        error, message = None, ""
    except Exception as caught:  # noqa: BLE001 -- the test checks which
        error, message = type(caught).__name__, str(caught)
    after = snapshot()
    unchanged = sorted(before[0]) == sorted(after[0]) and all(
        sorted(before[0][d]) == sorted(after[0][d]) and all(
            np.array_equal(before[0][d][k][0], after[0][d][k][0]) for k in before[0][d])
        for d in before[0]) and all(np.array_equal(a, b) for a, b in zip(before[1], after[1]))
    with open(f"{out}{world.rank}.json", "w") as f:
        json.dump({"file": target, "error": error, "message": message,
                   "unchanged": bool(unchanged)}, f)
else:
    chain, full, out = sys.argv[2:5]
    report = model.load_checkpoint(chain)
    (chained, chained_dense), ranks_rows = snapshot(), model.embedding_stats()
    model.load_checkpoint(full)
    fulls, full_dense = snapshot()
    same = sorted(chained) == sorted(fulls) and all(
        sorted(chained[d]) == sorted(fulls[d]) and all(
            np.array_equal(chained[d][k][0], fulls[d][k][0])
            and np.array_equal(chained[d][k][1], fulls[d][k][1]) for k in fulls[d])
        for d in fulls) and all(np.array_equal(a, b) for a, b in zip(chained_dense, full_dense))
    rows_per_rank = [sum(t["rows"] for t in s["tables"])
                     for layer in ranks_rows.values() for s in layer["per_rank"]]
    if world.is_main:
        with open(out, "w") as f:
            json.dump({"same": bool(same), "links": len(report.chain),
                       "rows": sum(len(rows) for rows in fulls.values()),
                       "rows_per_rank": rows_per_rank}, f)
