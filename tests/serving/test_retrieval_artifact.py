"""Retrieval serving (issue 23, item 4): a two-tower's export and the
Keras-free `RetrievalPredictor`'s top K, exact and through faiss.

A small two-tower model is trained on latent-factor data; its artifact's
corpus must equal `candidate_embeddings`, its query vectors the query tower's
`predict`, and `retrieve` a numpy brute force over them (each user's history
left out, ties to the lower corpus position). The ANN indexes are held to a
recall floor against `exact_top_k` on a random corpus.
"""

import os
import subprocess
import sys

import keras
import numpy as np
import pyarrow as pa
import pytest
import torch

import reckeras as rk
from reckeras.serving import ann, artifact

faiss = pytest.importorskip("faiss")

F = rk.features
USERS, ITEMS, SEEN = 150, 120, 12


def data(seed=0):
    """Train rows of users picking items by a latent-factor score, and each
    user's seen items (ragged)."""
    rng = np.random.default_rng(seed)
    logits = 2.0 * rng.normal(size=(USERS, 4)) @ rng.normal(size=(ITEMS, 4)).T
    order = np.argsort(-logits - rng.gumbel(size=logits.shape), axis=1)
    seen = [row[:SEEN - (user % 5)] for user, row in enumerate(order)]
    train = pa.table({"user": np.repeat(np.arange(USERS), [len(s) for s in seen]),
                      "segment": np.repeat(np.arange(USERS) % 3, [len(s) for s in seen]),
                      "item": np.concatenate(seen)})
    return train, seen


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    train, seen = data()
    keras.utils.set_random_seed(0)
    columns = rk.layers.FeatureColumns([F.Categorical("user", dim=8),
                                        F.Categorical("segment", dim=8),
                                        F.Categorical("item", dim=8)])
    model = rk.models.two_tower(columns, ["user", "segment"], ["item"], query_units=(8,))
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.1))
    model.fit(train, batch_size=128, epochs=2, verbose=0)
    # A corpus order that is not the ids' own: positions and ids differ.
    item_ids = np.random.default_rng(1).permutation(ITEMS) + 5
    path = str(tmp_path_factory.mktemp("retrieval") / "artifact")
    model.export_serving(path, item_ids=item_ids)
    users = {"user": np.arange(USERS), "segment": np.arange(USERS) % 3}
    query = model.query_model().predict(
        pa.table({**users, "item": pa.nulls(USERS, pa.int64())}), verbose=0)
    corpus = model.candidate_embeddings(item_ids)
    return model, path, item_ids, users, seen, query, corpus


def brute_force(query, corpus, item_ids, k, exclude):
    """numpy: cosine scores, excluded ids at -inf, ordered by score then
    corpus position; `(ids, scores)` with `(-1, -inf)` past the corpus."""
    scores = (query @ corpus.T).astype(np.float32)
    for row, ids in enumerate(exclude):
        scores[row, np.isin(item_ids, ids)] = -np.inf
    positions = np.arange(len(item_ids))
    ids, top = [], []
    for row in scores:
        order = np.lexsort((positions, -row))[:k]
        kept = order[np.isfinite(row[order])]
        ids.append(np.pad(item_ids[kept], (0, k - len(kept)), constant_values=-1))
        top.append(np.pad(row[kept], (0, k - len(kept)), constant_values=-np.inf))
    return np.array(ids), np.array(top)


def test_the_artifact_holds_the_query_tower_and_the_corpus(exported):
    model, path, item_ids, users, _, query, corpus = exported
    manifest = artifact.read_manifest(path)
    assert manifest["retrieval"] == {"num_items": ITEMS, "dim": 8,
                                     "query_features": ["user", "segment"],
                                     "candidate_features": ["item"]}
    assert artifact.CANDIDATES in manifest["files"]
    predictor = rk.serving.load(path)
    assert isinstance(predictor, rk.serving.RetrievalPredictor)
    np.testing.assert_array_equal(predictor.item_ids.numpy(), item_ids)
    np.testing.assert_allclose(predictor.candidates.numpy(), corpus, atol=1e-6)
    # No item column in the request: the predictor fills it with nulls.
    np.testing.assert_allclose(predictor.predict(users), query, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(query, axis=1), 1.0, atol=1e-5)


