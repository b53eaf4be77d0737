"""Dense matmuls in oneDNN: forward and both gradients against float64
torch, which calls are routed and which are left to torch, and an
`rk.Model` fit that runs its Dense layers there and trains as torch's
matmul does."""

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


def routed(fn, *args):
    with dense_matmul.routed_to_onednn():
        out = fn(*args)
    return out.grad_fn is not None and type(out.grad_fn).__name__ == "OneDNNMatmulBackward"


def test_only_float32_cpu_products_with_a_matrix_are_routed():
    x = torch.randn(5, 4, requires_grad=True)
    kernel = torch.randn(4, 3, requires_grad=True)
    assert routed(torch.matmul, x, kernel)
    assert routed(torch.matmul, torch.randn(2, 5, 4, requires_grad=True), kernel)
    assert not routed(torch.matmul, x.double(), kernel.double())        # float64
    assert not routed(torch.matmul, x, torch.randn(2, 4, 3, requires_grad=True))  # batched
    assert not routed(torch.matmul, torch.randn(4, requires_grad=True), kernel)    # vector
    assert not routed(torch.mm, x, kernel)                          # only torch.matmul
    with dense_matmul.routed_to_onednn():
        with pytest.raises(RuntimeError):                           # torch's own error
            torch.matmul(x, torch.randn(5, 3))
        ints = torch.matmul(torch.ones(2, 3, dtype=torch.int64),
                            torch.ones(3, 2, dtype=torch.int64))
    assert ints.dtype == torch.int64 and ints.eq(3).all()


def test_without_onednn_nothing_is_routed(monkeypatch):
    monkeypatch.setattr(dense_matmul, "available", lambda: False)
    assert not routed(torch.matmul, torch.randn(5, 4, requires_grad=True),
                      torch.randn(4, 3, requires_grad=True))


def fit_once(use_onednn, monkeypatch):
    import keras
    import reckeras as rk

    if not use_onednn:
        monkeypatch.setattr(dense_matmul, "available", lambda: False)
    calls = []
    original = dense_matmul.linear
    monkeypatch.setattr(dense_matmul, "linear",
                        lambda *args: calls.append(1) or original(*args))
    keras.utils.set_random_seed(3)
    columns = rk.layers.FeatureColumns([rk.features.Numeric("x"),
                                        rk.features.Categorical("c", dim=4)])
    inputs = columns.inputs()
    dense, sparse = columns(inputs)
    embedded = rk.layers.ShardedEmbedding(columns, output="concat")(sparse)
    hidden = keras.layers.Dense(16, activation="relu")(
        keras.layers.Concatenate()([dense, embedded]))
    model = rk.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(hidden))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.05))
    rng = np.random.default_rng(0)
    x = {"x": rng.normal(size=256).astype("float32"), "c": rng.integers(0, 30, 256)}
    y = rng.integers(0, 2, 256).astype("float32")
    history = model.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0)
    monkeypatch.undo()
    return model.get_weights(), history.history["loss"], len(calls)


def test_a_fit_runs_its_dense_layers_in_onednn_and_trains_as_torch_does(monkeypatch):
    weights, losses, calls = fit_once(True, monkeypatch)
    torch_weights, torch_losses, torch_calls = fit_once(False, monkeypatch)
    # 8 steps x 2 Dense layers x (forward, input gradient, kernel gradient):
    # the first layer's input needs its gradient too (the embeddings train).
    assert calls == 8 * 2 * 3 and torch_calls == 0
    np.testing.assert_allclose(losses, torch_losses, rtol=1e-5)
    for ours, theirs in zip(weights, torch_weights):
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)
