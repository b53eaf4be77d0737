"""Tables whose rows are float16 or bfloat16 (`TableOptions(dtype=...)`):
storage and memory, training against float32 rows, export and load,
checkpoints (full, delta, across dtypes), the host cache and serving."""

import json
import os

import keras
import ml_dtypes
import numpy as np
import pyarrow as pa
import pytest
import torch
from safetensors import safe_open

import reckeras as rk
import reckeras.serving
from reckeras.embedding.engine import EmbeddingEngine
from reckeras.embedding.packing import PackingPlan
from reckeras.embedding.physical_table import PhysicalTable
from reckeras.features.plan import TransformPlan

HALVES = ["float16", "bfloat16"]
TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
SPECS = [rk.features.Categorical("a", dim=4), rk.features.Categorical("b", dim=4),
         rk.features.Sequence("h", dim=4, max_len=4, combiner="mean")]


def test_dtype_is_validated_and_defaults_to_float32():
    assert rk.embedding.TableOptions().dtype == "float32"
    assert rk.embedding.TableOptions(dtype="bfloat16").get_config()["dtype"] == "bfloat16"
    with pytest.raises(ValueError, match="TableOptions.dtype must be one of"):
        rk.embedding.TableOptions(dtype="float64")


def test_tables_of_one_dim_must_agree_on_the_dtype():
    plan = TransformPlan(SPECS)
    options = {"a": rk.embedding.TableOptions(dtype="float16")}
    with pytest.raises(ValueError, match=r"need one row dtype.*'a': 'float16'"):
        EmbeddingEngine(PackingPlan(plan.slots, plan.sparse_in_declaration_order, options))


@pytest.mark.parametrize("dtype", HALVES)
def test_rows_take_half_the_memory_and_state_stays_float32(dtype):
    keys = torch.arange(5000) * 7919
    tables = {}
    for name in ("float32", dtype):
        table = PhysicalTable(16, seed=3, dtype=TORCH[name])
        table.configure_state(1, 0.0)
        table.find_or_insert(keys)
        tables[name] = table
    full, half = (tables[n].memory_by_part() for n in ("float32", dtype))
    assert half["rows"] * 2 == full["rows"]
    assert half["optimizer_state"] == full["optimizer_state"] > 0
    assert tables[dtype].weights.dtype == TORCH[dtype]
    assert tables[dtype].state.dtype == torch.float32
    # A new row is its float32 initial value rounded to the nearest.
    np.testing.assert_array_equal(
        tables[dtype].weights[:5000].float().numpy(),
        tables["float32"].weights[:5000].to(TORCH[dtype]).float().numpy())


@pytest.mark.parametrize("dtype", HALVES)
def test_export_keeps_the_dtype_and_load_converts(dtype):
    half = PhysicalTable(8, seed=1, dtype=TORCH[dtype])
    half.configure_state(1, 0.5)
    half.find_or_insert(torch.arange(100))
    exported = half.export()
    expected = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[dtype]
    assert exported["weights"].dtype == expected and exported["state"].dtype == np.float32
    # Into a float32 table: exact; back into a half table: the same bits.
    full = PhysicalTable(8, dtype=torch.float32)
    full.configure_state(1, 0.0)
    full.load(exported)
    np.testing.assert_array_equal(full.export()["weights"],
                                  exported["weights"].astype(np.float32))
    again = PhysicalTable(8, dtype=TORCH[dtype])
    again.configure_state(1, 0.0)
    again.load(full.export())
    np.testing.assert_array_equal(again.export()["weights"].view(np.uint16),
                                  exported["weights"].view(np.uint16))
    # float32 rows into a half table round to the nearest.
    values = np.random.default_rng(0).normal(size=(100, 8)).astype(np.float32)
    again.load({"keys": exported["keys"], "weights": values, "state": exported["state"]})
    np.testing.assert_array_equal(again.weights[:100].float().numpy(),
                                  torch.from_numpy(values).to(TORCH[dtype]).float().numpy())


# ---- training --------------------------------------------------------------------------

