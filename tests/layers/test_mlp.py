import numpy as np
import pytest

import reckeras  # noqa: F401  (selects the torch backend before keras)
import keras

from reckeras.layers.mlp import MLP


def _numpy(tensor):
    return keras.ops.convert_to_numpy(tensor)


def _inputs(batch=5, dim=6, seed=0):
    return np.random.default_rng(seed).normal(size=(batch, dim)).astype(
        "float32")


def test_output_shape():
    layer = MLP([8, 4, 3])
    assert layer(_inputs()).shape == (5, 3)
    assert layer.compute_output_shape((None, 6)) == (None, 3)
    assert MLP([2])(np.zeros((2, 7, 6), "float32")).shape == (2, 7, 2)


def test_equals_numpy_forward():
    x = _inputs()
    layer = MLP([8, 4, 1], activation="tanh", output_activation="sigmoid")
    out = _numpy(layer(x))
    weights = [_numpy(w) for w in layer.weights]
    assert len(weights) == 6
    h = np.tanh(x @ weights[0] + weights[1])
    h = np.tanh(h @ weights[2] + weights[3])
    expected = 1 / (1 + np.exp(-(h @ weights[4] + weights[5])))
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_hidden_layers_get_distinct_kernels():
    layer = MLP([6, 6, 6],
                kernel_initializer=keras.initializers.GlorotUniform())
    layer.build((None, 6))
    kernels = [_numpy(w) for w in layer.weights if len(w.shape) == 2]
    assert len(kernels) == 3
    assert not np.allclose(kernels[0], kernels[1])


# 3 Dense layers (kernel, bias) plus, on each of the 2 hidden layers,
# gamma, beta and for batch norm the moving mean and variance.
@pytest.mark.parametrize("norm, weight_count", [("batch", 6 + 2 * 4),
                                                ("layer", 6 + 2 * 2)])
def test_norm_variants_build_and_run(norm, weight_count):
    layer = MLP([8, 4, 2], norm=norm)
    x = _inputs()
    assert layer(x, training=True).shape == (5, 2)
    assert len(layer.weights) == weight_count
    assert np.all(np.isfinite(_numpy(layer(x, training=False))))


def test_dropout_only_in_training():
    x = _inputs(batch=64, dim=16)
    layer = MLP([256, 4], dropout=0.5)
    reference = MLP([256, 4])
    reference.build(x.shape)
    layer.build(x.shape)
    reference.set_weights(layer.get_weights())
    inference = _numpy(layer(x, training=False))
    np.testing.assert_allclose(inference, _numpy(reference(x)), rtol=1e-5)
    np.testing.assert_allclose(inference, _numpy(layer(x)), rtol=1e-5)
    assert not np.allclose(_numpy(layer(x, training=True)), inference)


@pytest.mark.parametrize("kwargs, message", [
    (dict(units=[]), "units"),
    (dict(units=4), "units"),
    (dict(units=[4, 0]), "units"),
    (dict(units=[4, 2.5]), "units"),
    (dict(units=[True]), "units"),
    (dict(units=[4], dropout=1.0), "dropout"),
    (dict(units=[4], dropout=-0.1), "dropout"),
    (dict(units=[4], norm="group"), "norm"),
    (dict(units=[4], activation="nope"), "activation='nope'"),
    (dict(units=[4], output_activation="nope"), "output_activation"),
])
def test_invalid_arguments_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MLP(**kwargs)


def test_config_round_trip():
    layer = MLP([8, 1], activation="gelu", output_activation="sigmoid",
                dropout=0.25, norm="layer", use_bias=False,
                kernel_initializer="he_normal", name="tower")
    clone = MLP.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()
    x = _inputs()
    layer.build(x.shape)
    clone.build(x.shape)
    clone.set_weights(layer.get_weights())
    np.testing.assert_allclose(_numpy(clone(x)), _numpy(layer(x)), rtol=1e-6)


def test_functional_model_save_load(tmp_path):
    inputs = keras.Input((6,))
    outputs = MLP([8, 4, 1], norm="batch", dropout=0.1,
                  output_activation="sigmoid")(inputs)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="adam", loss="binary_crossentropy")
    x = _inputs(batch=32)
    model.fit(x, (x[:, 0] > 0).astype("float32"), epochs=1, verbose=0)
    expected = model.predict(x, verbose=0)

    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    np.testing.assert_allclose(loaded.predict(x, verbose=0), expected,
                               rtol=1e-6)


