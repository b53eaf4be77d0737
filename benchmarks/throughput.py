"""Training throughput, side by side in one run: reckeras vs the baselines.

For the `dlrm`, `wide` and `huge` workloads of DESIGN.md (batch 2048,
Adagrad-style optimizers), trains on the same pre-generated batches with:

* reckeras (`rk.Model.fit`) with its default `pipeline="auto"`, and with
  the pipeline's stage threads forced on (`reckeras_pipeline_threads`) and
  off (`reckeras_no_pipeline`); the model is written as a user writes it:
  `FeatureColumns`, `ShardedEmbedding`, `keras.layers.Dense`, and
  `rk.layers.DotInteraction` for `dlrm`;
* plain Keras (one `keras.layers.Embedding` per field, `model.fit`);
* plain PyTorch (one `nn.EmbeddingBag` per field, sparse Adagrad);
* TorchRec (`EmbeddingBagCollection` under `DistributedModelParallel`,
  Adagrad fused in backward), when installed (`bash scripts/install_bench.sh`).

Beside each system it measures that system's dense-only floor
(`<system>_floor`): the same model, loop and dense optimizer with the
embeddings replaced by constant inputs of their shape
(`baselines.ConstantEmbeddings` in the Keras models, a constant buffer in
the torch ones): no ids, no lookup, no sparse optimizer. The floor is
measured like the system (same batches, batch size, threads, fresh
process), so a system's step time minus its floor's is what its sparse path
costs it: its sparse overhead.

Each system runs in a fresh Python process, one after another, so that none
inherits another's heap, thread pools or process-wide settings: reckeras's
`fit` tunes glibc's malloc for the whole process (`reckeras._allocator`),
which a user of a baseline does not get (it made plain Keras ~1.6x faster on
`dlrm` when the baselines shared reckeras's process). `--same-process`
runs every system in this process instead, for comparison.

Every system is measured `--repeats` times (default 3), the systems taking
turns, and the median is reported: on a shared machine a single short run
can be off by a third. The timed steps default to 30 for `dlrm`, 20 for
`wide` and 10 for `huge` (a `huge` step takes ~0.2 s with reckeras and
several times that with plain Keras, whose dense Adagrad updates all 7.5M
rows), after `--warmup` untimed ones.

Prints `<workload> <system> examples_per_s=<median>` per system and
workload (with `#` lines listing every run), then per workload a table of
examples/s, step ms, floor and sparse overhead (step ms - floor ms) of every
system, then the ratios of reckeras (the default) to each baseline and the
machine's load average at the start and the end.

    python benchmarks/throughput.py [--workloads dlrm wide huge] [--steps N] [--repeats 3]
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
FLOOR_SUFFIX = "_floor"
# The floor each system is compared with; the reckeras variants differ only
# in how batches are prepared, so they share reckeras's floor.
FLOOR_OF = {**{system: "reckeras" + FLOOR_SUFFIX for system in RECKERAS_SYSTEMS},
            **{system: system + FLOOR_SUFFIX for system in BASELINE_SYSTEMS}}
SYSTEMS = [*RECKERAS_SYSTEMS, *BASELINE_SYSTEMS, *dict.fromkeys(FLOOR_OF.values())]


def reckeras_model(workload, floor=False):
    """The workload's model as a reckeras user writes it, compiled.

    Args:
        workload: a `workloads.Workload`.
        floor: build the dense-only floor: `baselines.ConstantEmbeddings`
            stands in for the `ShardedEmbedding` (no lookup, no embedding
            optimizer) and the FeatureColumns hold the numeric features and
            `C1` only.

    Returns:
        A compiled `rk.Model` whose inputs are the columns `I1..I13` and
        `C1..CF` (`C1` only when `floor`).
    """
    import reckeras as rk
    import keras
    specs = [rk.features.Numeric(f"I{i + 1}") for i in range(NUM_DENSE)]
    # FeatureColumns cannot be built without a sparse feature yet (its
    # symbolic call returns None for the sparse part, which Keras rejects), so
    # the floor keeps C1: its 2048 ids per step are packed, never looked up.
    specs += [rk.features.Categorical(f"C{f + 1}", dim=workload.dim)
              for f in range(1 if floor else workload.num_fields)]
    columns = rk.layers.FeatureColumns(specs)
    inputs = columns.inputs()
    dense, sparse = columns(inputs)
    stacked = workload.interaction == "dot"
    if floor:
        embedded = baselines.ConstantEmbeddings(workload.num_fields, workload.dim,
                                                flatten=not stacked)(dense)
    else:
        embedded = rk.layers.ShardedEmbedding(
            columns, output="stacked" if stacked else "concat")(sparse)
    bottom = dense
    for width in workload.bottom:
        bottom = keras.layers.Dense(width, activation="relu")(bottom)
    if stacked:
        features = rk.layers.DotInteraction()([bottom, embedded])
    else:
        features = keras.layers.Concatenate()([bottom, embedded])
    for width in workload.top[:-1]:
        features = keras.layers.Dense(width, activation="relu")(features)
    output = keras.layers.Dense(workload.top[-1], activation="sigmoid")(features)
    model = rk.Model(inputs, output)
    model.compile(optimizer=keras.optimizers.Adagrad(LEARNING_RATE),
                  loss="binary_crossentropy",
                  embedding_optimizer=None if floor else rk.optimizers.Adagrad(LEARNING_RATE))
    return model


def run_reckeras(workload, batches, warmup, pipeline, floor=False):
    """examples/s of `rk.Model.fit` over the batches after `warmup`.

    Args:
        workload: a `workloads.Workload`.
        batches: `workloads.make_batches` output for it, all of one size.
        warmup: leading batches trained by a first, untimed `fit` call.
        pipeline: `fit`'s `pipeline` argument.
        floor: train the dense-only floor model (`reckeras_model`) on the
            columns it reads only.

    Returns:
        Examples of the timed `fit` call / its wall-clock seconds.
    """
    import keras
    import torch
    keras.utils.set_random_seed(0)
    table = to_arrow(batches, workload)
    if floor:
        table = table.select([f"I{i + 1}" for i in range(NUM_DENSE)] + ["C1", "label"])
    batch_size = len(batches[0][2])
    model = reckeras_model(workload, floor)
    model.fit(table.slice(0, warmup * batch_size), batch_size=batch_size, verbose=0,
              shuffle=False, pipeline=pipeline)
    timed = table.slice(warmup * batch_size)
    started = time.perf_counter()
    model.fit(timed, batch_size=batch_size, verbose=0, shuffle=False, pipeline=pipeline)
    rate = timed.num_rows / (time.perf_counter() - started)
    if pipeline == "auto" and not floor:
        print(f"# {workload.name}: pipeline='auto' ran the stages "
              f"{'in threads' if model.pipeline_stats['threads'] else 'inline'} "
              f"({len(os.sched_getaffinity(0))} usable cores, {torch.get_num_threads()} "
              f"torch threads)", flush=True)
    return rate


def measure(name, system, batch_size, steps, warmup):
    """examples/s of one system (or floor) on one workload, in this process.

    Args:
        name: a key of `workloads.WORKLOADS`.
        system: one of `SYSTEMS`.
        batch_size: examples per step.
        steps: timed steps (None: the workload's default).
        warmup: untimed leading steps.

    Returns:
        examples/s, or None when the system is not installed.
    """
    import torch
    torch.set_num_threads(int(os.environ.get("RECKERAS_BENCH_THREADS", "2")))
    workload = WORKLOADS[name]
    if system not in SYSTEMS:
        raise ValueError(f"unknown system {system!r}; choose from {SYSTEMS}")
    floor = system.endswith(FLOOR_SUFFIX)
    base = system[:-len(FLOOR_SUFFIX)] if floor else system
    batches = make_batches(workload, batch_size, warmup + (steps or default_steps(name)))
    if base in RECKERAS_SYSTEMS:
        return run_reckeras(workload, batches, warmup, RECKERAS_SYSTEMS[base], floor)
    measured = baselines.BASELINES[BASELINE_SYSTEMS[base]](workload, batches, warmup,
                                                           floor=floor)
    return None if measured is None else measured.examples_per_s


def default_steps(name):
    """Timed steps of workload `name` when `--steps` is not given."""
    return baselines.STEPS[name][1]


def measure_in_fresh_process(name, system, batch_size, steps, warmup):
    """`measure` in a new Python process; its `#` lines are passed on."""
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


def overhead_rows(rates, batch_size):
    """Step time, floor and sparse overhead of every measured system.

    Args:
        rates: `{system: examples/s or None}` for the systems and floors of
            one workload (None: not installed).
        batch_size: examples per step.

    Returns:
        One dict per system of `FLOOR_OF` measured with its floor, in
        `FLOOR_OF`'s order: `system`, `examples_per_s`, `step_ms`,
        `floor_examples_per_s`, `floor_ms`, `sparse_ms` (step ms - floor ms).
    """
    rows = []
    for system, floor in FLOOR_OF.items():
        rate, floor_rate = rates.get(system), rates.get(floor)
        if not rate or not floor_rate:
            continue
        step_ms, floor_ms = 1e3 * batch_size / rate, 1e3 * batch_size / floor_rate
        rows.append({"system": system, "examples_per_s": rate, "step_ms": step_ms,
                     "floor_examples_per_s": floor_rate, "floor_ms": floor_ms,
                     "sparse_ms": step_ms - floor_ms})
    return rows


def print_overhead_table(name, rows):
    """Prints `overhead_rows` of workload `name` as a Markdown table."""
    print(f"\n{name}: step, dense-only floor and sparse overhead (medians)")
    print("| system | examples/s | step ms | floor examples/s | floor ms | sparse ms |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['system']} | {row['examples_per_s']:,.0f} | {row['step_ms']:.1f} | "
              f"{row['floor_examples_per_s']:,.0f} | {row['floor_ms']:.1f} | "
              f"{row['sparse_ms']:.1f} |")
    print(flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS),
                        choices=list(WORKLOADS))
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=None,
                        help="timed steps (default 30 for dlrm, 20 for wide, 10 for huge)")
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
    # Other jobs on the machine move every figure: say how busy it was.
    load_at_start = os.getloadavg()[0]
    results = {}
    for name in args.workloads:
        steps = args.steps or default_steps(name)
        runs = {system: [] for system in SYSTEMS}
        for _ in range(args.repeats):            # the systems take turns
            for system in SYSTEMS:
                runs[system].append(run(name, system, args.batch, steps, args.warmup))
        rates = {}
        for system, measured in runs.items():
            if None in measured:
                rates[system] = None
                print(f"{name} {system} skipped (not installed)", flush=True)
                continue
            rates[system] = statistics.median(measured)
            print(f"# {name} {system} runs: " + " ".join(f"{r:.0f}" for r in measured))
            print(f"{name} {system} examples_per_s={rates[system]:.0f}", flush=True)
        print_overhead_table(name, overhead_rows(rates, args.batch))
        results[name] = rates
    for name, rates in results.items():
        for system in BASELINE_SYSTEMS:
            if rates.get(system):
                print(f"{name} reckeras/{system}={rates['reckeras'] / rates[system]:.2f}")
    print(f"# load average (1 min): {load_at_start:.1f} at the start, "
          f"{os.getloadavg()[0]:.1f} at the end, on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