def test_exact_retrieve_equals_a_numpy_brute_force(exported):
    _, path, item_ids, users, seen, query, corpus = exported
    predictor = rk.serving.load(path)
    exclude = [list(ids + 5) + [-1, 10_000] for ids in seen]   # ids outside: ignored
    for k in (1, 20, ITEMS + 3):
        ids, scores = predictor.retrieve(users, k=k, exclude=exclude)
        want_ids, want_scores = brute_force(query, corpus, item_ids, k,
                                            [np.asarray(e) for e in exclude])
        assert ids.dtype == np.int64 and scores.dtype == np.float32
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_allclose(scores, want_scores, atol=1e-5)
    # A pyarrow table and an int array of excluded ids answer the same.
    padded = np.full((USERS, SEEN), -1)
    for row, ids in enumerate(seen):
        padded[row, :len(ids)] = ids + 5
    again, _ = predictor.retrieve(pa.table(users), k=20, exclude=padded)
    np.testing.assert_array_equal(again, brute_force(query, corpus, item_ids, 20,
                                                     list(padded))[0])


def test_a_model_without_towers_serves_its_rows(tmp_path):
    """Matrix factorization (`query_units=()`): the export traces no tower."""
    train, seen = data()
    keras.utils.set_random_seed(0)
    columns = rk.layers.FeatureColumns([F.Categorical("user", dim=8),
                                        F.Categorical("item", dim=8)])
    model = rk.models.two_tower(columns, ["user"], ["item"], query_units=())
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.1))
    model.fit(train.drop_columns(["segment"]), batch_size=128, epochs=1, verbose=0)
    path = model.export_serving(str(tmp_path / "mf"), item_ids=np.arange(ITEMS))
    users = {"user": np.arange(USERS)}
    query = model.query_model().predict(
        pa.table({**users, "item": pa.nulls(USERS, pa.int64())}), verbose=0)
    corpus = model.candidate_embeddings(np.arange(ITEMS))
    ids, _ = rk.serving.load(path).retrieve(users, k=10, exclude=[list(s) for s in seen])
    np.testing.assert_array_equal(ids, brute_force(query, corpus, np.arange(ITEMS), 10,
                                                   seen)[0])


def test_ties_go_to_the_lower_corpus_position(exported, tmp_path):
    model, *_ = exported
    # Ids never trained share the zero row's embedding: equal scores.
    path = model.export_serving(tmp_path / "ties", item_ids=[900, 3, 901, 902])
    predictor = rk.serving.load(path)
    ids, scores = predictor.retrieve({"user": [0], "segment": [0]}, k=4)
    untrained = [i for i in ids[0] if i != 3]
    assert untrained == [900, 901, 902]
    assert len(set(scores[0][ids[0] != 3].tolist())) == 1


@pytest.mark.parametrize("kind", ["hnsw", "ivf"])
def test_an_ann_index_of_the_artifact_answers_the_exact_top_k(exported, kind):
    # A corpus this small is searched whole (ef_search >= N; nprobe >= nlist).
    _, path, _, users, seen, _, _ = exported
    exact = rk.serving.load(path)
    options = {"nlist": 2, "nprobe": 2} if kind == "ivf" else None
    approximate = rk.serving.load(path, index=kind, index_options=options)
    exclude = [list(ids + 5) for ids in seen]
    want, want_scores = exact.retrieve(users, k=10, exclude=exclude)
    got, got_scores = approximate.retrieve(users, k=10, exclude=exclude)
    assert approximate.index_kind == kind
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got_scores, want_scores, atol=1e-5)


@pytest.mark.parametrize("kind, floor", [("hnsw", 0.95), ("ivf", 0.9)])
def test_ann_recall_against_exact_search(kind, floor):
    generator = torch.Generator().manual_seed(0)
    corpus = torch.nn.functional.normalize(torch.randn(20_000, 16, generator=generator),
                                           dim=1)
    queries = torch.nn.functional.normalize(torch.randn(200, 16, generator=generator),
                                            dim=1)
    seen = torch.randint(0, 20_000, (200, 30), generator=generator)
    index = ann.AnnIndex(kind, corpus.numpy(), None)
    _, exact = rk.retrieval.exact_top_k(queries, corpus, 20, exclude=seen)
    scores, found = index.search(queries, 20, seen)
    recall = np.mean([len(set(a.tolist()) & set(b.tolist())) / 20
                      for a, b in zip(found, exact, strict=True)])
    assert recall >= floor, recall
    assert not (found[:, :, None] == seen[:, None, :]).any()
    assert (scores[:, :-1] >= scores[:, 1:]).all()


