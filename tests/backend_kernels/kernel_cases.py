"""Shared helpers of the kernel tests (see conftest.py)."""

import collections
import contextlib
import os

import pytest
import torch
from hypothesis import settings

from reckeras.backend_kernels import dispatch
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


def triton_route():
    """The block in which entry points take their Triton route for the test's
    tensors: on CUDA tensors they always do; CPU tensors are sent there, in
    the interpreter (conftest.py sets ``TRITON_INTERPRET=1``)."""
    return contextlib.nullcontext() if DEVICE.type == "cuda" else dispatch.triton_on_cpu()


class Launches:
    """Counts the launches of a kernel module's Triton kernels.

    Every ``*_kernel`` of the module (a ``dispatch.Kernel``) is replaced
    (through ``monkeypatch``, so for one test) by a wrapper that counts
    ``kernel[grid](...)`` launches by name and launches the kernel.
    """

    def __init__(self, monkeypatch, module):
        self.counts = collections.Counter()
        for name, fn in list(vars(module).items()):
            if isinstance(fn, dispatch.Kernel) and name.endswith("_kernel"):
                monkeypatch.setattr(module, name, _Counted(fn, name, self.counts))


class _Counted:
    def __init__(self, fn, name, counts):
        self.fn, self.name, self.counts = fn, name, counts

    def __getitem__(self, grid):
        self.counts[self.name] += 1
        return self.fn[grid]
