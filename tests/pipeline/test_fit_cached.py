"""rk.Model training with host_cached tables: same result as all-on-device."""

import keras
import numpy as np
import pyarrow as pa
import pytest
from safetensors.numpy import load_file

import reckeras as rk


def synthetic(n=2048, seed=0):
    rng = np.random.default_rng(seed)
    data = {"n": rng.normal(size=n).astype(np.float32),
            "a": np.minimum(rng.zipf(1.2, n), 300), "b": rng.integers(0, 150, n)}
    logit = np.sin(data["a"]) + np.cos(data["b"]) + data["n"]
    data["label"] = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    return pa.table(data)


def cached(rows, policy="lfu"):
    return rk.embedding.TableOptions(storage="host_cached", cache_rows=rows,
                                     cache_policy=policy)


def build(table_options=None):
    keras.utils.set_random_seed(0)
    columns = rk.layers.FeatureColumns([rk.features.Numeric("n"),
                                        rk.features.Categorical("a", dim=8),
                                        rk.features.Categorical("b", dim=8)])
    model = rk.models.dlrm(columns, bottom_units=(16, 8), top_units=(16, 1),
                           table_options=table_options, dropout=0.0, embedding_l2=0.0)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.1))
    return model


def snapshot(model):
    return [w.numpy().copy() for w in model.weights], \
        [t.export() for layer in model.embedding_layers for t in layer.tables]


def assert_same(a, b):
    for x, y in zip(a[0], b[0]):
        np.testing.assert_array_equal(x, y)
    for x, y in zip(a[1], b[1]):
        for key in x:
            np.testing.assert_array_equal(x[key], y[key], err_msg=key)


# At batch 128 one step needs at most 256 rows; both tables hold ~450 rows.
SMALL = {"a": cached(150), "b": cached(120)}


@pytest.fixture(scope="module")
def uncached():
    model = build()
    model.fit(synthetic(), batch_size=128, epochs=2, verbose=0)
    return snapshot(model)


@pytest.mark.parametrize("policy", ["lfu", "lru"])
@pytest.mark.parametrize("pipeline", [True, False])
@pytest.mark.slow
def test_cached_fit_equals_uncached_fit(uncached, policy, pipeline):
    model = build({name: cached(o.cache_rows, policy) for name, o in SMALL.items()})

    class Budget(keras.callbacks.Callback):
        """Measures the device tier after every step."""
        peak_bytes = peak_rows = 0

        def on_train_batch_end(self, batch, logs=None):
            cache = model.embedding_layers[0].engine.caches[0]
            Budget.peak_bytes = max(Budget.peak_bytes, cache.memory_bytes())
            Budget.peak_rows = max(Budget.peak_rows, int((cache.slot_row >= 0).sum()))

    model.fit(synthetic(), batch_size=128, epochs=2, verbose=0, pipeline=pipeline,
              callbacks=[Budget()])
    assert_same(snapshot(model), uncached)
    stats = model.pipeline_stats["embedding_cache"]
    (cache,) = stats[model.embedding_layers[0].name]
    # RowWiseAdagrad: one state float per row: (8 + 1) * 4 bytes a row.
    assert cache["cache_rows"] == 270 and cache["budget_bytes"] == 270 * 36
    assert Budget.peak_rows == 270 and Budget.peak_bytes == 270 * 36
    assert cache["rows_out"] > 0 and 0.3 < cache["hit_rate"] < 1
    assert cache["prefetches"] == 32 and cache["rows_in_prefetched"] > 0
    assert model.pipeline_stats["cache_prefetch"]["items"] == 32


def test_checkpoint_with_cache_equals_checkpoint_without(tmp_path):
    files = []
    for name, options in (("plain", None), ("cached", SMALL)):
        model = build(options)
        model.fit(synthetic(), batch_size=128, verbose=0)
        model.save_checkpoint(tmp_path / name)
        files.append(load_file(tmp_path / name / "tables-00000-of-00001.safetensors"))
    assert files[0].keys() == files[1].keys()
    for key in files[0]:
        np.testing.assert_array_equal(files[0][key], files[1][key], err_msg=key)
    # Loading into a cached model empties its cache and training goes on.
    model = build(SMALL)
    model.load_checkpoint(tmp_path / "plain")
    assert not (model.embedding_layers[0].engine.caches[0].slot_row >= 0).any()
    model.fit(synthetic(256, seed=1), batch_size=128, verbose=0)


def test_failed_step_leaves_tables_and_cache_results_unchanged(uncached):
    data = synthetic(512)
    bad = data.set_column(0, "n", pa.array(np.r_[np.ones(384), np.full(128, np.inf)],
                                           pa.float32()))
    results = []
    for options in (None, SMALL):
        model = build(options)
        with pytest.raises(rk.features.FeatureInputError, match="feature 'n': column holds"):
            model.fit(bad, batch_size=128, verbose=0, shuffle=False)
        results.append(snapshot(model))
    assert_same(*results)


def test_save_and_load_keep_the_storage_options(tmp_path):
    model = build(SMALL)
    model.fit(synthetic(512), batch_size=128, verbose=0)
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    layer = loaded.embedding_layers[0]
    assert layer.table_options == SMALL and layer.engine.caches[0].capacity == 270
    probe = synthetic(256, seed=2)
    np.testing.assert_array_equal(loaded.predict(probe, batch_size=128),
                                  model.predict(probe, batch_size=128))
