"""Shared helpers of the kernel tests (see conftest.py)."""

import os

import pytest
import torch
from hypothesis import settings

from reckeras.backend_kernels.dispatch import TRITON_AVAILABLE

DEVICE = torch.device(os.environ.get("RECKERAS_TEST_DEVICE", "cpu"))

# The interpreter runs a few programs per millisecond: keep cases small.
SETTINGS = settings(max_examples=8, deadline=None, print_blob=True)

requires_triton = pytest.mark.skipif(not TRITON_AVAILABLE, reason="triton not installed")

INT64_MIN, INT64_MAX = -2**63, 2**63 - 1


def on_device(*tensors):
    """Copies of CPU tensors on the kernel test device (one tensor: not a tuple)."""
    moved = tuple(t.to(DEVICE) for t in tensors)
    return moved if len(moved) > 1 else moved[0]


def on_cpu(*tensors):
    moved = tuple(t.cpu() for t in tensors)
    return moved if len(moved) > 1 else moved[0]


def assert_same(actual, expected):
    """Integer results: bit-identical, on CPU."""
    actual = actual.cpu()
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert torch.equal(actual, expected), (actual, expected)


def assert_close(actual, expected, **tolerances):
    torch.testing.assert_close(actual.cpu(), expected.cpu(), **tolerances)
