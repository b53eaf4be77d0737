import numpy as np
import pytest
import torch

import reckeras  # noqa: F401  (selects the torch backend before keras)
import keras

from reckeras.backend_kernels.jagged_attention import padded_attention_reference
from reckeras.layers import TransformerBlock

LENGTHS = [0, 1, 7, 3]        # a length-0 row, a length-1 row, a row at max_len


def batch(lengths=LENGTHS, max_len=7, dim=8, seed=0):
    rng = np.random.default_rng(seed)
    x = torch.tensor(rng.normal(size=(len(lengths), max_len, dim)), dtype=torch.float32)
    mask = torch.arange(max_len)[None] < torch.tensor(lengths)[:, None]
    return x, mask


def padded_block(block, x, mask):
    """The block on the padded batch, straight from its definition and weights."""
    batch_size, length, dim = x.shape
    if block.learned_positions:
        x = x + block.positions.value
    heads = block.num_heads

    def attend(h):
        q, k, v = block._qkv(h).view(batch_size, length, 3, heads, -1).unbind(2)
        out = padded_attention_reference(q.transpose(1, 2), k.transpose(1, 2),
                                         v.transpose(1, 2), mask, block.causal)
        return block._attention_output(out.transpose(1, 2).reshape(x.shape))

    def feed_forward(h):
        return block._ff_outer(block._ff_inner(h))

    if block.norm_first:
        h = x + attend(block._attention_norm(x))
        h = h + feed_forward(block._ff_norm(h))
    else:
        h = block._attention_norm(x + attend(x))
        h = block._ff_norm(h + feed_forward(h))
    return h * mask[..., None]


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("learned_positions", [False, True])
def test_matches_the_padded_definition(norm_first, causal, learned_positions):
    keras.utils.set_random_seed(0)
    block = TransformerBlock(2, 16, norm_first=norm_first, causal=causal,
                             learned_positions=learned_positions)
    x, mask = batch()
    out = block(x, mask=mask)
    torch.testing.assert_close(out, padded_block(block, x, mask), atol=1e-5, rtol=1e-5)


def test_rows_of_length_zero_one_and_max_len_without_nan():
    keras.utils.set_random_seed(0)
    block = TransformerBlock(4, 16, learned_positions=True)
    x, mask = batch()
    x.requires_grad_()
    out = block(x, mask=mask, training=True)
    out.square().sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    assert all(torch.isfinite(w.value.grad).all() for w in block.trainable_weights)
    assert torch.equal(out[0], torch.zeros_like(out[0]))          # length 0
    assert torch.equal(out[1, 1:], torch.zeros_like(out[1, 1:]))  # padding of length 1
    assert torch.equal(x.grad[0], torch.zeros_like(x.grad[0]))    # padding is not read
    all_empty = block(x, mask=torch.zeros_like(mask))
    assert torch.equal(all_empty, torch.zeros_like(all_empty))


def test_padding_values_do_not_matter_and_no_mask_means_all_valid():
    keras.utils.set_random_seed(0)
    block = TransformerBlock(2, 8)
    x, mask = batch()
    noisy = torch.where(mask[..., None], x, torch.full_like(x, 1e6))
    torch.testing.assert_close(block(noisy, mask=mask), block(x, mask=mask))
    full = torch.ones_like(mask)
    torch.testing.assert_close(block(x), block(x, mask=full))


def test_a_causal_position_ignores_later_positions():
    keras.utils.set_random_seed(0)
    block = TransformerBlock(2, 8, causal=True)
    x, mask = batch([7, 7])
    changed = x.clone()
    changed[:, 4:] += 1.0
    torch.testing.assert_close(block(changed, mask=mask)[:, :4],
                               block(x, mask=mask)[:, :4])


def test_dropout_only_in_training():
    keras.utils.set_random_seed(0)
    block = TransformerBlock(2, 8, dropout=0.5)
    x, mask = batch()
    torch.testing.assert_close(block(x, mask=mask), block(x, mask=mask))
    assert not torch.allclose(block(x, mask=mask, training=True), block(x, mask=mask))


@pytest.mark.parametrize("kwargs, message", [
    ({"num_heads": 0}, "num_heads must be a positive int"),
    ({"num_heads": 2.0}, "num_heads must be a positive int"),
    ({"ff_dim": -1}, "ff_dim must be a positive int"),
    ({"dropout": 1.0}, "dropout must be a rate"),
    ({"causal": "yes"}, "causal must be True or False"),
    ({"norm_first": 1}, "norm_first must be True or False"),
    ({"learned_positions": None}, "learned_positions must be True or False"),
    ({"activation": "nope"}, "unknown activation='nope'"),
    ({"epsilon": 0}, "epsilon must be > 0"),
])
def test_argument_errors(kwargs, message):
    arguments = {"num_heads": 2, "ff_dim": 8, **kwargs}
    with pytest.raises(ValueError, match=message):
        TransformerBlock(**arguments)


def test_shape_errors():
    with pytest.raises(ValueError, match="must divide the model dimension D=10"):
        TransformerBlock(4, 8)(keras.Input((5, 10)))
    with pytest.raises(ValueError, match=r"shape \[B, L, D\]"):
        TransformerBlock(2, 8)(keras.Input((10,)))
    with pytest.raises(ValueError, match="sequence length L to be known"):
        TransformerBlock(2, 8, learned_positions=True)(keras.Input((None, 10)))


def test_config_round_trip():
    block = TransformerBlock(4, 32, dropout=0.1, causal=True, norm_first=False,
                             learned_positions=True, activation="gelu", epsilon=1e-5,
                             name="t")
    again = TransformerBlock.from_config(block.get_config())
    assert again.get_config() == block.get_config()


def test_functional_model_with_mask_saves_and_loads(tmp_path):
    keras.utils.set_random_seed(0)
    x_in = keras.Input((7, 8))
    mask_in = keras.Input((7,), dtype="bool")
    h = TransformerBlock(2, 16, learned_positions=True)(x_in, mask=mask_in)
    h = TransformerBlock(2, 16, causal=True)(h, mask=mask_in)
    assert tuple(h.shape) == (None, 7, 8)
    model = keras.Model([x_in, mask_in], h)
    x, mask = batch()
    model.save(tmp_path / "t.keras")
    loaded = keras.models.load_model(tmp_path / "t.keras")
    np.testing.assert_array_equal(loaded.predict([x, mask], verbose=0),
                                  model.predict([x, mask], verbose=0))
