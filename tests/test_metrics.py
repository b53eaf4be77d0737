import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import reckeras  # noqa: F401  (selects the torch backend before keras)
import keras

from reckeras.metrics import AUC


def pairwise_auc(labels, scores, weights=None):
    """O(n^2) reference: weighted share of (positive, negative) pairs ranked
    right, ties counting 1/2; 0.0 without both classes."""
    labels = np.asarray(labels, dtype=np.float64).ravel()
    scores = np.asarray(scores, dtype=np.float64).ravel()
    weights = (np.ones_like(scores) if weights is None
               else np.asarray(weights, dtype=np.float64).ravel())
    pos, neg = labels == 1, labels == 0
    pair_weight = np.outer(weights[pos], weights[neg])
    if pair_weight.sum() == 0:
        return 0.0
    pos_scores, neg_scores = scores[pos][:, None], scores[neg][None, :]
    credit = (pos_scores > neg_scores) + 0.5 * (pos_scores == neg_scores)
    return float((pair_weight * credit).sum() / pair_weight.sum())


def auc_of(labels, scores, weights=None):
    metric = AUC()
    metric.update_state(labels, scores, sample_weight=weights)
    return float(metric.result())


def test_perfect_reversed_and_tied_rankings():
    labels = [0, 0, 1, 1, 1]
    assert auc_of(labels, [0.1, 0.2, 0.3, 0.4, 0.5]) == 1.0
    assert auc_of(labels, [0.5, 0.4, 0.3, 0.2, 0.1]) == 0.0
    assert auc_of(labels, [0.7] * 5) == 0.5


def test_weighted_case_by_hand():
    labels = [1, 0, 1, 0]
    weights = [2.0, 1.0, 1.0, 3.0]
    # Positives 0.9 (w2), 0.3 (w1); negatives 0.8 (w1), 0.5 (w3):
    # 0.9 beats both (2*1 + 2*3), 0.3 beats neither; total pair weight 3*4.
    assert auc_of(labels, [0.9, 0.8, 0.3, 0.5], weights) == pytest.approx(
        8 / 12)
    # Moving 0.3 to 0.5 ties it with the w3 negative: +0.5 * 1 * 3.
    assert auc_of(labels, [0.9, 0.8, 0.5, 0.5], weights) == pytest.approx(
        9.5 / 12)


def test_one_class_or_no_data_gives_zero():
    assert float(AUC().result()) == 0.0
    assert auc_of([1, 1], [0.2, 0.9]) == 0.0
    assert auc_of([0, 1], [0.2, 0.9], [1.0, 0.0]) == 0.0


def test_streaming_equals_one_shot_and_reference():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 3000)
    scores = rng.integers(0, 50, 3000) / 50 + 0.2 * labels
    weights = rng.random(3000)
    metric = AUC()
    for start, stop in [(0, 1000), (1000, 1300), (1300, 1310), (1310, 3000)]:
        metric.update_state(labels[start:stop], scores[start:stop],
                            sample_weight=weights[start:stop])
    streamed = float(metric.result())
    assert streamed == pytest.approx(auc_of(labels, scores, weights),
                                     abs=1e-6)
    assert streamed == pytest.approx(pairwise_auc(labels, scores, weights),
                                     abs=1e-6)


def test_many_small_batches_keep_few_runs():
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 2, 4096)
    scores = rng.random(4096).astype(np.float32)
    metric = AUC()
    for start in range(0, 4096, 64):
        metric.update_state(labels[start:start + 64],
                            scores[start:start + 64])
    assert len(metric._runs) <= 7
    assert float(metric.result()) == pytest.approx(
        pairwise_auc(labels, scores), abs=1e-6)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_matches_pairwise_reference(data):
    n = data.draw(st.integers(1, 60))
    labels = np.array(data.draw(st.lists(st.integers(0, 1), min_size=n,
                                         max_size=n)))
    scores = np.array(data.draw(st.lists(
        st.sampled_from([-np.inf, -1.0, 0.0, 0.25, 0.5, 3.0, np.inf]),
        min_size=n, max_size=n)))
    weights = np.array(data.draw(st.lists(
        st.sampled_from([0.0, 0.5, 1.0, 2.0, 7.25]), min_size=n,
        max_size=n)))
    cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=5)))
    metric = AUC()
    for start, stop in zip([0] + cuts, cuts + [n]):
        metric.update_state(labels[start:stop], scores[start:stop],
                            sample_weight=weights[start:stop])
    assert float(metric.result()) == pytest.approx(
        pairwise_auc(labels, scores, weights), abs=1e-6)


def test_accepts_torch_tensors_with_grad_and_column_shapes():
    scores = torch.tensor([[0.2], [0.9], [0.4]], requires_grad=True)
    labels = torch.tensor([0.0, 1.0, 1.0])
    assert auc_of(labels, scores) == 1.0


def test_per_example_weights_broadcast_over_outputs():
    labels = np.array([[1, 0], [0, 1], [1, 1]])
    scores = np.array([[0.9, 0.1], [0.3, 0.6], [0.2, 0.7]])
    weights = np.array([1.0, 2.0, 3.0])
    assert auc_of(labels, scores, weights) == pytest.approx(pairwise_auc(
        labels, scores, np.repeat(weights, 2)))


@pytest.mark.parametrize("labels, scores, weights, message", [
    ([0, 2], [0.1, 0.2], None, "labels must be 0 or 1"),
    ([0, 1], [0.1, np.nan], None, "NaN score"),
    ([0, 1], [0.1, 0.2], [1.0, -1.0], "non-negative"),
    ([0, 1], [0.1, 0.2], [1.0, np.inf], "finite"),
    ([0, 1, 1], [0.1, 0.2], None, "one label per score"),
    ([0, 1], [0.1, 0.2], [1.0, 2.0, 3.0], "cannot apply sample_weight"),
])
def test_bad_input_raises(labels, scores, weights, message):
    metric = AUC()
    with pytest.raises(ValueError, match=message):
        metric.update_state(labels, scores, sample_weight=weights)
    assert float(metric.result()) == 0.0


def test_reset_state_and_stateless_scope():
    metric = AUC()
    metric.update_state([0, 1], [0.9, 0.1])
    metric.reset_state()
    metric.update_state([0, 1], [0.1, 0.9])
    with keras.StatelessScope():
        metric.update_state([0, 1], [0.9, 0.1])
    assert float(metric.result()) == 1.0


def test_config_round_trip():
    metric = AUC(name="ctr_auc", dtype="float64")
    clone = AUC.from_config(metric.get_config())
    assert clone.get_config() == metric.get_config()
    assert clone.name == "ctr_auc"
    assert keras.metrics.deserialize(
        keras.metrics.serialize(metric)).get_config() == metric.get_config()


def test_in_keras_fit_and_evaluate():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 4)).astype("float32")
    y = (x[:, 0] + rng.normal(size=512) > 0).astype("float32")
    weights = rng.random(512).astype("float32")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)),
                              keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer="adam", loss="binary_crossentropy",
                  metrics=[AUC()], weighted_metrics=[AUC(name="w_auc")])
    history = model.fit(x, y, batch_size=64, epochs=1, verbose=0)
    assert 0.0 < history.history["auc"][0] <= 1.0

    logs = model.evaluate(x, y, sample_weight=weights, batch_size=100,
                          verbose=0, return_dict=True)
    scores = model.predict(x, batch_size=100, verbose=0)
    assert logs["auc"] == pytest.approx(pairwise_auc(y, scores), abs=1e-6)
    assert logs["w_auc"] == pytest.approx(
        pairwise_auc(y, scores, weights), abs=1e-6)
