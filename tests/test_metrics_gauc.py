"""GAUC against a per-group reference, and inside rk.Model."""

import keras
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reckeras as rk


def reference_gauc(groups, labels, scores):
    total, weight = 0.0, 0
    for g in np.unique(groups):
        y, p = labels[groups == g], scores[groups == g]
        pos, neg = p[y == 1], p[y == 0]
        if len(pos) and len(neg):
            auc = ((pos[:, None] > neg[None, :]).sum()
                   + 0.5 * (pos[:, None] == neg[None, :]).sum()) / (len(pos) * len(neg))
            total += auc * len(y)
            weight += len(y)
    return total / weight if weight else 0.0


def test_hand_case():
    metric = rk.metrics.GAUC(group="user")
    # user 1: perfect (AUC 1, 3 examples); user 2: reversed (AUC 0, 2); user 3: one class.
    metric.update_state([1, 0, 0, 1, 0], [0.9, 0.1, 0.2, 0.3, 0.8], groups=[1, 1, 1, 2, 2])
    metric.update_state([1, 1], [0.5, 0.6], groups=[3, 3])
    assert float(metric.result()) == pytest.approx((3 * 1.0 + 2 * 0.0) / 5)
    metric.reset_state()
    assert float(metric.result()) == 0.0


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 1), st.integers(0, 5)),
                min_size=1, max_size=60), st.integers(1, 4))
def test_matches_reference_with_ties_and_batches(rows, batches):
    groups, labels, scores = (np.array(c, dtype=float) for c in zip(*rows))
    metric = rk.metrics.GAUC(group="g")
    for part in np.array_split(np.arange(len(rows)), batches):
        metric.update_state(labels[part], scores[part] / 5, groups=groups[part].astype(int))
    expected = reference_gauc(groups, labels, scores)
    assert float(metric.result()) == pytest.approx(expected, abs=1e-6)   # float32 result


def test_needs_groups_and_a_name():
    with pytest.raises(ValueError, match="name of the group input"):
        rk.metrics.GAUC(group="")
    with pytest.raises(ValueError, match="group ids"):
        rk.metrics.GAUC(group="u").update_state([1], [0.5])


def test_in_model_fit_evaluate_and_save(tmp_path):
    rng = np.random.default_rng(0)
    n = 600
    data = {"user": rng.integers(0, 30, n), "item": rng.integers(0, 50, n)}
    y = ((data["user"] + data["item"]) % 3 == 0).astype(np.float32)
    columns = rk.layers.FeatureColumns([rk.features.Categorical("user", dim=4),
                                        rk.features.Categorical("item", dim=4)])
    inputs = columns.inputs()
    emb = rk.layers.ShardedEmbedding(columns, output="concat")(columns(inputs)[1])
    out = rk.layers.MLP([8, 1], output_activation="sigmoid")(emb)
    model = rk.Model(inputs, out)
    model.compile(optimizer="adam", loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.Adagrad(0.1),
                  metrics=[rk.metrics.AUC(), rk.metrics.GAUC(group="user")])
    history = model.fit(data, y, batch_size=100, epochs=2, verbose=0)
    assert "gauc" in history.history and "auc" in history.history
    logs = model.evaluate(data, y, batch_size=100, verbose=0, return_dict=True)
    p = model.predict(data, batch_size=100)[:, 0]
    assert logs["gauc"] == pytest.approx(reference_gauc(data["user"], y, p), abs=1e-6)
    model.save(tmp_path / "g.keras")
    loaded = keras.models.load_model(tmp_path / "g.keras")
    again = loaded.evaluate(data, y, batch_size=100, verbose=0, return_dict=True)
    assert again["gauc"] == pytest.approx(logs["gauc"], abs=1e-6)
