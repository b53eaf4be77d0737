"""The HTTP server (issue 15, item 4): `python -m reckeras.serving PATH`.

Tiny models are trained here and exported to a temporary folder; each is
served by a real server process on 127.0.0.1 and queried with a real HTTP
client (httpx). Predictions in TF Serving's row and columnar formats must
equal `model.predict` on the same rows; every bad request gets a 400 naming
the feature and the process goes on answering; concurrent requests all get
their own rows' predictions; the server's import path holds no Keras.
"""

import concurrent.futures
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from types import SimpleNamespace

import httpx
import keras
import numpy as np
import pyarrow as pa
import pytest

import reckeras as rk

F = rk.features
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ATOL = 1e-5


def environment():
    # The server process imports this checkout's reckeras, as the tests do.
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    return env


def every_kind_table(rows, seed):
    """Rows for every feature kind: scalar and vector Numerics, int64 and
    string Categoricals (10% missing ids), a bucketized one, a weighted
    Sequence (lengths 0..5, some over max_len)."""
    rng = np.random.default_rng(seed)
    seqs = [list(rng.integers(-9, 9, rng.integers(0, 6))) for _ in range(rows)]
    return pa.table({
        "n": rng.random(rows).astype(np.float32),
        "v": pa.FixedSizeListArray.from_arrays(
            pa.array(rng.normal(size=3 * rows).astype(np.float32)), 3),
        "a": pa.array(rng.integers(-20, 20, rows), mask=rng.random(rows) < 0.1),
        "b": rng.choice(["x", "y", "q"], rows),
        "z": rng.normal(size=rows),
        "s": pa.array(seqs, pa.list_(pa.int64())),
        "w": pa.array([list(rng.random(len(x))) for x in seqs], pa.list_(pa.float32())),
        "label": rng.integers(0, 2, rows).astype(np.float32)})


def every_kind_model(table):
    keras.utils.set_random_seed(0)
    columns = rk.layers.FeatureColumns([
        F.Numeric("n", transform="log1p"),
        F.Numeric("v", shape=(3,), transform="standardize"),
        F.Categorical("a", dim=4), F.Categorical("b", dim=4, dtype="string"),
        F.Categorical("z", dim=4, boundaries=[0.0, 1.0]),
        F.Cross(["a", "z"], dim=4, hash_buckets=50),
        F.Sequence("s", dim=4, max_len=4, combiner="mean", weights="w")])
    model = rk.models.dlrm(columns, bottom_units=(8, 4), top_units=(8, 1))
    model.compile(optimizer="adam", loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.1))
    model.fit(table, batch_size=64, verbose=0)
    return model


def two_task_model(table):
    keras.utils.set_random_seed(0)
    columns = rk.layers.FeatureColumns([F.Numeric("price", transform="log1p"),
                                        F.Categorical("user", dim=4)])
    model = rk.models.esmm(columns, tower_units=(4,))
    model.compile(optimizer="adam",
                  loss={"ctr": "binary_crossentropy", "ctcvr": "binary_crossentropy"},
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.1))
    model.fit(table, labels={"ctr": "click", "ctcvr": "conversion"}, batch_size=64,
              verbose=0)
    return model


