"""fit_windows on the common model over three days of the common data,
which rank 0 writes below a directory (`dt=*/part-0.parquet`): once over the
dataset's windows, once over the same days in memory, then with rank 1 given
one day fewer. Every rank writes its histories and the mismatch error as
JSON to `<out>.rank<r>.json`."""

import json
import sys
from pathlib import Path

import common  # noqa: E402  (sits beside this file)

import reckeras as rk
from reckeras import distributed

import pyarrow.parquet as pq  # noqa: E402

DATES = ["2026-12-01", "2026-12-02", "2026-12-03"]

out_path, root = sys.argv[1], Path(sys.argv[2])
world = distributed.init(timeout_s=60)
if world.is_main:
    for day, date in enumerate(DATES):
        (root / f"dt={date}").mkdir(parents=True)
        pq.write_table(common.data(rows=384, seed=day),
                       root / f"dt={date}" / "part-0.parquet", row_group_size=100)
distributed.barrier("rank 0 has written the days")
batch_size = common.GLOBAL_BATCH // world.size
days = rk.datasets.from_parquet(root).windows("dt")
on_files = common.model().fit_windows(days, batch_size=batch_size, seed=3, verbose=0)
in_memory = common.model().fit_windows([day.to_table() for day in days],
                                       batch_size=batch_size, seed=3, verbose=0)
try:
    common.model().fit_windows(days[:-1] if world.rank == 1 else days,
                               batch_size=batch_size, verbose=0)
    mismatch = None
except RuntimeError as error:
    mismatch = str(error)
with open(f"{out_path}.rank{world.rank}.json", "w") as f:
    json.dump({"files": on_files.history, "memory": in_memory.history,
               "mismatch": mismatch}, f)
distributed.barrier("every rank's history is written")
