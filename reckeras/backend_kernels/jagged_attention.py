"""Multi-head attention over jagged (variable-length) sequences.

A batch of `B` sequences is packed without padding: `q`, `k` and `v`
are `[N, H, Dh]` (`N` tokens in all, `H` heads of `Dh` dims) and
sequence `b` holds tokens `offsets[b]:offsets[b + 1]`. Every token attends
to the tokens of its own sequence only (with `causal`, to those at or before
it), which is the key mask of a padded `[B, L]` batch, fused into the kernel.

* Triton (CUDA tensors): a flash-attention forward (`_forward_kernel`: one
  program per block of `FORWARD_BLOCK` queries of one sequence and head,
  online softmax over blocks of keys, keys past the sequence's length never
  loaded) and a backward in two kernels with no atomics
  (`_backward_kv_kernel`: one program per block of keys accumulates their
  `dK`/`dV` over the queries; `_backward_q_kernel`: one per block of queries
  accumulates `dQ`). Work and memory follow `N`, not `B * max_len`: a batch
  of long-tailed behaviour histories pays nothing for its padding.
* torch reference (CPU tensors): the tokens scattered into padded
  `[B, H, L, Dh]` batches (one per length class, so padding stays below
  half of the work), `scaled_dot_product_attention` with the boolean key
  mask, and gathered back.

Empty sequences have no tokens, so they cost nothing and produce nothing; a
padded reference never sees a fully masked softmax row either (padding
queries attend to every key, and their outputs are dropped), so no NaN can
reach a value or a gradient.
"""

import math
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import torch

from reckeras.backend_kernels.dispatch import constexpr, kernel, next_power_of_2, register
from reckeras.backend_kernels.pooling import sequence_positions

if TYPE_CHECKING:
    # The kernels' `tl`: `dispatch.Kernel.jit` binds it when it jits them, so
    # importing this module imports no triton.
    import triton.language as tl

FORWARD_BLOCK = 64      # queries (and keys per step) of a forward program
BACKWARD_BLOCK = 32     # keys (queries) of a backward program, and per step
MAX_HEAD_DIM = 256


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           offsets: torch.Tensor) -> None:
    if q.dim() != 3 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"jagged attention needs q, k and v of one shape [N, H, Dh]; "
                         f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if offsets.dim() != 1 or offsets.numel() < 1:
        raise ValueError(f"offsets must be a 1-D tensor of B + 1 entries, got shape "
                         f"{tuple(offsets.shape)}")


def _scale(scale: float | None, head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


# ---- torch reference -------------------------------------------------------------------

def padded_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               mask: torch.Tensor, causal: bool = False,
                               scale: float | None = None) -> torch.Tensor:
    """Masked attention over a padded batch, with SDPA.

    Args:
        q: float `[B, H, L, Dh]` queries.
        k: float `[B, H, L, Dh]` keys.
        v: float `[B, H, L, Dh]` values.
        mask: bool `[B, L]`, True at the positions that hold a token; the
            keys of other positions are never attended to.
        causal: whether position `i` attends only to positions `<= i`.
        scale: softmax scale; `1 / sqrt(Dh)` by default.

    Returns:
        `[B, H, L, Dh]`, zeros at the positions where `mask` is False
        (rows of length 0 included).

    Example:

    ```python
    from reckeras.backend_kernels.jagged_attention import padded_attention_reference

    q = k = v = torch.randn(2, 1, 3, 4)
    mask = torch.tensor([[True, True, False], [False, False, False]])
    out = padded_attention_reference(q, k, v, mask)   # zeros where not mask
    ```
    """
    length = q.shape[2]
    allowed = mask[:, None, None, :]
    if causal:
        positions = torch.arange(length, device=q.device)
        allowed = allowed & (positions[None, :] <= positions[:, None])
    # A padding query may have no key to attend to (a length-0 row): it
    # attends to every key instead, and its output is dropped below, so the
    # softmax never sees a fully masked row (NaN in values and gradients).
    allowed = allowed | ~mask[:, None, :, None]
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=allowed, scale=_scale(scale, q.shape[-1]))
    return out * mask[:, None, :, None].to(out.dtype)


