"""NegativeSampler's draws against their distribution."""

import keras
import numpy as np
import pytest

import reckeras as rk


def test_uniform_draws_cover_the_ids_evenly_with_their_log_q():
    ids = np.array([10, 20, 30, 40])
    sampler = rk.retrieval.NegativeSampler(ids, num_negatives=40000, seed=1)
    drawn, log_q = sampler.sample()
    values, counts = np.unique(drawn.numpy(), return_counts=True)
    assert values.tolist() == ids.tolist()
    np.testing.assert_allclose(counts / 40000, 0.25, atol=0.01)
    np.testing.assert_allclose(log_q.numpy(), np.log(40000 * 0.25), rtol=1e-6)


def test_popularity_draws_follow_counts_to_the_power():
    ids = np.array([5, 6, 7, 8])
    counts = np.array([16.0, 4.0, 0.0, 1.0])
    sampler = rk.retrieval.NegativeSampler(ids, num_negatives=50000, counts=counts,
                                           power=0.5, seed=2)
    drawn, log_q = sampler.sample()
    p = np.sqrt(counts) / np.sqrt(counts).sum()         # 4, 2, 0, 1 out of 7
    frequency = np.array([(drawn.numpy() == i).mean() for i in ids])
    np.testing.assert_allclose(frequency, p, atol=0.01)
    assert frequency[2] == 0                             # count 0: never drawn
    expected = np.log(50000 * p[np.searchsorted(ids, drawn.numpy())])
    np.testing.assert_allclose(log_q.numpy(), expected, rtol=1e-5)


def test_seed_and_stream_decide_the_draws_and_config_round_trips():
    sampler = rk.retrieval.NegativeSampler(np.arange(100), num_negatives=8, seed=3)
    again = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(sampler))
    assert again.get_config() == sampler.get_config()
    first = sampler.sample()[0]
    assert first.tolist() == again.sample()[0].tolist()
    assert sampler.sample(stream=1)[0].tolist() != again.sample(stream=0)[0].tolist()


@pytest.mark.parametrize("arguments, message", [
    ({"item_ids": [], "num_negatives": 2}, "item_ids must be a non-empty"),
    ({"item_ids": [1, 1], "num_negatives": 2}, "distinct"),
    ({"item_ids": [1, 2], "num_negatives": 0}, "num_negatives"),
    ({"item_ids": [1, 2], "num_negatives": 2, "counts": [1]}, "counts must hold"),
    ({"item_ids": [1, 2], "num_negatives": 2, "counts": [0, 0]}, "counts must hold"),
    ({"item_ids": [1, 2], "num_negatives": 2, "power": -1}, "power"),
])
def test_bad_arguments_are_refused(arguments, message):
    with pytest.raises(ValueError, match=message):
        rk.retrieval.NegativeSampler(**arguments)
