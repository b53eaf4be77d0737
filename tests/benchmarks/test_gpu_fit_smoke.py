"""benchmarks/gpu_fit.py, on the CPU at a small size: both systems train and
the ratio is the median of the per-pair ratios (the GPU run is
benchmarks/gpu_check.sh's)."""

import re
import statistics

import pytest

import gpu_fit

pytestmark = pytest.mark.slow  # runs the benchmarks' workloads


def test_reports_both_systems_and_the_median_pair_ratio(small_workload, capsys):
    name = small_workload.name
    figures = gpu_fit.measure(small_workload, repeats=3, batch_size=64, steps=(1, 2),
                              device="cpu")
    pairs = re.findall(rf"# {name} (\w+): (\d+) examples/s", capsys.readouterr().out)
    rates = {"reckeras": [], "plain_pytorch": []}
    for system, rate in pairs:
        rates[system].append(int(rate))
    assert [len(v) for v in rates.values()] == [3, 3] and min(rates["reckeras"]) > 0
    ratios = [a / b for a, b in zip(rates["reckeras"], rates["plain_pytorch"])]
    ratio = figures[f"gpu_fit_{name}_ratio"]
    assert abs(ratio - statistics.median(ratios)) < 0.02 * statistics.median(ratios) + 1e-3
    assert figures[f"gpu_fit_{name}_ratio_min"] <= ratio <= figures[f"gpu_fit_{name}_ratio_max"]


def test_a_failing_system_is_reported_and_ends_the_workload(small_workload, monkeypatch,
                                                           capsys):
    def broken(*args):
        raise RuntimeError("device-side assert")
    monkeypatch.setitem(gpu_fit.SYSTEMS, "reckeras", broken)
    figures = gpu_fit.measure(small_workload, repeats=2, batch_size=32, steps=(1, 1),
                              device="cpu")
    key = f"gpu_fit_{small_workload.name}_reckeras_error"
    assert figures == {key: "RuntimeError: device-side assert"}
    assert f"{key}=RuntimeError" in capsys.readouterr().out
