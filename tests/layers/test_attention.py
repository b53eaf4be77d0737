import numpy as np
import pytest
import torch

import reckeras  # noqa: F401  (selects the torch backend before keras)
import keras

from reckeras.layers import TargetAttention


def batch(lengths=(0, 1, 5, 3), max_len=5, dim=4, seed=0):
    rng = np.random.default_rng(seed)
    query = torch.tensor(rng.normal(size=(len(lengths), dim)), dtype=torch.float32)
    keys = torch.tensor(rng.normal(size=(len(lengths), max_len, dim)),
                        dtype=torch.float32)
    mask = torch.arange(max_len)[None] < torch.tensor(lengths)[:, None]
    return query, keys, mask


def loop_attention(layer, query, keys, mask):
    """Row by row: DIN's scores of the valid keys, then their weighted sum."""
    rows = []
    for q, k, m in zip(query, keys, mask):
        k = k[m]
        if not len(k):
            rows.append(torch.zeros_like(q))
            continue
        q = q.expand_as(k)
        scores = layer._scorer(torch.cat([q, k, q - k, q * k], dim=1))[:, 0]
        if layer.softmax:
            scores = torch.softmax(scores, 0)
        rows.append((scores[:, None] * k).sum(0))
    return torch.stack(rows)


@pytest.mark.parametrize("softmax", [False, True])
def test_matches_a_loop(softmax):
    keras.utils.set_random_seed(0)
    layer = TargetAttention([8, 4], softmax=softmax)
    query, keys, mask = batch()
    out = layer([query, keys], mask=mask)
    torch.testing.assert_close(out, loop_attention(layer, query, keys, mask))
    assert torch.equal(out[0], torch.zeros_like(out[0]))          # length 0


@pytest.mark.parametrize("softmax", [False, True])
def test_no_nan_and_padding_is_never_read(softmax):
    keras.utils.set_random_seed(0)
    layer = TargetAttention([8], activation="sigmoid", softmax=softmax)
    query, keys, mask = batch()
    keys.requires_grad_()
    out = layer([query, keys], mask=mask)
    out.square().sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(keys.grad).all()
    assert torch.equal(keys.grad[~mask], torch.zeros_like(keys.grad[~mask]))
    noisy = torch.where(mask[..., None], keys, torch.full_like(keys, 1e6)).detach()
    torch.testing.assert_close(layer([query, noisy], mask=mask), out)
    empty = layer([query, keys], mask=torch.zeros_like(mask))
    assert torch.equal(empty, torch.zeros_like(empty))


def test_softmax_weights_sum_to_one():
    keras.utils.set_random_seed(0)
    layer = TargetAttention([8], softmax=True)
    query, keys, mask = batch(lengths=(2,), dim=3)
    same = keys.clone()
    same[0, :2] = keys[0, 0]                  # equal keys: the output is that key
    torch.testing.assert_close(layer([query, same], mask=mask)[0], keys[0, 0])


def test_no_mask_means_every_position():
    keras.utils.set_random_seed(0)
    layer = TargetAttention([8])
    query, keys, mask = batch()
    torch.testing.assert_close(layer([query, keys]),
                               layer([query, keys], mask=torch.ones_like(mask)))


@pytest.mark.parametrize("kwargs, message", [
    ({"units": 8}, "units must be a list of positive ints"),
    ({"units": [8, 0]}, "units must be a list of positive ints"),
    ({"softmax": "no"}, "softmax must be True or False"),
    ({"activation": "nope"}, "unknown activation='nope'"),
])
def test_argument_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TargetAttention(**kwargs)


def test_shape_errors():
    layer = TargetAttention()
    with pytest.raises(ValueError, match="one known dimension D"):
        layer([keras.Input((4,)), keras.Input((5, 3))])
    with pytest.raises(ValueError, match=r"query of shape \[B, D\]"):
        layer([keras.Input((5, 4)), keras.Input((5, 4))])
    with pytest.raises(ValueError, match="list of two tensors"):
        layer(keras.Input((5, 4)))


def test_config_round_trip_and_save_load(tmp_path):
    layer = TargetAttention([16, 8], activation="sigmoid", softmax=True, name="din")
    again = TargetAttention.from_config(layer.get_config())
    assert again.get_config() == layer.get_config()
    keras.utils.set_random_seed(0)
    query_in, keys_in = keras.Input((4,)), keras.Input((5, 4))
    mask_in = keras.Input((5,), dtype="bool")
    out = TargetAttention([8])([query_in, keys_in], mask=mask_in)
    assert tuple(out.shape) == (None, 4)
    model = keras.Model([query_in, keys_in, mask_in], out)
    query, keys, mask = batch()
    model.save(tmp_path / "a.keras")
    loaded = keras.models.load_model(tmp_path / "a.keras")
    np.testing.assert_array_equal(loaded.predict([query, keys, mask], verbose=0),
                                  model.predict([query, keys, mask], verbose=0))
