"""Dense matmuls in oneDNN: forward and both gradients against float64
torch, and which calls a `RoutedKernels` block routes and which it leaves
to torch (the model's use of it: tests/pipeline/test_dense_routing.py)."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reckeras.backend_kernels import dense_matmul

pytestmark = pytest.mark.skipif(not dense_matmul.available(),
                                reason="torch without oneDNN")


def reference(x, kernel, grad):
    """Output and gradients of `x @ kernel` in float64."""
    x64 = x.detach().double().requires_grad_()
    k64 = kernel.detach().double().requires_grad_()
    out = torch.matmul(x64, k64)
    out.backward(grad.double())
    return out, x64.grad, k64.grad


@settings(max_examples=60, deadline=None)
@given(lead=st.lists(st.integers(1, 9), min_size=1, max_size=2),
       inner=st.integers(1, 40), outer=st.integers(1, 40), seed=st.integers(0, 2**16),
       transposed=st.booleans())
def test_forward_and_gradients_match_float64(lead, inner, outer, seed, transposed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, inner, generator=g).requires_grad_()
    kernel = torch.randn(inner, outer, generator=g)
    if transposed:                       # a kernel viewed with other strides
        kernel = torch.randn(outer, inner, generator=g).t()
    kernel.requires_grad_()
    grad = torch.randn(*lead, outer, generator=g)
    out = dense_matmul.OneDNNMatmul.apply(x, kernel)
    out.backward(grad)
    expected, grad_x, grad_kernel = reference(x, kernel, grad)
    tolerance = dict(rtol=1e-5, atol=1e-5 * max(inner, int(np.prod(lead))))
    np.testing.assert_allclose(out.detach().numpy(), expected.detach().numpy(), **tolerance)
    np.testing.assert_allclose(x.grad.numpy(), grad_x.numpy(), **tolerance)
    np.testing.assert_allclose(kernel.grad.numpy(), grad_kernel.numpy(), **tolerance)


@pytest.mark.parametrize("inner,outer", [(300, 8), (8, 300)])   # both orientations
def test_kernel_gradient_in_either_orientation(inner, outer):
    x = torch.randn(512, inner)
    kernel = torch.randn(inner, outer, requires_grad=True)
    grad = torch.randn(512, outer)
    dense_matmul.OneDNNMatmul.apply(x, kernel).backward(grad)
    assert kernel.grad.shape == (inner, outer)
    np.testing.assert_allclose(kernel.grad.numpy(), reference(x, kernel, grad)[2].numpy(),
                               rtol=1e-4, atol=1e-3)


def test_a_frozen_kernel_gets_no_gradient():
    x = torch.randn(4, 3, requires_grad=True)
    kernel = torch.randn(3, 2)
    dense_matmul.OneDNNMatmul.apply(x, kernel).sum().backward()
    assert kernel.grad is None
    np.testing.assert_allclose(x.grad.numpy(), kernel.sum(1).expand(4, 3).numpy(), rtol=1e-6)


def routed(fn, x, kernel, kernels=None):
    with dense_matmul.RoutedKernels([kernel] if kernels is None else kernels):
        out = fn(x, kernel)
    return out.grad_fn is not None and type(out.grad_fn).__name__ == "OneDNNMatmulBackward"


def test_only_float32_cpu_products_with_a_given_matrix_are_routed():
    x = torch.randn(5, 4, requires_grad=True)
    kernel = torch.randn(4, 3, requires_grad=True)
    assert routed(torch.matmul, x, kernel)
    assert routed(torch.matmul, torch.randn(2, 5, 4, requires_grad=True), kernel)
    assert not routed(torch.matmul, x, kernel, kernels=[])          # not one of the block's
    assert not routed(torch.matmul, x, kernel, kernels=[kernel.detach().clone()])  # equal
    double = kernel.detach().double().requires_grad_()
    assert not routed(torch.matmul, x.double(), double)             # float64
    batched = torch.randn(2, 4, 3, requires_grad=True)
    assert not routed(torch.matmul, x, batched)                     # batched
    assert not routed(torch.matmul, torch.randn(4, requires_grad=True), kernel)    # vector
    assert not routed(torch.mm, x, kernel)                          # only torch.matmul
    with dense_matmul.RoutedKernels([kernel]):
        with pytest.raises(RuntimeError):                           # torch's own error
            torch.matmul(torch.randn(5, 3), kernel)
        ints = torch.matmul(torch.ones(2, 3, dtype=torch.int64),
                            torch.ones(3, 2, dtype=torch.int64))
    assert ints.dtype == torch.int64 and ints.eq(3).all()


def test_without_onednn_nothing_is_routed(monkeypatch):
    monkeypatch.setattr(dense_matmul, "available", lambda: False)
    assert not routed(torch.matmul, torch.randn(5, 4, requires_grad=True),
                      torch.randn(4, 3, requires_grad=True))
