"""rk.Model fit/evaluate/predict on in-memory data."""

import keras
import numpy as np
import pyarrow as pa
import pytest

import reckeras as rk
from reckeras.pipeline import steps
from reckeras.pipeline.batches import Targets, to_tensors


def synthetic(n=4000, seed=0):
    rng = np.random.default_rng(seed)
    data = {"n": rng.normal(size=n).astype(np.float32),
            "a": rng.integers(0, 20, n), "b": rng.integers(0, 20, n)}
    logit = 2.0 * np.sin(data["a"]) * np.cos(data["b"]) + data["n"]
    data["label"] = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    return pa.table(data)


def build(seed=0):
    keras.utils.set_random_seed(seed)
    columns = rk.layers.FeatureColumns([rk.features.Numeric("n"),
                                        rk.features.Categorical("a", dim=8),
                                        rk.features.Categorical("b", dim=8)])
    model = rk.models.dlrm(columns, bottom_units=(16, 8), top_units=(32, 1),
                           dropout=0.0, embedding_l2=0.0)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.1),
                  metrics=[rk.metrics.AUC()])
    return model


def snapshot(model):
    dense = [w.numpy().copy() for w in model.weights]
    tables = [t.export() for layer in model.embedding_layers for t in layer.tables]
    return dense, tables


def assert_same(a, b):
    for x, y in zip(a[0], b[0]):
        np.testing.assert_array_equal(x, y)
    for x, y in zip(a[1], b[1]):
        for key in x:
            np.testing.assert_array_equal(x[key], y[key])


@pytest.mark.slow
def test_fit_learns_interactions_and_history():
    train, test = synthetic(), synthetic(2000, seed=1)
    model = build()
    history = model.fit(train, batch_size=256, epochs=4, verbose=0, validation_data=test)
    assert set(history.history) == {"loss", "auc", "val_loss", "val_auc"}
    assert len(history.history["loss"]) == 4
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert history.history["val_auc"][-1] > 0.75
    # evaluate's figures agree with predict's outputs.
    logs = model.evaluate(test, batch_size=500, verbose=0, return_dict=True)
    p = model.predict(test, batch_size=500)[:, 0].astype(np.float64)
    y = test.column("label").to_numpy()
    eps = 1e-7
    bce = -np.mean(y * np.log(np.clip(p, eps, 1)) + (1 - y) * np.log(np.clip(1 - p, eps, 1)))
    np.testing.assert_allclose(logs["loss"], bce, rtol=1e-4)
    pos, neg = p[y == 1], p[y == 0]
    auc = ((pos[:, None] > neg[None, :]).mean() + 0.5 * (pos[:, None] == neg[None, :]).mean())
    np.testing.assert_allclose(logs["auc"], auc, rtol=1e-6)


def test_early_stopping_and_stop_training():
    model = build()
    stopper = keras.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=10.0)
    history = model.fit(synthetic(1000), batch_size=250, epochs=5, verbose=0,
                        callbacks=[stopper])
    assert len(history.history["loss"]) == 2


