import numpy as np
import pytest

import reckeras  # noqa: F401  (selects the torch backend before keras)
import keras

from reckeras.layers import CrossNet


def _random(*shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def loop_cross(layer, x0):
    """x_{l+1} = x_0 * (W_l x_l + b_l) + x_l with W_l = U_l V_l for low rank."""
    x = x0
    for index, factors in enumerate(layer.kernels):
        w = factors[0].numpy()
        for factor in factors[1:]:
            w = w @ factor.numpy()
        bias = layer.biases[index].numpy() if layer.use_bias else 0.0
        x = x0 * (x @ w + bias) + x
    return x


@pytest.mark.parametrize("low_rank", [None, 2])
@pytest.mark.parametrize("use_bias", [True, False])
def test_matches_the_formula(low_rank, use_bias):
    keras.utils.set_random_seed(0)
    layer = CrossNet(3, low_rank=low_rank, use_bias=use_bias,
                     bias_initializer="random_normal")
    x0 = _random(5, 6)
    out = keras.ops.convert_to_numpy(layer(x0))
    np.testing.assert_allclose(out, loop_cross(layer, x0), rtol=1e-5, atol=1e-5)
    expected_weights = 3 * ((2 if low_rank else 1) + use_bias)
    assert len(layer.trainable_weights) == expected_weights
    if low_rank:
        assert tuple(layer.kernels[0][0].shape) == (6, 2)
        assert tuple(layer.kernels[0][1].shape) == (2, 6)


def test_layers_start_from_different_matrices():
    layer = CrossNet(2)
    layer.build((None, 4))
    assert not np.array_equal(layer.kernels[0][0].numpy(), layer.kernels[1][0].numpy())


def test_one_layer_holds_degree_two_crosses():
    layer = CrossNet(1, bias_initializer="zeros", kernel_initializer="ones")
    x = np.array([[1.0, 2.0]], dtype="float32")
    # x0 * (W x0) + x0 with W all ones: x_i * (x_1 + x_2) + x_i
    np.testing.assert_allclose(keras.ops.convert_to_numpy(layer(x)), [[4.0, 8.0]])


@pytest.mark.parametrize("kwargs, message", [
    ({"num_layers": 0}, "num_layers must be a positive int"),
    ({"num_layers": True}, "num_layers must be a positive int"),
    ({"low_rank": 0}, "low_rank must be a positive int or None"),
    ({"low_rank": 2.5}, "low_rank must be a positive int or None"),
    ({"use_bias": "yes"}, "use_bias must be True or False"),
])
def test_argument_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CrossNet(**kwargs)


def test_shape_error_and_output_shape():
    with pytest.raises(ValueError, match=r"shape \[B, D\]"):
        CrossNet()(keras.Input((3, 4)))
    assert CrossNet().compute_output_shape((None, 7)) == (None, 7)


def test_config_round_trip_and_save_load(tmp_path):
    layer = CrossNet(2, low_rank=3, use_bias=False, name="cross")
    again = CrossNet.from_config(layer.get_config())
    assert again.get_config() == layer.get_config()
    x_in = keras.Input((6,))
    model = keras.Model(x_in, CrossNet(2, low_rank=3)(x_in))
    model.save(tmp_path / "c.keras")
    loaded = keras.models.load_model(tmp_path / "c.keras")
    x = _random(4, 6)
    np.testing.assert_array_equal(loaded.predict(x, verbose=0),
                                  model.predict(x, verbose=0))
