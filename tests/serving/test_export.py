"""The serving artifact: export, parity with model.predict for the zoo,
row precisions, no Keras at serving, damaged files, threads."""

import json
import os
import subprocess
import sys
import threading

import keras
import numpy as np
import pyarrow as pa
import pytest

import reckeras as rk
import reckeras.serving
from safetensors.numpy import load_file
from reckeras.serving import artifact

F = rk.features
ROWS = 600


def logs(seed, rows=ROWS):
    """A batch of every kind of column the zoo reads, with nulls."""
    rng = np.random.default_rng(seed)
    history = [rng.integers(-5, 40, rng.integers(0, 9)).tolist() for _ in range(rows)]
    item = rng.integers(-5, 40, rows)
    click = (rng.random(rows) < 1 / (1 + np.exp(-(np.sin(item) + 0.1 * np.array(
        [len(h) for h in history]) - 0.5)))).astype(np.float32)
    return pa.table({
        "price": rng.lognormal(0, 1, rows).astype(np.float32),
        "user": pa.array(rng.integers(-2**63, 2**63 - 1, 40)[rng.integers(0, 40, rows)],
                         mask=rng.random(rows) < 0.1),
        "site": rng.choice(np.array(["a", "b", "c"]), rows),
        "item": item, "hist_items": pa.array(history, pa.list_(pa.int64())),
        "tags": pa.array(history, pa.list_(pa.int64())),
        "tag_weights": pa.array([rng.uniform(0, 2, len(h)).tolist() for h in history],
                                pa.list_(pa.float32())),
        "click": click, "conversion": click * (rng.random(rows) < 0.3)})


def columns(combiner, weighted=False):
    specs = [F.Numeric("price", transform="log1p"), F.Categorical("user", dim=8),
             F.Categorical("site", dim=8, dtype="string"),
             F.Categorical("item", dim=8, table="item"),
             F.Sequence("hist_items", dim=8, max_len=6, table="item", combiner=combiner)]
    if weighted:
        specs.append(F.Sequence("tags", dim=8, max_len=5, combiner="sqrtn",
                                weights="tag_weights"))
    return rk.layers.FeatureColumns(specs)


ZOO = {
    "dlrm": lambda: rk.models.dlrm(columns("sum", weighted=True), bottom_units=(16, 8),
                                   top_units=(16, 1)),
    "dcn_v2": lambda: rk.models.dcn_v2(columns("sum"), cross_layers=1, deep_units=(16,)),
    "deepfm": lambda: rk.models.deepfm(columns("mean"), deep_units=(16,)),
    "din": lambda: rk.models.din(columns(None), top_units=(16, 1)),
    "bst": lambda: rk.models.bst(columns(None), num_blocks=1, num_heads=2, dropout=0.0,
                                 top_units=(16, 1)),
    "esmm": lambda: rk.models.esmm(columns("mean"), tower_units=(16,)),
    "mmoe": lambda: rk.models.mmoe(columns("mean"), tasks=("ctr", "ctcvr"), num_experts=2,
                                   expert_units=(16,), tower_units=(8,)),
    # Towers with normalization and dropout: the program holds the moving
    # statistics and no dropout, as model.predict runs them.
    "deepfm_batch_norm": lambda: rk.models.deepfm(columns("mean"), deep_units=(16, 8),
                                                  dropout=0.2, norm="batch"),
    "dcn_v2_layer_norm": lambda: rk.models.dcn_v2(columns("sum"), cross_layers=1,
                                                  deep_units=(16, 8), dropout=0.1,
                                                  norm="layer"),
}
LABELS = {"esmm": {"ctr": "click", "ctcvr": "conversion"},
          "mmoe": {"ctr": "click", "ctcvr": "conversion"}}


def trained(name):
    keras.utils.set_random_seed(0)
    model = ZOO[name]()
    labels = LABELS.get(name, "click")
    losses = {task: "binary_crossentropy" for task in labels} if name in LABELS \
        else "binary_crossentropy"
    model.compile(optimizer="adam", loss=losses,
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.1))
    model.fit(logs(0), labels=labels, batch_size=100, verbose=0)
    return model


def assert_same_outputs(actual, expected, atol=1e-5):
    if isinstance(expected, dict):
        assert sorted(actual) == sorted(expected)
        for name in expected:
            np.testing.assert_allclose(actual[name], expected[name], atol=atol, rtol=0)
    else:
        np.testing.assert_allclose(actual, expected, atol=atol, rtol=0)


@pytest.mark.parametrize("name", sorted(ZOO))
@pytest.mark.slow
def test_predictor_equals_model_predict_for_the_zoo(name, tmp_path):
    model = trained(name)
    model.export_serving(tmp_path / name)
    predictor = reckeras.serving.load(tmp_path / name)
    test = logs(1)
    # Ids never seen in training (another seed's users) read zeros in both.
    assert_same_outputs(predictor.predict(test), model.predict(test, verbose=0))
    one = test.slice(7, 1)
    assert_same_outputs(predictor.predict(one), model.predict(one, verbose=0))


@pytest.fixture(scope="module")
def dlrm():
    return trained("dlrm")


