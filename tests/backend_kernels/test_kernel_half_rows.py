"""Half-precision table rows (float16, bfloat16) in the pooled lookup and the
sparse update: the native and Triton kernels against the torch reference, and
the stochastic rounding against its definition."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from kernel_cases import SETTINGS, assert_close, on_device, requires_triton, triton_route
from test_kernel_sparse_optimizers import optimizer_case

from reckeras.backend_kernels import cpu_native, pooling
from reckeras.backend_kernels import sparse_optimizers as so
from reckeras.backend_kernels.aggregation import unique_rows

HALVES = [torch.bfloat16, torch.float16]
# One step of a half type relative to the value: 2^-7 (bfloat16), 2^-10 (float16).
RELATIVE_STEP = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}
NATIVE_KINDS = {so.SGD: "sgd", so.ADAGRAD: "adagrad", so.ROWWISE_ADAGRAD: "rowwise_adagrad"}
requires_native = pytest.mark.skipif(not cpu_native.available(),
                                     reason="no C compiler: native kernels unavailable")


def exact_sgd_case(dtype, seed=0, rows=300, dim=5):
    """Half rows and gradients whose SGD step at lr 0.5 is exact in float32,
    so that every kernel rounds the very same float32 values."""
    g = torch.Generator().manual_seed(seed)
    weights = (torch.randn(rows, dim, generator=g) * 0.1).to(dtype)
    grads = (torch.randn(rows, dim, generator=g) * 1e-3).to(torch.bfloat16).float()
    return weights, torch.zeros(rows, 0), torch.arange(rows), grads


def one_step_up(values, dtype):
    """Each value's neighbour one half step away from zero."""
    bits = values.to(dtype).view(torch.int16)
    return (bits + 1).view(dtype)


def sgd_native(weights, rows, grads, lr, round_seed):
    cpu_native.apply_update("sgd", weights, torch.zeros(len(weights), 0), rows, grads, lr,
                            0.0, round_seed)


# ---- the rounding itself ---------------------------------------------------------------

@pytest.mark.parametrize("dtype", HALVES)
def test_values_a_half_type_holds_are_never_moved(dtype):
    values = torch.randn(200, 8).to(dtype)
    for seed in (0, 1, 2**31 - 1):
        rounded = so.stochastic_round_reference(values.float(), dtype, seed)
        assert torch.equal(rounded.view(torch.int16), values.view(torch.int16))


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("fraction", [1 / 16, 1 / 4, 3 / 4])
def test_rounding_up_is_as_likely_as_the_distance_below(dtype, fraction):
    """Over steps, a value `fraction` of a step above a half value rounds up
    with probability `fraction`: the rounding is unbiased."""
    low = torch.tensor([[0.3, -1.7, 12.0]]).to(dtype)
    high = one_step_up(low, dtype)
    values = low.float() + fraction * (high.float() - low.float())
    steps = 4000
    up = sum((so.stochastic_round_reference(values, dtype, so.rounding_seed(3, step))
              == high).float() for step in range(steps)) / steps
    spread = 4 * (fraction * (1 - fraction) / steps) ** 0.5      # 4 standard deviations
    assert torch.all((up - fraction).abs() < spread), up


@pytest.mark.parametrize("dtype", HALVES)
def test_rounding_seed_spreads_steps_and_tables(dtype):
    seeds = {so.rounding_seed(seed, step, stream)
             for seed in (0, 1) for step in range(200) for stream in range(3)}
    assert len(seeds) == 2 * 200 * 3 and all(0 <= s < 2**31 for s in seeds)


@requires_native
@pytest.mark.parametrize("dtype", HALVES)
def test_many_tiny_updates_are_not_all_lost(dtype):
    """100 SGD steps of a tenth of a half step each, on 256 rows in [0.75,
    1) (one step there: 2^-8 in bfloat16, 2^-11 in float16): round-to-nearest
    never moves a row; stochastic rounding moves the rows by the sum of the
    updates on average, 10 steps."""
    step = RELATIVE_STEP[dtype] / 2                     # the step of [0.5, 1)
    start = (0.75 + (torch.arange(256.0).reshape(64, 4) % 32) * step).to(dtype)
    grads = torch.full((64, 4), step / 10 / 0.1)      # lr 0.1: a tenth of a step
    rows = torch.arange(64)
    nearest, stochastic = start.clone(), start.clone()
    for t in range(100):
        nearest.copy_((nearest.float() - 0.1 * grads).to(dtype))
        so.update(so.SGD, stochastic, torch.zeros(64, 0), rows, grads, 0.1,
                  round_seed=so.rounding_seed(0, t))
    assert torch.equal(nearest, start)
    moved = (start.float() - stochastic.float()) / step
    assert abs(float(moved.mean()) - 10) < 1, float(moved.mean())
    assert float((moved >= 1).float().mean()) > 0.95