def test_ann_options_are_checked():
    assert ann.resolved_options("ivf", None, 10_000) == {"nlist": 100, "nprobe": 32}
    assert ann.resolved_options("hnsw", {"ef_search": 7}, 10)["ef_search"] == 7
    with pytest.raises(ValueError, match="'efSearch'.*not options of a 'hnsw'"):
        ann.resolved_options("hnsw", {"efSearch": 7}, 10)
    with pytest.raises(ValueError, match=r"index_options\['m'\] must be a positive int"):
        ann.resolved_options("hnsw", {"m": 0}, 10)
    with pytest.raises(ValueError, match="nlist.*exceeds the 10 items"):
        ann.resolved_options("ivf", {"nlist": 11}, 10)


def test_missing_faiss_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "faiss", None)
    with pytest.raises(ImportError, match=r"reckeras\[ann\]"):
        ann.AnnIndex("hnsw", np.eye(4, dtype=np.float32), None)


def test_what_is_not_supported_is_refused(exported, tmp_path):
    model, path, *_ = exported
    with pytest.raises(NotImplementedError, match="no deltas"):
        model.export_serving(tmp_path / "delta", base=path, item_ids=[1, 2])
    with pytest.raises(ValueError, match="needs item_ids"):
        model.export_serving(tmp_path / "none")
    with pytest.raises(ValueError, match=r"repeats ids, e.g. \[2\]"):
        model.export_serving(tmp_path / "twice", item_ids=[1, 2, 2])
    with pytest.raises(ValueError, match="1-D array of int ids"):
        model.export_serving(tmp_path / "floats", item_ids=[1.0, 2.0])
    predictor = rk.serving.load(path)
    with pytest.raises(rk.serving.DeltaError, match="takes no deltas"):
        predictor.apply_delta(path)
    with pytest.raises(ValueError, match="index must be one of"):
        rk.serving.load(path, index="lsh")
    with pytest.raises(ValueError, match="the exact one takes none"):
        rk.serving.load(path, index_options={"m": 8})
    with pytest.raises(ValueError, match="k must be a positive int"):
        predictor.retrieve({"user": [1], "segment": [1]}, k=0)
    with pytest.raises(ValueError, match="exclude holds 1 lists, the batch 2 rows"):
        predictor.retrieve({"user": [1, 2], "segment": [1, 1]}, exclude=[[3]])
    with pytest.raises(ValueError, match="one list of int item ids"):
        predictor.retrieve({"user": [1], "segment": [1]}, exclude=[["a"]])


def test_a_damaged_corpus_is_named(exported, tmp_path):
    model, *_ = exported
    path = model.export_serving(tmp_path / "damaged", item_ids=[1, 2, 3])
    file = os.path.join(path, artifact.CANDIDATES)
    with open(file, "r+b") as f:
        f.seek(-4, os.SEEK_END)
        f.write(b"\0\0\0\1")
    with pytest.raises(rk.serving.ArtifactError, match="candidates.safetensors: its CRC-32"):
        rk.serving.load(path)


def test_a_ranking_artifact_takes_no_ann_index(tmp_path):
    columns = rk.layers.FeatureColumns([F.Categorical("user", dim=4)])
    inputs = columns.inputs()
    dense, sparse = columns(inputs)
    embedded = rk.layers.ShardedEmbedding(columns)(sparse)
    model = rk.Model(inputs, keras.layers.Dense(1)(keras.layers.Flatten()(embedded)))
    model.predict({"user": np.arange(4)}, verbose=0)
    path = model.export_serving(tmp_path / "ranking")
    assert type(rk.serving.load(path)) is rk.serving.Predictor
    with pytest.raises(ValueError, match="a ranking artifact; index='hnsw'"):
        rk.serving.load(path, index="hnsw")


@pytest.mark.slow
def test_retrieval_serving_imports_no_keras(exported):
    _, path, *_ = exported
    code = ("import sys, reckeras.serving as s;"
            f"p = s.load({path!r}, index='hnsw');"
            "ids, scores = p.retrieve({'user': [1, 2], 'segment': [1, 2]}, k=3);"
            "assert ids.shape == (2, 3), ids.shape;"
            "print(sorted(m for m in sys.modules if m == 'keras' or m.startswith('keras.')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                sys.path)})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"
