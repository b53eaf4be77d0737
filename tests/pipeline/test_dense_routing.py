"""rk.Model runs its own Dense layers' matmuls in oneDNN (a graph's Dense,
the Dense stack of rk.layers.MLP) and never a user's layer's: counted by
the calls of the oneDNN op, compared with plain torch (`onednn_dense` off)."""

import keras
import numpy as np
import pyarrow as pa
import pytest
import torch

import reckeras as rk
from reckeras.backend_kernels import dense_matmul
from reckeras.pipeline import dense_routing, steps
from reckeras.pipeline.batches import Targets, to_tensors

pytestmark = pytest.mark.skipif(not dense_matmul.available(), reason="torch without oneDNN")


class Bilinear(keras.layers.Layer):
    """A user's own layer: `torch.matmul` with its own weight, and a Dense of
    its own. Neither may be routed."""

    def build(self, input_shape):
        self.weight = self.add_weight(shape=(input_shape[-1], 6), name="weight")
        self.inner = keras.layers.Dense(6)
        self.inner.build(input_shape)

    def call(self, x):
        return torch.matmul(x, self.weight.value) + self.inner(x)

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], 6)


def counting_onednn(monkeypatch):
    """The list that gets one entry per call of the oneDNN op."""
    calls = []
    original = dense_matmul.linear
    monkeypatch.setattr(dense_matmul, "linear",
                        lambda *args: calls.append(1) or original(*args))
    return calls


def model_with(middle):
    """A model with the layer `middle` between its inputs and two Dense layers."""
    keras.utils.set_random_seed(3)
    columns = rk.layers.FeatureColumns([rk.features.Numeric("x"),
                                        rk.features.Categorical("c", dim=4)])
    inputs = columns.inputs()
    dense, sparse = columns(inputs)
    embedded = rk.layers.ShardedEmbedding(columns, output="concat")(sparse)
    joined = keras.layers.Concatenate()([dense, embedded])
    hidden = keras.layers.Dense(16, activation="relu")(middle(joined))
    model = rk.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(hidden))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.05))
    return model


def data(n=256):
    rng = np.random.default_rng(0)
    x = {"x": rng.normal(size=n).astype("float32"), "c": rng.integers(0, 30, n)}
    return x, rng.integers(0, 2, n).astype("float32")


def fit_once(onednn, monkeypatch, middle=Bilinear):
    rk.config.set(onednn_dense=onednn)
    calls = counting_onednn(monkeypatch)
    model = model_with(middle())
    x, y = data()
    history = model.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0)
    monkeypatch.undo()
    return model.get_weights(), history.history["loss"], len(calls)


@pytest.mark.slow
def test_only_the_models_dense_layers_run_in_onednn_and_train_as_torch(monkeypatch):
    weights, losses, calls = fit_once(True, monkeypatch)
    torch_weights, torch_losses, torch_calls = fit_once(False, monkeypatch)
    # 8 steps x the model's 2 Dense layers x (forward, input gradient, kernel
    # gradient); none for Bilinear's torch.matmul or its inner Dense.
    assert calls == 8 * 2 * 3 and torch_calls == 0
    np.testing.assert_allclose(losses, torch_losses, rtol=1e-5)
    for ours, theirs in zip(weights, torch_weights):
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)


def test_an_mlp_runs_its_dense_stack_in_onednn_with_the_training_flag(monkeypatch):
    # norm="layer" keeps MLP on its Dense-by-Dense path (not its fused addmm).
    model = model_with(rk.layers.MLP([8, 6], norm="layer", dropout=0.5))
    tensors, _, _ = to_tensors(model.feature_columns, pa.table(data(32)[0]), Targets())
    keras_path = model(tensors, training=False)            # Keras's call: plain torch
    calls = counting_onednn(monkeypatch)
    loop_path = steps.forward(model, tensors, training=False)
    # MLP's 2 Dense layers and the model's 2, forward only.
    assert len(calls) == 4
    np.testing.assert_allclose(loop_path.detach().numpy(), keras_path.detach().numpy(),
                               rtol=1e-5, atol=1e-6)
    dropped = steps.forward(model, tensors, training=True)        # the MLP's dropout acts
    assert not np.allclose(dropped.detach().numpy(), keras_path.detach().numpy())


def test_the_routes_are_decided_once(monkeypatch):
    decided = []
    original = dense_routing.dense_routes
    monkeypatch.setattr(dense_routing, "dense_routes",
                        lambda model: decided.append(1) or original(model))
    model = model_with(Bilinear())
    x, y = data()
    model.fit(x, y, batch_size=64, epochs=2, verbose=0)
    model.evaluate(x, y, batch_size=64, verbose=0)
    assert len(decided) == 1
    routed = dense_routing.dense_routes(model)
    assert {type(layer).__name__ for layer in routed} == {"Dense"} and len(routed) == 2


def test_the_option_off_routes_nothing():
    rk.config.set(onednn_dense=False)
    model = model_with(rk.layers.MLP([8, 6]))
    assert dict(dense_routing.dense_routes(model)) == {}
