import keras
import torch
import numpy as np
import pytest

import reckeras as rk
from reckeras.features.encode import as_tensors


def test_validation():
    columns = rk.layers.FeatureColumns([rk.features.Categorical("a", dim=4),
                                        rk.features.Categorical("b", dim=8)])
    with pytest.raises(ValueError, match="one dim.*'a': 4.*'b': 8.*concat"):
        rk.layers.ShardedEmbedding(columns)
    with pytest.raises(ValueError, match="output must be one of"):
        rk.layers.ShardedEmbedding(columns, output="sum")
    with pytest.raises(ValueError, match="at least one sparse"):
        rk.layers.ShardedEmbedding(rk.layers.FeatureColumns([rk.features.Numeric("n")]))


def test_concat_output_in_declaration_order():
    columns = rk.layers.FeatureColumns([rk.features.Categorical("a", dim=2),
                                        rk.features.Categorical("b", dim=3),
                                        rk.features.Categorical("c", dim=2)])
    inputs = columns.inputs()
    _, sparse = columns(inputs)
    layer = rk.layers.ShardedEmbedding(columns, output="concat")
    out = layer(sparse)
    assert tuple(out.shape) == (None, 7)
    model = rk.Model(inputs, out)
    model.compile(loss="mse", embedding_optimizer=rk.optimizers.SGD(0.1))
    x = {"a": np.array([1, 2]), "b": np.array([1, 2]), "c": np.array([1, 2])}
    model.fit(x, np.zeros((2, 7)), batch_size=2, verbose=0)   # creates rows
    result = model.predict(x)
    (small, _), (large, _) = layer.engine.lookup(*_packed(columns, x), training=False)
    expected = torch.cat([small[:, 0], large[:, 0], small[:, 1]], dim=1).detach().numpy()
    np.testing.assert_allclose(result, expected)


def _packed(columns, x):
    import torch
    packed = columns.plan.packed_sparse(as_tensors(x))
    return packed["ids"], packed["offsets"]


def test_training_without_dense_weights_and_save_load(tmp_path):
    columns = rk.layers.FeatureColumns([rk.features.Categorical("a", dim=1)])
    inputs = columns.inputs()
    _, sparse = columns(inputs)
    out = keras.layers.Reshape((1,))(rk.layers.ShardedEmbedding(columns, seed=3)(sparse))
    model = rk.Model(inputs, out)
    model.compile(optimizer="sgd", loss="mse", embedding_optimizer=rk.optimizers.SGD(0.5))
    x = {"a": np.array([1, 2, 3, 1])}
    y = np.array([1.0, -1.0, 0.5, 1.0])
    model.fit(x, y, batch_size=4, epochs=30, verbose=0)
    prediction = model.predict(x)[:, 0]
    np.testing.assert_allclose(prediction, y, atol=1e-3)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    np.testing.assert_array_equal(loaded.predict(x), model.predict(x))
    assert loaded.embedding_optimizer.learning_rate == 0.5
    # The loaded model keeps training from the saved tables and state.
    loaded.fit(x, y, batch_size=4, verbose=0)


def test_model_save_keeps_every_array_of_the_table_states(tmp_path):
    """`model.save` writes the same `TableState`s as checkpoints: rows,
    state, counts, and for a table aging out by windows each row's last
    window and the window count."""
    columns = rk.layers.FeatureColumns([rk.features.Categorical("a", dim=2)])
    inputs = columns.inputs()
    layer = rk.layers.ShardedEmbedding(columns, table_options={
        "a": rk.embedding.TableOptions(evict_idle_windows=3)})
    model = rk.Model(inputs, keras.layers.Dense(1)(keras.layers.Flatten()(
        layer(columns(inputs)[1]))))
    model.compile(optimizer="sgd", loss="mse", embedding_optimizer=rk.optimizers.Adagrad(0.1))
    windows = [{"a": np.array(ids), "label": np.ones(len(ids), np.float32)}
               for ids in ([1, 2, 3, 1], [1, 4], [4, 4, 5])]
    model.fit_windows(windows, batch_size=2, verbose=0, labels="label")
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    (saved,), (got,) = model.embedding_layers[0].table_states(), \
        loaded.embedding_layers[0].table_states()
    assert saved.window == got.window == 3
    order, got_order = np.argsort(saved.keys), np.argsort(got.keys)
    assert set(saved.arrays()) == set(got.arrays()) == {
        "keys", "weights", "state", "seen_steps", "last_window"}
    for name, values in saved.arrays().items():
        np.testing.assert_array_equal(getattr(got, name)[got_order], values[order],
                                      err_msg=name)
    # Ids 2 and 3 were last trained in window 0, 5 in window 2 (by hand).
    last = dict(zip(saved.keys[order].tolist(), saved.last_window[order].tolist()))
    assert sorted(last.values()) == [0, 0, 1, 2, 2]