@pytest.mark.parametrize("kwargs", [
    {"activation": "relu", "output_activation": "sigmoid"},
    {"activation": "tanh", "use_bias": False},
    {"activation": "gelu", "output_activation": None, "dropout": 0.3},
])
def test_fused_call_equals_the_layer_stack(kwargs):
    # Float32 tensors take the fused path (addmm per layer); the stack of
    # Keras layers must give the same outputs and the same weight gradients.
    import torch
    layer = MLP([16, 8, 3], **kwargs)
    x = torch.from_numpy(_inputs(batch=32, dim=6, seed=1))
    layer(x)
    assert layer._can_fuse(x, training=False)
    fused = layer(x)
    stacked = x
    for sublayer in layer._stack:
        stacked = sublayer(stacked, training=False)
    np.testing.assert_allclose(_numpy(fused), _numpy(stacked), rtol=1e-5, atol=1e-6)
    grads = []
    for out in (fused, stacked):
        weights = [w.value for w in layer.trainable_weights]
        grads.append(torch.autograd.grad(out.square().sum(), weights))
    for a, b in zip(*grads):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-6)
    if kwargs.get("dropout"):          # dropout in training needs the stack
        assert not layer._can_fuse(x, training=True)


def test_batch_norm_uses_moving_statistics_in_inference():
    layer = MLP([6, 3], norm="batch")
    x = _inputs(batch=16)
    layer.build(x.shape)
    dense, norm, _, out = layer._stack
    rng = np.random.default_rng(1)
    norm.set_weights([rng.normal(size=6), rng.normal(size=6),
                      rng.normal(size=6), rng.uniform(0.5, 2.0, size=6)])
    gamma, beta, mean, variance = norm.get_weights()
    hidden = x @ _numpy(dense.kernel) + _numpy(dense.bias)
    normalized = gamma * (hidden - mean) / np.sqrt(variance + norm.epsilon) + beta
    expected = np.maximum(normalized, 0) @ _numpy(out.kernel) + _numpy(out.bias)
    np.testing.assert_allclose(_numpy(layer(x, training=False)), expected,
                               rtol=1e-5, atol=1e-5)
    # Training normalizes with the batch's own statistics instead.
    batch_normalized = gamma * (hidden - hidden.mean(0)) / np.sqrt(
        hidden.var(0) + norm.epsilon) + beta
    trained = np.maximum(batch_normalized, 0) @ _numpy(out.kernel) + _numpy(out.bias)
    np.testing.assert_allclose(_numpy(layer(x, training=True)), trained,
                               rtol=1e-4, atol=1e-4)


def test_rk_model_fit_updates_the_moving_statistics():
    import pyarrow as pa

    import reckeras as rk

    rng = np.random.default_rng(0)
    table = pa.table({"price": rng.lognormal(0, 1, 256).astype("float32"),
                      "user": rng.integers(0, 20, 256),
                      "click": (rng.random(256) < 0.3).astype("float32")})
    columns = rk.layers.FeatureColumns([rk.features.Numeric("price", transform="log1p"),
                                        rk.features.Categorical("user", dim=4)])
    inputs = columns.inputs()
    dense, sparse = columns(inputs)
    features = keras.ops.concatenate(
        [dense, rk.layers.ShardedEmbedding(columns, output="concat")(sparse)], axis=1)
    tower = MLP([8, 1], norm="batch", dropout=0.5, output_activation="sigmoid")
    model = rk.Model(inputs, tower(features))
    # (Near) zero learning rates: the one step, on one batch of every row,
    # changes the moving statistics only, so the features after it are the
    # ones the step normalized.
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.SGD(1e-12))
    model.fit(table, labels="click", batch_size=256, epochs=1, verbose=0)
    seen = rk.Model(inputs, features).predict(table, verbose=0)
    dense_layer, norm = tower._stack[0], tower._stack[1]
    hidden = seen @ _numpy(dense_layer.kernel) + _numpy(dense_layer.bias)
    momentum = norm.momentum
    np.testing.assert_allclose(_numpy(norm.moving_mean), (1 - momentum) * hidden.mean(0),
                               rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(_numpy(norm.moving_variance),
                               momentum + (1 - momentum) * hidden.var(0),
                               rtol=1e-4, atol=1e-6)
    # Inference is deterministic: no dropout, the moving statistics.
    first = model.predict(table, verbose=0)
    np.testing.assert_array_equal(model.predict(table, verbose=0), first)
