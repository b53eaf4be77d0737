"""Training throughput, side by side in one run: reckeras vs the baselines.

For the `dlrm`, `wide` and `huge` workloads of DESIGN.md (batch 2048,
Adagrad-style optimizers, numeric features through `sign(x) * log1p(|x|)`),
trains on the same batches with:

* reckeras (`rk.Model.fit`) with its default `pipeline="auto"`, and with
  the pipeline's stage threads forced on (`reckeras_pipeline_threads`) and
  off (`reckeras_no_pipeline`), and its tables on the compact key index
  (`reckeras_compact`: `TableOptions(index="compact")`, the opt-in index of
  large tables); the model is written as a user writes it:
  `FeatureColumns`, `ShardedEmbedding`, `keras.layers.Dense`, and
  `rk.layers.DotInteraction` for `dlrm`;
* plain Keras (one `keras.layers.Embedding` per field, `model.fit`);
* plain PyTorch: one `nn.EmbeddingBag` per field (`plain_pytorch_per_field`)
  and one concatenated table (`plain_pytorch_concat`), sparse Adagrad;
* TorchRec, when installed (`bash scripts/install_bench.sh`), in every
  configuration of `torchrec_baselines.py`: `torchrec_dmp_default`,
  `torchrec_tw_fused`, `torchrec_dp`, `torchrec_ebc_fused`,
  `torchrec_ebc_in_backward`.

Where the batches come from (`--source`, printed first as `source=...`):

* `memory` (the default): batches generated in memory without nulls; reckeras
  fits a pyarrow Table of them, the baselines read numpy arrays.
* `parquet`: the same rows written once per run to parquet files in a
  temporary directory, with nulls in the proportions of Criteo's logs
  (`workloads.null_rates`); reckeras reads them through
  `rk.datasets.from_parquet(...)` passed to `fit`, the baselines with
  `pyarrow.parquet` filling the nulls as their users must (`feeds.py`).
  Opening, reading and converting the files is timed for every system. One
  more system, `reckeras_memory`, fits the null-free in-memory batches, and
  `<workload> reckeras_parquet_over_memory` compares the two.

Beside each system it measures that system's dense-only floor
(`<system>_floor`, always on the in-memory batches): the same model, loop
and dense optimizer with the embeddings replaced by constant inputs of their
shape (`baselines.ConstantEmbeddings` in the Keras models, a constant buffer
in the torch ones): no ids, no lookup, no sparse optimizer. Configurations
that run their dense part alike share a floor (`FLOOR_OF`). A system's step
time minus its floor's is what its sparse path costs it: its sparse overhead
(with `--source parquet`, the reading too).

Each system runs in a fresh Python process, one after another, so that none
inherits another's heap, thread pools or process-wide settings: reckeras's
`fit` tunes glibc's malloc for the whole process (`reckeras._allocator`),
which a user of a baseline does not get. `--same-process` runs every
system in this process instead, for comparison. The batches are generated
(and written) once per workload by this process and read by the others.

Every system is measured `--repeats` times (default 5), the systems taking
turns: repeat 1 of every system, then repeat 2, and so on. The timed steps
default to 30 for `dlrm`, 20 for `wide` and 10 for `huge`, after
`--warmup` untimed ones.

Prints `<workload> <system> examples_per_s=<median>` per system and workload
(with `#` lines listing every run), then per workload a table of examples/s,
step ms, floor and sparse overhead (step ms - floor ms) of every system, the
fastest configuration of each baseline family (`<workload>
best_torchrec=<system> ...`), and the ratios of reckeras (the default) to
each family's fastest: the median over the pairs of runs of one repeat
(reckeras's run i / the baseline's run i) with the smallest and largest pair
ratio, e.g. `dlrm reckeras_over_best_torchrec median=1.12 min=1.01 max=1.20
pairs=5`; last the machine's load average at the start and the end.

`--scaling` measures instead the cost per example (us/example) of reckeras
and the baseline configurations of `--scaling-baselines` at 26, 300 and 1000
fields (the `dlrm`, `wide` and `huge` models) and batch 512, 2048 and 8192.

    python benchmarks/throughput.py [--workloads dlrm wide huge] [--source parquet] [--repeats 5]
    python benchmarks/throughput.py --scaling [--repeats 1]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import baselines  # noqa: E402  (selects Keras's torch backend first)
from feeds import MemoryFeed, ParquetFeed  # noqa: E402
from workloads import (NUM_DENSE, WORKLOADS, make_batches, null_rates, to_arrow,  # noqa: E402
                       write_parquet)

LEARNING_RATE = baselines.LEARNING_RATE
SOURCES = ("memory", "parquet")
RECKERAS_SYSTEMS = {"reckeras": "auto", "reckeras_pipeline_threads": True,
                    "reckeras_no_pipeline": False, "reckeras_compact": "auto"}
# The key index of each reckeras system's tables (the others: the default).
RECKERAS_INDEX = {"reckeras_compact": "compact"}
# With --source parquet: reckeras on the null-free in-memory batches, beside it.
RECKERAS_MEMORY = "reckeras_memory"
BASELINE_SYSTEMS = list(baselines.BASELINES)
FLOOR_SUFFIX = "_floor"
# The floor each system is compared with: the reckeras variants differ only
# in how batches are prepared; the TorchRec configurations under
# DistributedModelParallel run their dense part in its DDP, those without it
# as plain PyTorch does.
FLOOR_OF = {
    **{system: "reckeras_floor" for system in [*RECKERAS_SYSTEMS, RECKERAS_MEMORY]},
    "plain_pytorch_per_field": "plain_pytorch_floor",
    "plain_pytorch_concat": "plain_pytorch_floor",
    "plain_keras": "plain_keras_floor",
    **{name: "torchrec_floor" if sharded else "plain_pytorch_floor"
       for name, sharded in baselines.torchrec_baselines.CONFIGURATIONS.items()},
}
# Which system's `floor=True` run measures each floor.
FLOOR_RUN_BY = {"reckeras_floor": "reckeras", "plain_pytorch_floor": "plain_pytorch_per_field",
                "plain_keras_floor": "plain_keras", "torchrec_floor": "torchrec_tw_fused"}
SYSTEMS = [*RECKERAS_SYSTEMS, RECKERAS_MEMORY, *BASELINE_SYSTEMS, *FLOOR_RUN_BY]
# The families whose fastest configuration reckeras is compared with.
COMPARED_FAMILIES = ("torchrec", "plain_pytorch", "plain_keras")
SCALING_BATCHES = (512, 2048, 8192)
SCALING_WORKLOADS = ("dlrm", "wide", "huge")       # 26, 300 and 1000 fields


def reckeras_model(workload, floor=False, index="hash"):
    """The workload's model as a reckeras user writes it, compiled: numeric
    features `I1..I13` with `transform="log1p"` (a missing value is 0 first),
    one Categorical per field (a missing id: an empty bag).

    Args:
        workload: a `workloads.Workload`.
        floor: build the dense-only floor: `baselines.ConstantEmbeddings`
            stands in for the `ShardedEmbedding` (no lookup, no embedding
            optimizer) and the FeatureColumns hold the numeric features and
            `C1` only.
        index: the tables' key index (`TableOptions(index=...)`).

    Returns:
        A compiled `rk.Model` whose inputs are the columns `I1..I13` and
        `C1..CF` (`C1` only when `floor`).
    """
    import reckeras as rk
    import keras
    specs = [rk.features.Numeric(f"I{i + 1}", transform="log1p") for i in range(NUM_DENSE)]
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
        options = {spec.name: rk.embedding.TableOptions(index=index)
                   for spec in specs if isinstance(spec, rk.features.Categorical)}
        embedded = rk.layers.ShardedEmbedding(
            columns, output="stacked" if stacked else "concat",
            table_options=options if index != "hash" else None)(sparse)
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


def run_reckeras(workload, batches, warmup, pipeline, floor=False, parquet_dir=None,
                 index="hash"):
    """examples/s of `rk.Model.fit` over the batches after `warmup`.

    Args:
        workload: a `workloads.Workload`.
        batches: `workloads.make_batches` output for it, all of one size.
        warmup: leading batches trained by a first, untimed `fit` call.
        pipeline: `fit`'s `pipeline` argument.
        floor: train the dense-only floor model (`reckeras_model`) on the
            columns it reads only.
        parquet_dir: None to fit a pyarrow Table of `batches`; else the
            directory `workloads.write_parquet` wrote them to: the warmup
            `fit` and the timed one each get `rk.datasets.from_parquet` of
            their part, opened inside the timed span for the timed one.
        index: the tables' key index.

    Returns:
        Examples of the timed `fit` call / its wall-clock seconds.
    """
    import keras
    import torch

    import reckeras as rk
    keras.utils.set_random_seed(0)
    batch_size = len(batches[0][2])
    model = reckeras_model(workload, floor, index)
    timed_rows = (len(batches) - warmup) * batch_size
    if parquet_dir is None:
        table = to_arrow(batches, workload)
        if floor:
            table = table.select([f"I{i + 1}" for i in range(NUM_DENSE)] + ["C1", "label"])
        warmup_data, timed_data = table.slice(0, warmup * batch_size), table.slice(
            warmup * batch_size)
    else:
        warmup_data = rk.datasets.from_parquet(os.path.join(parquet_dir, "warmup"))
        timed_data = os.path.join(parquet_dir, "timed")
    model.fit(warmup_data, batch_size=batch_size, verbose=0, shuffle=False, pipeline=pipeline)
    started = time.perf_counter()
    if parquet_dir is not None:
        timed_data = rk.datasets.from_parquet(timed_data)
    model.fit(timed_data, batch_size=batch_size, verbose=0, shuffle=False, pipeline=pipeline)
    rate = timed_rows / (time.perf_counter() - started)
    if pipeline == "auto" and not floor:
        print(f"# {workload.name}: pipeline='auto' ran the stages "
              f"{'in threads' if model.pipeline_stats['threads'] else 'inline'} "
              f"({len(os.sched_getaffinity(0))} usable cores, {torch.get_num_threads()} "
              f"torch threads)", flush=True)
    return rate


def prepare_data(name, batch_size, steps, warmup, source, directory):
    """Generates a workload's batches once (and writes its parquet files) for
    the processes that measure it.

    Args:
        name: a key of `workloads.WORKLOADS`.
        batch_size: examples per step.
        steps: timed steps.
        warmup: untimed leading steps.
        source: one of `SOURCES`.
        directory: an empty directory to write into.

    Returns:
        `directory`, holding `batches.npz` (the null-free batches) and, for
        `source="parquet"`, `parquet/` (`workloads.write_parquet`).
    """
    workload = WORKLOADS[name]
    batches = make_batches(workload, batch_size, warmup + steps)
    np.savez(os.path.join(directory, "batches.npz"),
             **{key: np.concatenate([batch[index] for batch in batches])
                for index, key in enumerate(("dense", "ids", "labels"))})
    if source == "parquet":
        write_parquet(batches, workload, os.path.join(directory, "parquet"), warmup)
    return directory


def _load_batches(data_dir, batch_size):
    with np.load(os.path.join(data_dir, "batches.npz")) as arrays:
        dense, ids, labels = arrays["dense"], arrays["ids"], arrays["labels"]
    return [(dense[start:start + batch_size], ids[start:start + batch_size],
             labels[start:start + batch_size]) for start in range(0, len(labels), batch_size)]


def measure(name, system, batch_size, steps, warmup, source="memory", data_dir=None):
    """examples/s of one system (or floor) on one workload, in this process.

    Args:
        name: a key of `workloads.WORKLOADS`.
        system: one of `SYSTEMS`.
        batch_size: examples per step.
        steps: timed steps (None: the workload's default).
        warmup: untimed leading steps.
        source: one of `SOURCES`: where the systems read the batches from
            (floors and `reckeras_memory` always read them from memory).
        data_dir: a `prepare_data` directory of these arguments; None to
            prepare one here (untimed) and remove it afterwards.

    Returns:
        examples/s, or None when the system is not installed.
    """
    import torch
    torch.set_num_threads(int(os.environ.get("RECKERAS_BENCH_THREADS", "2")))
    workload = WORKLOADS[name]
    if system not in SYSTEMS:
        raise ValueError(f"unknown system {system!r}; choose from {SYSTEMS}")
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}; choose from {SOURCES}")
    if data_dir is None:
        with tempfile.TemporaryDirectory(prefix=f"throughput-{name}-") as directory:
            prepare_data(name, batch_size, steps or default_steps(name), warmup, source,
                         directory)
            return measure(name, system, batch_size, steps, warmup, source, directory)
    floor = system in FLOOR_RUN_BY
    base = FLOOR_RUN_BY[system] if floor else system
    from_files = source == "parquet" and not floor and system != RECKERAS_MEMORY
    batches = _load_batches(data_dir, batch_size)
    parquet_dir = os.path.join(data_dir, "parquet") if from_files else None
    if base in RECKERAS_SYSTEMS or base == RECKERAS_MEMORY:
        return run_reckeras(workload, batches, warmup, RECKERAS_SYSTEMS.get(base, "auto"),
                            floor, parquet_dir, RECKERAS_INDEX.get(base, "hash"))
    feed = (MemoryFeed(batches, warmup) if parquet_dir is None
            else ParquetFeed(parquet_dir, workload, batch_size))
    measured = baselines.BASELINES[base](workload, feed, floor=floor)
    return None if measured is None else measured.examples_per_s


def default_steps(name):
    """Timed steps of workload `name` when `--steps` is not given."""
    return baselines.STEPS[name][1]


def measure_in_fresh_process(name, system, batch_size, steps, warmup, source, data_dir):
    """`measure` in a new Python process; its `#` lines are passed on."""
    command = [sys.executable, os.path.abspath(__file__), "--one", name, system,
               "--batch", str(batch_size), "--steps", str(steps), "--warmup", str(warmup),
               "--source", source, "--data", data_dir]
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


def pair_ratios(numerators, denominators):
    """Median, min and max of `numerators[i] / denominators[i]` over the pairs.

    Args:
        numerators: examples/s of one system, one per repeat.
        denominators: examples/s of another, one per repeat (same order).

    Returns:
        `{"median", "min", "max", "pairs"}`.
    """
    ratios = [a / b for a, b in zip(numerators, denominators, strict=True)]
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
            "pairs": len(ratios)}


def fastest_configurations(runs):
    """The fastest configuration of each baseline family that was measured.

    Args:
        runs: `{system: [examples/s per repeat] or None}` (None: not installed).

    Returns:
        `{family: system}` for the families of `COMPARED_FAMILIES` with at
        least one configuration measured: the one with the highest median.
    """
    best = {}
    for family in COMPARED_FAMILIES:
        measured = [system for system in baselines.FAMILIES[family] if runs.get(system)]
        if measured:
            best[family] = max(measured, key=lambda system: statistics.median(runs[system]))
    return best


def format_ratio(name, label, ratio):
    return (f"{name} {label} median={ratio['median']:.2f} min={ratio['min']:.2f} "
            f"max={ratio['max']:.2f} pairs={ratio['pairs']}")


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


def systems_to_run(selected, source):
    """The systems and floors of a run, in turn order.

    Args:
        selected: systems asked for (None: every system but the floors);
            their floors are added.
        source: one of `SOURCES`; `reckeras_memory` runs with "parquet" only,
            and then always beside `reckeras`.

    Returns:
        A list of `SYSTEMS`.
    """
    chosen = list(selected or FLOOR_OF)
    if source == "parquet" and "reckeras" in chosen:
        chosen.insert(chosen.index("reckeras") + 1, RECKERAS_MEMORY)
    chosen = [system for system in dict.fromkeys(chosen)
              if source == "parquet" or system != RECKERAS_MEMORY]
    unknown = sorted(set(chosen) - set(SYSTEMS))
    if unknown:
        raise ValueError(f"unknown systems {unknown}; choose from {SYSTEMS}")
    floors = [FLOOR_OF[system] for system in chosen if system in FLOOR_OF]
    return list(dict.fromkeys([*chosen, *floors]))


def measure_workload(name, systems, args, run, directory):
    """Every system's runs on one workload, interleaved: `{system: [rates] or None}`."""
    steps = args.steps or default_steps(name)
    data_dir = prepare_data(name, args.batch, steps, args.warmup, args.source,
                            tempfile.mkdtemp(prefix=f"{name}-", dir=directory))
    runs = {system: [] for system in systems}
    for _ in range(args.repeats):            # the systems take turns
        for system in systems:
            runs[system].append(run(name, system, args.batch, steps, args.warmup,
                                    args.source, data_dir))
    shutil.rmtree(data_dir)
    return {system: None if None in rates else rates for system, rates in runs.items()}


def report_workload(name, runs, batch_size):
    """Prints one workload's per-system lines, overhead table and ratios."""
    rates = {}
    for system, measured in runs.items():
        if measured is None:
            rates[system] = None
            print(f"{name} {system} skipped (not installed)", flush=True)
            continue
        rates[system] = statistics.median(measured)
        print(f"# {name} {system} runs: " + " ".join(f"{r:.0f}" for r in measured))
        print(f"{name} {system} examples_per_s={rates[system]:.0f}", flush=True)
    print_overhead_table(name, overhead_rows(rates, batch_size))
    if runs.get("reckeras"):
        for family, system in fastest_configurations(runs).items():
            print(f"{name} best_{family}={system}")
            print(format_ratio(name, f"reckeras_over_best_{family}",
                               pair_ratios(runs["reckeras"], runs[system])))
        if runs.get(RECKERAS_MEMORY):
            print(format_ratio(name, "reckeras_parquet_over_memory",
                               pair_ratios(runs["reckeras"], runs[RECKERAS_MEMORY])))
    print(flush=True)


def scaling_steps(name, batch_size):
    """Timed steps of a `--scaling` point: about the examples of the
    workload's default run, at least 3 steps."""
    return max(3, round(default_steps(name) * 2048 / batch_size))


def run_scaling(args, run, directory):
    """Cost per example of reckeras and the `--scaling-baselines` over the grid
    of `SCALING_WORKLOADS` x `SCALING_BATCHES`; prints one line per point and a table."""
    systems = ["reckeras", *args.scaling_baselines]
    rows = []
    for name in SCALING_WORKLOADS:
        for batch_size in SCALING_BATCHES:
            steps = scaling_steps(name, batch_size)
            data_dir = prepare_data(name, batch_size, steps, args.warmup, args.source,
                                    tempfile.mkdtemp(prefix=f"{name}-{batch_size}-",
                                                     dir=directory))
            runs = {system: [] for system in systems}
            for _ in range(args.repeats):
                for system in systems:
                    runs[system].append(run(name, system, batch_size, steps, args.warmup,
                                            args.source, data_dir))
            shutil.rmtree(data_dir)
            cost = {system: 1e6 / statistics.median(rates) for system, rates in runs.items()
                    if None not in rates}
            best = min((system for system in cost if system != "reckeras"),
                       key=cost.get, default=None)
            fields = WORKLOADS[name].num_fields
            print(f"scaling fields={fields} batch={batch_size} "
                  + " ".join(f"{system}_us_per_example={value:.2f}"
                             for system, value in cost.items()), flush=True)
            rows.append((fields, batch_size, cost["reckeras"], best,
                         cost.get(best), steps))
    print("\n| fields | batch | reckeras us/example | best baseline | its us/example "
          "| baseline / reckeras | timed steps |")
    print("|---|---|---|---|---|---|---|")
    for fields, batch_size, ours, best, theirs, steps in rows:
        print(f"| {fields} | {batch_size} | {ours:.2f} | {best or '-'} | "
              f"{'-' if theirs is None else f'{theirs:.2f}'} | "
              f"{'-' if theirs is None else f'{theirs / ours:.2f}'} | {steps} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS),
                        choices=list(WORKLOADS))
    parser.add_argument("--systems", nargs="+", default=None, metavar="SYSTEM",
                        help="systems to run (their floors are added); default: all")
    parser.add_argument("--source", choices=SOURCES, default="memory",
                        help="where every system reads the batches from")
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=None,
                        help="timed steps (default 30 for dlrm, 20 for wide, 10 for huge)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=None,
                        help="interleaved measurements per system (default 5; 1 with "
                             "--scaling)")
    parser.add_argument("--scaling", action="store_true",
                        help="cost per example over fields x batch size instead")
    parser.add_argument("--scaling-baselines", nargs="+", metavar="SYSTEM",
                        default=["torchrec_tw_fused", "torchrec_ebc_fused",
                                 "plain_pytorch_concat"],
                        help="baseline configurations of --scaling (the fastest is shown)")
    parser.add_argument("--same-process", action="store_true",
                        help="run every system in this process")
    parser.add_argument("--one", nargs=2, metavar=("WORKLOAD", "SYSTEM"),
                        help=argparse.SUPPRESS)     # one measurement, for the parent
    parser.add_argument("--data", help=argparse.SUPPRESS)   # prepare_data's directory
    args = parser.parse_args()
    if args.one:
        rate = measure(*args.one, args.batch, args.steps, args.warmup, args.source, args.data)
        print(f"rate={rate}", flush=True)
        return
    args.repeats = args.repeats or (1 if args.scaling else 5)
    run = measure if args.same_process else measure_in_fresh_process
    print(f"source={args.source}", flush=True)
    if args.source == "parquet":
        numeric, categorical = null_rates(WORKLOADS["dlrm"])
        print("# null rates: " + " ".join(f"I{i + 1}={rate:g}"
                                          for i, rate in enumerate(numeric))
              + " " + " ".join(f"C{f + 1}={rate:g}" for f, rate in enumerate(categorical))
              + " (cycled past C26)", flush=True)
    # Other jobs on the machine move every figure: say how busy it was.
    load_at_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="throughput-") as directory:
        if args.scaling:
            run_scaling(args, run, directory)
        else:
            systems = systems_to_run(args.systems, args.source)
            for name in args.workloads:
                report_workload(name, measure_workload(name, systems, args, run, directory),
                                args.batch)
    print(f"# load average (1 min): {load_at_start:.1f} at the start, "
          f"{os.getloadavg()[0]:.1f} at the end, on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