def test_config_round_trip():
    columns = rk.layers.FeatureColumns([rk.features.Categorical("a", dim=4)])
    layer = rk.layers.ShardedEmbedding(columns, init_scale=0.01, seed=5)
    again = rk.layers.ShardedEmbedding.from_config(layer.get_config())
    assert again.specs == layer.specs and again.seed == 5 and again.init_scale == 0.01


def test_dict_output_with_unpooled_sequence_save_load(tmp_path):
    columns = rk.layers.FeatureColumns([
        rk.features.Categorical("item", dim=4),
        rk.features.Sequence("hist", dim=4, max_len=5, combiner=None, table="item")])
    with pytest.raises(ValueError, match="unpooled sequence features \\['hist'\\]"):
        rk.layers.ShardedEmbedding(columns)
    inputs = columns.inputs()
    _, sparse = columns(inputs)
    emb = rk.layers.ShardedEmbedding(columns, output="dict")(sparse)
    assert tuple(emb["hist"].shape) == (None, 5, 4) and tuple(emb["item"].shape) == (None, 4)
    mask = keras.ops.cast(keras.ops.greater_equal(inputs["hist"], 0), "float32")
    history = keras.ops.sum(emb["hist"] * keras.ops.expand_dims(mask, -1), axis=1)
    out = keras.ops.sum(emb["item"] * history, axis=1, keepdims=True)
    model = rk.Model(inputs, out)
    model.compile(optimizer="sgd", loss="mse", embedding_optimizer=rk.optimizers.SGD(0.1))
    x = {"item": np.array([1, 2]), "hist": np.array([[1, 2, -1, -1, -1], [3, -1, -1, -1, -1]])}
    model.fit(x, np.array([1.0, 0.0]), batch_size=2, epochs=3, verbose=0)
    model.save(tmp_path / "d.keras")
    loaded = keras.models.load_model(tmp_path / "d.keras")
    np.testing.assert_array_equal(loaded.predict(x), model.predict(x))


# ---- freezing (trainable=False) ---------------------------------------------------

def frozen_case(seed=0):
    keras.utils.set_random_seed(seed)
    columns = rk.layers.FeatureColumns([rk.features.Numeric("n"),
                                        rk.features.Categorical("a", dim=4)])
    inputs = columns.inputs()
    dense, sparse = columns(inputs)
    embedding = rk.layers.ShardedEmbedding(columns, output="concat")
    hidden = keras.layers.Concatenate()([dense, embedding(sparse)])
    model = rk.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(hidden))
    return model, embedding


def frozen_data(ids, seed=0):
    rng = np.random.default_rng(seed)
    return {"n": rng.normal(size=len(ids)).astype(np.float32), "a": np.asarray(ids)}, \
        (rng.random(len(ids)) < 0.5).astype(np.float32)


def compile_frozen(model):
    model.compile(optimizer="sgd", loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.5))


def tables_of(layer):
    return [{"keys": table.keys.copy(), "weights": table.weights.copy(),
             "state": table.state.copy(), "seen_steps": table.seen_steps.copy()}
            for table in layer.table_states()]


def dense_of(model):
    return [w.numpy().copy() for w in model.trainable_weights]


def test_frozen_table_keeps_rows_and_state_and_creates_none():
    model, embedding = frozen_case()
    compile_frozen(model)
    model.fit(*frozen_data(np.arange(10)), batch_size=5, verbose=0)
    before, head = tables_of(embedding), dense_of(model)
    embedding.trainable = False
    compile_frozen(model)
    x, y = frozen_data(np.r_[np.arange(10), np.arange(100, 110)], seed=1)   # 10 unseen ids
    model.fit(x, y, batch_size=5, epochs=2, verbose=0)
    after = tables_of(embedding)
    assert embedding.engine.num_rows == 10
    for old, new in zip(before, after):
        assert old.keys() == new.keys()
        for key in old:
            np.testing.assert_array_equal(old[key], new[key], err_msg=key)
    assert any(not np.array_equal(a, b) for a, b in zip(head, dense_of(model)))
    # An unseen id reads what evaluate/predict read for it: zeros.
    unseen = {"n": np.zeros(1, np.float32), "a": np.array([12345])}
    outputs = embedding(model.feature_columns.pack(
        as_tensors(model.feature_columns.encode(unseen)))[1],
        training=True)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(outputs), np.zeros((1, 4)))


