"""Serving deltas: `export_serving(..., base=...)` writes the rows changed
since its base, the ids removed since and the dense weights;
`Predictor.apply_delta` applies them atomically between requests, refuses
damaged, partial and out-of-order deltas (the old version serving on), and
frees old versions."""

import gc
import json
import os
import shutil
import threading
import weakref

import keras
import numpy as np
import pyarrow as pa
import pytest
import torch
from safetensors.numpy import load_file

import reckeras as rk
import reckeras.serving
from reckeras.backend_kernels.hashing import mix64
from reckeras.embedding.packing import table_salt
from reckeras.serving import artifact
from reckeras.serving.server import health
from reckeras.serving.table_copies import COMPACT_AT


def build():
    """A DLRM whose table "a" ages out after one idle window."""
    keras.utils.set_random_seed(0)
    columns = rk.layers.FeatureColumns([rk.features.Numeric("n"),
                                        rk.features.Categorical("a", dim=4),
                                        rk.features.Categorical("b", dim=4)])
    model = rk.models.dlrm(columns, bottom_units=(8, 4), top_units=(8, 1), table_options={
        "a": rk.embedding.TableOptions(evict_idle_windows=1)})
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.1))
    return model


def window(a_ids, b_ids, seed):
    rng = np.random.default_rng(seed)
    n = len(a_ids)
    return pa.table({"n": rng.normal(size=n).astype(np.float32), "a": a_ids, "b": b_ids,
                     "label": (rng.random(n) < 0.5).astype(np.float32)})


def train(model, a_ids, b_ids, seed):
    model.fit_windows([window(np.asarray(a_ids), np.asarray(b_ids), seed)], batch_size=8,
                      shuffle=False, verbose=0)


def key(raw_id, table):
    return int(mix64(torch.tensor([raw_id]))[0] ^ table_salt(table))


QUERY = window(np.arange(-5, 70), np.arange(75) % 30, seed=99)


def manifest(path):
    return json.loads((path / artifact.MANIFEST).read_text())


@pytest.fixture
def two_versions(tmp_path):
    """v1: a full export after window 0; v2: a delta after window 1, which
    trains a 20..59 and b 0..9 and ages a 0..19 out."""
    model = build()
    train(model, range(40), np.arange(40) % 10, seed=0)
    v1 = tmp_path / "v1"
    model.export_serving(v1)
    before = model.predict(QUERY, verbose=0)
    train(model, range(20, 60), np.arange(40) % 10, seed=1)
    v2 = tmp_path / "v2"
    model.export_serving(v2, base=v1)
    return model, v1, v2, before, model.predict(QUERY, verbose=0)


def test_a_delta_holds_the_changed_rows_the_removed_ids_and_its_base(two_versions):
    _, v1, v2, _, _ = two_versions
    delta = manifest(v2)
    assert delta["kind"] == "delta" and delta["base"] == manifest(v1)["version"]
    assert artifact.version_number(delta["version"]) == 2
    assert delta["rows"] == "float32" and delta["rows_written_at"] >= \
        manifest(v1)["rows_written_at"]
    stored = load_file(str(v2 / artifact.table_file(0, 0, 0)))
    # Window 1 trains a 20..59 and b 0..9: those rows and no others.
    assert sorted(stored["keys"].tolist()) == sorted(
        [key(i, "a") for i in range(20, 60)] + [key(i, "b") for i in range(10)])
    assert sorted(stored["deleted"].tolist()) == sorted(key(i, "a") for i in range(20))
    table, = delta["embedding_layers"][0]["tables"]
    assert (table["num_rows"], table["num_removed"], table["bytes_per_row"]) == (50, 20, 24)
    # Bytes: rows x (key + 4 float32) + 8 per removed id + a safetensors header.
    rows_bytes = os.path.getsize(v2 / artifact.table_file(0, 0, 0))
    assert 50 * 24 + 20 * 8 <= rows_bytes <= 50 * 24 + 20 * 8 + 400
    assert delta["bytes"] == rows_bytes + os.path.getsize(v2 / artifact.DENSE_WEIGHTS)


