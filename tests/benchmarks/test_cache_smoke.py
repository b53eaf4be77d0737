"""Smoke test of benchmarks/cache.py on a small table."""

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import cache  # noqa: E402

pytestmark = pytest.mark.slow  # runs the benchmarks' workloads


def test_small_run_gives_hit_rates_and_throughput():
    args = argparse.Namespace(vocab=5000, fields=2, batch=128, warmup=20, steps=10)
    device = cache.measure(args, 1.2, None)
    cached = cache.measure(args, 1.2, 0.05)
    assert device["examples_per_s"] > 0 and cached["examples_per_s"] > 0
    assert cached["cache_rows"] == 500 and device["rows"] == cached["rows"]
    assert 0.5 < cached["hit_rate"] < 1 and 0 < cached["unique_hit_rate"] < cached["hit_rate"]
    assert cached["rows_in"] > 0


def test_zipf_batches_are_skewed_and_in_range():
    (ids,) = cache.zipf_batches(1, 4096, 3, 1000, 1.2)
    assert ids.shape == (4096, 3) and int(ids.min()) >= 0 and int(ids.max()) < 1000
    _, counts = ids[:, 0].unique(return_counts=True)
    assert int(counts.max()) > 4096 * 0.05          # a hot id


def test_five_percent_cache_serves_80_percent_of_zipf_1_2_lookups():
    # 100k rows, 5,000 cached; batches of 2,048 ids after 100 warm-up steps.
    args = argparse.Namespace(vocab=50_000, fields=2, batch=1024, warmup=100, steps=50)
    figures = cache.measure(args, 1.2, 0.05)
    assert figures["cache_rows"] == 5000 and figures["hit_rate"] >= 0.8
