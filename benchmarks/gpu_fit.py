"""`fit` on one GPU: reckeras against plain PyTorch on the same GPU.

For the `dlrm`, `wide` and `huge` workloads of DESIGN.md (batch 2048), on the
same pre-generated batches:

* `reckeras`: `rk.Model.fit` from a pyarrow Table with `pipeline=True` (the
  stage threads and the h2d stage: pinned host batches copied to the GPU on
  a side stream while the previous step runs), the model of
  `throughput.reckeras_model` (`FeatureColumns`, `ShardedEmbedding`,
  `keras.layers.Dense`), tables on the GPU;
* `plain_pytorch`: one `nn.EmbeddingBag(sparse=True)` per field on the GPU,
  sparse Adagrad, each batch copied to the GPU inside the loop
  (`baselines.plain_pytorch`).

TorchRec does not run here: its CUDA fbgemm wheel is too large to carry to
the GPU machine (benchmarks/throughput.py compares it on CPU).

The two systems take turns `--repeats` times in this one process (the
batches of a workload are generated once; a fresh process per run would pay
CUDA's start each time). Prints `name=value` lines, per workload `W`:
`gpu_fit_W_reckeras_examples_per_s` and `gpu_fit_W_plain_pytorch_examples_per_s`
(medians), `gpu_fit_W_ratio` (the median of the per-pair ratios, reckeras
over plain PyTorch) with `gpu_fit_W_ratio_min` / `_max`. A run that fails
prints `gpu_fit_W_SYSTEM_error=<exception>` and its traceback, and the other
runs go on.

    python benchmarks/gpu_fit.py [--workloads dlrm,wide,huge] [--repeats 3]
"""

import argparse
import os
import statistics
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import baselines  # noqa: E402  (selects Keras's torch backend first)
import torch  # noqa: E402
from feeds import MemoryFeed  # noqa: E402
from throughput import run_reckeras  # noqa: E402
from workloads import WORKLOADS, make_batches  # noqa: E402

# (warmup, timed) steps per workload: the warmup absorbs the Triton compiles.
STEPS = {"dlrm": (4, 40), "wide": (3, 20), "huge": (3, 10)}


def reckeras_rate(workload, batches, warmup, device):
    # Keras puts the model, and reckeras its tables, on Keras's device
    # (CUDA when available): `device` is that one.
    return run_reckeras(workload, batches, warmup, pipeline=True)


def plain_pytorch_rate(workload, batches, warmup, device):
    return baselines.plain_pytorch(workload, MemoryFeed(batches, warmup),
                                   device=device).examples_per_s


SYSTEMS = {"reckeras": reckeras_rate, "plain_pytorch": plain_pytorch_rate}


def measure(workload, repeats, batch_size, steps, device):
    """Runs the systems in turns on one workload and prints its `name=value` lines.

    Args:
        workload: a `workloads.Workload`.
        repeats: turns of each system.
        batch_size: examples per step.
        steps: `(warmup, timed)` steps of each run.
        device: where plain PyTorch runs (reckeras runs on Keras's device).

    Returns:
        `{name: value}` of the printed lines (without the `#` ones).
    """
    name = workload.name
    warmup, timed = steps
    batches = make_batches(workload, batch_size, warmup + timed)
    rates = {system: [] for system in SYSTEMS}
    figures = {}
    for _ in range(repeats):
        for system, rate_of in SYSTEMS.items():
            try:
                rate = rate_of(workload, batches, warmup, device)
            except Exception as error:     # noqa: BLE001 - reported, the others go on
                traceback.print_exc()
                message = str(error).splitlines()[0][:200] if str(error) else ""
                figures[f"gpu_fit_{name}_{system}_error"] = f"{type(error).__name__}: {message}"
                print(f"gpu_fit_{name}_{system}_error={figures[f'gpu_fit_{name}_{system}_error']}",
                      flush=True)
                return figures
            rates[system].append(rate)
            print(f"# {name} {system}: {rate:.0f} examples/s", flush=True)
    for system, values in rates.items():
        figures[f"gpu_fit_{name}_{system}_examples_per_s"] = round(statistics.median(values))
    ratios = [a / b for a, b in zip(rates["reckeras"], rates["plain_pytorch"])]
    figures[f"gpu_fit_{name}_ratio"] = round(statistics.median(ratios), 3)
    figures[f"gpu_fit_{name}_ratio_min"] = round(min(ratios), 3)
    figures[f"gpu_fit_{name}_ratio_max"] = round(max(ratios), 3)
    for key, value in figures.items():
        print(f"{key}={value}", flush=True)
    return figures


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default="dlrm,wide,huge")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=baselines.BATCH_SIZE)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_fit.py needs a CUDA device")
    print(f"gpu_fit_device={torch.cuda.get_device_name()}", flush=True)
    for name in args.workloads.split(","):
        measure(WORKLOADS[name], args.repeats, args.batch, STEPS[name], "cuda")


if __name__ == "__main__":
    main()