def test_an_applied_delta_equals_a_full_export_of_the_same_model(two_versions, tmp_path):
    model, v1, v2, before, after = two_versions
    predictor = reckeras.serving.load(v1)
    np.testing.assert_allclose(predictor.predict(QUERY), before, atol=1e-5, rtol=0)
    assert predictor.apply_delta(v2) == manifest(v2)["version"] == predictor.version
    outputs = predictor.predict(QUERY)
    np.testing.assert_allclose(outputs, after, atol=1e-5, rtol=0)
    assert np.abs(outputs - before).max() > 1e-3
    full = reckeras.serving.load(model.export_serving(tmp_path / "full"))
    np.testing.assert_array_equal(outputs, full.predict(QUERY))
    # An aged-out id reads zeros, as an id never seen does.
    np.testing.assert_array_equal(
        predictor.predict(window(np.array([3]), np.array([0]), 1)),
        predictor.predict(window(np.array([12345]), np.array([0]), 1)))


def test_a_full_checkpoint_between_exports_keeps_the_delta_exact(tmp_path):
    model = build()
    train(model, range(40), np.arange(40) % 10, seed=0)
    model.export_serving(tmp_path / "v1")
    train(model, range(20, 60), np.arange(40) % 10, seed=1)     # ages a 0..19 out
    model.save_checkpoint(tmp_path / "ckpt")                   # full: forgets its deletions
    train(model, range(50, 70), np.arange(20) % 10, seed=2)
    model.export_serving(tmp_path / "v2", base=tmp_path / "v1")
    stored = load_file(str(tmp_path / "v2" / artifact.table_file(0, 0, 0)))
    assert {key(i, "a") for i in range(20)} <= set(stored["deleted"].tolist())
    predictor = reckeras.serving.load(tmp_path / "v1")
    predictor.apply_delta(tmp_path / "v2")
    full = reckeras.serving.load(model.export_serving(tmp_path / "full"))
    np.testing.assert_array_equal(predictor.predict(QUERY), full.predict(QUERY))


def test_a_delta_keeps_its_bases_precision_and_min_count(tmp_path):
    model = build()
    train(model, range(40), np.arange(40) % 10, seed=0)
    model.export_serving(tmp_path / "v1", rows="int8", min_count=2)
    train(model, range(20, 60), np.arange(40) % 10, seed=1)
    with pytest.raises(ValueError, match="base's rows are 'int8'"):
        model.export_serving(tmp_path / "v2", rows="float16", base=tmp_path / "v1")
    with pytest.raises(ValueError, match="base's min_count is 2"):
        model.export_serving(tmp_path / "v2", min_count=1, base=tmp_path / "v1")
    model.export_serving(tmp_path / "v2", base=tmp_path / "v1")
    delta = manifest(tmp_path / "v2")
    assert (delta["rows"], delta["min_count"]) == ("int8", 2)
    stored = load_file(str(tmp_path / "v2" / artifact.table_file(0, 0, 0)))
    assert stored["rows"].dtype == np.int8 and "scale" in stored
    assert delta["embedding_layers"][0]["tables"][0]["bytes_per_row"] == 8 + 4 + 8


def test_a_base_that_is_not_the_latest_export_is_refused(two_versions, tmp_path):
    model, v1, _, _, _ = two_versions
    with pytest.raises(ValueError, match=r"v1/manifest.json: version 1-\w+ is not this "
                                         r"model's latest serving export \(2-"):
        model.export_serving(tmp_path / "v3", base=v1)
    with pytest.raises(ValueError, match="latest serving export"):
        build().export_serving(tmp_path / "v3", base=v1)
    assert not (tmp_path / "v3").exists()


def flipped(path, name):
    data = bytearray((path / name).read_bytes())
    data[-5] ^= 0xFF
    (path / name).write_bytes(bytes(data))


