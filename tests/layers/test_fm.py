import numpy as np
import pytest

import reckeras  # noqa: F401  (selects the torch backend before keras)
import keras

from reckeras.layers import FM


def _random(*shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def pairwise(v):
    """sum over i < j of v_i * v_j, per dimension: O(F^2 K)."""
    fields = v.shape[1]
    return sum((v[:, i] * v[:, j] for i in range(fields) for j in range(i + 1, fields)),
               np.zeros_like(v[:, 0]))


@pytest.mark.parametrize("fields, dim", [(1, 3), (2, 1), (7, 5)])
def test_matches_the_pairs(fields, dim):
    v = _random(4, fields, dim)
    terms = keras.ops.convert_to_numpy(FM(reduce_sum=False)(v))
    np.testing.assert_allclose(terms, pairwise(v), rtol=1e-4, atol=1e-5)
    total = keras.ops.convert_to_numpy(FM()(v))
    np.testing.assert_allclose(total, pairwise(v).sum(1, keepdims=True),
                               rtol=1e-4, atol=1e-5)


def test_output_shapes_and_errors():
    assert FM().compute_output_shape((None, 5, 3)) == (None, 1)
    assert FM(reduce_sum=False).compute_output_shape((None, 5, 3)) == (None, 3)
    with pytest.raises(ValueError, match=r"shape \[B, F, K\]"):
        FM()(keras.Input((4,)))
    with pytest.raises(ValueError, match="reduce_sum must be True or False"):
        FM(reduce_sum=1)


def test_config_round_trip_and_save_load(tmp_path):
    layer = FM(reduce_sum=False, name="fm")
    assert FM.from_config(layer.get_config()).get_config() == layer.get_config()
    v_in = keras.Input((3, 4))
    model = keras.Model(v_in, FM()(v_in))
    model.save(tmp_path / "f.keras")
    loaded = keras.models.load_model(tmp_path / "f.keras")
    v = _random(2, 3, 4)
    np.testing.assert_array_equal(loaded.predict(v, verbose=0),
                                  model.predict(v, verbose=0))
