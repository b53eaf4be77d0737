"""Tiered embedding storage benchmark: a device cache of hot rows over host tables.

One physical table (``--fields`` fields of ``--vocab`` ids each, dim 16,
RowWiseAdagrad) trained by sparse lookup+update steps on Zipf ids, with the
cache prefetch of batch i+1 running in a pipeline thread while batch i
computes, as ``rk.Model.fit`` runs it. For Zipf exponents 1.05 and 1.2 it
prints, side by side in one run, the all-on-device table and caches of 1%, 5%
and 20% of the vocabulary:

* ``hit_rate``: fraction of id lookups served by rows already cached before
  their batch asked for them (rows a prefetch loaded for the batch count as
  misses);
* ``unique_hit_rate``: the same over the batch's distinct rows;
* ``rows_in``/``rows_out`` per step: rows loaded from / written back to the
  host tier; ``stall_ms`` per step: time the step waited for the cache;
* ``examples_per_s`` of the measured steps.

Every run first trains ``--warmup`` steps (rows are created, the cache and its
counts warm up), then measures ``--steps`` steps. On a CUDA machine it also
trains, end to end, a table larger than the device memory this process may
use (``--device-limit-gib``), with 5% of it cached on the device.

The last line is ``hit_rate_5pct_zipf1.2=<fraction>``.

    python benchmarks/cache.py [--vocab 250000] [--fields 4] [--batch 2048]
                               [--warmup 200] [--steps 100] [--policy lfu]
                               [--threads 1]
"""

import argparse
import time

import torch

DIM = 16
EXPONENTS = (1.05, 1.2)
FRACTIONS = (0.01, 0.05, 0.20)


def zipf_batches(count, batch, fields, vocab, exponent, seed=0):
    """``count`` int64 ``[batch, fields]`` id batches, Zipf over ``vocab`` per field."""
    generator = torch.Generator().manual_seed(seed)
    weights = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64) ** exponent
    cdf = torch.cumsum(weights, 0)
    # A different popular set per field: rank r of field f is id perm_f[r].
    perms = [torch.randperm(vocab, generator=generator) for _ in range(fields)]
    out = []
    for _ in range(count):
        u = torch.rand(batch, fields, generator=generator, dtype=torch.float64) * cdf[-1]
        ranks = torch.searchsorted(cdf, u).clamp(max=vocab - 1)
        out.append(torch.stack([perms[f][ranks[:, f]] for f in range(fields)], dim=1))
    return out


