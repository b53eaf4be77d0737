"""Deltas reaching a running server: a watched directory (`DeltaWatcher`)
and the admin endpoint (`--admin-port`, token, localhost, never the public
port); every answer names its model version, `/health` its rows' age."""

import json
import logging
import os
import shutil
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest

import reckeras.serving
from reckeras.serving import artifact
from reckeras.serving.watch import DeltaWatcher

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_delta import QUERY, build, train  # noqa: E402
from test_http import environment, free_port

TOKEN = "s3cret-token-of-the-admin"


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """A full export and three deltas, each with `model.predict` of QUERY."""
    folder = tmp_path_factory.mktemp("chain")
    model = build()
    train(model, range(40), np.arange(40) % 10, seed=0)
    paths = [folder / "v1"]
    model.export_serving(paths[0])
    expected = [model.predict(QUERY, verbose=0)]
    for day in range(1, 4):
        train(model, range(10 * day, 10 * day + 40), (np.arange(40) + day) % 10, seed=day)
        paths.append(folder / f"v{day + 1}")
        model.export_serving(paths[-1], base=paths[-2])
        expected.append(model.predict(QUERY, verbose=0))
    versions = [json.loads((p / artifact.MANIFEST).read_text())["version"] for p in paths]
    return paths, versions, expected


def test_the_watcher_applies_deltas_in_chain_order(chain, tmp_path):
    paths, versions, expected = chain
    predictor = reckeras.serving.load(paths[0])
    watched = tmp_path / "deltas"
    watched.mkdir()
    watcher = DeltaWatcher(predictor, watched, interval=0.05)
    assert watcher.poll() == []
    # v3 arrives first: it waits for its base; a writer's staging is skipped.
    shutil.copytree(paths[2], watched / "b")
    shutil.copytree(paths[3], watched / "c.tmp")
    assert watcher.poll() == [] and predictor.version == versions[0]
    shutil.copytree(paths[1], watched / "a")
    assert watcher.poll() == versions[1:3]
    np.testing.assert_allclose(predictor.predict(QUERY), expected[2], atol=1e-5, rtol=0)
    # A damaged delta is refused once (logged), the old version serving on.
    shutil.copytree(paths[3], watched / "d")
    data = bytearray((watched / "d" / artifact.table_file(0, 0, 0)).read_bytes())
    data[-3] ^= 0xFF
    (watched / "d" / artifact.table_file(0, 0, 0)).write_bytes(bytes(data))
    records = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = records.append
    logging.getLogger("reckeras.serving").addHandler(handler)
    try:
        assert watcher.poll() == [] and watcher.poll() == []
    finally:
        logging.getLogger("reckeras.serving").removeHandler(handler)
    assert [r.getMessage().count("CRC-32") for r in records] == [1]
    assert predictor.version == versions[2]
    # Rewritten whole, it is applied by the polling thread.
    shutil.rmtree(watched / "d")
    shutil.copytree(paths[3], watched / "d")
    watcher.start()
    deadline = time.monotonic() + 10
    while predictor.version != versions[3] and time.monotonic() < deadline:
        time.sleep(0.02)
    watcher.stop()
    assert predictor.version == versions[3]
    np.testing.assert_allclose(predictor.predict(QUERY), expected[3], atol=1e-5, rtol=0)


def test_a_bad_watch_interval_or_directory_is_refused(chain, tmp_path):
    predictor = reckeras.serving.load(chain[0][0])
    with pytest.raises(ValueError, match="interval must be > 0"):
        DeltaWatcher(predictor, tmp_path, interval=0)
    with pytest.raises(ValueError, match="nowhere: the watched directory does not exist"):
        DeltaWatcher(predictor, tmp_path / "nowhere")


def wait_for(check, what, process, log):
    deadline = time.monotonic() + 120
    while True:
        assert process.poll() is None, f"server exited: {log.read_text()}"
        try:
            if check():
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"{what} never happened: {log.read_text()}"
        time.sleep(0.05)


@pytest.mark.slow
def test_a_server_takes_deltas_from_its_watched_directory_and_its_admin_port(
        chain, tmp_path):
    paths, versions, expected = chain
    watched = tmp_path / "deltas"
    watched.mkdir()
    port, admin_port = free_port(), free_port()
    log = tmp_path / "server.log"
    env = {**environment(), "RECKERAS_ADMIN_TOKEN": TOKEN}
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "reckeras.serving", str(paths[0]), "--port", str(port),
             "--watch", str(watched), "--watch-interval", "0.1",
             "--admin-port", str(admin_port)],
            stdout=out, stderr=subprocess.STDOUT, env=env)
    public = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
    admin = httpx.Client(base_url=f"http://127.0.0.1:{admin_port}", timeout=30)
    body = {"inputs": {name: QUERY[name].to_pylist() for name in ("n", "a", "b")}}

    def answer():
        response = public.post("/predict", json=body)
        assert response.status_code == 200
        return response.headers["x-model-version"], np.array(response.json()["outputs"])
    try:
        wait_for(lambda: public.get("/health").status_code == 200, "health", process, log)
        health = public.get("/health").json()
        assert health["version"] == versions[0] and 0 <= health["rows_age_s"] < 600
        version, outputs = answer()
        assert version == versions[0]
        np.testing.assert_allclose(outputs, expected[0], atol=1e-5, rtol=0)
        # Watched: the delta appears (renamed into place, as export_serving does).
        shutil.copytree(paths[1], watched / "v2.tmp")
        os.rename(watched / "v2.tmp", watched / "v2")
        wait_for(lambda: public.get("/health").json()["version"] == versions[1],
                 "the watched delta's version", process, log)
        version, outputs = answer()
        assert version == versions[1]
        np.testing.assert_allclose(outputs, expected[1], atol=1e-5, rtol=0)
        # Admin: never on the public port; a token is required.
        assert public.post("/delta", json={"path": str(paths[2])}).status_code == 404
        assert admin.post("/delta", json={"path": str(paths[2])}).status_code == 401
        wrong = {"authorization": f"Bearer {TOKEN[:-1]}x"}
        assert admin.post("/delta", json={"path": str(paths[2])},
                          headers=wrong).status_code == 401
        good = {"authorization": f"Bearer {TOKEN}"}
        out_of_order = admin.post("/delta", json={"path": str(paths[3])}, headers=good)
        assert out_of_order.status_code == 409
        assert "is based on version" in out_of_order.json()["error"]
        assert out_of_order.json()["version"] == versions[1]
        assert answer()[0] == versions[1]
        applied = admin.post("/delta", json={"path": str(paths[2])}, headers=good)
        assert applied.status_code == 200 and applied.json() == {"version": versions[2]}
        version, outputs = answer()
        assert version == versions[2]
        np.testing.assert_allclose(outputs, expected[2], atol=1e-5, rtol=0)
        assert public.get("/metadata").json()["version"] == versions[2]
    finally:
        public.close()
        admin.close()
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.parametrize("extra, message", [
    (["--admin-port", "PORT"], "--admin-port must differ from --port"),
    (["--admin-port", "1"], "needs a token of at least 16 characters"),
    (["--watch", "/nonexistent/deltas"], "the watched directory does not exist"),
])
def test_bad_admin_or_watch_options_are_refused(chain, extra, message):
    port = str(free_port())
    extra = [port if value == "PORT" else value for value in extra]
    env = {key: value for key, value in environment().items()
           if key != "RECKERAS_ADMIN_TOKEN"}
    done = subprocess.run([sys.executable, "-m", "reckeras.serving", str(chain[0][0]),
                           "--port", port, *extra], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2 and message in done.stderr