def test_failed_step_changes_no_weights():
    data = synthetic(512)
    bad = data.set_column(0, "n", pa.array(np.r_[np.zeros(256), np.full(256, np.inf)],
                                           pa.float32()))
    model = build()
    model.fit(data.slice(0, 256), batch_size=256, verbose=0)

    class Snapshot(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            self.after_first = snapshot(model)

    callback = Snapshot()
    with pytest.raises(rk.features.FeatureInputError, match="feature 'n': column holds"):
        model.fit(bad, batch_size=256, verbose=0, shuffle=False, callbacks=[callback])
    assert_same(callback.after_first, snapshot(model))


@pytest.mark.parametrize("column, values, message", [
    ("n", pa.array(["x"] * 8), "feature 'n': expected a numeric"),
    ("b", pa.array(["x"] * 8), "feature 'b' is declared int64"),
    ("label", pa.array([np.nan] * 8), "label column 'label' has NaN"),
    ("label", pa.array([0.0, 1.0, -1.0, 1.0] * 2), r"label column 'label' has values outside \[0, 1\]"),
])
def test_bad_batches_rejected_before_any_change(column, values, message):
    model = build()
    model.fit(synthetic(64), batch_size=64, verbose=0)
    before = snapshot(model)
    bad = synthetic(8).drop([column]).append_column(column, values)
    with pytest.raises(rk.features.FeatureInputError, match=message):
        model.fit(bad, batch_size=8, verbose=0)
    assert_same(before, snapshot(model))


def test_missing_column_names_feature():
    model = build()
    with pytest.raises(rk.features.FeatureInputError, match="feature 'b'"):
        model.fit(synthetic(8).drop(["b"]), batch_size=8, verbose=0)


def test_compile_requires_embedding_optimizer():
    columns = rk.layers.FeatureColumns([rk.features.Numeric("n"),
                                        rk.features.Categorical("a", dim=4)])
    model = rk.models.dlrm(columns, bottom_units=(4,), top_units=(1,))
    with pytest.raises(ValueError, match="embedding_optimizer"):
        model.compile(optimizer="adam", loss="binary_crossentropy")


def test_standardize_is_adapted_by_fit():
    columns = rk.layers.FeatureColumns([rk.features.Numeric("n", transform="standardize"),
                                        rk.features.Categorical("a", dim=4)])
    model = rk.models.dlrm(columns, bottom_units=(4,), top_units=(1,))
    model.compile(optimizer="adam", loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.Adagrad(0.05))
    data = synthetic(1000)
    model.fit(data, batch_size=100, verbose=0)
    values = data.column("n").to_numpy()
    np.testing.assert_allclose(columns.mean.numpy()[0], values.mean(), rtol=1e-4)
    np.testing.assert_allclose(columns.std.numpy()[0], values.std(), rtol=1e-4)


def test_embedding_stats():
    model = build()
    model.fit(synthetic(512), batch_size=128, verbose=0)
    stats = model.embedding_stats()
    (layer_stats,) = stats.values()
    (rank0,) = layer_stats["per_rank"]
    table = model.embedding_layers[0].tables[0]
    assert rank0["tables"] == [{"dim": 8, "rows": table.num_rows,
                                "bytes": table.memory_bytes(),
                                "bytes_by_part": table.memory_by_part()}]
    # dim 8 float32 rows, one row-wise Adagrad value, one int64 key, and the
    # hash index's int64 key and row per slot, at the table's capacity.
    parts, capacity = table.memory_by_part(), table.weights.shape[0]
    assert (parts["rows"], parts["optimizer_state"], parts["keys"]) == (
        capacity * 32, capacity * 4, capacity * 8)
    assert parts["index"] == table.key_index.slot_keys.numel() * 16
    assert table.num_rows == 40          # 20 ids of "a" + 20 of "b"
    assert rank0["requests"] > 0 and layer_stats["rows_imbalance"] == 1.0


def test_pipelined_fit_equals_sequential_fit():
    data = synthetic(2048)
    results = []
    for pipeline in (True, False):
        model = build()
        model.fit(data, batch_size=256, epochs=2, verbose=0, pipeline=pipeline,
                  prefetch_depth=3)
        results.append(snapshot(model))
        stats = model.pipeline_stats
        assert stats["step"]["items"] == 16 and stats["examples"] == 2 * 2048
        assert stats["read"]["items"] == stats["encode"]["items"] == 16
        assert stats["examples_per_s"] > 0
    assert_same(*results)


def test_sample_weights_scale_the_loss():
    data = synthetic(512)
    weights = np.where(np.arange(512) % 2 == 0, 2.0, 0.0).astype(np.float32)
    data = data.append_column("w", pa.array(weights))
    model = build()
    model.fit(data, batch_size=512, verbose=0, sample_weight="w")
    p = model.predict(data, batch_size=512)[:, 0].astype(np.float64)
    y = data.column("label").to_numpy()
    eps = 1e-7
    per_example = -(y * np.log(np.clip(p, eps, 1)) + (1 - y) * np.log(np.clip(1 - p, eps, 1)))
    logs = model.evaluate(data, batch_size=512, verbose=0, return_dict=True)
    np.testing.assert_allclose(logs["loss"], per_example.mean(), rtol=1e-4)
    # Keras's reduction: sum(w * loss) / batch size.
    weighted = model.evaluate(data, batch_size=512, verbose=0, return_dict=True,
                              sample_weight="w")
    np.testing.assert_allclose(weighted["loss"], (weights * per_example).mean(), rtol=1e-4)
    with pytest.raises(rk.features.FeatureInputError, match="sample weight column 'zz'"):
        model.fit(data, batch_size=512, verbose=0, sample_weight="zz")


def test_tensor_inputs_fast_path_matches_keras_path():
    # Names out of sorted order and a 2-D sequence input: the fast path for
    # dicts of declared tensors (what fit feeds) must hand every input where
    # Keras's own path (taken by numpy inputs) does.
    keras.utils.set_random_seed(3)
    specs = [rk.features.Numeric("z_num"), rk.features.Numeric("a_num"),
             rk.features.Categorical("y_cat", dim=4),
             rk.features.Sequence("b_seq", max_len=3, dim=4, combiner="mean"),
             rk.features.Categorical("c_cat", dim=4)]
    columns = rk.layers.FeatureColumns(specs)
    inputs = columns.inputs()
    dense, sparse = columns(inputs)
    embedded = rk.layers.ShardedEmbedding(columns, output="concat")(sparse)
    joined = keras.layers.Concatenate()([dense, embedded])
    model = rk.Model(inputs, keras.layers.Dense(1)(joined))
    rng = np.random.default_rng(0)
    batch = pa.table({"z_num": rng.normal(size=6).astype(np.float32),
                      "a_num": rng.normal(size=6).astype(np.float32),
                      "y_cat": rng.integers(0, 9, 6), "c_cat": rng.integers(0, 9, 6),
                      "b_seq": [[1, 2], [3], [], [4, 5, 6, 7], [8], [2, 2]]})
    tensors, _, _ = to_tensors(columns, batch, Targets())
    assert model.inputs_as_declared(tensors) is not None
    arrays = {name: tensor.numpy() for name, tensor in tensors.items()}
    assert model.inputs_as_declared(arrays) is None
    expected = model(arrays).detach().numpy()
    np.testing.assert_array_equal(model(tensors).detach().numpy(), expected)
    # The loops' forward (no Keras __call__ for the model and its columns).
    np.testing.assert_array_equal(
        steps.forward(model, tensors, training=False).detach().numpy(), expected)
    # Swapping two inputs changes the output: each one reaches its own feature.
    swapped = {**tensors, "z_num": tensors["a_num"], "a_num": tensors["z_num"]}
    assert not np.allclose(model(swapped).detach().numpy(), expected)
    # A wrong width or dtype is not fast-pathed: Keras's check names the input.
    too_wide = {**tensors, "b_seq": tensors["b_seq"].repeat(1, 2)}
    assert model.inputs_as_declared(too_wide) is None
    # (Keras 3.10 names the input by position, later releases by name.)
    with pytest.raises(ValueError, match="b_seq|expected shape=\\(None, 3\\)"):
        model(too_wide)
    assert model.inputs_as_declared({**tensors, "y_cat": tensors["y_cat"].int()}) is None


def test_auto_pipeline_uses_threads_only_with_a_spare_core(monkeypatch):
    from reckeras.pipeline import stream
    monkeypatch.setattr(stream.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(stream.torch, "get_num_threads", lambda: 2)
    assert stream.pipeline_threads("auto") is False
    monkeypatch.setattr(stream.torch, "get_num_threads", lambda: 1)
    assert stream.pipeline_threads("auto") is True
    # Two torchrun ranks of one thread each already use both cores.
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert stream.pipeline_threads("auto") is False
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert stream.pipeline_threads(False) is False
    model = build()
    model.fit(synthetic(600), batch_size=200, verbose=0)
    assert model.pipeline_stats["threads"] is True
    with pytest.raises(ValueError, match="pipeline must be"):
        model.fit(synthetic(600), batch_size=200, verbose=0, pipeline="yes")


def test_loop_forward_keeps_layer_losses_and_training_flag():
    # The loops run the graph without the model's Layer.__call__: losses
    # added by layers must still be cleared per call, not pile up, and
    # ``training`` must still reach layers that read it (dropout).
    keras.utils.set_random_seed(5)
    columns = rk.layers.FeatureColumns([rk.features.Numeric("n"),
                                        rk.features.Categorical("a", dim=4)])
    inputs = columns.inputs()
    dense, sparse = columns(inputs)
    embedded = rk.layers.ShardedEmbedding(columns, output="concat")(sparse)
    joined = keras.layers.Concatenate()([dense, embedded])
    hidden = keras.layers.Dense(8, activity_regularizer="l2")(joined)
    output = keras.layers.Dense(1)(keras.layers.Dropout(0.5)(hidden))
    model = rk.Model(inputs, output)
    data = synthetic(16)
    tensors, _, _ = to_tensors(columns, data.drop(["b", "label"]), Targets())
    assert model.inputs_as_declared(tensors) is not None
    # The loops run Dense's matmuls in oneDNN, the Keras call in torch: turn
    # the routing off for the two paths to be compared exactly.
    rk.config.set(onednn_dense=False)
    keras_path = model(tensors, training=False)
    keras_losses = [float(loss.detach()) for loss in model.losses]
    for _ in range(3):
        loop_path = steps.forward(model, tensors, training=False)
        assert [float(loss.detach()) for loss in model.losses] == keras_losses
    np.testing.assert_array_equal(loop_path.detach().numpy(),
                                  keras_path.detach().numpy())
    dropped = steps.forward(model, tensors, training=True)      # dropout active
    assert not np.array_equal(dropped.detach().numpy(), keras_path.detach().numpy())
    assert len(model.losses) == 1
