"""RecallAtK, NDCGAtK, HitRateAtK and MRR against a per-user Python
reference, batch by batch, and in rk.Model's evaluate and fit."""

import math

import keras
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reckeras as rk


def per_user(relevant, ranked, k):
    """{metric: value} of one user, or None when it has no relevant item."""
    relevant = {r for r in relevant if r >= 0}
    if not relevant:
        return None
    top = list(ranked[:k])
    hits = [p in relevant for p in top]
    ideal = sum(1 / math.log2(i + 2) for i in range(min(k, len(relevant))))
    first = next((i + 1 for i, p in enumerate(ranked) if p in relevant), None)
    return {"recall": sum(hits) / len(relevant), "hit_rate": float(any(hits)),
            "ndcg": sum(1 / math.log2(i + 2) for i, h in enumerate(hits) if h) / ideal,
            "mrr": 0.0 if first is None else 1 / first}


def metrics(k):
    return {"recall": rk.metrics.RecallAtK(k), "hit_rate": rk.metrics.HitRateAtK(k),
            "ndcg": rk.metrics.NDCGAtK(k), "mrr": rk.metrics.MRR()}


@st.composite
def batches(draw):
    k = draw(st.integers(1, 6))
    width = draw(st.integers(k, 8))
    relevant_width = draw(st.integers(1, 6))
    users = st.tuples(st.lists(st.integers(-1, 12), min_size=relevant_width,
                               max_size=relevant_width),
                      st.lists(st.integers(-1, 12), min_size=width, max_size=width,
                               unique=True))
    return k, draw(st.lists(st.lists(users, min_size=1, max_size=5), min_size=1,
                            max_size=3))


@settings(max_examples=100, deadline=None)
@given(batches())
def test_equal_the_per_user_reference(case):
    k, parts = case
    state = metrics(k)
    values = {name: [] for name in state}
    for part in parts:
        relevant = np.array([u[0] for u in part], dtype=np.float32)
        ranked = np.array([u[1] for u in part])
        for metric in state.values():
            metric.update_state(relevant, ranked)
        for relevant_row, ranked_row in part:
            one = per_user(relevant_row, ranked_row, k)
            for name in values if one else ():
                values[name].append(one[name])
    for name, metric in state.items():
        expected = np.mean(values[name]) if values[name] else 0.0
        assert float(metric.result()) == pytest.approx(expected, abs=1e-6), name


def test_weights_reset_and_config():
    recall = rk.metrics.RecallAtK(2)
    recall.update_state([[1, -1], [2, 3]], [[1, 0], [0, 2]], sample_weight=[3.0, 1.0])
    assert float(recall.result()) == pytest.approx((3 * 1 + 1 * 0.5) / 4)
    recall.reset_state()
    assert float(recall.result()) == 0.0
    assert recall.name == "recall_at_2"
    clone = rk.metrics.RecallAtK.from_config(recall.get_config())
    assert clone.k == 2 and clone.name == "recall_at_2"
    assert "k" not in rk.metrics.MRR().get_config()
    with pytest.raises(ValueError, match="recall_at_5 needs at least 5 ranked positions"):
        rk.metrics.RecallAtK(5).update_state([[1]], [[1, 2]])
    with pytest.raises(ValueError, match="k must be a positive int"):
        rk.metrics.NDCGAtK(0)
    with pytest.raises(ValueError, match="one row per user"):
        rk.metrics.MRR().update_state([[1], [2]], [[1, 2]])


def retrieval_model(items, k=3, width=2):
    """user id -> embedding -> exact top k over `items`, the seen items left out."""
    columns = rk.layers.FeatureColumns([rk.features.Categorical("user", dim=items.shape[1]),
                                        rk.features.Numeric("seen", shape=(width,))])
    inputs = columns.inputs()
    seen, sparse = columns(inputs)
    query = rk.layers.ShardedEmbedding(columns, output="concat")(sparse)
    top_k = rk.retrieval.BruteForceTopK(k, num_candidates=len(items), name="top_k")
    outputs = {"top_k": top_k(query, exclude=seen),
               "score": keras.layers.Dense(1, activation="sigmoid", name="score")(query)}
    model = rk.Model(inputs, outputs)
    top_k.set_candidates(items)
    return model


def test_evaluate_and_fit_validation_equal_the_reference():
    rng = np.random.default_rng(0)
    items = rng.integers(-2, 3, (12, 4)).astype(np.float32)
    users = np.arange(40)
    seen = rng.integers(-1, 12, (40, 2))
    relevant = rng.integers(-1, 12, (40, 3))
    model = retrieval_model(items)
    model.compile(optimizer="adam", embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.1),
                  loss={"score": "binary_crossentropy", "top_k": None},
                  metrics={"top_k": [rk.metrics.RecallAtK(3), rk.metrics.NDCGAtK(3),
                                     rk.metrics.HitRateAtK(2), rk.metrics.MRR()]})
    x = {"user": users, "seen": seen.astype(np.float32)}
    y = {"score": np.ones(40, np.float32), "top_k": relevant.astype(np.float32)}
    history = model.fit(x, y, batch_size=16, epochs=2, verbose=0, validation_data=(x, y))
    logs = model.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)
    # The reference: the trained model's ranked positions, scored per user.
    ranked = keras.ops.convert_to_numpy(model.predict(x, batch_size=16, verbose=0)["top_k"])
    names = {"recall": ("top_k_recall_at_3", 3), "ndcg": ("top_k_ndcg_at_3", 3),
             "hit_rate": ("top_k_hit_rate_at_2", 2), "mrr": ("top_k_mrr", 3)}
    for name, (log, k) in names.items():
        expected = np.mean([one[name] for b in range(40)
                            if (one := per_user(relevant[b], ranked[b], k))])
        assert logs[log] == pytest.approx(expected, abs=1e-6), log
        assert history.history[f"val_{log}"][-1] == pytest.approx(expected, abs=1e-6), log