def test_frozen_table_head_still_trains():
    # The head trains on the frozen rows: the loss after a step differs.
    model, embedding = frozen_case()
    compile_frozen(model)
    model.fit(*frozen_data(np.arange(10)), batch_size=5, verbose=0)
    embedding.trainable = False
    compile_frozen(model)
    x, y = frozen_data(np.arange(10), seed=1)
    logs = model.train_on_batch(x, y, return_dict=True)
    expected = model.test_on_batch(x, y, return_dict=True)
    assert logs["loss"] != expected["loss"]        # the head moved
    assert embedding.engine.num_rows == 10


def test_unfreezing_trains_the_table_again():
    model, embedding = frozen_case()
    embedding.trainable = False
    compile_frozen(model)
    model.fit(*frozen_data(np.arange(10)), batch_size=5, verbose=0)
    assert embedding.engine.num_rows == 0
    embedding.trainable = True
    compile_frozen(model)
    model.fit(*frozen_data(np.arange(10)), batch_size=5, verbose=0)
    assert embedding.engine.num_rows == 10
    before = tables_of(embedding)
    model.fit(*frozen_data(np.arange(10), seed=2), batch_size=5, verbose=0)
    assert not np.array_equal(before[0]["weights"], tables_of(embedding)[0]["weights"])
    assert not np.array_equal(before[0]["state"], tables_of(embedding)[0]["state"])