# ---- every kernel rounds the same bits ------------------------------------------------

@requires_native
@pytest.mark.parametrize("dtype", HALVES)
def test_native_update_rounds_bit_for_bit_as_the_reference(dtype):
    weights, state, rows, grads = exact_sgd_case(dtype)
    expected = weights.clone()
    so.update_reference(so.SGD, expected, state, rows, grads, 0.5, round_seed=1234)
    sgd_native(weights, rows, grads, 0.5, 1234)
    assert torch.equal(weights.view(torch.int16), expected.view(torch.int16))
    assert (weights != expected.to(dtype)).sum() == 0


@requires_native
def test_native_float16_rounding_of_subnormals_overflow_and_specials():
    """Updates landing below float16's normal range, past its largest value,
    on zero, inf and NaN: the native conversion equals torch's."""
    targets = torch.tensor([[3e-5, -6e-8, 1e-9, 2.0**-24, 6.1e-5, 65504.0, 65519.0],
                            [65520.0, 1e6, 0.0, -0.0, float("inf"), -float("inf"),
                             float("nan")]])
    rows = torch.arange(2)
    for seed in range(20):
        expected = torch.zeros(2, 7, dtype=torch.float16)
        so.update_reference(so.SGD, expected, torch.zeros(2, 0), rows, -2 * targets, 0.5,
                            round_seed=seed)
        weights = torch.zeros(2, 7, dtype=torch.float16)
        sgd_native(weights, rows, -2 * targets, 0.5, seed)
        assert torch.equal(weights.view(torch.int16).masked_fill(weights.isnan(), 0),
                           expected.view(torch.int16).masked_fill(expected.isnan(), 0))
        assert torch.equal(weights.isnan(), targets.isnan())


@requires_native
def test_native_pooling_reads_every_float16_exactly():
    table = torch.arange(-2**15, 2**15, dtype=torch.int32).to(torch.int16) \
        .view(torch.float16).reshape(-1, 16)
    rows = torch.arange(table.shape[0])
    out = cpu_native.pool_forward(table, rows, rows, rows, torch.ones(rows.numel()),
                                  rows.numel())
    torch.testing.assert_close(out, table.float(), rtol=0, atol=0, equal_nan=True)


@requires_triton
@pytest.mark.parametrize("dtype", HALVES)
def test_triton_update_rounds_bit_for_bit_as_the_reference(dtype):
    weights, state, rows, grads = exact_sgd_case(dtype, seed=1, rows=70)
    expected = weights.clone()
    so.update_reference(so.SGD, expected, state, rows, grads, 0.5, round_seed=99)
    device_weights = on_device(weights)
    so.update_triton(so.SGD, device_weights, *on_device(state, rows, grads), 0.5,
                     round_seed=99)
    assert torch.equal(device_weights.cpu().view(torch.int16), expected.view(torch.int16))


# ---- the kernels against the reference -------------------------------------------------

def assert_within_a_step(actual, expected, dtype):
    """Kernels may sum in another order: a float32 value an ulp apart rounds
    with other random bits, to a neighbour at most one half step away."""
    torch.testing.assert_close(actual.cpu().float(), expected.float(),
                               rtol=RELATIVE_STEP[dtype] * 1.01, atol=1e-7)


@requires_native
@SETTINGS
@given(st.integers(0, 2**31), st.sampled_from(list(NATIVE_KINDS)),
       st.sampled_from([1, 3, 16, 100]), st.sampled_from(HALVES), st.integers(0, 40))
def test_native_update_of_half_rows_matches_reference(seed, kind, dim, dtype, touched):
    weights, state, rows, grads = optimizer_case(seed, kind, dim, dtype, touched=touched)
    expected_weights, expected_state = weights.clone(), state.clone()
    so.update_reference(kind, expected_weights, expected_state, rows, grads, 0.05, 1e-6,
                        round_seed=seed)
    cpu_native.apply_update(NATIVE_KINDS[kind], weights, state, rows, grads, 0.05, 1e-6,
                            seed)
    assert weights.dtype == dtype
    assert_within_a_step(weights, expected_weights, dtype)
    assert_close(state, expected_state, rtol=1e-5, atol=1e-6)