class _LengthClass(NamedTuple):
    """The sequences of one length class, padded to its width.

    Args:
        tokens: int64, the class's tokens (rows of the packed batch).
        slot: int64, each one's row in the padded `[members * width]` layout.
        members: the class's sequences.
        width: the class's padded length.
    """

    tokens: torch.Tensor
    slot: torch.Tensor
    members: int
    width: int

    def pad(self, x: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """`[N, H, ...]` packed -> `[members, H, width, ...]`, `fill` at padding."""
        rows = self.members * self.width
        padded = x.new_full((rows, *x.shape[1:]), fill).index_copy(
            0, self.slot, x.index_select(0, self.tokens))
        return padded.view(self.members, self.width, *x.shape[1:]).transpose(1, 2)

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """`[members, H, width, ...]` -> the class's tokens' `[tokens, H, ...]`."""
        x = x.transpose(1, 2)
        return x.reshape(self.members * self.width, *x.shape[2:]).index_select(0, self.slot)

    def mask(self, causal: bool, dtype: torch.dtype) -> torch.Tensor:
        """`[members, 1, width, width]`: 0 where a query attends to a key (the
        key in its sequence, and not after it with `causal`), -inf elsewhere.
        Key 0 is allowed for every query, padding ones included, so no
        softmax row is fully masked."""
        live = torch.zeros(self.members * self.width, dtype=torch.bool,
                           device=self.slot.device).index_fill_(0, self.slot, True)
        allowed = live.view(self.members, 1, 1, self.width)
        if causal:
            positions = torch.arange(self.width, device=live.device)
            allowed = allowed & (positions[None, :] <= positions[:, None])
        return torch.zeros(allowed.shape, dtype=dtype,
                           device=live.device).masked_fill_(~allowed, float("-inf"))


def _length_classes(offsets: torch.Tensor, num_tokens: int,
                    max_len: int) -> list[_LengthClass]:
    """The batch's sequences grouped by length class: lengths in `(c/2, c]`
    for `c` a power of two, capped at `max_len`; empty sequences in none."""
    lengths = offsets[1:] - offsets[:-1]
    sequence, position = sequence_positions(offsets, num_tokens)
    # 2 ** ceil(log2(length)), exactly, for lengths >= 1.
    classes = torch.where(lengths > 1, torch.pow(2, torch.frexp(
        (lengths - 1).double())[1].long()), lengths).clamp(max=max_len)
    token_class = classes.index_select(0, sequence)
    result = []
    for width in torch.unique(classes[lengths > 0]).tolist():
        members = (classes == width).nonzero().squeeze(1)
        rank = torch.full_like(lengths, -1).index_copy_(
            0, members, torch.arange(members.numel(), device=offsets.device))
        tokens = (token_class == width).nonzero().squeeze(1)
        slot = rank.index_select(0, sequence.index_select(0, tokens)) * width \
            + position.index_select(0, tokens)
        result.append(_LengthClass(tokens, slot, members.numel(), width))
    return result


def _lse_dtype(q: torch.Tensor) -> torch.dtype:
    """The log-sum-exp's: float32 for float32 and half types, float64 for float64."""
    return torch.promote_types(q.dtype, torch.float32)


# torch's fused CPU attention, the one SDPA runs on CPU, called directly for
# the log-sum-exp it returns and its backward takes (SDPA hides both): the
# backward then needs no second forward, and no `[L, L]` scores are stored.
_flash_attention = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_flash_attention_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def _forward_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       offsets: torch.Tensor, max_len: int, causal: bool,
                       scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`jagged_attention_forward` on CPU tensors, padded length classes at a
    time: the output and the log-sum-exp of every query's scores (`[N, H]`)."""
    _check(q, k, v, offsets)
    num_tokens, heads = q.shape[:2]
    # Every token belongs to one class, so every row below is written.
    out = q.new_empty(q.shape)
    lse = q.new_empty((num_tokens, heads), dtype=_lse_dtype(q))
    for group in _length_classes(offsets, num_tokens, max_len):
        group_out, group_lse = _flash_attention(
            group.pad(q), group.pad(k), group.pad(v), 0.0, False,
            attn_mask=group.mask(causal, q.dtype), scale=scale)
        out.index_copy_(0, group.tokens, group.unpad(group_out))
        lse.index_copy_(0, group.tokens, group.unpad(group_lse).to(lse.dtype))
    return out, lse


def _backward_reference(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offsets: torch.Tensor,
        max_len: int, causal: bool, scale: float, out: torch.Tensor, lse: torch.Tensor,
        grad_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`jagged_attention_backward` on CPU tensors, padded length classes at a
    time, from the forward's output and log-sum-exp."""
    num_tokens = q.shape[0]
    grad_q, grad_k, grad_v = (torch.empty_like(t) for t in (q, k, v))
    for group in _length_classes(offsets, num_tokens, max_len):
        # Padding queries: a log-sum-exp of +inf makes their probabilities 0,
        # so they add nothing to the keys' and values' gradients.
        grads = _flash_attention_backward(
            group.pad(grad_out), group.pad(q), group.pad(k), group.pad(v), group.pad(out),
            group.pad(lse, float("inf")), 0.0, False, attn_mask=group.mask(causal, q.dtype),
            scale=scale)
        for grad, value in zip((grad_q, grad_k, grad_v), grads, strict=True):
            grad.index_copy_(0, group.tokens, group.unpad(value))
    return grad_q, grad_k, grad_v


def jagged_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               offsets: torch.Tensor, max_len: int, causal: bool = False,
                               scale: float | None = None) -> torch.Tensor:
    """`jagged_attention` with torch ops on padded batches.

    Sequences are grouped by length class (lengths in `(c/2, c]` for
    `c` a power of two, capped at `max_len`) and each group is padded to
    its class only: a long-tailed batch then pays for about twice its
    tokens' attention, not for `B * max_len**2`. It is what the op runs on
    CPU tensors; called directly, torch's autograd differentiates its ops.

    Args:
        q: float `[N, H, Dh]` queries of all sequences, packed.
        k: float `[N, H, Dh]` keys.
        v: float `[N, H, Dh]` values.
        offsets: int64 `[B + 1]`; sequence `b` is tokens
            `offsets[b]:offsets[b + 1]`.
        max_len: an upper bound of the sequence lengths.
        causal: whether a token attends only to itself and earlier tokens.
        scale: softmax scale; `1 / sqrt(Dh)` by default.

    Returns:
        `[N, H, Dh]`.

    Example:

    ```python
    from reckeras.backend_kernels.jagged_attention import jagged_attention_reference

    q = k = v = torch.randn(5, 2, 8)              # sequences of 2, 0 and 3 tokens
    out = jagged_attention_reference(q, k, v, torch.tensor([0, 2, 2, 5]), 3)
    ```
    """
    return _forward_reference(q, k, v, offsets, max_len, causal,
                              _scale(scale, q.shape[-1]))[0]


def _padded_to_max_len(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       offsets: torch.Tensor, max_len: int, causal: bool,
                       scale: float) -> torch.Tensor:
    """The reference with every sequence padded to `max_len`: shapes that do
    not depend on the lengths, which `torch.export` can trace (the length
    classes' loop of `jagged_attention_reference` cannot be)."""
    num_tokens, heads, head_dim = q.shape
    batch = offsets.numel() - 1
    sequence, position = sequence_positions(offsets, num_tokens)
    slot = sequence * max_len + position

    def padded(x):
        return x.new_zeros(batch * max_len, heads, head_dim).index_copy(0, slot, x) \
            .view(batch, max_len, heads, head_dim).transpose(1, 2)

    mask = torch.zeros(batch * max_len, dtype=torch.bool, device=q.device)
    mask = mask.index_fill(0, slot, True).view(batch, max_len)
    out = padded_attention_reference(padded(q), padded(k), padded(v), mask, causal, scale)
    return out.transpose(1, 2).reshape(batch * max_len, heads, head_dim).index_select(0, slot)


# ---- Triton ------------------------------------------------------------------------------

@kernel
def _tile(ptr, first_token, rows, length, head, heads, head_dim, cols):
    """The `[rows, cols]` tile of one head; zeros past `length`/`head_dim`."""
    live = (rows < length)[:, None] & (cols < head_dim)[None, :]
    at = ((first_token + rows) * heads + head)[:, None] * head_dim + cols[None, :]
    return tl.load(ptr + at, mask=live, other=0.0)


@kernel
def _allowed(rows, keys, length, CAUSAL: constexpr):
    """`[rows, keys]`: key inside the sequence (and not after the query)."""
    allowed = (keys < length)[None, :] & (rows >= 0)[:, None]
    if CAUSAL:
        allowed = allowed & (keys[None, :] <= rows[:, None])
    return allowed


@kernel
def _forward_kernel(q_ptr, k_ptr, v_ptr, offsets_ptr, out_ptr, lse_ptr, heads,
                    head_dim, scale, CAUSAL: constexpr, PRECISION: constexpr,
                    BLOCK: constexpr, BLOCK_D: constexpr):
    first_query = tl.program_id(0) * BLOCK
    sequence = tl.program_id(1).to(tl.int64)
    head = tl.program_id(2).to(tl.int64)
    start = tl.load(offsets_ptr + sequence)
    length = tl.load(offsets_ptr + sequence + 1) - start
    if first_query < length:
        rows = first_query + tl.arange(0, BLOCK)
        cols = tl.arange(0, BLOCK_D)
        q = _tile(q_ptr, start, rows, length, head, heads, head_dim, cols)
        best = tl.full([BLOCK], float("-inf"), tl.float32)
        total = tl.full([BLOCK], 0.0, tl.float32)
        acc = tl.full([BLOCK, BLOCK_D], 0.0, tl.float32)
        last_key = length
        if CAUSAL:
            last_key = tl.minimum(length, first_query + BLOCK)
        # Key 0 is allowed for every query, so `best` is finite after the
        # first step and no exp() below sees -inf - -inf.
        for first_key in range(0, last_key, BLOCK):
            keys = first_key + tl.arange(0, BLOCK)
            k = _tile(k_ptr, start, keys, length, head, heads, head_dim, cols)
            v = _tile(v_ptr, start, keys, length, head, heads, head_dim, cols)
            scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
            scores = tl.where(_allowed(rows, keys, length, CAUSAL), scores,
                              float("-inf"))
            new_best = tl.maximum(best, tl.max(scores, 1))
            decay = tl.exp(best - new_best)
            p = tl.exp(scores - new_best[:, None])
            total = total * decay + tl.sum(p, 1)
            acc = acc * decay[:, None] + tl.dot(p.to(v.dtype), v,
                                                input_precision=PRECISION)
            best = new_best
        out = acc / total[:, None]
        live = rows < length
        at = ((start + rows) * heads + head)[:, None] * head_dim + cols[None, :]
        tl.store(out_ptr + at, out.to(out_ptr.dtype.element_ty),
                 mask=live[:, None] & (cols < head_dim)[None, :])
        tl.store(lse_ptr + (start + rows) * heads + head, best + tl.log(total),
                 mask=live)


@kernel
def _probabilities(q, k, lse, rows, keys, length, scale, CAUSAL: constexpr,
                   PRECISION: constexpr):
    """Recomputed softmax `[rows, keys]`; zero where not allowed."""
    scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
    allowed = _allowed(rows, keys, length, CAUSAL) & (rows < length)[:, None]
    return tl.where(allowed, tl.exp(scores - lse[:, None]), 0.0)


@kernel
def _backward_kv_kernel(q_ptr, k_ptr, v_ptr, offsets_ptr, grad_out_ptr, lse_ptr,
                        delta_ptr, grad_k_ptr, grad_v_ptr, heads, head_dim, scale,
                        CAUSAL: constexpr, PRECISION: constexpr, BLOCK: constexpr,
                        BLOCK_D: constexpr):
    first_key = tl.program_id(0) * BLOCK
    sequence = tl.program_id(1).to(tl.int64)
    head = tl.program_id(2).to(tl.int64)
    start = tl.load(offsets_ptr + sequence)
    length = tl.load(offsets_ptr + sequence + 1) - start
    if first_key < length:
        keys = first_key + tl.arange(0, BLOCK)
        cols = tl.arange(0, BLOCK_D)
        k = _tile(k_ptr, start, keys, length, head, heads, head_dim, cols)
        v = _tile(v_ptr, start, keys, length, head, heads, head_dim, cols)
        grad_k = tl.full([BLOCK, BLOCK_D], 0.0, tl.float32)
        grad_v = tl.full([BLOCK, BLOCK_D], 0.0, tl.float32)
        first_query = 0
        if CAUSAL:
            first_query = first_key       # earlier queries never see these keys
        for query_block in range(first_query, length, BLOCK):
            rows = query_block + tl.arange(0, BLOCK)
            live = rows < length
            q = _tile(q_ptr, start, rows, length, head, heads, head_dim, cols)
            grad_out = _tile(grad_out_ptr, start, rows, length, head, heads,
                             head_dim, cols)
            lse = tl.load(lse_ptr + (start + rows) * heads + head, mask=live, other=0.0)
            delta = tl.load(delta_ptr + (start + rows) * heads + head, mask=live,
                            other=0.0)
            p = _probabilities(q, k, lse, rows, keys, length, scale, CAUSAL, PRECISION)
            grad_v += tl.dot(tl.trans(p).to(grad_out.dtype), grad_out,
                             input_precision=PRECISION)
            grad_p = tl.dot(grad_out, tl.trans(v), input_precision=PRECISION)
            grad_scores = p * (grad_p - delta[:, None])
            grad_k += tl.dot(tl.trans(grad_scores).to(q.dtype), q,
                             input_precision=PRECISION)
        at = ((start + keys) * heads + head)[:, None] * head_dim + cols[None, :]
        live = (keys < length)[:, None] & (cols < head_dim)[None, :]
        tl.store(grad_k_ptr + at, (grad_k * scale).to(grad_k_ptr.dtype.element_ty),
                 mask=live)
        tl.store(grad_v_ptr + at, grad_v.to(grad_v_ptr.dtype.element_ty), mask=live)


@kernel
def _backward_q_kernel(q_ptr, k_ptr, v_ptr, offsets_ptr, grad_out_ptr, lse_ptr,
                       delta_ptr, grad_q_ptr, heads, head_dim, scale,
                       CAUSAL: constexpr, PRECISION: constexpr, BLOCK: constexpr,
                       BLOCK_D: constexpr):
    first_query = tl.program_id(0) * BLOCK
    sequence = tl.program_id(1).to(tl.int64)
    head = tl.program_id(2).to(tl.int64)
    start = tl.load(offsets_ptr + sequence)
    length = tl.load(offsets_ptr + sequence + 1) - start
    if first_query < length:
        rows = first_query + tl.arange(0, BLOCK)
        cols = tl.arange(0, BLOCK_D)
        live = rows < length
        q = _tile(q_ptr, start, rows, length, head, heads, head_dim, cols)
        grad_out = _tile(grad_out_ptr, start, rows, length, head, heads, head_dim,
                         cols)
        lse = tl.load(lse_ptr + (start + rows) * heads + head, mask=live, other=0.0)
        delta = tl.load(delta_ptr + (start + rows) * heads + head, mask=live,
                        other=0.0)
        grad_q = tl.full([BLOCK, BLOCK_D], 0.0, tl.float32)
        last_key = length
        if CAUSAL:
            last_key = tl.minimum(length, first_query + BLOCK)
        for first_key in range(0, last_key, BLOCK):
            keys = first_key + tl.arange(0, BLOCK)
            k = _tile(k_ptr, start, keys, length, head, heads, head_dim, cols)
            v = _tile(v_ptr, start, keys, length, head, heads, head_dim, cols)
            p = _probabilities(q, k, lse, rows, keys, length, scale, CAUSAL, PRECISION)
            grad_p = tl.dot(grad_out, tl.trans(v), input_precision=PRECISION)
            grad_scores = p * (grad_p - delta[:, None])
            grad_q += tl.dot(grad_scores.to(k.dtype), k, input_precision=PRECISION)
        at = ((start + rows) * heads + head)[:, None] * head_dim + cols[None, :]
        tl.store(grad_q_ptr + at, (grad_q * scale).to(grad_q_ptr.dtype.element_ty),
                 mask=live[:, None] & (cols < head_dim)[None, :])


def _launch_config(q: torch.Tensor) -> tuple[int, str]:
    head_dim = q.shape[2]
    if head_dim > MAX_HEAD_DIM:
        raise ValueError(f"the Triton jagged attention supports head dims up to "
                         f"{MAX_HEAD_DIM}, got {head_dim}")
    # float32 products in full precision (as the reference); half types in the
    # tensor cores' native precision.
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    # tl.dot needs every tile dimension >= 16.
    return max(16, next_power_of_2(head_dim)), precision


def _forward_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    offsets: torch.Tensor, max_len: int, causal: bool,
                    scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    _check(q, k, v, offsets)
    q, k, v, offsets = (t.contiguous() for t in (q, k, v, offsets))
    num_tokens, heads, head_dim = q.shape
    out = torch.empty_like(q)
    lse = torch.empty(num_tokens, heads, dtype=_lse_dtype(q), device=q.device)
    batch = offsets.numel() - 1
    if num_tokens and batch and max_len:
        block_d, precision = _launch_config(q)
        grid = (-(-max_len // FORWARD_BLOCK), batch, heads)
        _forward_kernel[grid](
            q, k, v, offsets, out, lse, heads, head_dim, scale, CAUSAL=causal,
            PRECISION=precision, BLOCK=FORWARD_BLOCK, BLOCK_D=block_d)
    return out, lse


def _backward_triton(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offsets: torch.Tensor,
        max_len: int, causal: bool, scale: float, out: torch.Tensor, lse: torch.Tensor,
        grad_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q, k, v, offsets, lse = (t.contiguous() for t in (q, k, v, offsets, lse))
    num_tokens, heads, head_dim = q.shape
    grad_q, grad_k, grad_v = (torch.empty_like(q) for _ in range(3))
    batch = offsets.numel() - 1
    if num_tokens and batch and max_len:
        block_d, precision = _launch_config(q)
        grad_out = grad_out.contiguous()
        delta = (grad_out.float() * out.float()).sum(-1)       # [N, H]
        grid = (-(-max_len // BACKWARD_BLOCK), batch, heads)
        _backward_kv_kernel[grid](
            q, k, v, offsets, grad_out, lse, delta, grad_k, grad_v, heads, head_dim,
            scale, CAUSAL=causal, PRECISION=precision, BLOCK=BACKWARD_BLOCK,
            BLOCK_D=block_d)
        _backward_q_kernel[grid](
            q, k, v, offsets, grad_out, lse, delta, grad_q, heads, head_dim, scale,
            CAUSAL=causal, PRECISION=precision, BLOCK=BACKWARD_BLOCK, BLOCK_D=block_d)
    return grad_q, grad_k, grad_v


# ---- the torch ops -----------------------------------------------------------------------

_ARGUMENTS = "Tensor q, Tensor k, Tensor v, Tensor offsets, int max_len, bool causal, float scale"

_backward = register(
    f"jagged_attention_backward({_ARGUMENTS}, Tensor out, Tensor lse, Tensor grad_out) "
    "-> (Tensor, Tensor, Tensor)",
    reference=_backward_reference, triton=_backward_triton,
    fake=lambda q, k, v, *_: (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)))


class _AttentionContext(Protocol):
    """What the op's autograd keeps in torch's context of a call."""

    saved_tensors: tuple[torch.Tensor, ...]
    max_len: int
    causal: bool
    scale: float

    def save_for_backward(self, *tensors: torch.Tensor) -> None: ...

    def mark_non_differentiable(self, *tensors: torch.Tensor) -> None: ...


def _save_for_backward(ctx: _AttentionContext, inputs: tuple[Any, ...],
                       output: tuple[torch.Tensor, torch.Tensor]) -> None:
    q, k, v, offsets, max_len, causal, scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, offsets, out, lse)
    ctx.max_len, ctx.causal, ctx.scale = max_len, causal, scale
    ctx.mark_non_differentiable(lse)        # the backward's input, not a result


def _differentiate(ctx: _AttentionContext, grad_out: torch.Tensor,
                   _grad_lse: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    q, k, v, offsets, out, lse = ctx.saved_tensors
    grads = _backward(q, k, v, offsets, ctx.max_len, ctx.causal, ctx.scale, out, lse,
                      grad_out)
    return (*grads, None, None, None, None)


_forward = register(
    f"jagged_attention_forward({_ARGUMENTS}) -> (Tensor, Tensor)",
    reference=_forward_reference, triton=_forward_triton,
    fake=lambda q, *_: (torch.empty_like(q),
                        q.new_empty(q.shape[:2], dtype=_lse_dtype(q))),
    backward=_differentiate, setup_context=_save_for_backward)


def jagged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     offsets: torch.Tensor, max_len: int, causal: bool = False,
                     scale: float | None = None) -> torch.Tensor:
    """Softmax attention within each sequence of a packed batch.

    The torch op `reckeras::jagged_attention_forward` (differentiable: its
    backward is the op `reckeras::jagged_attention_backward`): the Triton
    kernels on CUDA tensors, `jagged_attention_reference`'s arithmetic on
    CPU tensors. While `torch.export` traces it (`rk.Model.export_serving`),
    the reference with every sequence padded to `max_len`, whose shapes do
    not depend on the lengths.

    Args:
        q: float `[N, H, Dh]`, the queries of all sequences' tokens, packed
            (`Dh` at most `MAX_HEAD_DIM` on CUDA).
        k: float `[N, H, Dh]` keys.
        v: float `[N, H, Dh]` values.
        offsets: int64 `[B + 1]`; sequence `b` is tokens
            `offsets[b]:offsets[b + 1]` (it may be empty).
        max_len: an upper bound of the sequence lengths.
        causal: whether a token attends only to itself and earlier tokens.
        scale: softmax scale; `1 / sqrt(Dh)` by default.

    Returns:
        `[N, H, Dh]`, differentiable in `q`, `k` and `v`.

    Example:

    ```python
    from reckeras.backend_kernels.jagged_attention import jagged_attention

    # Two sequences, of 2 and 3 tokens; 2 heads of 8 dims.
    q, k, v = (torch.randn(5, 2, 8) for _ in range(3))
    out = jagged_attention(q, k, v, torch.tensor([0, 2, 5]), max_len=3, causal=True)
    out.shape   # torch.Size([5, 2, 8])
    ```
    """
    _check(q, k, v, offsets)
    scale = _scale(scale, q.shape[-1])
    if torch.compiler.is_exporting():       # model.export_serving traces it
        return _padded_to_max_len(q, k, v, offsets, max_len, causal, scale)
    return _forward(q, k, v, offsets, int(max_len), bool(causal), scale)[0]
