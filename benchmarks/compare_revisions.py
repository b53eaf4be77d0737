"""reckeras's training throughput at two revisions, side by side in one run.

A change that moves code around (a refactor, a new seam) should not cost
speed. This benchmark checks out `--base` (any git revision) into a
temporary worktree and measures `rk.Model.fit` there and in this working
tree, in interleaved pairs: base, then head, `--pairs` times, each
measurement in a fresh process running this tree's
`benchmarks/throughput.py --one WORKLOAD reckeras` (one harness, so one
model and one data) with the measured tree's reckeras first on
`PYTHONPATH`. One figure moves by about 20% between runs on a shared
2-core machine, so only the per-pair ratios head / base are compared: their
median, with their min and max.

Prints per workload `<workload> head_over_base median=<m> min=<a> max=<b>
pairs=<n>` after one `#` line per pair.

    python benchmarks/compare_revisions.py --base 9bb82cc [--workloads dlrm wide huge] [--pairs 5]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HEAD = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rate_of(tree, workload, steps):
    """examples/s of `tree`'s reckeras on `workload`, by this tree's harness.

    Args:
        tree: the root of the reckeras checkout to measure.
        workload: a workload name of `benchmarks/workloads.py`.
        steps: timed steps (None: the harness's default).

    Returns:
        The examples/s that `throughput.py --one` printed.

    Raises:
        RuntimeError: when the measurement failed, with its stderr.
    """
    command = [sys.executable, os.path.join(HEAD, "benchmarks", "throughput.py"),
               "--one", workload, "reckeras"]
    if steps:
        command += ["--steps", str(steps)]
    environment = {**os.environ, "PYTHONPATH": tree}
    result = subprocess.run(command, capture_output=True, text=True, env=environment,
                            cwd=tree)
    rates = [line for line in result.stdout.splitlines() if line.startswith("rate=")]
    if result.returncode != 0 or not rates:
        raise RuntimeError(f"{workload} in {tree} failed:\n{result.stderr[-3000:]}")
    return float(rates[-1][len("rate="):])


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the git revision to compare with")
    parser.add_argument("--workloads", nargs="+", default=["dlrm", "wide", "huge"])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=None)
    args = parser.parse_args()
    base = tempfile.mkdtemp(prefix="reckeras-base-")
    subprocess.run(["git", "-C", HEAD, "worktree", "add", "--detach", base, args.base],
                   check=True, capture_output=True)
    try:
        load_at_start = os.getloadavg()[0]
        for workload in args.workloads:
            ratios = []
            for pair in range(args.pairs):
                base_rate = rate_of(base, workload, args.steps)
                head_rate = rate_of(HEAD, workload, args.steps)
                ratios.append(head_rate / base_rate)
                print(f"# {workload} pair {pair + 1}: base {base_rate:.0f} head "
                      f"{head_rate:.0f} examples/s, head/base {ratios[-1]:.3f}", flush=True)
            print(f"{workload} head_over_base median={statistics.median(ratios):.3f} "
                  f"min={min(ratios):.3f} max={max(ratios):.3f} pairs={len(ratios)}",
                  flush=True)
        print(f"# base {args.base}; load average (1 min) {load_at_start:.1f} at the start, "
              f"{os.getloadavg()[0]:.1f} at the end, on {os.cpu_count()} cores")
    finally:
        subprocess.run(["git", "-C", HEAD, "worktree", "remove", "--force", base],
                       capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
