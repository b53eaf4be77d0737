"""`POST /retrieve` (issue 23, item 4): a two-tower's artifact served over
HTTP, through Starlette's TestClient and one real `python -m
reckeras.serving` process with an HNSW index. Answers must equal
`RetrievalPredictor.retrieve` on the same rows; bad requests get a 400
naming the field."""

import json
import sys

import numpy as np
import pytest
from starlette.testclient import TestClient

import reckeras as rk
from reckeras.serving.server import create_app

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from test_http import Server  # noqa: E402
from test_retrieval_artifact import USERS, exported  # noqa: E402, F401

pytest.importorskip("faiss")


@pytest.fixture(scope="module")
def client(exported):  # noqa: F811
    _, path, *_ = exported
    predictor = rk.serving.load(path)
    with TestClient(create_app(predictor, max_k=50)) as client:
        yield client, predictor


def test_retrieve_answers_in_both_formats(client, exported):  # noqa: F811
    client, predictor = client
    _, _, _, users, seen, _, _ = exported
    rows = [{"user": int(u), "segment": int(s)}
            for u, s in zip(users["user"][:4], users["segment"][:4], strict=True)]
    exclude = [[int(i) + 5 for i in ids] for ids in seen[:4]]
    want_ids, want_scores = predictor.retrieve(
        {"user": users["user"][:4], "segment": users["segment"][:4]}, k=7, exclude=exclude)
    answer = client.post("/retrieve", json={"instances": rows, "k": 7, "exclude": exclude})
    assert answer.status_code == 200, answer.text
    assert answer.headers["X-Model-Version"] == predictor.version
    predictions = answer.json()["predictions"]
    assert [p["item_ids"] for p in predictions] == want_ids.tolist()
    np.testing.assert_allclose([p["scores"] for p in predictions], want_scores, atol=1e-6)
    columnar = client.post("/retrieve", json={
        "inputs": {"user": [r["user"] for r in rows], "segment": [r["segment"] for r in rows]},
        "k": 7, "exclude": exclude}).json()["outputs"]
    assert columnar["item_ids"] == want_ids.tolist()
    default_k = client.post("/retrieve", json={"instances": rows[:1]}).json()
    assert len(default_k["predictions"][0]["item_ids"]) == 10


def test_metadata_says_it_is_a_retrieval_artifact(client):
    client, _ = client
    described = client.get("/metadata").json()
    assert described["retrieval"]["num_items"] == 120
    assert described["retrieval"]["index"] == "exact"
    assert described["retrieval"]["query_features"] == ["user", "segment"]


@pytest.mark.parametrize("body, words", [
    ({"instances": [{"user": 1, "segment": 0}], "k": 51}, ["'k'", "1 to 50"]),
    ({"instances": [{"user": 1, "segment": 0}], "k": "5"}, ["'k'"]),
    ({"instances": [{"user": 1, "segment": 0}], "exclude": [[1], [2]]},
     ["'exclude'", "1 lists"]),
    ({"instances": [{"user": 1, "segment": 0}], "exclude": [["a"]]}, ["'exclude'"]),
    ({"instances": [{"user": "x", "segment": 0}]}, ["user"]),
    ({"instances": [{"user": 1, "segment": 0}], "top": 3}, ["unknown key", "top"]),
])
def test_bad_requests_get_a_400_naming_the_field(client, body, words):
    client, _ = client
    answer = client.post("/retrieve", content=json.dumps(body))
    assert answer.status_code == 400, answer.text
    for word in words:
        assert word in answer.json()["error"]


def test_a_real_server_answers_through_its_ann_index(exported, tmp_path):  # noqa: F811
    _, path, _, users, seen, _, _ = exported
    exact = rk.serving.load(path)
    server = Server(path, str(tmp_path / "server.log"), "--index", "hnsw",
                    "--index-options", '{"ef_search": 200}')
    try:
        rows = [{"user": int(u), "segment": int(u) % 3} for u in range(USERS)]
        exclude = [[int(i) + 5 for i in ids] for ids in seen]
        answer = server.client.post("/retrieve", json={"instances": rows, "k": 10,
                                                       "exclude": exclude})
        assert answer.status_code == 200, answer.text
        assert answer.headers["X-Model-Version"] == exact.version
        want, _ = exact.retrieve(users, k=10, exclude=exclude)
        # 120 items under ef_search 200: the graph is searched whole.
        assert [p["item_ids"] for p in answer.json()["predictions"]] == want.tolist()
        assert server.client.get("/metadata").json()["retrieval"]["index_options"] == {
            "m": 32, "ef_construction": 200, "ef_search": 200}
    finally:
        server.close()