def test_frozen_model_changes_nothing_and_frozen_columns_change_nothing():
    model, embedding = frozen_case()
    compile_frozen(model)
    model.fit(*frozen_data(np.arange(10)), batch_size=5, verbose=0)
    tables, weights = tables_of(embedding), [w.numpy().copy() for w in model.weights]
    model.trainable = False
    assert embedding.trainable is False
    compile_frozen(model)
    history = model.fit(*frozen_data(np.arange(20), seed=1), batch_size=5, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    for old, new in zip(weights, model.weights):
        np.testing.assert_array_equal(old, new.numpy())
    np.testing.assert_array_equal(tables[0]["weights"], tables_of(embedding)[0]["weights"])
    assert embedding.engine.num_rows == 10
    # FeatureColumns hold no trainable weight: freezing them changes no step.
    model.trainable = True
    model.feature_columns.trainable = False
    compile_frozen(model)
    model.fit(*frozen_data(np.arange(20), seed=1), batch_size=5, verbose=0)
    assert embedding.engine.num_rows == 20


def test_trainable_false_round_trips_through_model_save(tmp_path):
    model, embedding = frozen_case()
    embedding.trainable = False
    compile_frozen(model)
    model.save(tmp_path / "frozen.keras")
    loaded = keras.models.load_model(tmp_path / "frozen.keras")
    assert loaded.embedding_layers[0].trainable is False


def test_inference_lookup_has_no_backward():
    model, embedding = frozen_case()
    compile_frozen(model)
    model.fit(*frozen_data(np.arange(4)), batch_size=4, verbose=0)
    before = tables_of(embedding)
    x, _ = frozen_data(np.arange(4))
    columns = model.feature_columns
    _, sparse = columns.pack(as_tensors(columns.encode(x)))
    out = embedding(sparse, training=False)
    assert not out.requires_grad
    np.testing.assert_array_equal(before[0]["weights"], tables_of(embedding)[0]["weights"])


# ---- embeddings_regularizer --------------------------------------------------------
# (The penalty's values and updates: tests/embedding/test_regularization.py.)

@keras.saving.register_keras_serializable(package="test_sharded_embedding")
class RowNorms(keras.regularizers.Regularizer):
    """A registered regularizer of one's own: the sum of the rows' L2 norms."""

    def __init__(self, scale=0.1):
        self.scale = scale

    def __call__(self, x):
        return self.scale * keras.ops.sum(keras.ops.sqrt(keras.ops.sum(x * x, axis=1)))

    def get_config(self):
        return {"scale": self.scale}


def _regularized_model():
    columns = rk.layers.FeatureColumns([rk.features.Categorical("a", dim=4),
                                        rk.features.Categorical("b", dim=4),
                                        rk.features.Categorical("c", dim=2)])
    inputs = columns.inputs()
    layer = rk.layers.ShardedEmbedding(
        columns, output="concat", embeddings_regularizer=keras.regularizers.L2(0.05),
        regularize="occurrence",
        table_options={"c": {"embeddings_regularizer": RowNorms(0.3)}})
    model = rk.Model(inputs, keras.layers.Dense(1)(layer(columns(inputs)[1])))
    model.compile(optimizer="sgd", loss="mse", embedding_optimizer=rk.optimizers.Adagrad(0.1))
    return model, layer


def test_regularizer_round_trips_through_get_config_and_model_save(tmp_path):
    model, layer = _regularized_model()
    config = layer.get_config()
    assert config["embeddings_regularizer"]["config"] == {"l2": 0.05}
    assert config["regularize"] == "occurrence"
    assert config["table_options"]["c"]["embeddings_regularizer"]["config"] == {"scale": 0.3}
    again = rk.layers.ShardedEmbedding.from_config(config)
    assert isinstance(again.embeddings_regularizer, keras.regularizers.L2)
    assert again.table_options["c"].embeddings_regularizer.get_config() == {"scale": 0.3}
    x = {"a": np.array([1, 2, 1, 3]), "b": np.array([5, 5, 6, 7]),
         "c": np.array([1, 1, 2, 9])}
    y = np.array([0.5, -1.0, 1.0, 0.0], np.float32)
    model.fit(x, y, batch_size=4, epochs=2, verbose=0)
    model.save(tmp_path / "r.keras")
    loaded = keras.models.load_model(tmp_path / "r.keras")
    loaded_layer = loaded.embedding_layers[0]
    assert loaded_layer.regularize == "occurrence"
    assert isinstance(loaded_layer.table_options["c"].embeddings_regularizer, RowNorms)
    # The same loss, penalty included (evaluate counts it, as Keras does).
    expected = model.evaluate(x, y, verbose=0)
    data_loss = np.mean((model.predict(x, verbose=0)[:, 0] - y) ** 2)
    assert expected > data_loss + 1e-3
    np.testing.assert_allclose(loaded.evaluate(x, y, verbose=0), expected, rtol=1e-6)
    loaded.fit(x, y, batch_size=4, verbose=0)


class _Shifted(keras.regularizers.Regularizer):
    def __call__(self, x):
        return keras.ops.sum(keras.ops.square(x - 1.0))


@pytest.mark.parametrize("kwargs, message", [
    ({"embeddings_regularizer": 3}, r"ShardedEmbedding 'emb': embeddings_regularizer must "
                                    r"be a keras.regularizers.Regularizer, its name"),
    ({"embeddings_regularizer": "l3"}, r"ShardedEmbedding 'emb': embeddings_regularizer"),
    ({"embeddings_regularizer": lambda x: keras.ops.sum(x)},
     r"'emb': embeddings_regularizer must be a keras.regularizers.Regularizer \(a subclass"),
    ({"embeddings_regularizer": keras.regularizers.OrthogonalRegularizer()},
     r"'emb': embeddings_regularizer: OrthogonalRegularizer penalizes"),
    ({"table_options": {"a": {"embeddings_regularizer": 3}}},
     r"ShardedEmbedding 'emb' table 'a': embeddings_regularizer must be"),
    ({"regularize": "sometimes"}, r"'emb': regularize must be one of"),
    ({"table_options": {"a": {"embeddings_regularizer": "l2"}}},
     r"tables \['a', 'b'\] are packed into one physical table \(dim 4\), so they need "
     r"one embeddings_regularizer"),
    ({"embeddings_regularizer": "l2",
      "table_options": {"b": {"regularize": "occurrence"}}},
     r"tables \['a', 'b'\] are packed .* 'occurrence'"),
    ({"embeddings_regularizer": _Shifted()},
     r"embeddings_regularizer of tables \['a', 'b'\] \(dim 4\) must give a scalar 0"),
])
def test_bad_regularizers_are_refused_naming_the_layer_and_table(kwargs, message):
    columns = rk.layers.FeatureColumns([rk.features.Categorical("a", dim=4),
                                        rk.features.Categorical("b", dim=4)])
    with pytest.raises(ValueError, match=message):
        rk.layers.ShardedEmbedding(columns, output="concat", name="emb", **kwargs)


def test_table_options_validate_the_regularization_fields():
    with pytest.raises(ValueError, match="TableOptions.embeddings_regularizer must be"):
        rk.embedding.TableOptions(embeddings_regularizer=3)
    with pytest.raises(ValueError, match="TableOptions.regularize must be None or one of"):
        rk.embedding.TableOptions(regularize="always")
    assert rk.embedding.TableOptions().get_config()["embeddings_regularizer"] is None
