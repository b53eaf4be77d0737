"""rk.models.two_tower: learns a latent-factor teacher, saves, and refuses bad options."""

import keras
import numpy as np
import pyarrow as pa
import pytest
import torch

import reckeras as rk

F = rk.features
USERS, ITEMS = 300, 200
AGES = np.linspace(-1, 1, USERS).astype(np.float32)    # a numeric query feature


def teacher(seed=0):
    """A latent-factor teacher: user u picks item i with p ~ exp(2 u.v), 25
    interactions each. A user's relevant items are the teacher's 10 best
    among those it did not pick."""
    rng = np.random.default_rng(seed)
    logits = 2.0 * rng.normal(size=(USERS, 4)) @ rng.normal(size=(ITEMS, 4)).T
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    seen = np.stack([rng.choice(ITEMS, size=25, p=row) for row in p])
    train = pa.table({"user": np.repeat(np.arange(USERS), 25), "item": seen.reshape(-1),
                      "age": np.repeat(AGES, 25)})
    unseen = logits.copy()
    np.put_along_axis(unseen, seen, -np.inf, axis=1)
    relevant = np.argsort(-unseen, axis=1)[:, :10]
    return train, seen, relevant, logits


def columns(dim=16):
    return rk.layers.FeatureColumns([F.Categorical("user", dim=dim), F.Numeric("age"),
                                     F.Categorical("item", dim=dim)])


def compiled(model):
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.1))
    return model


def recall_at(k, query, candidates, seen, relevant):
    """Plain numpy brute force: each user's top k unseen items against its
    relevant ones."""
    scores = query @ candidates.T
    for user, items in enumerate(seen):
        scores[user, items] = -np.inf
    top = np.argsort(-scores, axis=1)[:, :k]
    return np.mean([len(set(t) & set(r)) / len(r) for t, r in zip(top, relevant)])


def queries(model):
    users = pa.table({"user": np.arange(USERS), "item": pa.nulls(USERS, pa.int64()),
                      "age": AGES})
    return model.query_model().predict(users, verbose=0)