def engine_for(dtype, storage="device"):
    plan = TransformPlan(SPECS)
    options = {name: rk.embedding.TableOptions(
        dtype=dtype, **({"storage": "host_cached", "cache_rows": 40}
                        if storage == "host_cached" else {})) for name in ("a", "b", "h")}
    engine = EmbeddingEngine(PackingPlan(plan.slots, plan.sparse_in_declaration_order,
                                         options), seed=5)
    engine.set_optimizer(rk.optimizers.RowWiseAdagrad(0.05))
    return plan, engine


def batches(count, batch=32, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        yield {"a": torch.tensor(np.minimum(rng.zipf(1.3, batch), 200)),
               "b": torch.tensor(rng.integers(0, 50, batch)),
               "h": torch.tensor(rng.integers(0, 30, (batch, 4)))}


def train(plan, engine, steps=30):
    outputs = []
    for raw in batches(steps):
        packed = plan.packed_sparse(raw)
        (pooled, _), = engine.lookup(packed["ids"], packed["offsets"], training=True)
        flat = pooled.reshape(-1)
        outputs.append(flat.detach())
        (flat * torch.linspace(-1, 1, flat.numel())).sum().backward()
    return outputs


@pytest.mark.parametrize("dtype", HALVES)
def test_training_on_half_rows_stays_close_to_float32(dtype):
    full = engine_for("float32")
    half = engine_for(dtype)
    expected, outputs = train(*full), train(*half)
    assert half[1].tables[0].weights.dtype == TORCH[dtype]
    for mine, theirs in zip(outputs, expected):
        scale = float(theirs.abs().max())
        assert float((mine - theirs).abs().max()) < 0.05 * scale
    full_rows, half_rows = full[1].table_states()[0], half[1].table_states()[0]
    np.testing.assert_array_equal(full_rows.keys, half_rows.keys)
    error = half_rows.weights.astype(np.float32) - full_rows.weights
    assert np.abs(error).mean() < 0.02 * np.abs(full_rows.weights).mean()
    np.testing.assert_allclose(half_rows.state, full_rows.state, rtol=0.05)


@pytest.mark.parametrize("dtype", HALVES)
def test_cached_half_table_trains_bit_for_bit_as_on_device(dtype):
    device = engine_for(dtype)
    cached = engine_for(dtype, storage="host_cached")
    for mine, theirs in zip(train(*cached), train(*device)):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=0)
    assert cached[1].tables[0].weights.dtype == TORCH[dtype]      # the device tier
    assert cached[1].tables[0].index.weights.dtype == TORCH[dtype]    # the host tier
    mine, theirs = cached[1].table_states()[0], device[1].table_states()[0]
    for name in ("keys", "weights", "state"):
        np.testing.assert_array_equal(getattr(mine, name), getattr(theirs, name), err_msg=name)
    cache = cached[1].stats()["tables"][0]["cache"]
    assert cache["rows_out"] > 0                      # the budget made it evict
    # 3 tables of 40 rows, each of 4 half values and 1 float32 state value.
    assert cache["budget_bytes"] == cache["device_bytes"] == 3 * 40 * (4 * 2 + 1 * 4)


# ---- checkpoints, model.save and serving -----------------------------------------------

def logs(n=600, seed=0):
    rng = np.random.default_rng(seed)
    a, b = rng.integers(0, 120, n), rng.integers(0, 40, n)
    logit = np.sin(a) + np.cos(b)
    return pa.table({"n": rng.normal(size=n).astype(np.float32), "a": a, "b": b,
                     "label": (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)})


def model_with(dtype):
    keras.utils.set_random_seed(0)
    columns = rk.layers.FeatureColumns([
        rk.features.Numeric("n"), rk.features.Categorical("a", dim=8),
        rk.features.Categorical("b", dim=8)])
    options = {name: rk.embedding.TableOptions(dtype=dtype) for name in ("a", "b")}
    model = rk.models.dcn_v2(columns, cross_layers=1, deep_units=(16,),
                             table_options=options, dropout=0.0, embedding_l2=0.0)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.Adagrad(0.1))
    return model


