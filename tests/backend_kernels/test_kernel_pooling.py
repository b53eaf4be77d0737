import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from kernel_cases import DEVICE, SETTINGS, assert_close, on_device, requires_triton

from reckeras.backend_kernels import dispatch, pooling
from reckeras.backend_kernels.aggregation import (group_by, ids_per_step,
                                                  split_segments, unique_rows)

DIMS = [1, 3, 16, 100, 256]


def lookup_case(seed, num_rows=40, dim=8, num_slots=12, n=30, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    weights = torch.randn(num_rows, dim, generator=g).to(dtype)
    rows = torch.randint(0, num_rows, (n,), generator=g)
    unique, unique_index = unique_rows(rows, num_rows)
    destination = torch.randint(0, max(num_slots, 1), (n,), generator=g)
    # Per-id weights as weighted features give them: any sign, some zero.
    id_weight = torch.randn(n, generator=g) * 2
    id_weight[torch.rand(n, generator=g) < 0.1] = 0.0
    return weights, unique, unique_index, destination, id_weight, num_slots


def naive_pooling(weights, unique, unique_index, destination, id_weight, num_slots):
    out = torch.zeros(num_slots, weights.shape[1], dtype=torch.float64)
    for i in range(unique_index.numel()):
        row = unique[unique_index[i]]
        out[destination[i]] += weights[row].double() * float(id_weight[i])
    return out.float()


@pytest.mark.parametrize("dim", DIMS)
def test_reference_matches_a_loop(dim):
    case = lookup_case(dim, dim=dim)
    assert_close(pooling.pooled_lookup_reference(*case), naive_pooling(*case))


def test_reference_with_unit_weights():
    case = list(lookup_case(4))
    case[4] = torch.ones_like(case[4])          # one-hot bags: no per-id scale
    assert_close(pooling.pooled_lookup_reference(*case), naive_pooling(*case))


def test_reference_of_a_permutation_and_of_empty_inputs():
    case = list(lookup_case(1, n=12, num_slots=12))
    case[3] = torch.randperm(12, generator=torch.Generator().manual_seed(0))
    assert_close(pooling.pooled_lookup_reference(*case), naive_pooling(*case))
    weights = case[0]
    none = torch.zeros(0, dtype=torch.int64)
    empty_bags = pooling.pooled_lookup_reference(weights, none, none, none,
                                                 torch.zeros(0), 5)
    assert torch.equal(empty_bags, torch.zeros(5, weights.shape[1]))
    assert pooling.pooled_lookup_reference(weights, none, none, none, torch.zeros(0),
                                           0).shape == (0, weights.shape[1])


def test_reference_of_a_bfloat16_table_accumulates_in_float32():
    case = lookup_case(2, dtype=torch.bfloat16)
    out = pooling.pooled_lookup_reference(*case)
    assert out.dtype == torch.float32
    assert_close(out, naive_pooling(*case))


@requires_triton
@SETTINGS
@given(st.integers(0, 2**31), st.sampled_from(DIMS), st.integers(0, 60),
       st.integers(1, 20), st.sampled_from([torch.float32, torch.bfloat16]))
def test_triton_matches_reference(seed, dim, n, num_slots, dtype):
    case = lookup_case(seed, dim=dim, n=n, num_slots=num_slots, dtype=dtype)
    expected = pooling.pooled_lookup_reference(*case)
    out = pooling.pooled_lookup_triton(*on_device(*case[:5]), num_slots)
    assert_close(out, expected)


@requires_triton
@pytest.mark.parametrize("n,num_slots", [(0, 0), (0, 4), (300, 3), (2000, 1000)])
def test_triton_edge_cases(n, num_slots):
    """Empty batch, empty bags only, long bags (cut into pieces), 1000 slots."""
    case = lookup_case(n, n=n, num_slots=num_slots, dim=3)
    expected = pooling.pooled_lookup_reference(*case)
    assert_close(pooling.pooled_lookup_triton(*on_device(*case[:5]), num_slots),
                 expected)


@requires_triton
def test_triton_cuts_a_hot_slot_into_pieces():
    weights, unique, unique_index, _, id_weight, _ = lookup_case(9, n=550, dim=16)
    destination = torch.cat([torch.zeros(500, dtype=torch.int64), torch.arange(1, 51)])
    order, offsets = group_by(destination, 51)
    block_n = ids_per_step(550, 51)
    assert split_segments(offsets[:-1], offsets[1:], block_n) is not None
    case = (weights, unique, unique_index, destination, id_weight)
    assert_close(pooling.pooled_lookup_triton(*on_device(*case), 51),
                 pooling.pooled_lookup_reference(*case, 51), rtol=1e-5, atol=1e-4)


class RecordingHook:
    def __init__(self):
        self.calls = []

    def __call__(self, rows, grads):
        self.calls.append((rows.cpu(), grads.cpu()))


def dense_grads(weights, unique, unique_index, destination, id_weight, num_slots,
                grad_out):
    """Gradient of sum(pooled * grad_out) with respect to the touched rows."""
    table = weights.double().requires_grad_()
    gathered = table[unique[unique_index]] * id_weight.double().unsqueeze(1)
    pooled = torch.zeros(num_slots, weights.shape[1], dtype=torch.float64)
    pooled = pooled.index_add(0, destination, gathered)
    (pooled * grad_out.double()).sum().backward()
    return table.grad[unique].float()


@pytest.mark.parametrize("dim", [1, 16])
def test_pooled_lookup_backward_hands_row_gradients_to_the_hook(dim):
    case = lookup_case(dim + 10, dim=dim)
    grad_out = torch.randn(case[-1], dim)
    hook = RecordingHook()
    anchor = torch.zeros(0, requires_grad=True)
    pooled = pooling.PooledLookup.apply(anchor, *on_device(*case[:5]), case[-1], hook)
    assert_close(pooled, pooling.pooled_lookup_reference(*case))
    (pooled * on_device(grad_out)).sum().backward()
    (rows, grads), = hook.calls
    assert torch.equal(rows, case[1])
    assert_close(grads, dense_grads(*case, grad_out))


def test_pooled_lookup_backward_hands_the_pooled_gradient_to_a_fusing_hook():
    """On CUDA (and with the native CPU kernels), a hook with ``apply_pooled``
    aggregates and updates in one pass; with the CPU references the backward
    aggregates itself and calls the hook."""
    case = lookup_case(5)
    received = {}

    class FusingHook:
        def __call__(self, rows, grads):
            received["grads"] = (rows.cpu(), grads.cpu())

        def apply_pooled(self, *args):
            received["pooled"] = [a.cpu() for a in args]

    anchor = torch.zeros(0, requires_grad=True)
    pooled = pooling.PooledLookup.apply(anchor, *on_device(*case[:5]), case[-1],
                                        FusingHook())
    grad_out = torch.randn(case[-1], case[0].shape[1])
    pooled.backward(on_device(grad_out))
    fused = DEVICE.type == "cuda" or dispatch.use_native(*case[:5])
    if fused:
        rows, got_grad, unique_index, destination, _ = received["pooled"]
        assert torch.equal(got_grad, grad_out) and torch.equal(destination, case[3])
    else:
        rows, grads = received["grads"]
        assert_close(grads, dense_grads(*case, grad_out))
    assert torch.equal(rows, case[1]) and len(received) == 1


def test_penalized_rows_are_a_second_output_whose_gradient_reaches_the_hook():
    """`penalized=(table, rows)`: the rows come out as float32 and their
    gradient reaches the hook beside the row gradients, never through the
    fused `apply_pooled` (the two must be summed before the update)."""
    case = lookup_case(8, dtype=torch.bfloat16)
    received = {}

    class FusingHook:
        def __call__(self, rows, grads, penalized_grads):
            received["grads"] = (rows.cpu(), grads.cpu(), penalized_grads.cpu())

        def apply_pooled(self, *args):
            received["pooled"] = True

    anchor = torch.zeros(0, requires_grad=True)
    weights, unique = on_device(*case[:2])
    pooled, rows = pooling.PooledLookup.apply(anchor, *on_device(*case[:5]), case[-1],
                                              FusingHook(), (weights, unique))
    assert rows.dtype == torch.float32
    assert torch.equal(rows.cpu(), case[0][case[1]].float())
    grad_out = torch.randn(case[-1], case[0].shape[1])
    ((pooled * on_device(grad_out)).sum() + 0.5 * rows.square().sum()).backward()
    got_rows, grads, penalized_grads = received["grads"]
    assert list(received) == ["grads"] and torch.equal(got_rows, case[1])
    assert_close(grads, dense_grads(*case, grad_out))
    assert_close(penalized_grads, case[0][case[1]].float())