@pytest.mark.parametrize("options", [
    {},
    {"loss": "cosine_contrastive", "margin": 0.2, "negative_weight": 2.0},
    {"negatives": "popularity", "share_tables": False},
])
def test_recall_far_above_random_on_a_latent_factor_teacher(options):
    keras.utils.set_random_seed(0)
    train, seen, relevant, _ = teacher()
    if options.get("negatives"):
        counts = np.bincount(seen.reshape(-1), minlength=ITEMS)
        options = {**options, "negatives": rk.retrieval.NegativeSampler(
            np.arange(ITEMS), num_negatives=64, counts=counts, power=0.75)}
    model = compiled(rk.models.two_tower(columns(), ["user", "age"], ["item"],
                                         query_units=(16,), temperature=0.1, **options))
    history = model.fit(train, batch_size=256, epochs=6, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    recall = recall_at(10, queries(model), model.candidate_embeddings(np.arange(ITEMS)),
                       seen, relevant)
    # Random picks of 10 out of the ~180 unseen items: recall ~0.055;
    # the three setups reach 0.4 to 0.6 here.
    assert recall > 0.3, recall


def test_two_tower_saves_and_loads_with_its_estimate_and_tables(tmp_path):
    keras.utils.set_random_seed(1)
    train, _, _, _ = teacher()
    model = compiled(rk.models.two_tower(columns(8), ["user", "age"], ["item"],
                                         query_units=(8, 4), frequency_buckets=64,
                                         dropout=0.1, norm="batch"))
    model.fit(train.slice(0, 1000), batch_size=100, verbose=0)
    assert int(model.frequency.step.numpy()) == 10
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    assert isinstance(loaded, rk.models.two_tower.__globals__["TwoTower"])
    np.testing.assert_array_equal(loaded.frequency.gap.numpy(), model.frequency.gap.numpy())
    data = train.slice(0, 300)
    before, after = model.predict(data, verbose=0), loaded.predict(data, verbose=0)
    for key in ("query", "candidate"):
        np.testing.assert_array_equal(after[key], before[key])
    np.testing.assert_array_equal(loaded.candidate_embeddings(np.arange(50)),
                                  model.candidate_embeddings(np.arange(50)))
    # The query tower alone, saved apart, gives the same query embeddings.
    queries_model = model.query_model()
    np.testing.assert_allclose(queries_model.predict(data, verbose=0), before["query"],
                               rtol=1e-6, atol=1e-7)
    queries_model.save(tmp_path / "q.keras")
    np.testing.assert_array_equal(
        keras.models.load_model(tmp_path / "q.keras").predict(data, verbose=0),
        queries_model.predict(data, verbose=0))


def test_no_tower_is_matrix_factorization(tmp_path):
    """Empty units: a side's embedding is its normalized row, nothing on top."""
    keras.utils.set_random_seed(0)
    train, seen, relevant, _ = teacher()
    model = compiled(rk.models.two_tower(
        rk.layers.FeatureColumns([F.Categorical("user", dim=16),
                                  F.Categorical("item", dim=16)]),
        ["user"], ["item"], query_units=(), temperature=0.1))
    model.fit(train.drop_columns(["age"]), batch_size=256, epochs=6, verbose=0)
    assert model.query_tower is None and model.candidate_tower is None
    assert not [w for w in model.trainable_weights if "kernel" in w.path]
    users = pa.table({"user": np.arange(USERS), "item": pa.nulls(USERS, pa.int64())})
    query = model.query_model().predict(users, verbose=0)
    np.testing.assert_allclose(np.linalg.norm(query, axis=1), 1.0, rtol=1e-5)
    recall = recall_at(10, query, model.candidate_embeddings(np.arange(ITEMS)), seen,
                       relevant)
    assert recall > 0.3, recall            # random picks: ~0.055
    model.save(tmp_path / "mf.keras")
    loaded = keras.models.load_model(tmp_path / "mf.keras")
    assert loaded.embedding_size == 16 and loaded.query_tower is None
    np.testing.assert_array_equal(loaded.query_model().predict(users, verbose=0), query)


def test_candidate_embeddings_are_the_towers_of_the_ids_in_chunks():
    keras.utils.set_random_seed(2)
    train, _, _, _ = teacher()
    model = compiled(rk.models.two_tower(columns(8), ["user"], ["item"], query_units=(8,)))
    model.fit(train.slice(0, 500), batch_size=250, verbose=0)
    rows = train.slice(0, 40)
    expected = model.predict(rows, verbose=0)["candidate"]
    chunked = model.candidate_embeddings(rows.column("item").to_numpy(), batch_size=7)
    np.testing.assert_allclose(chunked, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(chunked, axis=1), 1.0, rtol=1e-5)


def test_in_batch_loss_equals_the_reference_softmax():
    # One batch, no logQ: the loss fit reports is the in-batch softmax of
    # the towers' embeddings with accidental hits left out.
    keras.utils.set_random_seed(3)
    model = compiled(rk.models.two_tower(columns(8), ["user"], ["item"], query_units=(8,),
                                         temperature=0.5, logq_correction=False))
    data = pa.table({"user": np.arange(6), "item": np.array([3, 4, 3, 5, 6, 4]),
                     "age": np.zeros(6, np.float32)})
    logs = model.evaluate(data, batch_size=6, verbose=0, return_dict=True)
    out = model.predict(data, verbose=0)
    scores = out["query"] @ out["candidate"].T / 0.5
    items = data.column("item").to_numpy()
    expected = []
    for i in range(6):
        kept = [scores[i, j] for j in range(6) if j == i or items[j] != items[i]]
        expected.append(np.log(np.sum(np.exp(kept))) - scores[i, i])
    assert logs["loss"] == pytest.approx(np.mean(expected), rel=1e-5)


@pytest.mark.parametrize("loss", ["cosine_contrastive", "softmax", "bpr"])
def test_without_in_batch_negatives_a_row_sees_its_positive_and_the_sampled(loss):
    """in_batch_negatives=False: row i's candidates are its own positive and
    the sampled ids, an id equal to its positive left out; the softmax's
    log q is the estimate's for the positive, the sampler's for the rest."""
    keras.utils.set_random_seed(6)
    sampler = rk.retrieval.NegativeSampler(np.arange(8), num_negatives=5)
    model = compiled(rk.models.two_tower(
        rk.layers.FeatureColumns([F.Categorical("user", dim=4),
                                  F.Categorical("item", dim=4)]),
        ["user"], ["item"], query_units=(4,), loss=loss, temperature=0.5, margin=0.1,
        negative_weight=3.0, negatives=sampler, in_batch_negatives=False))
    data = pa.table({"user": np.arange(6), "item": np.array([3, 4, 3, 5, 6, 4])})
    model.fit(data, batch_size=6, verbose=0)               # builds; rows exist
    x = {name: torch.as_tensor(value) for name, value in
         model.feature_columns.encode(data).items()}
    y_pred = model(x, training=True)
    total = float(model.compute_loss(x=x, y_pred=y_pred, training=False).detach())
    query, own = (y_pred[k].detach().cpu().numpy() for k in ("query", "candidate"))
    sampled = y_pred["negative"].detach().cpu().numpy()
    sampled_ids = y_pred["negative_ids"].cpu().numpy()
    sampled_log_q = y_pred["negative_log_q"].cpu().numpy()
    items = data.column("item").to_numpy().copy()
    assert set(items) & set(sampled_ids)                    # some accidental hits
    own_log_q = model.frequency.log_probability(torch.as_tensor(items)).numpy() \
        if model.frequency is not None else np.zeros(6)
    rows = []
    for i in range(6):
        positive = float(query[i] @ own[i])
        kept = [j for j in range(5) if sampled_ids[j] != items[i]]
        negatives = np.array([float(query[i] @ sampled[j]) for j in kept])
        if loss == "cosine_contrastive":
            rows.append(1 - positive + 3.0 * np.mean(np.maximum(negatives - 0.1, 0.0))
                        if kept else 1 - positive)
        elif loss == "bpr":
            rows.append(np.mean(np.log1p(np.exp(-(positive - negatives)))) if kept else 0.0)
        else:
            logits = np.concatenate([[positive / 0.5 - own_log_q[i]],
                                     negatives / 0.5 - sampled_log_q[kept]])
            rows.append(np.log(np.sum(np.exp(logits))) - logits[0])
    assert total == pytest.approx(np.mean(rows), rel=1e-5)


def test_the_table_penalty_counts_once_per_step():
    # The inner layers run without Keras's __call__ (call_built): their
    # added losses must still be cleared by the model's own call each step.
    keras.utils.set_random_seed(4)
    model = compiled(rk.models.two_tower(columns(8), ["user"], ["item"], query_units=(8,),
                                         embedding_l2=0.5, logq_correction=False))
    data = pa.table({"user": np.arange(6), "item": np.arange(6) + 10,
                     "age": np.zeros(6, np.float32)})
    model.fit(data, batch_size=6, verbose=0)
    with_penalty = model.evaluate(data, batch_size=6, verbose=0, return_dict=True)["loss"]
    assert len(model.losses) == 1
    model.evaluate(data, batch_size=6, verbose=0)
    assert len(model.losses) == 1
    out = model.predict(data, verbose=0)
    scores = out["query"] @ out["candidate"].T / model.temperature
    plain = np.mean(np.log(np.exp(scores).sum(1)) - np.diag(scores))
    penalty = float(keras.ops.convert_to_numpy(model.losses[0]))
    assert penalty > 0
    assert with_penalty == pytest.approx(plain + penalty, rel=1e-5)


def test_bad_options_are_refused_naming_the_model():
    with pytest.raises(ValueError, match="two_tower: query_features names"):
        rk.models.two_tower(columns(), ["nobody"], ["item"])
    with pytest.raises(ValueError, match="on both sides"):
        rk.models.two_tower(columns(), ["user", "item"], ["item"])
    with pytest.raises(ValueError, match="candidate_id 'age' must be an id Categorical"):
        rk.models.two_tower(columns(), ["user"], ["item", "age"], candidate_id="age")
    with pytest.raises(ValueError, match="embedding sizes must match.*got 8 .query. and 4"):
        rk.models.two_tower(columns(), ["user"], ["item"], query_units=(8,),
                            candidate_units=(4,))
    # No tower: the user's embedding and its age (16 + 1) against the item's 16.
    with pytest.raises(ValueError, match="got 17 .query. and 16 .candidate."):
        rk.models.two_tower(columns(), ["user", "age"], ["item"], query_units=())
    with pytest.raises(ValueError, match="two_tower: loss must be one of"):
        rk.models.two_tower(columns(), ["user"], ["item"], loss="hinge")
    with pytest.raises(ValueError, match="two_tower: dropout"):
        rk.models.two_tower(columns(), ["user"], ["item"], dropout=1.0)
    sampler = rk.retrieval.NegativeSampler(np.arange(5), num_negatives=2)
    with pytest.raises(ValueError, match="sampled negatives need a candidate tower"):
        rk.models.two_tower(rk.layers.FeatureColumns([
            F.Categorical("user", dim=4), F.Categorical("item", dim=4),
            F.Categorical("brand", dim=4)]), ["user"], ["item", "brand"],
            negatives=sampler)
    with pytest.raises(ValueError, match="in_batch_negatives=False leaves the sampled "
                                         "negatives only: pass a"):
        rk.models.two_tower(columns(), ["user"], ["item"], in_batch_negatives=False)
    with pytest.raises(ValueError, match="in_batch_negatives must be a bool"):
        rk.models.two_tower(columns(), ["user"], ["item"], in_batch_negatives="no")
    model = rk.models.two_tower(columns(), ["user"], ["item"])
    with pytest.raises(ValueError, match="compile it without loss="):
        model.compile(optimizer="adam", loss="mse",
                      embedding_optimizer=rk.optimizers.SGD(0.1))


def test_query_model_reads_data_without_the_candidate_columns():
    """`query_model()` needs the query side's columns only: predict, evaluate
    and a call on a dict of them give what the same rows with a null
    candidate column give."""
    keras.utils.set_random_seed(3)
    train, _, _, _ = teacher()
    model = compiled(rk.models.two_tower(columns(8), ["user", "age"], ["item"],
                                         query_units=(8,)))
    model.fit(train.slice(0, 1000), batch_size=100, verbose=0)
    query_model = model.query_model()
    assert query_model.unread_features == ("item",)
    expected = queries(model)
    only_query = {"user": np.arange(USERS), "age": AGES}
    np.testing.assert_array_equal(query_model.predict(only_query, verbose=0), expected)
    np.testing.assert_allclose(query_model(only_query).detach().cpu().numpy(), expected,
                               rtol=1e-6, atol=1e-7)
    # A column the query side reads is still required, named.
    with pytest.raises(rk.features.FeatureInputError, match="'age'"):
        query_model.predict({"user": np.arange(USERS)}, verbose=0)
