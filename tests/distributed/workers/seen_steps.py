"""Per-row sighting counts across ranks.

Usage: seen_steps.py save <dir>
           trains on common.data(seed=0) unshuffled, saves a full checkpoint
           <dir>/full, trains on common.data(seed=1), saves a delta
           <dir>/delta (base: full); rank 0 writes every rank's
           {key: seen_steps} gathered at each save to <dir>/trained.json, as
           {"full": ..., "delta": ...}
       seen_steps.py load <checkpoint> <out.json>
           loads <checkpoint> and writes every rank's {key: seen_steps}
           gathered to <out.json>
"""

import json
import sys

import common

from reckeras import distributed

world = distributed.init(timeout_s=60)
model = common.model()


def counts():
    """{key: seen_steps} of the one physical table, over all ranks."""
    table, = model.embedding_layers[0].table_states()
    merged = common.merged_over_ranks(dict(zip(table.keys.tolist(),
                                               table.seen_steps.tolist())))
    return {str(k): v for k, v in merged.items()}


def fit(seed):
    model.fit(common.data(seed=seed), batch_size=common.GLOBAL_BATCH // world.size,
              epochs=1, shuffle=False, verbose=0)


if sys.argv[1] == "save":
    root = sys.argv[2]
    fit(0)
    model.save_checkpoint(f"{root}/full")
    at_full = counts()
    fit(1)
    model.save_checkpoint(f"{root}/delta", base=f"{root}/full")
    result, out = {"full": at_full, "delta": counts()}, f"{root}/trained.json"
else:
    model.load_checkpoint(sys.argv[2])
    result, out = counts(), sys.argv[3]
if world.is_main:
    with open(out, "w") as f:
        json.dump(result, f)
distributed.barrier("rank 0 has written the counts")
