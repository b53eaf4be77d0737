import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from kernel_cases import SETTINGS, assert_close, on_device, requires_triton

from reckeras.backend_kernels import aggregation


def aggregation_case(seed, num_rows=30, dim=8, num_slots=20, n=50, hot=0):
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, num_rows, (n,), generator=g)
    rows = torch.cat([rows, torch.full((hot,), 3)])       # one hot row
    unique, unique_index = aggregation.unique_rows(rows, num_rows)
    destination = torch.randint(0, max(num_slots, 1), (rows.numel(),), generator=g)
    id_weight = torch.rand(rows.numel(), generator=g)
    grad_out = torch.randn(num_slots, dim, generator=g)
    return grad_out, unique_index, destination, id_weight, unique.numel()


def naive_aggregation(grad_out, unique_index, destination, id_weight, num_unique):
    out = torch.zeros(num_unique, grad_out.shape[1], dtype=torch.float64)
    for i in range(unique_index.numel()):
        out[unique_index[i]] += grad_out[destination[i]].double() * float(id_weight[i])
    return out.float()


def test_unique_rows_matches_torch_unique():
    rows = torch.tensor([7, 3, 7, 0, 9, 3, 3])
    unique, unique_index = aggregation.unique_rows(rows, 10)
    # The order of the distinct rows is the kernel's (sorted in the reference,
    # first appearance in the native CPU kernel); the mapping is what counts.
    assert sorted(unique.tolist()) == torch.unique(rows).tolist()
    assert torch.equal(unique[unique_index], rows)
    none = torch.zeros(0, dtype=torch.int64)
    unique, unique_index = aggregation.unique_rows(none, 0)
    assert unique.numel() == 0 and unique_index.numel() == 0


@pytest.mark.parametrize("keys,groups", [([2, 0, 2, 1, 0, 2], 4), ([1, 0, 2], 3), ([], 2),
                                         ([0, 0], 1)])
def test_group_by_is_a_stable_csr(keys, groups):
    keys = torch.tensor(keys, dtype=torch.int64)
    order, offsets = aggregation.group_by(keys, groups)
    assert offsets.tolist()[0] == 0 and offsets.numel() == groups + 1
    for group in range(groups):
        members = order[offsets[group]:offsets[group + 1]].tolist()
        assert members == [i for i, k in enumerate(keys.tolist()) if k == group]


@pytest.mark.parametrize("dim", [1, 3, 16, 100, 256])
def test_reference_matches_a_loop(dim):
    case = aggregation_case(dim, dim=dim)
    assert_close(aggregation.aggregate_row_grads_reference(*case),
                 naive_aggregation(*case))


def test_reference_with_unit_weights():
    grad_out, unique_index, destination, id_weight, num_unique = aggregation_case(11)
    case = (grad_out, unique_index, destination, torch.ones_like(id_weight), num_unique)
    assert_close(aggregation.aggregate_row_grads_reference(*case), naive_aggregation(*case))


def test_reference_of_an_empty_batch():
    none = torch.zeros(0, dtype=torch.int64)
    out = aggregation.aggregate_row_grads(torch.zeros(0, 4), none, none, torch.zeros(0), 0)
    assert out.shape == (0, 4)


@requires_triton
@SETTINGS
@given(st.integers(0, 2**31), st.sampled_from([1, 3, 16, 100, 256]),
       st.integers(0, 80), st.integers(1, 30), st.sampled_from([0, 200]))
def test_triton_matches_reference(seed, dim, n, num_slots, hot):
    case = aggregation_case(seed, dim=dim, n=n, num_slots=num_slots, hot=hot)
    expected = aggregation.aggregate_row_grads_reference(*case)
    out = aggregation.aggregate_row_grads_triton(*on_device(*case[:4]), case[4])
    assert_close(out, expected, rtol=1e-5, atol=1e-4)


@requires_triton
def test_triton_cuts_hot_rows_into_pieces():
    case = aggregation_case(3, n=40, hot=600, dim=5)
    order, offsets = aggregation.group_by(case[1], case[4])
    block_n = aggregation.ids_per_step(case[1].numel(), case[4])
    assert aggregation.split_segments(offsets[:-1], offsets[1:], block_n) is not None
    out = aggregation.aggregate_row_grads_triton(*on_device(*case[:4]), case[4])
    assert_close(out, naive_aggregation(*case), rtol=1e-5, atol=1e-4)


@requires_triton
def test_triton_of_an_empty_batch():
    none = torch.zeros(0, dtype=torch.int64)
    out = aggregation.aggregate_row_grads_triton(
        *on_device(torch.zeros(3, 4), none, none, torch.zeros(0)), 0)
    assert out.shape == (0, 4)