def two_task_table(rows, seed):
    rng = np.random.default_rng(seed)
    click = rng.integers(0, 2, rows).astype(np.float32)
    return pa.table({"price": rng.lognormal(0, 1, rows).astype(np.float32),
                     "user": rng.integers(0, 30, rows), "click": click,
                     "conversion": click * rng.integers(0, 2, rows).astype(np.float32)})


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Server:
    """`python -m reckeras.serving PATH` in its own process, up and healthy."""

    def __init__(self, path, log, *options):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        with open(log, "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "reckeras.serving", path, "--port",
                 str(self.port), "--host", "127.0.0.1", "--threads", "4",
                 "--torch-threads", "1", *options],
                stdout=out, stderr=subprocess.STDOUT, env=environment())
        self.client = httpx.Client(base_url=self.url, timeout=30)
        try:
            self.wait_healthy()
        except BaseException:
            self.close()
            raise

    def wait_healthy(self):
        deadline = time.monotonic() + 120
        while True:
            assert self.process.poll() is None, f"server exited: {self.log()}"
            try:
                if self.client.get("/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"server never healthy: {self.log()}"
            time.sleep(0.1)

    def log(self):
        with open(self.log_path, errors="replace") as log:
            return log.read()

    def post(self, body):
        content = body if isinstance(body, bytes) else json.dumps(body)
        return self.client.post("/predict", content=content,
                                headers={"content-type": "application/json"})

    def close(self):
        self.client.close()
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def serving(rows, build):
    """A module fixture: trains `build(rows())`, exports it and serves it;
    the tests read the server, the rows and `model.predict` of them."""

    @pytest.fixture(scope="module")
    def fixture(tmp_path_factory):
        table = rows()
        model = build(table)
        folder = tmp_path_factory.mktemp(build.__name__)
        path = str(folder / "artifact")
        model.export_serving(path)
        expected = model.predict(table, batch_size=len(table), verbose=0)
        server = Server(path, str(folder / "server.log"))
        yield SimpleNamespace(server=server, table=table, expected=expected,
                              path=path, model=model)
        server.close()

    return fixture


served = serving(lambda: every_kind_table(256, seed=0), every_kind_model)
served_two_tasks = serving(lambda: two_task_table(192, seed=1), two_task_model)


def instances(table, start, stop):
    """TF Serving's row format of rows [start, stop) (the label too: other
    keys are ignored)."""
    return {"instances": table.slice(start, stop - start).to_pylist()}


def inputs(table, start, stop):
    return {"inputs": table.slice(start, stop - start).to_pydict()}


def test_health(served):
    server = served.server
    response = server.client.get("/health")
    version = json.load(open(os.path.join(served.path, "manifest.json")))["version"]
    answer = response.json()
    assert response.status_code == 200 and answer["status"] == "ok"
    assert answer["version"] == version and 0 <= answer["rows_age_s"] < 3600


def test_row_format_predictions_equal_model_predict(served):
    server, table, expected = served.server, served.table, served.expected
    response = server.post(instances(table, 0, 64))
    assert response.status_code == 200, response.text
    body = response.json()
    assert list(body) == ["predictions"]
    # TF Serving: one entry per instance, its output as a list ([1] here).
    assert len(body["predictions"]) == 64
    assert all(isinstance(p, list) and len(p) == 1 for p in body["predictions"])
    np.testing.assert_allclose(np.array(body["predictions"]), expected[:64],
                               rtol=0, atol=ATOL)


def test_columnar_format_outputs_equal_model_predict(served):
    server, table, expected = served.server, served.table, served.expected
    response = server.post(inputs(table, 100, 230))
    assert response.status_code == 200, response.text
    body = response.json()
    assert list(body) == ["outputs"]
    np.testing.assert_allclose(np.array(body["outputs"]), expected[100:230],
                               rtol=0, atol=ATOL)


@pytest.mark.slow
def test_dict_outputs_per_instance_objects_and_columnar_object(served_two_tasks):
    server, table, expected = (served_two_tasks.server, served_two_tasks.table,
                               served_two_tasks.expected)
    assert set(expected) == {"ctr", "ctcvr"}
    rows = server.post(instances(table, 10, 40)).json()["predictions"]
    assert len(rows) == 30 and all(set(row) == {"ctr", "ctcvr"} for row in rows)
    for name in ("ctr", "ctcvr"):
        np.testing.assert_allclose(np.array([row[name] for row in rows]),
                                   expected[name][10:40], rtol=0, atol=ATOL)
    columns = server.post(inputs(table, 0, 192)).json()["outputs"]
    assert set(columns) == {"ctr", "ctcvr"}
    for name in ("ctr", "ctcvr"):
        np.testing.assert_allclose(np.array(columns[name]), expected[name],
                                   rtol=0, atol=ATOL)
    described = server.client.get("/metadata").json()
    assert sorted(described["outputs"]) == ["ctcvr", "ctr"]
    assert described["columns"] == ["price", "user"]


def test_metadata_lists_features_columns_and_versions(served):
    server = served.server
    described = server.client.get("/metadata").json()
    assert described["features"] == [
        {"name": "n", "kind": "Numeric", "dtype": "float32", "shape": []},
        {"name": "v", "kind": "Numeric", "dtype": "float32", "shape": [3]},
        {"name": "a", "kind": "Categorical", "dtype": "int64"},
        {"name": "b", "kind": "Categorical", "dtype": "string"},
        {"name": "z", "kind": "Categorical", "dtype": "float32", "boundaries": [0.0, 1.0]},
        {"name": "a_x_z", "kind": "Cross", "features": ["a", "z"]},
        {"name": "s", "kind": "Sequence", "dtype": "int64", "max_len": 4, "weights": "w"}]
    assert described["columns"] == ["n", "v", "a", "b", "z", "s", "w"]
    assert described["outputs"] is None
    assert described["format"] == "reckeras-serving" and described["rows"] == "float32"
    assert described["version"] == server.client.get("/health").json()["version"]
    assert described["versions"]["reckeras"] == rk.__version__
    assert set(described["versions"]) >= {"reckeras", "torch"}


def test_columns_of_nulls_only_predict_as_missing_values(served):
    # JSON nulls alone carry no type: each column gets its feature's.
    server, table = served.server, served.table
    rows = table.slice(0, 5)
    nulls = {"a": pa.int64(), "b": pa.string(), "z": pa.float64(), "n": pa.float32(),
             "v": pa.list_(pa.float32(), 3), "s": pa.list_(pa.int64()),
             "w": pa.list_(pa.float32())}
    for names in (["a"], ["a", "b", "z"], list(nulls)):
        missing = rows
        for name in names:
            missing = missing.set_column(missing.schema.get_field_index(name), name,
                                         pa.nulls(5, nulls[name]))
        expected = served.model.predict(missing, verbose=0)
        # A one-example batch too: its column is one null.
        for start, stop, form, key in ((0, 5, instances, "predictions"),
                                       (0, 5, inputs, "outputs"),
                                       (2, 3, instances, "predictions")):
            response = server.post(form(missing, start, stop))
            assert response.status_code == 200, (names, response.text)
            np.testing.assert_allclose(np.array(response.json()[key]),
                                       expected[start:stop], rtol=0, atol=ATOL)


def good_rows():
    return every_kind_table(3, seed=5).to_pylist()


def with_row(index, **values):
    rows = good_rows()
    rows[index].update(values)
    return {"instances": rows}


def without(name, indices):
    rows = good_rows()
    for i in indices:
        del rows[i][name]
    return {"instances": rows}


def columnar(**values):
    columns = every_kind_table(3, seed=5).to_pydict()
    columns.update(values)
    return {"inputs": columns}


# (request body, words the 400's message must hold)
BAD_REQUESTS = {
    "not json": (b'{"instances": [', ["not JSON"]),
    "not utf-8": (b'{"instances": [\xff]}', ["not JSON", "utf-8"]),
    "nested too deep": (b"[" * 100_000 + b"]" * 100_000, ["not JSON", "recursion"]),
    "not an object": (b"[1, 2]", ["JSON object"]),
    "neither key": ({"examples": []}, ["unknown key", "examples"]),
    "no key": ({}, ["exactly one"]),
    "both keys": ({"instances": [], "inputs": {}}, ["exactly one"]),
    "signature": ({"signature_name": "tf/classify", "instances": []}, ["signature_name"]),
    "instances not a list": ({"instances": {"n": 1.0}}, ["'instances'", "list"]),
    "instance not an object": ({"instances": [1.0, 2.0]}, ["instance 0", "object"]),
    "empty batch": ({"instances": []}, ["empty batch"]),
    "feature missing everywhere": (without("b", [0, 1, 2]), ["'b'"]),
    "feature missing in one": (without("b", [1]), ["'b'", "instance 1"]),
    "string for int id": (with_row(1, a="seven"), ["'a'"]),
    "float for int id": (with_row(0, a=1.5), ["'a'"]),
    "id beyond int64": (with_row(2, a=2 ** 70), ["'a'"]),
    "int for string id": (with_row(0, b=3), ["'b'"]),
    "string for numeric": (with_row(2, n="high"), ["'n'"]),
    "list for numeric": (with_row(0, n=[1.0, 2.0]), ["'n'"]),
    "object for numeric": (with_row(0, n={"value": 1.0}), ["'n'"]),
    "infinite numeric": (with_row(1, n=float("inf")), ["'n'"]),
    "vector of wrong width": (with_row(1, v=[1.0, 2.0]), ["'v'"]),
    "scalar for vector": (with_row(0, v=1.0), ["'v'"]),
    "scalar for sequence": (with_row(0, s=3, w=1.0), ["'s'"]),
    "weights not matching ids": (with_row(0, s=[1, 2], w=[0.5]), ["'s'", "'w'"]),
    "string for bucketized": (with_row(1, z="cold"), ["'z'"]),
    "inputs not an object": ({"inputs": [[1.0]]}, ["'inputs'", "object"]),
    "column not a list": (columnar(n=1.0), ["'n'", "list"]),
    "columns of different lengths": (columnar(b=["x", "y"]), ["'b'", "2 values"]),
    "columnar wrong type": (columnar(a=["p", "q", "r"]), ["'a'"]),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_bad_request_gets_400_naming_the_feature_and_the_server_serves_on(served, case):
    server, table, expected = served.server, served.table, served.expected
    body, words = BAD_REQUESTS[case]
    response = server.post(body)
    assert response.status_code == 400, response.text
    message = response.json()["error"]
    for word in words:
        assert word in message, message
    assert server.process.poll() is None
    response = server.post(instances(table, 3, 5))
    assert response.status_code == 200
    np.testing.assert_allclose(np.array(response.json()["predictions"]), expected[3:5],
                               rtol=0, atol=ATOL)


def test_unknown_routes_and_methods_answer_json_errors(served):
    server = served.server
    missing = server.client.get("/v1/models/x")
    assert missing.status_code == 404 and "/v1/models/x" in missing.json()["error"]
    wrong = server.client.get("/predict")
    assert wrong.status_code == 405 and "GET /predict" in wrong.json()["error"]


def test_concurrent_requests_all_get_their_own_rows(served):
    server, table, expected = served.server, served.table, served.expected
    rng = np.random.default_rng(7)
    # 8 threads x 20 requests, each of its own rows, in both formats.
    plans = [[(int(start), int(start + size), bool(rng.integers(0, 2)))
              for start, size in zip(rng.integers(0, 240, 20), rng.integers(1, 17, 20))]
             for _ in range(8)]

    def client_thread(plan):
        with httpx.Client(base_url=server.url, timeout=60) as client:
            results = []
            for start, stop, rows in plan:
                body = instances(table, start, stop) if rows else inputs(table, start, stop)
                response = client.post("/predict", json=body)
                assert response.status_code == 200, response.text
                answer = response.json()["predictions" if rows else "outputs"]
                results.append((start, stop, np.array(answer)))
            return results

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = [r for results in pool.map(client_thread, plans) for r in results]
    assert len(answers) == 160
    for start, stop, answer in answers:
        np.testing.assert_allclose(answer, expected[start:stop], rtol=0, atol=ATOL)


def test_unexpected_failure_is_a_500_and_the_next_request_succeeds(served):
    # In-process app: the predictor raises an error no input check knows of
    # (as a fault deep in torch would) once, then works again.
    from starlette.testclient import TestClient

    import reckeras.serving
    from reckeras.serving.server import create_app

    table, expected, path = served.table, served.expected, served.path
    predictor = reckeras.serving.load(path)
    real_predict, calls = predictor.predict_with_version, []

    def failing_once(batch):
        calls.append(len(calls))
        if len(calls) == 1:
            raise RuntimeError("the kernel fell over")
        return real_predict(batch)

    predictor.predict_with_version = failing_once
    with TestClient(create_app(predictor)) as client:
        failed = client.post("/predict", json=instances(table, 0, 4))
        assert failed.status_code == 500
        assert failed.json()["error"] == "internal error: RuntimeError: the kernel fell over"
        served_again = client.post("/predict", json=instances(table, 0, 4))
        assert served_again.status_code == 200
        np.testing.assert_allclose(np.array(served_again.json()["predictions"]),
                                   expected[:4], rtol=0, atol=ATOL)
    assert calls == [0, 1]


NO_KERAS = """
import json, sys
import reckeras.serving.__main__
from reckeras.serving import load
from reckeras.serving.server import create_app
from starlette.testclient import TestClient

with TestClient(create_app(load(sys.argv[1]))) as client:
    response = client.post("/predict", json=json.loads(sys.argv[2]))
print(json.dumps({"status": response.status_code, "body": response.json(),
                  "keras": sorted(m for m in sys.modules
                                  if m == "keras" or m.startswith("keras."))}))
"""


@pytest.mark.slow
def test_server_import_path_and_a_prediction_import_no_keras(served):
    table, expected, path = served.table, served.expected, served.path
    run = subprocess.run([sys.executable, "-c", NO_KERAS, path,
                          json.dumps(instances(table, 20, 30))],
                         capture_output=True, text=True, env=environment(), timeout=120)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.splitlines()[-1])
    assert result["status"] == 200 and result["keras"] == []
    np.testing.assert_allclose(np.array(result["body"]["predictions"]),
                               expected[20:30], rtol=0, atol=ATOL)


@pytest.mark.slow
def test_a_damaged_artifact_is_refused_before_serving(served, tmp_path):
    path = served.path
    damaged = str(tmp_path / "damaged")
    shutil.copytree(path, damaged)
    manifest = os.path.join(damaged, "manifest.json")
    with open(manifest, "r+b") as file:
        file.truncate(os.path.getsize(manifest) // 2)
    run = subprocess.run([sys.executable, "-m", "reckeras.serving", damaged,
                          "--port", str(free_port())],
                         capture_output=True, text=True, env=environment(), timeout=120)
    assert run.returncode == 2
    assert "cannot serve" in run.stderr and "manifest.json" in run.stderr
