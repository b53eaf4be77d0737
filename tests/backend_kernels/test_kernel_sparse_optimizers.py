import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from kernel_cases import SETTINGS, assert_close, on_cpu, on_device, requires_triton

from reckeras.backend_kernels import sparse_optimizers as so
from reckeras.backend_kernels.aggregation import unique_rows

KINDS = [so.SGD, so.ADAGRAD, so.ROWWISE_ADAGRAD, so.ADAM, so.ADAMW]
HYPER = {"lr": 0.05, "eps": 1e-6, "beta1": 0.8, "beta2": 0.95, "weight_decay": 0.1}


def torch_optimizer(kind, params, initial_accumulator_value=0.0):
    lr, eps, betas = HYPER["lr"], HYPER["eps"], (HYPER["beta1"], HYPER["beta2"])
    if kind == so.SGD:
        return torch.optim.SGD(params, lr=lr)
    if kind == so.ADAGRAD:
        return torch.optim.Adagrad(params, lr=lr, eps=eps,
                                   initial_accumulator_value=initial_accumulator_value)
    if kind == so.ADAM:
        return torch.optim.Adam(params, lr=lr, betas=betas, eps=eps,
                                weight_decay=HYPER["weight_decay"])
    return torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps,
                             weight_decay=HYPER["weight_decay"])


@pytest.mark.parametrize("kind", [so.SGD, so.ADAGRAD, so.ADAM, so.ADAMW])
def test_reference_matches_torch_optim_per_row(kind):
    """Lazy semantics: each row is its own torch.optim problem that steps only
    when a batch touches the row (so Adam's step count is per row)."""
    g = torch.Generator().manual_seed(kind)
    num_rows, dim = 6, 5
    weights = torch.randn(num_rows, dim, generator=g)
    state = torch.full((num_rows, so.state_width(kind, dim)),
                       0.3 if kind == so.ADAGRAD else 0.0)
    params = [torch.nn.Parameter(weights[r].clone()) for r in range(num_rows)]
    optimizers = [torch_optimizer(kind, [p], initial_accumulator_value=0.3)
                  for p in params]
    for touched in ([0, 2, 3], [2], [5, 0, 2], [1, 2, 3, 4, 5]):
        rows = torch.tensor(touched)
        grads = torch.randn(len(touched), dim, generator=g)
        so.update_reference(kind, weights, state, rows, grads, HYPER["lr"], HYPER["eps"],
                            HYPER["beta1"], HYPER["beta2"], HYPER["weight_decay"])
        for row, grad in zip(touched, grads):
            params[row].grad = grad.clone()
            optimizers[row].step()
        expected = torch.stack([p.detach() for p in params])
        assert_close(weights, expected, rtol=1e-5, atol=1e-6)


def test_rowwise_adagrad_update_hand_formula():
    """``update``, what ``SparseOptimizer.apply`` runs (native kernel or reference)."""
    weights = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    state = torch.tensor([[0.5], [1.0], [2.0]])
    grads = torch.tensor([[3.0, 4.0], [1.0, -1.0]])
    so.update(so.ROWWISE_ADAGRAD, weights, state, torch.tensor([2, 0]), grads, 0.1, 0.0)
    # row 2: s = 2 + (9 + 16) / 2 = 14.5; row 0: s = 0.5 + 1 = 1.5
    assert state.flatten().tolist() == [1.5, 1.0, 14.5]
    expected_row2 = torch.tensor([5.0, 6.0]) - 0.1 * torch.tensor([3.0, 4.0]) / 14.5 ** 0.5
    expected_row0 = torch.tensor([1.0, 2.0]) - 0.1 * torch.tensor([1.0, -1.0]) / 1.5 ** 0.5
    assert_close(weights[2], expected_row2)
    assert_close(weights[0], expected_row0)
    assert weights[1].tolist() == [3.0, 4.0]


def test_update_of_bfloat16_tables_runs_in_float32():
    weights = torch.ones(3, 4, dtype=torch.bfloat16)
    state = torch.zeros(3, 1)
    so.update(so.ROWWISE_ADAGRAD, weights, state, torch.tensor([1]), torch.ones(1, 4), 0.5,
              0.0)
    assert weights.dtype == torch.bfloat16
    assert weights[1].tolist() == [0.5] * 4 and weights[0].tolist() == [1.0] * 4


def optimizer_case(seed, kind, dim, dtype, num_rows=40, touched=25):
    g = torch.Generator().manual_seed(seed)
    weights = torch.randn(num_rows, dim, generator=g).to(dtype)
    state = torch.rand(num_rows, so.state_width(kind, dim), generator=g)
    if kind in (so.ADAM, so.ADAMW):
        state[:, -1] = torch.randint(0, 5, (num_rows,), generator=g).float()
    rows = torch.randperm(num_rows, generator=g)[:touched]
    grads = torch.randn(rows.numel(), dim, generator=g)
    return weights, state, rows, grads


TOLERANCE = {torch.float32: {"rtol": 1e-4, "atol": 1e-5},
             torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2}}


@requires_triton
@SETTINGS
@given(st.integers(0, 2**31), st.sampled_from(KINDS), st.sampled_from([1, 3, 16, 100, 256]),
       st.sampled_from([torch.float32, torch.bfloat16]), st.integers(0, 30))
def test_triton_update_matches_reference(seed, kind, dim, dtype, touched):
    weights, state, rows, grads = optimizer_case(seed, kind, dim, dtype, touched=touched)
    device_weights, device_state = on_device(weights, state)
    so.update_triton(kind, device_weights, device_state, *on_device(rows, grads),
                     **HYPER)
    so.update_reference(kind, weights, state, rows, grads, **HYPER)
    assert_close(device_weights, weights, **TOLERANCE[dtype])
    assert_close(device_state, state, rtol=1e-4, atol=1e-5)


@requires_triton
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("hot", [0, 400])
def test_fused_aggregation_and_update_matches_reference(kind, hot):
    g = torch.Generator().manual_seed(kind + hot)
    dim, num_rows, num_slots = 6, 30, 16
    ids = torch.cat([torch.randint(0, num_rows, (60,), generator=g),
                     torch.full((hot,), 7)])
    unique, unique_index = unique_rows(ids, num_rows)
    destination = torch.randint(0, num_slots, (ids.numel(),), generator=g)
    id_weight = torch.rand(ids.numel(), generator=g)
    grad_out = torch.randn(num_slots, dim, generator=g) / max(1, hot) ** 0.5
    weights, state, _, _ = optimizer_case(kind, kind, dim, torch.float32, num_rows)
    device_weights, device_state = on_device(weights, state)
    so.aggregate_and_update_triton(
        kind, device_weights, device_state,
        *on_device(unique, grad_out, unique_index, destination, id_weight), **HYPER)
    so.aggregate_and_update(kind, weights, state, unique, grad_out, unique_index,
                            destination, id_weight, **HYPER)
    assert_close(device_weights, weights, rtol=1e-4, atol=1e-5)
    assert_close(device_state, state, rtol=1e-4, atol=1e-5)


@requires_triton
def test_triton_update_of_no_rows_changes_nothing():
    weights, state, _, _ = optimizer_case(0, so.ADAM, 4, torch.float32)
    before = weights.clone(), state.clone()
    device_weights, device_state = on_device(weights, state)
    none = torch.zeros(0, dtype=torch.int64)
    so.update_triton(so.ADAM, device_weights, device_state,
                     *on_device(none, torch.zeros(0, 4)), **HYPER)
    assert torch.equal(on_cpu(device_weights), before[0])
    assert torch.equal(on_cpu(device_state), before[1])