@requires_triton
@SETTINGS
@given(st.integers(0, 2**31), st.sampled_from(list(range(5))),
       st.sampled_from([1, 3, 16, 100]), st.sampled_from(HALVES), st.integers(0, 30))
def test_triton_update_of_half_rows_matches_reference(seed, kind, dim, dtype, touched):
    weights, state, rows, grads = optimizer_case(seed, kind, dim, dtype, touched=touched)
    device_weights, device_state = on_device(weights, state)
    hyper = {"lr": 0.05, "eps": 1e-6, "beta1": 0.8, "beta2": 0.95, "weight_decay": 0.1}
    so.update_triton(kind, device_weights, device_state, *on_device(rows, grads), **hyper,
                     round_seed=seed)
    so.update_reference(kind, weights, state, rows, grads, **hyper, round_seed=seed)
    assert device_weights.dtype == dtype
    assert_within_a_step(device_weights, weights, dtype)
    assert_close(device_state, state, rtol=1e-4, atol=1e-5)


@requires_triton
@pytest.mark.parametrize("dtype", HALVES)
def test_fused_aggregation_and_update_of_half_rows_matches_reference(dtype):
    g = torch.Generator().manual_seed(5)
    dim, num_rows, num_slots = 6, 30, 16
    ids = torch.randint(0, num_rows, (80,), generator=g)
    unique, unique_index = unique_rows(ids, num_rows)
    destination = torch.randint(0, num_slots, (ids.numel(),), generator=g)
    id_weight = torch.rand(ids.numel(), generator=g)
    grad_out = torch.randn(num_slots, dim, generator=g)
    weights, state, _, _ = optimizer_case(1, so.ROWWISE_ADAGRAD, dim, dtype, num_rows)
    device_weights, device_state = on_device(weights, state)
    so.aggregate_and_update_triton(
        so.ROWWISE_ADAGRAD, device_weights, device_state,
        *on_device(unique, grad_out, unique_index, destination, id_weight), lr=0.05,
        eps=1e-6, round_seed=17)
    with torch.no_grad():
        grads = torch.zeros(unique.numel(), dim).index_add_(
            0, unique_index, grad_out[destination] * id_weight[:, None])
    so.update_reference(so.ROWWISE_ADAGRAD, weights, state, unique, grads, 0.05, 1e-6,
                        round_seed=17)
    assert_within_a_step(device_weights, weights, dtype)
    assert_close(device_state, state, rtol=1e-4, atol=1e-5)


def pooling_case(seed, dim, n, num_slots, dtype, num_rows=30):
    g = torch.Generator().manual_seed(seed)
    weights = torch.randn(num_rows, dim, generator=g).to(dtype)
    unique = torch.randperm(num_rows, generator=g)[:max(1, min(n, num_rows))]
    unique_index = torch.randint(0, unique.numel(), (n,), generator=g)
    destination = torch.randint(0, max(num_slots, 1), (n,), generator=g)
    id_weight = torch.rand(n, generator=g)
    return weights, unique, unique_index, destination, id_weight


def naive_pooling(weights, unique, unique_index, destination, id_weight, num_slots):
    out = torch.zeros(num_slots, weights.shape[1], dtype=torch.float64)
    for i in range(unique_index.numel()):
        out[destination[i]] += weights[unique[unique_index[i]]].double() * id_weight[i]
    return out.float()


@requires_native
@SETTINGS
@given(st.integers(0, 2**31), st.sampled_from([1, 3, 16, 100]), st.integers(0, 60),
       st.integers(1, 20), st.sampled_from(HALVES))
def test_native_pooling_of_half_rows_matches_reference(seed, dim, n, num_slots, dtype):
    case = pooling_case(seed, dim, n, num_slots, dtype)
    out = cpu_native.pool_forward(*case, num_slots)
    assert_close(out, pooling.pooled_lookup_reference(*case, num_slots), rtol=1e-5,
                 atol=1e-5)
    assert_close(out, naive_pooling(*case, num_slots), rtol=1e-5, atol=1e-5)


@requires_triton
@SETTINGS
@given(st.integers(0, 2**31), st.sampled_from([1, 3, 16, 100]), st.integers(0, 60),
       st.integers(1, 20), st.sampled_from(HALVES))
def test_triton_pooling_of_half_rows_matches_reference(seed, dim, n, num_slots, dtype):
    case = pooling_case(seed, dim, n, num_slots, dtype)
    with triton_route():
        out = pooling.pooled_lookup(*on_device(*case), num_slots)
    assert_close(out, naive_pooling(*case, num_slots), rtol=1e-5, atol=1e-5)