def rows_of(model):
    table = model.embedding_layers[0].engine.table_states()[0]
    order = np.argsort(table.keys)
    return {name: getattr(table, name)[order] for name in ("keys", "weights", "state")}


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.slow
def test_checkpoint_round_trip_full_and_delta(dtype, tmp_path):
    model = model_with(dtype)
    model.fit(logs(), batch_size=100, epochs=1, verbose=0)
    model.save_checkpoint(tmp_path / "full")
    model.fit(logs(seed=1), batch_size=100, epochs=1, verbose=0)
    model.save_checkpoint(tmp_path / "delta", base=tmp_path / "full")
    saved = rows_of(model)
    index = json.loads((tmp_path / "delta" / "index.json").read_text())
    assert [t["dtype"] for t in index["layers"][0]] == [dtype]
    name = {"float16": "F16", "bfloat16": "BF16"}[dtype]
    with safe_open(os.fspath(tmp_path / "full" / index["table_files"][0]), "pt") as f:
        assert f.get_slice("L0.T0.weights").get_dtype() == name
        assert f.get_slice("L0.T0.state").get_dtype() == "F32"
    # The same dtype: bit for bit.
    same = model_with(dtype)
    same.fit(logs(), batch_size=100, epochs=1, verbose=0)
    same.load_checkpoint(tmp_path / "delta")
    loaded = rows_of(same)
    for part in ("keys", "weights", "state"):
        np.testing.assert_array_equal(loaded[part], saved[part], err_msg=part)
    # Into float32 rows: converted exactly; the float32 model then trains on.
    full = model_with("float32")
    full.fit(logs(), batch_size=100, epochs=1, verbose=0)
    full.load_checkpoint(tmp_path / "delta")
    converted = rows_of(full)
    np.testing.assert_array_equal(converted["weights"], saved["weights"].astype(np.float32))
    np.testing.assert_array_equal(converted["state"], saved["state"])
    np.testing.assert_allclose(full.predict(logs(100, seed=2), verbose=0),
                               model.predict(logs(100, seed=2), verbose=0), atol=1e-6)
    # A half model loads the float32 model's checkpoint (rows rounded to the
    # nearest: they hold half values, so exactly) and saves a delta against it.
    full.save_checkpoint(tmp_path / "from_full")
    back = model_with(dtype)
    back.fit(logs(), batch_size=100, epochs=1, verbose=0)
    back.load_checkpoint(tmp_path / "from_full")
    np.testing.assert_array_equal(rows_of(back)["weights"].view(np.uint16),
                                  saved["weights"].view(np.uint16))
    back.fit(logs(seed=3), batch_size=100, epochs=1, verbose=0)
    back.save_checkpoint(tmp_path / "mixed_delta", base=tmp_path / "from_full")
    final = model_with(dtype)
    final.fit(logs(), batch_size=100, epochs=1, verbose=0)
    final.load_checkpoint(tmp_path / "mixed_delta")
    for part in ("keys", "weights", "state"):
        np.testing.assert_array_equal(rows_of(final)[part], rows_of(back)[part],
                                      err_msg=part)


@pytest.mark.parametrize("dtype", HALVES)
def test_model_save_and_get_weights_keep_half_rows(dtype, tmp_path):
    model = model_with(dtype)
    model.fit(logs(), batch_size=100, epochs=1, verbose=0)
    saved = rows_of(model)
    weights = model.get_weights()
    model.save(tmp_path / "model.keras")
    restored = keras.saving.load_model(tmp_path / "model.keras")
    for part in ("keys", "weights", "state"):
        np.testing.assert_array_equal(rows_of(restored)[part], saved[part], err_msg=part)
    assert rows_of(restored)["weights"].dtype == saved["weights"].dtype
    model.fit(logs(seed=1), batch_size=100, epochs=1, verbose=0)
    model.set_weights(weights)
    np.testing.assert_array_equal(rows_of(model)["weights"], saved["weights"])


@pytest.mark.parametrize("dtype", HALVES)
def test_export_serving_of_a_half_table(dtype, tmp_path):
    model = model_with(dtype)
    model.fit(logs(), batch_size=100, epochs=1, verbose=0)
    test = logs(200, seed=4)
    expected = model.predict(test, verbose=0)
    for rows, atol in (("float32", 1e-5), ("float16", 1e-5 if dtype == "float16" else 2e-3),
                       ("int8", 2e-2)):
        path = model.export_serving(tmp_path / rows, rows=rows)
        np.testing.assert_allclose(reckeras.serving.load(path).predict(test), expected,
                                   atol=atol, rtol=0, err_msg=rows)
