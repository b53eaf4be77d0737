"""benchmarks/gpu_fit.py, on the CPU at a small size: both systems train and
the ratio is the median of the per-pair ratios (the GPU run is
benchmarks/gpu_check.sh's)."""

import re
import statistics

import gpu_fit
from conftest import SMALL


def test_reports_both_systems_and_the_median_pair_ratio(capsys):
    figures = gpu_fit.measure(SMALL["dlrm"], repeats=3, batch_size=64, steps=(1, 2),
                              device="cpu")
    pairs = re.findall(r"# dlrm_small (\w+): (\d+) examples/s", capsys.readouterr().out)
    rates = {"reckeras": [], "plain_pytorch": []}
    for system, rate in pairs:
        rates[system].append(int(rate))
    assert [len(v) for v in rates.values()] == [3, 3] and min(rates["reckeras"]) > 0
    ratios = [a / b for a, b in zip(rates["reckeras"], rates["plain_pytorch"])]
    assert abs(figures["gpu_fit_dlrm_small_ratio"] - statistics.median(ratios)) < 0.02 * \
        statistics.median(ratios) + 1e-3
    assert figures["gpu_fit_dlrm_small_ratio_min"] <= figures["gpu_fit_dlrm_small_ratio"] \
        <= figures["gpu_fit_dlrm_small_ratio_max"]


def test_a_failing_system_is_reported_and_ends_the_workload(monkeypatch, capsys):
    def broken(*args):
        raise RuntimeError("device-side assert")
    monkeypatch.setitem(gpu_fit.SYSTEMS, "reckeras", broken)
    figures = gpu_fit.measure(SMALL["wide"], repeats=2, batch_size=32, steps=(1, 1),
                              device="cpu")
    assert figures == {"gpu_fit_wide_small_reckeras_error": "RuntimeError: device-side assert"}
    assert "gpu_fit_wide_small_reckeras_error=RuntimeError" in capsys.readouterr().out
