"""Distributed training throughput with and without the pipeline's stage
threads (and so the sparse-dist stage), on one machine with gloo.

Launches ``--nproc`` ranks with torchrun; every rank trains the DESIGN
workload's reckeras model with ``fit(pipeline=True)`` (stage threads,
including ``sparse_dist``: the next batch's id all-to-all beside the running
step) and ``fit(pipeline=False)`` (every stage inline, the keys routed inside
the step), taking turns, ``--repeats`` times each. Prints the median
examples/s over all ranks per setting, the ``sparse_dist`` stage's busy time
per step, and the ratio.

    python benchmarks/distributed_fit.py [--workload dlrm] [--nproc 2] [--batch 1024]
"""

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(args):
    import torch

    import reckeras as rk
    from throughput import reckeras_model
    from workloads import WORKLOADS, make_batches, to_arrow
    world = rk.distributed.init()
    workload = WORKLOADS[args.workload]
    global_batch = args.batch * world.size
    batches = make_batches(workload, global_batch, args.warmup + args.steps)
    table = to_arrow(batches, workload)
    warm, timed = table.slice(0, args.warmup * global_batch), \
        table.slice(args.warmup * global_batch)
    model = reckeras_model(workload)
    rates = {True: [], False: []}
    busy = []
    for _ in range(args.repeats):
        for pipeline in (True, False):
            model.fit(warm, batch_size=args.batch, verbose=0, shuffle=False,
                      pipeline=pipeline)
            torch.distributed.barrier()
            started = time.perf_counter()
            model.fit(timed, batch_size=args.batch, verbose=0, shuffle=False,
                      pipeline=pipeline)
            torch.distributed.barrier()
            rates[pipeline].append(timed.num_rows / (time.perf_counter() - started))
            if pipeline:
                stats = model.pipeline_stats
                busy.append(stats["sparse_dist"]["busy_s"] / stats["step"]["items"])
    if world.is_main:
        on, off = statistics.median(rates[True]), statistics.median(rates[False])
        print(f"# runs pipeline=True {[round(r) for r in rates[True]]} "
              f"pipeline=False {[round(r) for r in rates[False]]}")
        print(f"{args.workload} ranks={world.size} batch_per_rank={args.batch} "
              f"sparse_dist_busy_ms_per_step={1000 * statistics.median(busy):.1f}")
        print(f"{args.workload} pipeline=True examples_per_s={on:.0f}")
        print(f"{args.workload} pipeline=False examples_per_s={off:.0f}")
        print(f"{args.workload} pipeline_speedup={on / off:.3f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workload", default="dlrm", choices=["dlrm", "wide"])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1024, help="examples per rank")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank:
        rank_main(args)
        return
    threads = max(1, len(os.sched_getaffinity(0)) // args.nproc)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={args.nproc}", f"--master_port={free_port()}",
               os.path.abspath(__file__), "--rank", *sys.argv[1:]]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    subprocess.run(command, check=True, env=env)


if __name__ == "__main__":
    main()