FAULTS = {
    "damaged row file": (lambda d: flipped(d, artifact.table_file(0, 0, 0)),
                         r"L0.T0.r0.safetensors: its CRC-32 does not match"),
    "damaged dense weights": (lambda d: flipped(d, artifact.DENSE_WEIGHTS),
                              r"dense.safetensors: its CRC-32 does not match"),
    "missing row file": (lambda d: os.remove(d / artifact.table_file(0, 0, 0)),
                         r"L0.T0.r0.safetensors: missing"),
    "truncated row file": (lambda d: os.truncate(d / artifact.table_file(0, 0, 0), 40),
                           r"L0.T0.r0.safetensors: 40 bytes, the manifest says"),
    "no manifest (the writer died)": (lambda d: os.remove(d / artifact.MANIFEST),
                                      r"v2: no serving delta here"),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_damaged_or_partial_delta_is_refused_and_the_old_version_serves_on(
        two_versions, fault):
    _, v1, v2, before, _ = two_versions
    predictor = reckeras.serving.load(v1)
    served = predictor.version
    inject, message = FAULTS[fault]
    inject(v2)
    with pytest.raises(reckeras.serving.DeltaError, match=message):
        predictor.apply_delta(v2)
    assert predictor.version == served
    np.testing.assert_allclose(predictor.predict(QUERY), before, atol=1e-5, rtol=0)


def test_an_out_of_order_delta_or_a_full_artifact_is_refused(two_versions, tmp_path):
    model, v1, v2, before, after = two_versions
    train(model, range(30, 70), np.arange(40) % 10, seed=2)
    v3 = tmp_path / "v3"
    model.export_serving(v3, base=v2)
    predictor = reckeras.serving.load(v1)
    with pytest.raises(reckeras.serving.DeltaError,
                       match=r"v3/manifest.json: delta 3-\w+ is based on version 2-\w+, "
                             r"but version 1-\w+ is served"):
        predictor.apply_delta(v3)
    with pytest.raises(reckeras.serving.DeltaError, match="a 'full' export, expected"):
        predictor.apply_delta(v1)
    np.testing.assert_allclose(predictor.predict(QUERY), before, atol=1e-5, rtol=0)
    predictor.apply_delta(v2)
    with pytest.raises(reckeras.serving.DeltaError, match="is based on version 1-"):
        predictor.apply_delta(v2)                  # applied twice
    np.testing.assert_allclose(predictor.predict(QUERY), after, atol=1e-5, rtol=0)
    predictor.apply_delta(v3)
    np.testing.assert_allclose(predictor.predict(QUERY), model.predict(QUERY, verbose=0),
                               atol=1e-5, rtol=0)


def test_a_delta_is_written_atomically(two_versions, tmp_path, monkeypatch):
    model, _, v2, _, _ = two_versions
    train(model, range(30, 70), np.arange(40) % 10, seed=2)
    v3 = tmp_path / "v3"

    def dies(*args, **kwargs):
        raise OSError("disk full")
    monkeypatch.setattr(artifact, "write_manifest", dies)
    with pytest.raises(OSError, match="disk full"):
        model.export_serving(v3, base=v2)
    assert not v3.exists()                # only the staging directory was written
    assert not (tmp_path / "v3.tmp" / artifact.MANIFEST).exists()


def test_requests_are_answered_wholly_by_one_version_while_deltas_apply(tmp_path):
    model = build()
    train(model, range(40), np.arange(40) % 10, seed=0)
    paths = [tmp_path / "v0"]
    model.export_serving(paths[0])
    expected = [model.predict(QUERY, verbose=0)]
    for day in range(1, 6):
        train(model, range(10 * day, 10 * day + 40), (np.arange(40) + day) % 10, seed=day)
        paths.append(tmp_path / f"v{day}")
        model.export_serving(paths[-1], base=paths[-2])
        expected.append(model.predict(QUERY, verbose=0))
    versions = [manifest(path)["version"] for path in paths]
    # The request: the examples whose output tells every two neighbouring
    # versions apart (by more than twice the tolerance a response is
    # matched with), so that a mixed response cannot match either.
    apart = np.all([np.abs(old - new)[:, 0] > 2e-5
                    for old, new in zip(expected, expected[1:])], axis=0)
    assert apart.sum() >= 30
    request = QUERY.filter(pa.array(apart))
    expected = [outputs[apart] for outputs in expected]
    predictor = reckeras.serving.load(paths[0])
    answers, stop = [], threading.Event()

    def client():
        while not stop.is_set():
            answers.append(predictor.predict_with_version(request))
    clients = [threading.Thread(target=client) for _ in range(4)]
    for thread in clients:
        thread.start()
    for path in paths[1:]:
        predictor.apply_delta(path)
    stop.set()
    for thread in clients:
        thread.join()
    assert len(answers) >= 8
    seen = set()
    for outputs, version in answers:
        index = versions.index(version)
        seen.add(index)
        np.testing.assert_allclose(outputs, expected[index], atol=1e-5, rtol=0)
    assert 0 in seen and len(seen) >= 2


def table_rows(predictor):
    return sum(store.num_rows for _, engine, _ in predictor.served.layers
               for store in engine.tables)


def table_bytes(predictor):
    return sum(table["bytes"] for _, engine, _ in predictor.served.layers
               for table in engine.stats()["tables"])


@pytest.mark.slow
def test_hundreds_of_deltas_keep_memory_bounded(tmp_path):
    model = build()
    train(model, range(40), np.arange(40) % 10, seed=0)
    model.export_serving(tmp_path / "d0")
    predictor = reckeras.serving.load(tmp_path / "d0")
    old, held = [], []
    for day in range(1, 201):
        # Each window trains 4 ids, 2 of them new; ids idle for a window age out.
        train(model, [day, day + 1, 1000 + day, 2000 + day], [day % 10] * 4, seed=day)
        model.export_serving(tmp_path / f"d{day}", base=tmp_path / f"d{day - 1}")
        old.append(weakref.ref(predictor.served))
        predictor.apply_delta(tmp_path / f"d{day}")
        shutil.rmtree(tmp_path / f"d{day - 1}")
        held.append((table_rows(predictor), table_bytes(predictor)))
    gc.collect()
    assert all(version() is None for version in old)        # no old version held
    full = reckeras.serving.load(model.export_serving(tmp_path / "full"))
    np.testing.assert_array_equal(predictor.predict(QUERY), full.predict(QUERY))
    # The tables hold the live rows and at most COMPACT_AT dead ones beside
    # them (removed ids' zeroed rows), and their bytes stop growing.
    live = table_rows(full)
    assert live <= table_rows(predictor) <= live / (1 - COMPACT_AT)
    assert max(b for _, b in held[100:]) <= max(b for _, b in held[:100])


def test_a_version_1_artifact_still_serves_and_takes_no_delta(two_versions, tmp_path):
    # An artifact written before deltas existed: its manifest lacks the kind,
    # version, base, the rows' time and the dense weights' names.
    model, v1, v2, before, _ = two_versions
    old = tmp_path / "old"
    shutil.copytree(v1, old)
    written = manifest(old)
    for field in ("kind", "version", "base", "rows_written_at", "dense_weights", "bytes"):
        written.pop(field, None)
    written["format_version"] = 1
    (old / artifact.MANIFEST).write_text(json.dumps(written))
    predictor = reckeras.serving.load(old)
    np.testing.assert_array_equal(predictor.predict(QUERY),
                                  reckeras.serving.load(v1).predict(QUERY))
    assert artifact.version_number(predictor.version) == 1
    assert predictor.served.rows_written_at is None
    assert health(predictor)["rows_age_s"] is None
    with pytest.raises(reckeras.serving.DeltaError, match="format version 1.*names no dense"):
        predictor.apply_delta(v2)
    np.testing.assert_array_equal(predictor.predict(QUERY),
                                  reckeras.serving.load(v1).predict(QUERY))
