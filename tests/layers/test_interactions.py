import numpy as np
import pytest

import reckeras  # noqa: F401  (selects the torch backend before keras)
import keras

from reckeras.layers.interactions import DotInteraction


def _random(*shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def loop_interaction(x, emb, self_interaction, skip_connection):
    """Reference: the documented pair order, one dot product at a time."""
    vectors = emb if x is None else np.concatenate([x[:, None], emb], axis=1)
    n = vectors.shape[1]
    pairs = [np.sum(vectors[:, i] * vectors[:, j], axis=1)
             for i in range(n)
             for j in range(i + 1 if self_interaction else i)]
    pairs = np.stack(pairs, axis=1)
    return np.concatenate([x, pairs], axis=1) if skip_connection else pairs


@pytest.mark.parametrize("self_interaction", [False, True])
@pytest.mark.parametrize("skip_connection", [False, True])
def test_matches_loop_with_x(self_interaction, skip_connection):
    x, emb = _random(4, 5), _random(4, 3, 5, seed=1)
    layer = DotInteraction(self_interaction=self_interaction,
                           skip_connection=skip_connection)
    out = keras.ops.convert_to_numpy(layer([x, emb]))
    np.testing.assert_allclose(
        out, loop_interaction(x, emb, self_interaction, skip_connection),
        rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("self_interaction", [False, True])
def test_matches_loop_on_embeddings_alone(self_interaction):
    emb = _random(3, 6, 7)
    layer = DotInteraction(self_interaction=self_interaction,
                           skip_connection=False)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(layer(emb)),
        loop_interaction(None, emb, self_interaction, False),
        rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("features, dim", [(1, 3), (26, 16), (5, 1)])
@pytest.mark.parametrize("self_interaction", [False, True])
@pytest.mark.parametrize("skip_connection", [False, True])
def test_output_shape_formula(features, dim, self_interaction,
                              skip_connection):
    n = features + 1
    expected = (dim * skip_connection + n * (n - 1) // 2
                + n * self_interaction)
    layer = DotInteraction(self_interaction=self_interaction,
                           skip_connection=skip_connection)
    shapes = [(None, dim), (None, features, dim)]
    assert layer.compute_output_shape(shapes) == (None, expected)
    out = layer([_random(2, dim), _random(2, features, dim)])
    assert tuple(out.shape) == (2, expected)


def test_dim_mismatch_names_both_dimensions():
    layer = DotInteraction()
    with pytest.raises(ValueError, match=r"last dimension 8.*D = 16"):
        layer([_random(2, 8), _random(2, 3, 16)])


@pytest.mark.parametrize("inputs, message", [
    (lambda: _random(2, 3, 4), "skip_connection=False"),
    (lambda: [_random(2, 4), _random(2, 3, 4), _random(2, 4)], "3 tensors"),
    (lambda: [_random(2, 4), _random(2, 4)], r"\[B, F, D\]"),
    (lambda: [_random(2, 3, 4), _random(2, 3, 4)], r"\[B, D\]"),
])
def test_bad_inputs_raise(inputs, message):
    with pytest.raises(ValueError, match=message):
        DotInteraction()(inputs())


def test_config_round_trip():
    layer = DotInteraction(self_interaction=True, skip_connection=False,
                           name="dot")
    clone = DotInteraction.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()


def test_functional_model_save_load(tmp_path):
    dense = keras.Input((4,))
    emb = keras.Input((3, 4))
    x = keras.layers.Dense(4)(dense)
    z = DotInteraction(self_interaction=True)([x, emb])
    model = keras.Model([dense, emb], keras.layers.Dense(1)(z))
    assert z.shape == (None, 4 + 10)
    inputs = [_random(6, 4), _random(6, 3, 4, seed=1)]
    expected = model.predict(inputs, verbose=0)

    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    np.testing.assert_allclose(loaded.predict(inputs, verbose=0), expected,
                               rtol=1e-6)
