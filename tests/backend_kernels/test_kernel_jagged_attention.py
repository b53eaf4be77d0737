import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from kernel_cases import (DEVICE, SETTINGS, assert_close, on_cpu, on_device, requires_triton,
                          triton_route)

from reckeras.backend_kernels import jagged_attention as ja


def jagged_case(lengths, heads=2, head_dim=6, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(lengths, dtype=torch.int64)
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    num_tokens = int(offsets[-1])
    q, k, v = (torch.randn(num_tokens, heads, head_dim, generator=g).to(dtype)
               for _ in range(3))
    return q, k, v, offsets


def naive_attention(q, k, v, offsets, causal):
    """Per sequence and head, in float64, one softmax row at a time."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    scale = 1 / math.sqrt(q.shape[-1])
    for start, stop in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
        for i in range(start, stop):
            keys = slice(start, i + 1 if causal else stop)
            scores = torch.einsum("hd,jhd->hj", q[i].double(), k[keys].double()) * scale
            out[i] = torch.einsum("hj,jhd->hd", torch.softmax(scores, -1),
                                  v[keys].double())
    return out


def with_grads(fn, q, k, v, *args):
    """Output and the gradients of q, k, v for a fixed random upstream gradient."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v, *args)
    if not out.requires_grad:                 # no token: nothing to differentiate
        return out, [torch.zeros_like(t) for t in (q, k, v)]
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)) \
        .to(out.device, out.dtype)
    grads = torch.autograd.grad(out, (q, k, v), upstream, allow_unused=True)
    return out.detach(), [torch.zeros_like(q) if g is None else g for g in grads]


# Length 0, 1 and max_len rows, lengths in every power-of-two class, rows
# spanning several Triton blocks (64 forward, 32 backward).
EDGE_LENGTHS = [[0], [1], [0, 1, 0], [70, 0, 1, 33, 70], [5, 9, 17, 2, 64, 0, 3]]


@pytest.mark.parametrize("lengths", EDGE_LENGTHS)
@pytest.mark.parametrize("causal", [False, True])
def test_reference_matches_a_loop(lengths, causal):
    q, k, v, offsets = jagged_case(lengths)
    out = ja.jagged_attention_reference(q, k, v, offsets, max(lengths), causal)
    torch.testing.assert_close(out.double(), naive_attention(q, k, v, offsets, causal),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("lengths", EDGE_LENGTHS)
@pytest.mark.parametrize("causal", [False, True])
def test_export_route_pads_to_max_len_and_matches_a_loop(lengths, causal, monkeypatch):
    # While torch.export traces, the dispatch pads every sequence to max_len.
    monkeypatch.setattr(torch.compiler, "is_exporting", lambda: True)
    q, k, v, offsets = jagged_case(lengths)
    out = ja.jagged_attention(q, k, v, offsets, max(lengths), causal)
    torch.testing.assert_close(out.double(), naive_attention(q, k, v, offsets, causal),
                               atol=1e-5, rtol=1e-5)


def test_reference_of_no_tokens_and_no_sequences():
    for lengths in ([], [0, 0, 0]):
        q, k, v, offsets = jagged_case(lengths)
        out, grads = with_grads(ja.jagged_attention_reference, q, k, v, offsets, 4)
        assert out.shape == (0, 2, 6) and all(g.shape == (0, 2, 6) for g in grads)


@pytest.mark.parametrize("causal", [False, True])
def test_padded_reference_has_no_nan_for_fully_masked_rows(causal):
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(3, 2, 5, 4, generator=g, requires_grad=True)
               for _ in range(3))
    mask = torch.tensor([[False] * 5, [True] + [False] * 4, [True] * 5])
    out = ja.padded_attention_reference(q, k, v, mask, causal)
    out.square().sum().backward()
    assert torch.isfinite(out).all() and all(torch.isfinite(t.grad).all()
                                             for t in (q, k, v))
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert torch.equal(out[1, :, 1:], torch.zeros_like(out[1, :, 1:]))
    # Length 1: the only key is the token itself.
    torch.testing.assert_close(out[1, :, 0], v[1, :, 0])
    # Keys at masked positions are never read.
    k2, v2 = k.detach().clone(), v.detach().clone()
    k2[1, :, 1:], v2[1, :, 1:] = 1e4, -1e4
    again = ja.padded_attention_reference(q, k2, v2, mask, causal)
    torch.testing.assert_close(again, out.detach())


@pytest.mark.parametrize("lengths", [lengths for lengths in EDGE_LENGTHS
                                     if sum(lengths) < 120])     # the loop is slow
@pytest.mark.parametrize("causal", [False, True])
def test_op_gradients_match_autograd_of_a_loop(lengths, causal):
    # The op's backward (the reference's arithmetic on CPU tensors) against
    # torch's autograd through the float64 loop.
    q, k, v, offsets = (t.double() if t.is_floating_point() else t
                        for t in jagged_case(lengths))
    out, grads = with_grads(ja.jagged_attention, q, k, v, offsets, max(lengths), causal)
    expected, expected_grads = with_grads(naive_attention, q, k, v, offsets, causal)
    torch.testing.assert_close(out, expected)
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad)