def build(fields, cache_rows, device=None, policy="lfu"):
    import reckeras as rk
    from reckeras.embedding.engine import EmbeddingEngine
    from reckeras.embedding.packing import PackingPlan
    from reckeras.features.plan import TransformPlan
    specs = [rk.features.Categorical(f"C{i}", dim=DIM) for i in range(fields)]
    options = {} if cache_rows is None else {
        s.name: rk.embedding.TableOptions(storage="host_cached", cache_policy=policy,
                                          cache_rows=cache_rows // fields)
        for s in specs}
    plan = TransformPlan(specs)
    engine = EmbeddingEngine(PackingPlan(plan.slots, plan.sparse_in_declaration_order,
                                         options), device=device)
    engine.set_optimizer(rk.optimizers.RowWiseAdagrad(0.05))
    return plan, engine


def train(plan, engine, batches, device="cpu"):
    """Runs the steps with the cache prefetch one batch ahead; returns seconds."""
    from reckeras.pipeline.prefetch import Pipeline

    def pack(ids):
        ids = ids.to(device)
        return plan.packed_sparse({f"C{i}": ids[:, i] for i in range(ids.shape[1])})

    def prefetch(packed):
        engine.prefetch(packed["ids"], packed["offsets"])
        return packed

    started = time.perf_counter()
    with Pipeline(batches, [("pack", pack), ("cache_prefetch", prefetch)],
                  depth=1) as items:
        for packed in items:
            (pooled, _), = engine.lookup(packed["ids"], packed["offsets"], training=True)
            pooled.backward(torch.ones_like(pooled))
    if device != "cpu":
        torch.cuda.synchronize()
    return time.perf_counter() - started


def measure(args, exponent, fraction):
    """Figures of one table setting (``fraction`` None: all rows on the device)."""
    total = args.vocab * args.fields
    cache_rows = None if fraction is None else int(total * fraction)
    plan, engine = build(args.fields, cache_rows, policy=getattr(args, "policy", "lfu"))
    batches = zipf_batches(args.warmup + args.steps, args.batch, args.fields,
                           args.vocab, exponent)
    train(plan, engine, batches[:args.warmup])
    cache = engine.caches[0]
    before = dict(cache.counters) if cache else None
    stall = cache.stall_s if cache else 0.0
    seconds = train(plan, engine, batches[args.warmup:])
    figures = {"rows": engine.tables[0].num_rows,
               "examples_per_s": args.batch * args.steps / seconds}
    if cache:
        c = {k: v - before[k] for k, v in cache.counters.items()}
        figures.update(
            cache_rows=cache.capacity, hit_rate=c["hits"] / c["lookups"],
            unique_hit_rate=c["unique_hits"] / c["unique_lookups"],
            rows_in=c["rows_in"] / c["steps"], rows_out=c["rows_out"] / c["steps"],
            stall_ms=1000 * (cache.stall_s - stall) / c["steps"])
    return figures


def larger_than_device(args):
    """CUDA only: a host table larger than the device memory this process may
    use, trained end to end through a cache of 5% of its rows."""
    import reckeras as rk
    from reckeras.backend_kernels.hashing import table_keys
    total = torch.cuda.get_device_properties(0).total_memory
    limit = int(args.device_limit_gib * 2**30)
    torch.cuda.set_per_process_memory_fraction(limit / total)
    row_bytes = 4 * (DIM + rk.optimizers.RowWiseAdagrad(0.05).state_width(DIM))
    rows = int(1.5 * limit / row_bytes)
    plan, engine = build(1, rows // 20, device="cuda")
    table = engine.tables[0]
    # The host tier is filled directly: creating rows one batch at a time
    # would take hours at this size.
    keys = table_keys(torch.arange(rows), engine.packing.slot_salt, torch.tensor([rows]))
    table.load({"keys": keys.numpy(), "weights": torch.zeros(rows, DIM).numpy(),
                "state": torch.zeros(rows, table.state.shape[1]).numpy()})
    host_gib = table.index.memory_bytes() / 2**30
    batches = zipf_batches(args.steps, args.batch * args.fields, 1, rows, 1.2)
    seconds = train(plan, engine, batches, device="cuda")
    stats = engine.caches[0].stats()
    print(f"cuda: host table {rows:,} rows ({host_gib:.1f} GiB with its index) > "
          f"device limit {args.device_limit_gib} GiB; cache {stats['cache_rows']:,} rows "
          f"hit_rate={stats['hit_rate']:.3f} "
          f"examples_per_s={args.batch * args.fields * args.steps / seconds:,.0f} "
          f"max_device_allocated_gib={torch.cuda.max_memory_allocated() / 2**30:.2f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--vocab", type=int, default=250_000, help="ids per field")
    parser.add_argument("--fields", type=int, default=4)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--policy", choices=("lfu", "lru"), default="lfu")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads of each Python thread")
    parser.add_argument("--device-limit-gib", type=float, default=2.0,
                        help="CUDA only: device memory this process may use")
    args = parser.parse_args()
    # With one shared OpenMP pool, the prefetch thread's small ops wait on
    # workers the step keeps spinning (and back): ~40x slower steps on 2 cores.
    torch.set_num_threads(args.threads)
    print(f"host_cached table: {args.fields} fields x {args.vocab:,} Zipf ids, dim {DIM}, "
          f"{args.policy.upper()} cache, RowWiseAdagrad, batch {args.batch}, "
          f"{args.warmup} warm-up + {args.steps} measured steps, prefetch one batch "
          f"ahead (thread)")
    hit_rates = {}
    for exponent in EXPONENTS:
        for fraction in (None, *FRACTIONS):
            f = measure(args, exponent, fraction)
            label = "all-on-device" if fraction is None else f"cache {fraction:.0%}"
            line = f"zipf={exponent} {label:>13}: examples_per_s={f['examples_per_s']:,.0f}"
            if fraction is not None:
                hit_rates[exponent, fraction] = f["hit_rate"]
                line += (f" cache_rows={f['cache_rows']:,} hit_rate={f['hit_rate']:.3f} "
                         f"unique_hit_rate={f['unique_hit_rate']:.3f} "
                         f"rows_in/step={f['rows_in']:,.0f} "
                         f"rows_out/step={f['rows_out']:,.0f} "
                         f"stall_ms/step={f['stall_ms']:.1f}")
            print(line + f" table_rows={f['rows']:,}", flush=True)
    if torch.cuda.is_available():
        larger_than_device(args)
    print(f"hit_rate_5pct_zipf1.2={hit_rates[1.2, 0.05]:.4f}")


if __name__ == "__main__":
    main()
