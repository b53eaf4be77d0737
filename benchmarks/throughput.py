"""Training throughput, side by side in one run: reckeras vs the baselines.

For the `dlrm` and `wide` workloads of DESIGN.md (batch 2048, Adagrad-style
optimizers), trains on the same pre-generated batches with:

* reckeras (``rk.Model.fit``) with its default ``pipeline="auto"``, and with
  the pipeline's stage threads forced on (``reckeras_pipeline_threads``) and
  off (``reckeras_no_pipeline``);
* plain Keras (one ``keras.layers.Embedding`` per field, ``model.fit``);
* plain PyTorch (one ``nn.EmbeddingBag`` per field, sparse Adagrad);
* TorchRec (``EmbeddingBagCollection`` under ``DistributedModelParallel``,
  Adagrad fused in backward), when the ``bench`` extra is installed.

Each system runs in a fresh Python process, one after another, so that none
inherits another's heap, thread pools or process-wide settings: importing
reckeras tunes glibc's malloc for the whole process (``reckeras._allocator``),
which a user of a baseline does not get (it made plain Keras ~1.6x faster on
``dlrm`` when the baselines shared reckeras's process). ``--same-process``
runs every system in this process instead, for comparison.

Every system is measured ``--repeats`` times (default 3), the systems taking
turns, and the median is reported: on a shared machine a single short run
can be off by a third.

Prints ``<workload> <system> examples_per_s=<median>`` per system and
workload (with ``#`` lines listing every run), then the ratios of reckeras
(the default) to each baseline.

    python benchmarks/throughput.py [--workloads dlrm wide] [--steps 20] [--repeats 3]
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import baselines  # noqa: E402  (selects Keras's torch backend first)
from workloads import NUM_DENSE, WORKLOADS, make_batches, to_arrow  # noqa: E402

LEARNING_RATE = baselines.LEARNING_RATE
RECKERAS_SYSTEMS = {"reckeras": "auto", "reckeras_pipeline_threads": True,
                    "reckeras_no_pipeline": False}
BASELINE_SYSTEMS = {"plain_pytorch": "pytorch", "plain_keras": "keras",
                    "torchrec": "torchrec"}      # names in baselines.BASELINES
SYSTEMS = [*RECKERAS_SYSTEMS, *BASELINE_SYSTEMS]


def reckeras_model(workload):
    """The workload's model from reckeras's public layers."""
    import reckeras as rk
    import keras
    columns = rk.layers.FeatureColumns(
        [rk.features.Numeric(f"I{i + 1}") for i in range(NUM_DENSE)]
        + [rk.features.Categorical(f"C{f + 1}", dim=workload.dim)
           for f in range(workload.num_fields)])
    if workload.interaction == "dot":
        model = rk.models.dlrm(columns, bottom_units=workload.bottom,
                               top_units=workload.top)
    else:
        inputs = columns.inputs()
        dense, sparse = columns(inputs)
        embedded = rk.layers.ShardedEmbedding(columns, output="concat")(sparse)
        bottom = rk.layers.MLP(list(workload.bottom), output_activation="relu")(dense)
        joined = keras.layers.Concatenate()([bottom, embedded])
        output = rk.layers.MLP(list(workload.top), output_activation="sigmoid")(joined)
        model = rk.Model(inputs, output)
    model.compile(optimizer=keras.optimizers.Adagrad(LEARNING_RATE),
                  loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.Adagrad(LEARNING_RATE))
    return model


def run_reckeras(workload, batches, warmup, pipeline):
    """examples/s of ``rk.Model.fit`` over the batches after ``warmup``."""
    import keras
    import torch
    keras.utils.set_random_seed(0)
    table = to_arrow(batches, workload)
    batch_size = len(batches[0][2])
    model = reckeras_model(workload)
    model.fit(table.slice(0, warmup * batch_size), batch_size=batch_size, verbose=0,
              shuffle=False, pipeline=pipeline)
    timed = table.slice(warmup * batch_size)
    started = time.perf_counter()
    model.fit(timed, batch_size=batch_size, verbose=0, shuffle=False, pipeline=pipeline)
    rate = timed.num_rows / (time.perf_counter() - started)
    if pipeline == "auto":
        print(f"# {workload.name}: pipeline='auto' ran the stages "
              f"{'in threads' if model.pipeline_stats['threads'] else 'inline'} "
              f"({len(os.sched_getaffinity(0))} usable cores, {torch.get_num_threads()} "
              f"torch threads)", flush=True)
    return rate


def measure(name, system, batch_size, steps, warmup):
    """examples/s of one system on one workload, in this process (None: not installed)."""
    import torch
    torch.set_num_threads(int(os.environ.get("RECKERAS_BENCH_THREADS", "2")))
    workload = WORKLOADS[name]
    batches = make_batches(workload, batch_size, warmup + steps)
    if system in RECKERAS_SYSTEMS:
        return run_reckeras(workload, batches, warmup, RECKERAS_SYSTEMS[system])
    measured = baselines.BASELINES[BASELINE_SYSTEMS[system]](workload, batches, warmup)
    return None if measured is None else measured.examples_per_s


def measure_in_fresh_process(name, system, batch_size, steps, warmup):
    """``measure`` in a new Python process; its ``#`` lines are passed on."""
    command = [sys.executable, os.path.abspath(__file__), "--one", name, system,
               "--batch", str(batch_size), "--steps", str(steps), "--warmup", str(warmup)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{name} {system} failed:\n{result.stderr[-3000:]}")
    rate = None
    for line in result.stdout.splitlines():
        if line.startswith("#"):
            print(line, flush=True)
        elif line.startswith("rate="):
            rate = None if line == "rate=None" else float(line[len("rate="):])
    return rate


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workloads", nargs="+", default=["dlrm", "wide"])
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=None,
                        help="timed steps (default 30 for dlrm, 20 for wide)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3,
                        help="measurements per system; the median is reported")
    parser.add_argument("--same-process", action="store_true",
                        help="run every system in this process")
    parser.add_argument("--one", nargs=2, metavar=("WORKLOAD", "SYSTEM"),
                        help=argparse.SUPPRESS)     # one measurement, for the parent
    args = parser.parse_args()
    if args.one:
        print(f"rate={measure(*args.one, args.batch, args.steps, args.warmup)}", flush=True)
        return
    run = measure if args.same_process else measure_in_fresh_process
    results = {}
    for name in args.workloads:
        steps = args.steps or (30 if name == "dlrm" else 20)
        runs = {system: [] for system in SYSTEMS}
        for _ in range(args.repeats):            # the systems take turns
            for system in SYSTEMS:
                runs[system].append(run(name, system, args.batch, steps, args.warmup))
        for system, rates in runs.items():
            if None in rates:
                results[name, system] = None
                print(f"{name} {system} skipped (not installed)", flush=True)
                continue
            results[name, system] = statistics.median(rates)
            print(f"# {name} {system} runs: " + " ".join(f"{r:.0f}" for r in rates))
            print(f"{name} {system} examples_per_s={results[name, system]:.0f}", flush=True)
    for name in args.workloads:
        ours = results[name, "reckeras"]
        for system in BASELINE_SYSTEMS:
            if results.get((name, system)):
                print(f"{name} reckeras/{system}={ours / results[name, system]:.2f}")


if __name__ == "__main__":
    main()
