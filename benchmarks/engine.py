"""Distributed embedding engine benchmark (CPU, gloo, one machine).

Prints, on Zipf ids of the DESIGN's `dlrm` shape (26 fields, batch per rank
--batch):

1. lookup+update throughput (examples/s over all ranks) for world sizes 1, 2
   and 4 (flat exchange);
2. rows and requests per rank and their imbalance (max/mean);
3. bytes sent between nodes on the same batches, with 2 simulated nodes x 2
   ranks, for Zipf exponents 1.05, 1.2 and 1.5, by three exchanges:

   * ``plain_flat``: every id of the batch travels to its owner and its row
     (then its gradient) comes back, as a flat all-to-all without dedup does
     (TorchRec's row-wise input dist); counted from the batches, with the same
     byte model as the engine (an 8-byte key, then a row and a gradient);
   * ``flat``: reckeras's flat exchange, which deduplicates each rank's ids
     first (measured);
   * ``hierarchical``: also deduplicates across the ranks of a node before
     anything crosses nodes (measured).

   The hierarchical gain over ``flat`` is the share of a node's unique remote
   ids that both of its ranks request. With 2 ranks per node it is bounded by
   how often a rank's ids recur on its neighbour: on this data the expected
   value (sum over ids of P(in either batch) vs twice P(in one)) is 0.15,
   0.19 and 0.25 for the three exponents, whatever the batch size.

4. the same at the default exponent with 2 simulated nodes x 4 ranks: more
   ranks share a node, so more of a node's requests overlap and the
   hierarchical gain over ``flat`` grows.

The last line is ``hierarchical_internode_bytes_reduction=<fraction>``
against ``flat`` (the stronger baseline) with 2 nodes x 2 ranks at the
default exponent (--zipf, 1.2).

    python benchmarks/engine.py [--steps 6] [--batch 2048] [--zipf 1.2]
"""

import argparse
import datetime
import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

VOCABS = [100_000] * 8 + [10_000] * 10 + [100] * 8
DIM = 16


def zipf_batch(batch, rank, step, exponent):
    generator = torch.Generator().manual_seed(1000 * step + rank)
    columns = []
    for vocab in VOCABS:
        # Zipf over the vocabulary by inverse-CDF sampling of ranks.
        weights = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64) ** exponent
        cdf = torch.cumsum(weights, 0)
        u = torch.rand(batch, generator=generator, dtype=torch.float64) * cdf[-1]
        columns.append(torch.searchsorted(cdf, u))
    return torch.stack(columns, dim=1)


def build(batch):
    import reckeras as rk
    from reckeras.embedding.engine import EmbeddingEngine
    from reckeras.embedding.packing import PackingPlan
    from reckeras.features.plan import TransformPlan
    specs = [rk.features.Categorical(f"C{i}", dim=DIM) for i in range(len(VOCABS))]
    plan = TransformPlan(specs)
    engine = EmbeddingEngine(PackingPlan(plan.slots, plan.sparse_in_declaration_order))
    engine.set_optimizer(rk.optimizers.RowWiseAdagrad(0.05))
    return plan, engine


def plain_flat_internode_bytes(plan, engine, ids, rank, world, ranks_per_node):
    """What a flat all-to-all without dedup would send between nodes."""
    from reckeras.backend_kernels.hashing import table_keys
    from reckeras.embedding.sharding import owner_of
    packed = plan.packed_sparse({f"C{i}": ids[:, i] for i in range(ids.shape[1])})
    batch = ids.shape[0]
    keys = table_keys(packed["ids"], engine.packing.slot_salt,
                      packed["offsets"][::batch].diff())
    remote = owner_of(keys, world) // ranks_per_node != rank // ranks_per_node
    key_bytes, row_bytes = 8, DIM * 4
    return int(remote.sum()) * (key_bytes + 2 * row_bytes)   # key, row, gradient


def sparse_step(plan, engine, ids):
    packed = plan.packed_sparse({f"C{i}": ids[:, i] for i in range(ids.shape[1])})
    (pooled, _), = engine.lookup(packed["ids"], packed["offsets"], training=True)
    pooled.backward(torch.ones_like(pooled))