def test_layers_call_the_registered_op():
    from reckeras.layers import TransformerBlock

    block = TransformerBlock(2, 12)
    out = block(torch.randn(2, 3, 8), mask=torch.tensor([[True, True, False], [True] * 3]))
    nodes, seen = [out.grad_fn], set()
    while nodes:                        # the autograd graph of the output
        node = nodes.pop()
        if node is not None and node not in seen:
            seen.add(node)
            nodes.extend(next_node for next_node, _ in node.next_functions)
    assert any("reckeras_jagged_attention_forward" in node.name() for node in seen), \
        sorted(node.name() for node in seen)


def test_dispatch_on_cpu_is_the_reference():
    q, k, v, offsets = jagged_case([3, 0, 4])
    assert torch.equal(ja.jagged_attention(q, k, v, offsets, 4),
                       ja.jagged_attention_reference(q, k, v, offsets, 4))


def test_argument_errors():
    q, k, v, offsets = jagged_case([3])
    with pytest.raises(ValueError, match="one shape"):
        ja.jagged_attention(q, k[:, :1], v, offsets, 3)
    with pytest.raises(ValueError, match="offsets"):
        ja.jagged_attention(q, k, v, offsets[None], 3)


def assert_triton_matches(lengths, causal, head_dim=6, heads=2, dtype=torch.float32,
                          seed=0, tolerance=None):
    case = jagged_case(lengths, heads, head_dim, seed, dtype)
    max_len = max(lengths, default=0)
    with triton_route():
        out, grads = with_grads(ja.jagged_attention, *on_device(*case[:3]),
                                on_device(case[3]), max_len, causal)
    expected, expected_grads = with_grads(ja.jagged_attention_reference, *case,
                                          max_len, causal)
    tolerance = tolerance or {}
    assert torch.isfinite(on_cpu(out)).all()
    assert_close(out, expected, **tolerance)
    for grad, expected_grad in zip(grads, expected_grads):
        assert_close(grad, expected_grad, **tolerance)


@requires_triton
@pytest.mark.parametrize("lengths", EDGE_LENGTHS + [[], [0, 0]])
@pytest.mark.parametrize("causal", [False, True])
def test_triton_edge_cases(lengths, causal):
    assert_triton_matches(lengths, causal)


@requires_triton
@SETTINGS
@given(st.lists(st.integers(0, 40), min_size=1, max_size=5), st.booleans(),
       st.sampled_from([1, 5, 16, 24]), st.integers(1, 3), st.integers(0, 2**31))
def test_triton_matches_reference(lengths, causal, head_dim, heads, seed):
    assert_triton_matches(lengths, causal, head_dim, heads, seed=seed)


@requires_triton
@pytest.mark.skipif(DEVICE.type != "cuda", reason="Triton 3.9's interpreter gets "
                    "tl.dot of bfloat16 tiles wrong (tried: garbage values)")
def test_triton_bfloat16():
    assert_triton_matches([7, 0, 20], True, head_dim=16, dtype=torch.bfloat16,
                          tolerance={"atol": 3e-2, "rtol": 3e-2})


@requires_triton
def test_triton_rejects_huge_heads():
    q, k, v, offsets = jagged_case([2], heads=1, head_dim=ja.MAX_HEAD_DIM + 1)
    with pytest.raises(ValueError, match="head dims up to"), triton_route():
        ja.jagged_attention(*on_device(q, k, v, offsets), 2)


@requires_triton
@pytest.mark.parametrize("norm_first,causal", [(True, False), (False, True)])
@pytest.mark.slow
def test_transformer_block_through_the_kernel(monkeypatch, norm_first, causal):
    """The layer gives the same values and gradients on either path."""
    import reckeras  # noqa: F401  (selects the torch backend before keras)
    import keras

    from reckeras.layers import TransformerBlock, transformer

    keras.utils.set_random_seed(1)
    block = TransformerBlock(2, 12, norm_first=norm_first, causal=causal,
                             learned_positions=True)
    rng = np.random.default_rng(0)
    x = on_device(torch.tensor(rng.normal(size=(4, 9, 8)), dtype=torch.float32))
    mask = on_device(torch.arange(9)[None] < torch.tensor([0, 1, 9, 4])[:, None])
    results = []
    for triton in (False, True):
        with monkeypatch.context() as patch, triton_route():
            if not triton:          # the reference, differentiated by autograd
                patch.setattr(transformer, "jagged_attention", ja.jagged_attention_reference)
            out = block(x, mask=mask)
            grads = torch.autograd.grad(out.square().sum(),
                                        [w.value for w in block.trainable_weights])
        results.append((out, grads))
    (expected, expected_grads), (out, grads) = results
    assert_close(out, expected, atol=1e-5, rtol=1e-5)
    for grad, expected_grad in zip(grads, expected_grads):
        assert_close(grad, expected_grad, atol=1e-4, rtol=1e-4)
