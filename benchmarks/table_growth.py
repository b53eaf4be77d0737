"""One embedding table grown to 10^8 rows in training steps: memory and stalls.

Trains one `dim`-16 table with row-wise Adagrad through the engine (the
lookup and the sparse update of a training step, as `ShardedEmbedding` runs
them; no dense network), each step `--new` ids never seen before and
`--seen` ids drawn from those already held, until the table holds
`--rows` rows. Every `--report-every` rows it prints:

* the bytes per row the table reports (`embedding_stats`' `bytes_by_part`:
  rows, optimizer state, keys, change tracking, hash index), and their
  total against the row and its state alone (`dim * 4 + 4` bytes);
* the process's resident memory per row now and at its peak (ru_maxrss),
  above what it held before the table had rows;
* the step time's p50, p99 and max over the steps so far.

The last lines are `bytes_per_row_ratio=` (steady state, table-reported),
`peak_bytes_per_row_ratio=` (peak RSS per row over rows + state) and
`p99_over_p50=` (step times over the whole growth). Targets (issue 25): at
most 1.3, 1.4 and 3.

    python benchmarks/table_growth.py [--rows 100000000] [--new 200000]
        [--seen 50000] [--report-every 10000000] [--threads 2]
        [--index compact|hash]

`--index` is the table's key index (`TableOptions(index=...)`, default
`compact`, the one built for this size; `hash` is the default of a table).

10^8 rows need ~11 GB of memory and take about 15 minutes on 2 cores.
"""

import argparse
import resource
import time

import numpy as np
import torch

DIM = 16


def build(index):
    """The engine of one Categorical feature of dim `DIM`, row-wise Adagrad,
    its table's key index `index`."""
    import reckeras as rk
    from reckeras.embedding.engine import EmbeddingEngine
    from reckeras.embedding.packing import PackingPlan
    from reckeras.features.plan import TransformPlan
    plan = TransformPlan([rk.features.Categorical("item", dim=DIM)])
    engine = EmbeddingEngine(PackingPlan(
        plan.slots, plan.sparse_in_declaration_order,
        table_options={"item": rk.embedding.TableOptions(index=index)}), device="cpu")
    engine.set_optimizer(rk.optimizers.RowWiseAdagrad(0.05))
    return plan, engine


def resident_bytes():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


def peak_resident_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # KiB on Linux


def step(plan, engine, ids):
    packed = plan.packed_sparse({"item": ids})
    (pooled, _), = engine.lookup(packed["ids"], packed["offsets"], training=True)
    pooled.backward(torch.ones_like(pooled))


def report(rows, parts, base, times, row_and_state):
    total = sum(parts.values())
    split = "  ".join(f"{name} {value / rows:.1f}" for name, value in parts.items())
    now = (resident_bytes() - base) / rows
    peak = (peak_resident_bytes() - base) / rows
    p50, p99 = np.percentile(times, [50, 99])
    print(f"| {rows:,} | {total / rows:.1f} ({total / rows / row_and_state:.2f}x) | "
          f"{split} | {now:.1f} | {peak:.1f} | {p50 * 1e3:.1f} | {p99 * 1e3:.1f} | "
          f"{max(times) * 1e3:.0f} |", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000_000)
    parser.add_argument("--new", type=int, default=200_000)
    parser.add_argument("--seen", type=int, default=50_000)
    parser.add_argument("--report-every", type=int, default=10_000_000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--index", default="compact", choices=("hash", "compact"),
                        help="the table's key index (TableOptions.index)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    plan, engine = build(args.index)
    row_and_state = DIM * 4 + 4            # float32 row + one row-wise Adagrad value
    generator = torch.Generator().manual_seed(0)
    # Distinct ids in a shuffled order, spread over the int64 range.
    base = resident_bytes()
    print(f"one table, dim {DIM}, row-wise Adagrad, index {args.index!r}; {args.new:,} new "
          f"and {args.seen:,} "
          f"seen ids a step, to {args.rows:,} rows; rows + state = {row_and_state} "
          f"bytes a row")
    print("| rows | table bytes/row | by part (bytes/row) | RSS/row now | RSS/row peak | "
          "p50 ms | p99 ms | max ms |")
    print("|---|---|---|---|---|---|---|---|")
    times, held, next_report = [], 0, args.report_every
    while held < args.rows:
        new = torch.arange(held, held + args.new, dtype=torch.int64) * 6364136223846793005
        seen = torch.randint(0, max(held, 1), (args.seen,), generator=generator) \
            * 6364136223846793005 if held else new[:0]
        ids = torch.cat([new, seen])
        started = time.perf_counter()
        step(plan, engine, ids)
        times.append(time.perf_counter() - started)
        held = engine.tables[0].num_rows
        if held >= next_report or held >= args.rows:
            table = engine.stats()["tables"][0]
            report(held, table["bytes_by_part"], base, times, row_and_state)
            next_report += args.report_every
    table = engine.stats()["tables"][0]
    p50, p99 = np.percentile(times, [50, 99])
    print(f"bytes_per_row_ratio={table['bytes'] / held / row_and_state:.3f}")
    print(f"peak_bytes_per_row_ratio="
          f"{(peak_resident_bytes() - base) / held / row_and_state:.3f}")
    print(f"p99_over_p50={p99 / p50:.2f}")


if __name__ == "__main__":
    main()
