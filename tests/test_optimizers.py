import keras
import numpy as np
import pytest
import torch

from reckeras import optimizers
from reckeras.backend_kernels.aggregation import aggregate_row_grads


@pytest.mark.parametrize("name,cls,width", [
    ("sgd", optimizers.SGD, 0), ("adagrad", optimizers.Adagrad, 8),
    ("rowwise_adagrad", optimizers.RowWiseAdagrad, 1), ("adam", optimizers.Adam, 17),
    ("AdamW", optimizers.AdamW, 17)])
def test_get_by_name_and_state_width(name, cls, width):
    optimizer = optimizers.get(name)
    assert type(optimizer) is cls and optimizer.state_width(8) == width


@pytest.mark.parametrize("optimizer", [
    optimizers.SGD(0.1), optimizers.Adagrad(0.2, epsilon=1e-6),
    optimizers.RowWiseAdagrad(0.05, initial_accumulator_value=0.1),
    optimizers.Adam(0.01, beta_1=0.8, weight_decay=0.1),
    optimizers.AdamW(0.02, beta_2=0.99, epsilon=1e-7)])
def test_serialize_round_trip(optimizer):
    restored = optimizers.get(optimizers.serialize(optimizer))
    assert type(restored) is type(optimizer)
    assert restored.get_config() == optimizer.get_config()


def test_adam_defaults_follow_torch():
    assert optimizers.Adam().get_config() == {
        "learning_rate": 0.001, "beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-8,
        "weight_decay": 0.0}
    assert optimizers.AdamW().weight_decay == 0.01


@pytest.mark.parametrize("kwargs,message", [
    ({"learning_rate": 0}, "learning_rate"), ({"beta_1": 1.0}, "beta_1"),
    ({"beta_2": -0.1}, "beta_2"), ({"epsilon": 0}, "epsilon"),
    ({"weight_decay": -1}, "weight_decay")])
@pytest.mark.parametrize("cls", [optimizers.Adam, optimizers.AdamW])
def test_adam_validates_arguments(cls, kwargs, message):
    with pytest.raises(ValueError, match=message):
        cls(**kwargs)


def test_unknown_optimizer_is_rejected():
    with pytest.raises(ValueError, match="unknown embedding optimizer"):
        optimizers.get("lamb")


def test_adam_matches_torch_adam_on_touched_rows():
    weights = torch.randn(5, 3)
    state = torch.zeros(5, optimizers.Adam().state_width(3))
    param = torch.nn.Parameter(weights[[1, 3]].clone())
    reference = torch.optim.Adam([param], lr=0.1, weight_decay=0.01)
    optimizer = optimizers.Adam(0.1, weight_decay=0.01)
    untouched = weights[[0, 2, 4]].clone()
    for step in range(3):
        grads = torch.randn(2, 3)
        optimizer.apply(weights, state, torch.tensor([1, 3]), grads)
        param.grad = grads
        reference.step()
    torch.testing.assert_close(weights[[1, 3]], param.detach())
    assert torch.equal(weights[[0, 2, 4]], untouched)
    assert state[[1, 3], -1].tolist() == [3.0, 3.0] and state[0, -1] == 0


@pytest.mark.parametrize("optimizer", [optimizers.SGD(0.1), optimizers.RowWiseAdagrad(0.1),
                                       optimizers.AdamW(0.1)])
def test_apply_pooled_equals_aggregate_then_apply(optimizer):
    g = torch.Generator().manual_seed(0)
    weights = torch.randn(6, 4, generator=g)
    state = torch.rand(6, optimizer.state_width(4), generator=g)
    rows = torch.tensor([0, 2, 5])
    unique_index = torch.tensor([0, 1, 2, 1, 0])
    destination = torch.tensor([0, 1, 2, 3, 3])
    id_weight = torch.rand(5, generator=g)
    grad_out = torch.randn(4, 4, generator=g)
    expected_weights, expected_state = weights.clone(), state.clone()
    optimizer.apply(expected_weights, expected_state, rows,
                    aggregate_row_grads(grad_out, unique_index, destination, id_weight, 3))
    optimizer.apply_pooled(weights, state, rows, grad_out, unique_index, destination,
                           id_weight)
    torch.testing.assert_close(weights, expected_weights)
    torch.testing.assert_close(state, expected_state)


def test_a_schedule_is_refused_and_the_rate_is_read_at_every_step():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 100, 0.5)
    with pytest.raises(ValueError, match="learning_rate must be a number, not a schedule "
                                         r"\(ExponentialDecay\)"):
        optimizers.Adagrad(schedule)
    optimizer = optimizers.SGD(0.5)
    weights, state = torch.ones(3, 2), torch.zeros(3, optimizer.state_width(2))
    optimizer.apply(weights, state, torch.tensor([0]), torch.ones(1, 2))
    optimizer.learning_rate = 0.25          # as a callback sets it between steps
    optimizer.apply(weights, state, torch.tensor([0]), torch.ones(1, 2))
    np.testing.assert_allclose(weights.numpy(), [[0.25, 0.25], [1, 1], [1, 1]])
