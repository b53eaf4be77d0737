"""rk.retrieval.evaluate and RetrievalEvaluation: a trained two-tower's
retrieval metrics over the whole corpus equal a numpy brute force."""

import keras
import numpy as np
import pyarrow as pa
import pytest

import reckeras as rk

F = rk.features
USERS, ITEMS, SEEN = 150, 120, 12


def data(seed=0):
    """Users picking items by a random latent-factor score: the train rows,
    each user's seen items (-1 padded, ragged) and held-out items."""
    rng = np.random.default_rng(seed)
    logits = 2.0 * rng.normal(size=(USERS, 4)) @ rng.normal(size=(ITEMS, 4)).T
    order = np.argsort(-logits - rng.gumbel(size=logits.shape), axis=1)
    seen = order[:, :SEEN].copy()
    seen[::7, SEEN - 4:] = -1                     # fewer seen items for some users
    relevant = order[:, SEEN:SEEN + 6].copy()
    relevant[::5, 3:] = -1
    relevant[::11] = -1                           # users without relevant items
    rows = seen >= 0
    train = pa.table({"user": np.repeat(np.arange(USERS), rows.sum(1)),
                      "segment": np.repeat(np.arange(USERS) % 3, rows.sum(1)),
                      "item": seen[rows]})
    return train, seen, relevant


def trained(train):
    keras.utils.set_random_seed(0)
    columns = rk.layers.FeatureColumns([F.Categorical("user", dim=8),
                                        F.Categorical("segment", dim=8),
                                        F.Categorical("item", dim=8)])
    model = rk.models.two_tower(columns, ["user", "segment"], ["item"], query_units=(8,))
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.1))
    model.fit(train, batch_size=128, epochs=2, verbose=0)
    return model


def reference(model, users, seen, relevant, k):
    """numpy brute force: the top k unseen items of each user by score, and
    Recall/NDCG/HitRate@k and MRR over it (users without relevant items
    skipped)."""
    table = pa.table({"user": users["user"], "segment": users["segment"],
                      "item": pa.nulls(USERS, pa.int64())})
    scores = model.query_model().predict(table, verbose=0) @ \
        model.candidate_embeddings(np.arange(ITEMS)).T
    for user, items in enumerate(seen):
        scores[user, items[items >= 0]] = -np.inf
    top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    recall, ndcg, hit, mrr = [], [], [], []
    for ranked, wanted in zip(top, relevant, strict=True):
        wanted = set(wanted[wanted >= 0].tolist())
        if not wanted:
            continue
        hits = np.array([item in wanted for item in ranked])
        recall.append(hits.sum() / len(wanted))
        discount = 1 / np.log2(np.arange(k) + 2)
        ndcg.append(hits @ discount / discount[:min(k, len(wanted))].sum())
        hit.append(float(hits[:5].any()))
        mrr.append(1 / (np.argmax(hits) + 1) if hits.any() else 0.0)
    return {f"recall_at_{k}": np.mean(recall), f"ndcg_at_{k}": np.mean(ndcg),
            "hit_rate_at_5": np.mean(hit), "mrr": np.mean(mrr)}


@pytest.fixture(scope="module")
def setup():
    train, seen, relevant = data()
    users = {"user": np.arange(USERS), "segment": np.arange(USERS) % 3}
    return trained(train), users, seen, relevant


def metrics(k):
    return [rk.metrics.RecallAtK(k), rk.metrics.NDCGAtK(k), rk.metrics.HitRateAtK(5),
            rk.metrics.MRR()]


def test_evaluate_equals_a_numpy_brute_force(setup):
    model, users, seen, relevant = setup
    expected = reference(model, users, seen, relevant, 10)
    # Small query batches and candidate chunks: the chunked paths run.
    results = rk.retrieval.evaluate(model, users, np.arange(ITEMS), relevant, seen,
                                    metrics=metrics(10), batch_size=40, chunk_size=32)
    assert set(results) == set(expected)
    for name, value in expected.items():
        assert results[name] == pytest.approx(value, abs=1e-6), name
    assert expected["recall_at_10"] > 0.05        # not a model that finds nothing


def test_a_second_call_starts_from_reset_metrics(setup):
    model, users, seen, relevant = setup
    recall = rk.metrics.RecallAtK(10)
    first = rk.retrieval.evaluate(model, users, np.arange(ITEMS), relevant, seen,
                                  metrics=[recall])
    second = rk.retrieval.evaluate(model, pa.table(users), np.arange(ITEMS), relevant,
                                   seen, metrics=[recall])
    assert second == first


def test_without_exclusion_the_seen_items_are_ranked(setup):
    model, users, seen, _ = setup
    # The seen items as relevant: a model trained on them ranks them above
    # chance (20 random picks of 120 find 1/6 of them) when they are not
    # excluded (0.31 here), none when they are.
    kept = rk.retrieval.evaluate(model, users, np.arange(ITEMS), seen)
    left_out = rk.retrieval.evaluate(model, users, np.arange(ITEMS), seen, seen)
    assert kept["recall_at_20"] > 0.25
    assert left_out["recall_at_20"] == 0.0


def test_mrr_over_k_positions(setup):
    model, users, seen, relevant = setup
    expected = reference(model, users, seen, relevant, 7)["mrr"]
    results = rk.retrieval.evaluate(model, users, np.arange(ITEMS), relevant, seen,
                                    metrics=[rk.metrics.MRR()], k=7)
    assert results["mrr"] == pytest.approx(expected, abs=1e-6)


def test_the_callback_reports_at_epoch_end(setup):
    model, users, seen, relevant = setup
    train, _, _ = data()
    callback = rk.retrieval.RetrievalEvaluation(users, np.arange(ITEMS), relevant, seen,
                                                metrics=[rk.metrics.RecallAtK(10)],
                                                every=2)
    history = model.fit(train, batch_size=128, epochs=3, verbose=0, callbacks=[callback])
    reported = history.history["val_recall_at_10"]
    assert len(reported) == 2                     # after epochs 2 and 3 (the last)
    expected = reference(model, users, seen, relevant, 10)["recall_at_10"]
    assert reported[-1] == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("arguments, message", [
    ({"relevant": np.zeros((USERS - 1, 3), np.int64)}, "relevant must be an int"),
    ({"exclude": np.zeros((USERS, 3), np.float32)}, "exclude must be an int"),
    ({"metrics": [rk.metrics.MRR()]}, "give k"),
    ({"k": 5}, "at least every metric's cut-off"),
    ({"batch_size": 0}, "batch_size must be a positive int"),
])
def test_bad_arguments_are_refused(setup, arguments, message):
    model, users, seen, relevant = setup
    call = {"relevant": relevant, "exclude": seen, **arguments}
    with pytest.raises(ValueError, match=message):
        rk.retrieval.evaluate(model, users, np.arange(ITEMS), **call)


def test_the_callback_refuses_a_bad_every():
    with pytest.raises(ValueError, match="every must be a positive int"):
        rk.retrieval.RetrievalEvaluation({}, [0], [[0]], every=0)
