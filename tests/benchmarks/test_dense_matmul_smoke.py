"""Smoke test of benchmarks/dense_matmul.py: both sides compute the same
products (the benchmark's own check) and are timed."""

import numpy as np
import pytest
import torch

import dense_matmul as bench
from reckeras.backend_kernels import dense_matmul

pytestmark = [pytest.mark.skipif(not dense_matmul.available(), reason="torch without oneDNN"),
              pytest.mark.slow]  # runs the benchmarks' workloads


def test_both_sides_compute_each_product_of_a_layer():
    fns = bench.products(16, 12, 5, torch.Generator().manual_seed(1))
    assert set(fns) == {"forward", "input gradient", "kernel gradient"}
    shapes = {"forward": (16, 5), "input gradient": (16, 12), "kernel gradient": (12, 5)}
    for product, (reference, onednn) in fns.items():
        assert reference().shape == onednn().shape == shapes[product]
        np.testing.assert_allclose(onednn().numpy(), reference().numpy(), rtol=1e-5, atol=1e-5)
        assert all(ms > 0 for ms in bench.median_ms([reference, onednn], 2))