def worker(rank, world, store_path, args, ranks_per_node, hierarchical, results):
    os.environ.update(WORLD_SIZE=str(world), RANK=str(rank),
                      RECKERAS_RANKS_PER_NODE=str(ranks_per_node))
    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank,
                                world_size=world,
                                timeout=datetime.timedelta(seconds=300))
    from reckeras import distributed
    distributed.init(ranks_per_node=ranks_per_node, hierarchical=hierarchical)
    plan, engine = build(args.batch)
    batches = [zipf_batch(args.batch, rank, step, args.zipf)
               for step in range(args.steps + 1)]
    sparse_step(plan, engine, batches[0])                  # warm up, create rows
    if world > 1:
        dist.barrier()
    router = engine.connect()
    bytes_before = router.internode_bytes if router else 0
    started = time.perf_counter()
    for ids in batches[1:]:
        sparse_step(plan, engine, ids)
    if world > 1:
        dist.barrier()
    elapsed = time.perf_counter() - started
    table = engine.tables[0]
    plain_flat = sum(plain_flat_internode_bytes(plan, engine, ids, rank, world,
                                                ranks_per_node) for ids in batches[1:])
    results[rank] = {"elapsed": elapsed, "rows": table.num_rows,
                     "plain_flat_internode_bytes": plain_flat,
                     "requests": engine.requests,
                     "internode_bytes": (router.internode_bytes - bytes_before)
                     if router else 0}
    if world > 1:
        dist.destroy_process_group()


def run(world, args, ranks_per_node=None, hierarchical=False):
    ranks_per_node = ranks_per_node or world
    with tempfile.TemporaryDirectory() as tmp:
        manager = mp.Manager()
        results = manager.dict()
        mp.spawn(worker, args=(world, os.path.join(tmp, "store"), args, ranks_per_node,
                               hierarchical, results), nprocs=world, join=True)
        return [results[r] for r in range(world)]


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--zipf", type=float, default=1.2)
    args = parser.parse_args()
    from reckeras.embedding.sharding import imbalance

    print(f"sparse lookup+update, dlrm shape ({len(VOCABS)} fields, dim {DIM}), "
          f"batch {args.batch} per rank, {args.steps} steps, Zipf {args.zipf}")
    for world in (1, 2, 4):
        results = run(world, args)
        seconds = max(r["elapsed"] for r in results)
        rate = world * args.batch * args.steps / seconds
        print(f"world={world} examples_per_s={rate:,.0f}")
        if world == 4:
            rows = [r["rows"] for r in results]
            requests = [r["requests"] for r in results]
            print(f"world=4 rows_per_rank={rows} imbalance={imbalance(rows):.3f}")
            print(f"world=4 requests_per_rank={requests} "
                  f"imbalance={imbalance(requests):.3f}")
    reduction = {}
    for exponent in sorted({1.05, 1.5, args.zipf}):
        setting = argparse.Namespace(**{**vars(args), "zipf": exponent})
        reduction[exponent] = compare_exchanges(setting, ranks_per_node=2)
    compare_exchanges(args, ranks_per_node=4)
    print(f"hierarchical_internode_bytes_reduction={reduction[args.zipf]:.3f}")


def compare_exchanges(args, ranks_per_node, nodes=2):
    """Prints the inter-node bytes of the three exchanges on the same
    batches; returns the hierarchical reduction against ``flat``."""
    world = nodes * ranks_per_node
    flat = run(world, args, ranks_per_node=ranks_per_node, hierarchical=False)
    hierarchical = run(world, args, ranks_per_node=ranks_per_node, hierarchical=True)
    plain_bytes = sum(r["plain_flat_internode_bytes"] for r in flat)
    flat_bytes = sum(r["internode_bytes"] for r in flat)
    hier_bytes = sum(r["internode_bytes"] for r in hierarchical)
    reduction = 1 - hier_bytes / flat_bytes
    print(f"{nodes} nodes x {ranks_per_node} ranks, Zipf {args.zipf}: internode_bytes "
          f"plain_flat={plain_bytes:,} flat={flat_bytes:,} "
          f"hierarchical={hier_bytes:,}; hierarchical reduction "
          f"vs flat={reduction:.3f} vs plain_flat={1 - hier_bytes / plain_bytes:.3f}",
          flush=True)
    return reduction

if __name__ == "__main__":
    main()
