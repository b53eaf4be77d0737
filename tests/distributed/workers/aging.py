"""Aging out by windows on every rank: the model and windows of
tests/pipeline/test_aging.py, trained by fit_windows with a full checkpoint
after window 0, a delta after window 2 (<dir>/<storage>-delta2) and, after
window 3, a delta and a full; both deltas' base is the first full. Rank 0
writes, per storage, the History's row counts, every rank's keys gathered,
and whether the delta's chain loads to the full's rows and weights, to
<out.json>.

Usage: aging.py <dir> <out.json>
       aging.py resume <dir> <out.json>
           per storage, loads <dir>/<storage>-delta2 into a fresh model, trains
           on window 3 and writes the History's row counts and every rank's
           keys gathered, to <out.json>
"""

import json
import sys
from pathlib import Path

import common  # sits beside this file; selects the backend first

import numpy as np

from reckeras import distributed

sys.path.insert(0, str(Path(__file__).parents[2] / "pipeline"))
from test_aging import BATCH, build, window_table  # noqa: E402

resume = sys.argv[1] == "resume"
directory, out_path = Path(sys.argv[1 + resume]), sys.argv[2 + resume]
world = distributed.init(timeout_s=60)


def gathered(model):
    """{key: (row, state)} over all ranks."""
    layer, = model.embedding_layers
    table = layer.table_states()[0]
    return common.merged_over_ranks({int(k): (w.tolist(), s.tolist()) for k, w, s in zip(
        table.keys, table.weights, table.state)})


def counts(*histories):
    return [list(row) for history in histories for row in zip(
        *(history.history[name] for name in ("rows_added", "rows_evicted", "rows_kept")))]


results = {}
windows = [window_table(w) for w in range(4)]
for storage in ("device", "host_cached"):
    model = build(storage)
    if resume:
        model.load_checkpoint(directory / f"{storage}-delta2")
        history = model.fit_windows(windows[3:], batch_size=BATCH // world.size, verbose=0,
                                    shuffle=False)
        results[storage] = {"counts": counts(history), "keys": sorted(gathered(model))}
        continue
    first = model.fit_windows(windows[:1], batch_size=BATCH // world.size, verbose=0,
                              shuffle=False)
    model.save_checkpoint(directory / f"{storage}-full0")
    rest = model.fit_windows(windows[1:3], batch_size=BATCH // world.size, verbose=0,
                             shuffle=False)
    model.save_checkpoint(directory / f"{storage}-delta2",
                          base=directory / f"{storage}-full0")
    last = model.fit_windows(windows[3:], batch_size=BATCH // world.size, verbose=0,
                             shuffle=False)
    model.save_checkpoint(directory / f"{storage}-delta", base=directory / f"{storage}-full0")
    model.save_checkpoint(directory / f"{storage}-full3")
    held = gathered(model)
    from_delta, from_full = build(storage), build(storage)
    from_delta.load_checkpoint(directory / f"{storage}-delta")
    from_full.load_checkpoint(directory / f"{storage}-full3")
    same_weights = all(np.array_equal(a, b) for a, b in
                       zip(from_delta.get_weights(), from_full.get_weights()))
    results[storage] = {
        "counts": counts(first, rest, last),
        "keys": sorted(held),
        "delta_equals_full": gathered(from_delta) == gathered(from_full) == held
        and same_weights}
if world.is_main:
    with open(out_path, "w") as f:
        json.dump(results, f)
distributed.barrier("rank 0 has written the results")
