"""FrequencyEstimator against the paper's per-example loop (Yi et al. 2019)."""

import keras
import numpy as np
import pytest
import torch

import reckeras as rk


def sequential_reference(batches, num_buckets, alpha, bucket_of):
    """Algorithm 2 of the paper: one example after the other, step = batch."""
    last = np.zeros(num_buckets, np.int64)
    gap = np.zeros(num_buckets, np.float64)
    for step, ids in enumerate(batches, start=1):
        for h in bucket_of(ids):
            gap[h] = (1 - alpha) * gap[h] + alpha * (step - last[h])
            last[h] = step
    return last, gap


def test_matches_the_sequential_loop_with_duplicates_and_collisions():
    rng = np.random.default_rng(0)
    estimator = rk.retrieval.FrequencyEstimator(num_buckets=13, alpha=0.1)
    # Zipf ids: many duplicates in a batch; 13 buckets: many collisions.
    batches = [np.minimum(rng.zipf(1.5, 40), 200).astype(np.int64) for _ in range(30)]
    for ids in batches:
        log_q = estimator(torch.as_tensor(ids), training=True)
    last, gap = sequential_reference(
        batches, 13, 0.1, lambda ids: estimator.buckets(torch.as_tensor(ids)).numpy())
    np.testing.assert_array_equal(estimator.last_step.numpy(), last)
    np.testing.assert_allclose(estimator.gap.numpy(), gap, rtol=1e-5)
    assert int(estimator.step.numpy()) == 30
    expected = -np.log(gap[estimator.buckets(torch.as_tensor(batches[-1])).numpy()])
    np.testing.assert_allclose(log_q.numpy(), expected, rtol=1e-5)


def test_update_returns_what_log_probability_reads_after_it():
    estimator = rk.retrieval.FrequencyEstimator(num_buckets=16, alpha=0.3)
    estimator.build()
    estimator.update(torch.tensor([1, 2, 2]))
    ids = torch.tensor([[2, 7, 2], [9, 1, 7]])          # any shape, duplicates
    log_q = estimator.update(ids)
    assert log_q.shape == (2, 3) and int(estimator.step.numpy()) == 2
    np.testing.assert_array_equal(log_q.numpy(), estimator.log_probability(ids).numpy())
    # Id 9, first seen at step 2 (a bucket of its own): B = 0.3 * (2 - 0).
    np.testing.assert_allclose(log_q[1, 0].item(), -np.log(0.6), rtol=1e-6)


def test_in_a_training_step_the_update_waits_for_the_commit():
    from reckeras._keras_compat import DeferredAssignments

    direct = rk.retrieval.FrequencyEstimator(num_buckets=16, alpha=0.3)
    deferred = rk.retrieval.FrequencyEstimator(num_buckets=16, alpha=0.3)
    for estimator in (direct, deferred):
        estimator.build()
        estimator.update(torch.tensor([1, 2, 2]))
    ids = torch.tensor([2, 7, 2, 9])
    expected = direct.update(ids)
    before = [v.numpy().copy() for v in deferred.weights]
    with DeferredAssignments():                    # a step refused: never committed
        np.testing.assert_array_equal(deferred.update(ids).numpy(), expected.numpy())
    for variable, value in zip(deferred.weights, before, strict=True):
        np.testing.assert_array_equal(variable.numpy(), value)
    with DeferredAssignments() as step:
        log_q = deferred.update(ids)
    step.commit(keras.Sequential())
    np.testing.assert_array_equal(log_q.numpy(), expected.numpy())
    for a, b in zip(deferred.weights, direct.weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_estimate_converges_to_the_true_frequency():
    # Item i appears in a batch with probability p_i: the gap tends to 1 / p_i.
    rng = np.random.default_rng(1)
    p = np.array([0.9, 0.5, 0.1, 0.05])
    estimator = rk.retrieval.FrequencyEstimator(num_buckets=1 << 12, alpha=0.01)
    for _ in range(6000):
        present = np.flatnonzero(rng.random(4) < p)
        estimator(torch.as_tensor(present, dtype=torch.int64), training=True)
    log_q = estimator(torch.arange(4)).numpy()
    np.testing.assert_allclose(np.exp(log_q), p, rtol=0.25)


def test_inference_reads_without_updating_and_unseen_ids_read_zero():
    estimator = rk.retrieval.FrequencyEstimator(num_buckets=64, alpha=0.5)
    assert estimator(torch.tensor([5, 6])).tolist() == [0.0, 0.0]
    estimator(torch.tensor([5]), training=True)
    before = estimator.gap.numpy().copy()
    estimator(torch.tensor([5, 6]), training=False)
    np.testing.assert_array_equal(estimator.gap.numpy(), before)
    assert int(estimator.step.numpy()) == 1


@pytest.mark.parametrize("bad", [{"num_buckets": 0}, {"num_buckets": 2.5},
                                 {"alpha": 0.0}, {"alpha": 1.5}, {"alpha": True}])
def test_bad_arguments_are_refused_naming_them(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        rk.retrieval.FrequencyEstimator(**bad)


def test_state_round_trips_model_save(tmp_path):
    ids = keras.Input(shape=(), dtype="int64")
    estimator = rk.retrieval.FrequencyEstimator(num_buckets=32, alpha=0.2)
    model = keras.Model(ids, estimator(ids))
    for batch in ([1, 2, 2, 3], [3, 4], [1]):
        estimator(torch.tensor(batch), training=True)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    restored = loaded.layers[-1]
    assert (restored.num_buckets, restored.alpha) == (32, 0.2)
    for name in ("last_step", "gap", "step"):
        np.testing.assert_array_equal(getattr(restored, name).numpy(),
                                      getattr(estimator, name).numpy())