@pytest.mark.parametrize("rows, atol", [("float16", 2e-3), ("int8", 2e-2)])
@pytest.mark.slow
def test_lower_precision_rows_are_smaller_and_close(dlrm, tmp_path, rows, atol):
    full = dlrm.export_serving(tmp_path / "float32")
    small = dlrm.export_serving(tmp_path / rows, rows=rows)

    def stored(root):
        return load_file(os.path.join(root, artifact.table_file(0, 0, 0)))

    # Rows of 2 bytes (float16) or 1 (int8) a value instead of 4; keys alike.
    shrink = {"float16": 2, "int8": 4}[rows]
    assert stored(small)["rows"].nbytes * shrink == stored(full)["rows"].nbytes
    np.testing.assert_array_equal(stored(small)["keys"], stored(full)["keys"])
    test = logs(1)
    expected = dlrm.predict(test, verbose=0)
    assert_same_outputs(reckeras.serving.load(small).predict(test), expected, atol=atol)


def test_int8_rows_round_trip_within_half_a_step():
    rng = np.random.default_rng(0)
    weights = rng.normal(size=(50, 7)).astype(np.float32) * rng.uniform(0.01, 3, (50, 1))
    weights[3] = 0.25                                   # a constant row
    stored = artifact.encode_rows(weights, "int8")
    assert stored["rows"].dtype == np.int8
    import torch
    decoded = artifact.decode_rows({k: torch.from_numpy(v) for k, v in stored.items()})
    step = stored["scale"][:, None]
    assert np.all(np.abs(decoded.numpy() - weights) <= step / 2 + 1e-6)
    np.testing.assert_allclose(decoded.numpy()[3], 0.25, atol=1e-6)


@pytest.mark.slow
def test_serving_imports_no_keras(dlrm, tmp_path):
    path = dlrm.export_serving(tmp_path / "model")
    code = ("import sys, reckeras.serving as s;"
            f"p = s.load({str(path)!r});"
            "out = p.predict({'price': [1.0], 'user': [None], 'site': ['b'], 'item': [3],"
            " 'hist_items': [[1, 2]], 'tags': [[4]], 'tag_weights': [[0.5]]});"
            "assert out.shape == (1, 1), out.shape;"
            "print(sorted(m for m in sys.modules if m == 'keras' or m.startswith('keras.')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                sys.path)})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_damaged_or_missing_files_are_named(dlrm, tmp_path):
    path = dlrm.export_serving(tmp_path / "model")
    table = os.path.join(path, artifact.table_file(0, 0, 0))
    with open(table, "rb") as file:
        data = bytearray(file.read())
    data[len(data) // 2] ^= 0xFF
    with open(table, "wb") as file:
        file.write(bytes(data))
    with pytest.raises(artifact.ArtifactError, match="L0.T0.r0.safetensors: its CRC-32"):
        reckeras.serving.load(path)
    os.truncate(table, 100)
    with pytest.raises(artifact.ArtifactError, match="L0.T0.r0.safetensors: 100 bytes"):
        reckeras.serving.load(path)
    os.remove(table)
    with pytest.raises(artifact.ArtifactError, match="L0.T0.r0.safetensors: missing"):
        reckeras.serving.load(path)
    with open(os.path.join(path, "manifest.json"), "w") as f:
        json.dump({"format": "other"}, f)
    with pytest.raises(artifact.ArtifactError, match="format 'other'"):
        reckeras.serving.load(path)
    with pytest.raises(artifact.ArtifactError, match="no serving artifact here"):
        reckeras.serving.load(tmp_path / "nothing")


def test_bad_input_names_the_feature(dlrm, tmp_path):
    predictor = reckeras.serving.load(dlrm.export_serving(tmp_path / "model"))
    batch = {k: v for k, v in logs(2, rows=3).to_pydict().items()}
    with pytest.raises(rk.features.FeatureInputError, match="feature 'site': the batch has "
                                                             "no column 'site'"):
        predictor.predict({k: v for k, v in batch.items() if k != "site"})
    with pytest.raises(rk.features.FeatureInputError, match="feature 'item' is declared int64"):
        predictor.predict({**batch, "item": ["x", "y", "z"]})
    with pytest.raises(rk.features.FeatureInputError, match="feature 'tags': weights column"):
        predictor.predict({**batch, "tag_weights": [[1.0] * 9] * 3})


def test_rows_as_a_list_of_dicts_predict_as_their_columns(dlrm, tmp_path):
    """TF Serving's row format in Python: a list of dicts, one per example,
    with None for a missing value; a missing key is an error, not a null."""
    predictor = reckeras.serving.load(dlrm.export_serving(tmp_path / "model"))
    table = logs(3, rows=6)
    rows = table.to_pylist()
    rows[2]["site"] = None
    expected = predictor.predict(pa.Table.from_pylist(rows, schema=table.schema))
    np.testing.assert_array_equal(predictor.predict(rows), expected)
    del rows[4]["item"]
    with pytest.raises(rk.features.FeatureInputError,
                       match="feature 'item': instance 4 has no value for it"):
        predictor.predict(rows)
    with pytest.raises(rk.features.FeatureInputError, match="instance 1 is not an object"):
        predictor.predict([rows[0], [1, 2]])


def test_concurrent_predictions_from_threads(dlrm, tmp_path):
    predictor = reckeras.serving.load(dlrm.export_serving(tmp_path / "model"))
    batches = [logs(10 + i, rows=50) for i in range(8)]
    expected = [predictor.predict(b) for b in batches]
    failures = []

    def work(i):
        for _ in range(5):
            try:
                np.testing.assert_array_equal(predictor.predict(batches[i]), expected[i])
            except Exception as error:       # reported below, with the thread's index
                failures.append((i, error))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures


def test_export_refuses_an_unknown_precision(dlrm, tmp_path):
    with pytest.raises(ValueError, match="rows must be one of"):
        dlrm.export_serving(tmp_path / "m", rows="int4")
