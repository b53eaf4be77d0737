"""Sparse optimizer updates applied to the unique rows a batch touched.

Each update reads the aggregated gradient of every touched row once and
updates the row and its per-row state in place. Formulas (`g` the row's
aggregated gradient, `w` its weights, `lr` learning rate):

* SGD: `w -= lr * g`.
* Adagrad (torch.optim.Adagrad, no decay), state `s` (`D` values):
  `s += g * g`; `w -= lr * g / (sqrt(s) + eps)`.
* RowWiseAdagrad (one accumulator per row, as in fbgemm/TorchRec), state
  `s` (1 value): `s += mean(g * g)` over the row;
  `w -= lr * g / (sqrt(s) + eps)`.
* Adam / AdamW (torch.optim.Adam / AdamW), state `[m (D), v (D), t (1)]`
  with `t` the row's own step count (a row that a batch does not touch does
  not step): `t += 1`; Adam: `g += weight_decay * w`; AdamW:
  `w *= 1 - lr * weight_decay`; then `m = b1 m + (1 - b1) g`,
  `v = b2 v + (1 - b2) g^2`,
  `w -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)`.

State is float32 (`[num_rows, width]`); weights keep the table's dtype (float32
or bfloat16) and are updated in float32.

On CUDA tensors one Triton kernel does every update (a program updates
GROUPS rows, whole rows at once, so the row-wise mean needs no second pass);
`aggregate_and_update` also fuses the backward aggregation into it: each
program sums its rows' gradients from the pooled gradient through the CSR of
`aggregation.group_by` (the tile of `aggregation._segment_tile`) and
updates the rows, so the per-row gradients never go to memory.
"""

import math

import torch

from reckeras.backend_kernels.aggregation import (MAX_BLOCK_N, _segment_tile,
                                                  aggregate_row_grads, group_by,
                                                  groups_per_program, ids_per_step,
                                                  segment_sums, split_segments)
from reckeras.backend_kernels.dispatch import (TritonKernels, constexpr, kernel,
                                               next_power_of_2, reduce_sum, use_native,
                                               use_triton)

SGD, ADAGRAD, ROWWISE_ADAGRAD, ADAM, ADAMW = range(5)

# The optimizers with a native CPU kernel (cpu_native.apply_update).
_NATIVE_KINDS = {SGD: "sgd", ADAGRAD: "adagrad", ROWWISE_ADAGRAD: "rowwise_adagrad"}
MAX_DIM = 4096        # widest row of the update kernel (one row per tile line)


def state_width(kind: int, dim: int) -> int:
    """The float32 state values per row of optimizer `kind`.

    Args:
        kind: `SGD`, `ADAGRAD`, `ROWWISE_ADAGRAD`, `ADAM` or `ADAMW`.
        dim: the table's row width `D`.

    Returns:
        0, `D`, 1, `2 D + 1` or `2 D + 1`.

    Example:

    ```python
    state_width(ADAM, 16)   # 33: m, v and the row's step count
    ```
    """
    return {SGD: 0, ADAGRAD: dim, ROWWISE_ADAGRAD: 1, ADAM: 2 * dim + 1,
            ADAMW: 2 * dim + 1}[kind]


# ---- torch reference -----------------------------------------------------------------

def update_reference(kind: int, weights: torch.Tensor, state: torch.Tensor,
                     rows: torch.Tensor, grads: torch.Tensor, lr: float, eps: float = 0.0,
                     beta1: float = 0.0, beta2: float = 0.0,
                     weight_decay: float = 0.0) -> None:
    """The torch reference of `update` (the formulas of this module's docstring).

    Args:
        kind, weights, state, rows, grads, lr, eps, beta1, beta2, weight_decay:
            as for `update`.

    Example:

    ```python
    update_reference(SGD, weights, torch.zeros(len(weights), 0), rows, grads, lr=0.1)
    ```
    """
    if not rows.numel():
        return
    g = grads.float()
    w = weights.index_select(0, rows).float()
    if kind == SGD:
        w.add_(g, alpha=-lr)
    elif kind == ADAGRAD:
        s = state.index_select(0, rows).addcmul_(g, g)
        state.index_copy_(0, rows, s)
        w.addcdiv_(g, s.sqrt_().add_(eps), value=-lr)
    elif kind == ROWWISE_ADAGRAD:
        s = state.index_select(0, rows) + g.square().mean(dim=1, keepdim=True)
        state.index_copy_(0, rows, s)
        w.addcdiv_(g, s.sqrt_().add_(eps), value=-lr)
    elif kind in (ADAM, ADAMW):
        dim = w.shape[1]
        s = state.index_select(0, rows)
        m, v, t = s[:, :dim], s[:, dim:2 * dim], s[:, 2 * dim:]
        t += 1
        if kind == ADAM:
            g = g + weight_decay * w
        else:
            w *= 1 - lr * weight_decay
        m.lerp_(g, 1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        state.index_copy_(0, rows, s)
        step = lr / (1 - beta1 ** t)
        denominator = v.sqrt() / (1 - beta2 ** t).sqrt() + eps
        w.addcdiv_(step * m, denominator, value=-1)
    else:
        raise ValueError(f"unknown sparse optimizer kind {kind!r}")
    weights.index_copy_(0, rows, w.to(weights.dtype))


# ---- Triton kernel ----------------------------------------------------------------------

@kernel(do_not_specialize=("num_rows", "state_width"))
def _update_kernel(weights_ptr, state_ptr, rows_ptr, source_ptr, source_row_ptr,
                   scale_ptr, order_ptr, starts_ptr, ends_ptr, num_rows, dim, state_width,
                   lr, eps, beta1, beta2, log2_beta1, log2_beta2, weight_decay,
                   KIND: constexpr, INDIRECT: constexpr, BLOCK_N: constexpr,
                   GROUPS: constexpr, BLOCK_D: constexpr):
    index = tl.program_id(0).to(tl.int64) * GROUPS + tl.arange(0, GROUPS)
    valid = index < num_rows
    cols = tl.arange(0, BLOCK_D)
    in_row = cols < dim
    inside = valid[:, None] & in_row[None, :]
    # Each row's gradient: a segment sum over its ids (see aggregation).
    starts = tl.load(starts_ptr + index, mask=valid, other=0)
    ends = tl.load(ends_ptr + index, mask=valid, other=0)
    g = _segment_tile(source_ptr, source_row_ptr, scale_ptr, order_ptr, starts, ends,
                      cols, in_row, dim, INDIRECT, BLOCK_N, GROUPS, BLOCK_D)
    row = tl.load(rows_ptr + index, mask=valid, other=0)
    w_ptr = weights_ptr + row[:, None] * dim + cols[None, :]
    w = tl.load(w_ptr, mask=inside, other=0.0).to(tl.float32)
    s_ptr = state_ptr + row * state_width
    if KIND == 0:
        w = w - lr * g
    elif KIND == 1:
        s = tl.load(s_ptr[:, None] + cols[None, :], mask=inside, other=0.0) + g * g
        tl.store(s_ptr[:, None] + cols[None, :], s, mask=inside)
        w = w - lr * g / (tl.sqrt(s) + eps)
    elif KIND == 2:
        s = tl.load(s_ptr, mask=valid, other=0.0) + reduce_sum(g * g, 1) / dim
        tl.store(s_ptr, s, mask=valid)
        w = w - lr * g / (tl.sqrt(s) + eps)[:, None]
    else:
        m = tl.load(s_ptr[:, None] + cols[None, :], mask=inside, other=0.0)
        v = tl.load(s_ptr[:, None] + dim + cols[None, :], mask=inside, other=0.0)
        t = tl.load(s_ptr + 2 * dim, mask=valid, other=0.0) + 1.0
        if KIND == 3:
            g = g + weight_decay * w
        else:
            w = w * (1.0 - lr * weight_decay)
        m = beta1 * m + (1.0 - beta1) * g
        v = beta2 * v + (1.0 - beta2) * g * g
        step = lr / (1.0 - tl.exp2(t * log2_beta1))
        bias2_sqrt = tl.sqrt(1.0 - tl.exp2(t * log2_beta2))
        w = w - step[:, None] * m / (tl.sqrt(v) / bias2_sqrt[:, None] + eps)
        tl.store(s_ptr[:, None] + cols[None, :], m, mask=inside)
        tl.store(s_ptr[:, None] + dim + cols[None, :], v, mask=inside)
        tl.store(s_ptr + 2 * dim, t, mask=valid)
    tl.store(w_ptr, w.to(weights_ptr.dtype.element_ty), mask=inside)


_triton = TritonKernels(globals())


def _log2(beta):
    return math.log2(beta) if beta > 0 else -math.inf


def _launch(kind, weights, state, rows, segments, hyper):
    """Runs the update kernel; `segments` gives every row's gradient as
    `(source, source_row, scale, order, starts, ends, indirect, block_n)`."""
    source, source_row, scale, order, starts, ends, indirect, block_n = segments
    dim = weights.shape[1]
    if not rows.numel() or not dim:
        return
    block_d = next_power_of_2(dim)
    if block_d > MAX_DIM:
        raise ValueError(f"rows of {dim} values are wider than the update kernel's "
                         f"{MAX_DIM}")
    groups = groups_per_program(block_n, block_d)
    lr, eps, beta1, beta2, weight_decay = hyper
    state = state if state.numel() else weights      # never read by SGD
    ns = _triton.ready()
    ns["_update_kernel"][(-(-rows.numel() // groups),)](
        weights, state, rows.contiguous(), source.contiguous(), source_row.contiguous(),
        scale.contiguous(), order.contiguous(), starts, ends, rows.numel(), dim,
        state.shape[1], float(lr), float(eps), float(beta1), float(beta2), _log2(beta1),
        _log2(beta2), float(weight_decay), KIND=kind, INDIRECT=indirect,
        BLOCK_N=block_n, GROUPS=groups, BLOCK_D=block_d)


def update_triton(kind: int, weights: torch.Tensor, state: torch.Tensor,
                  rows: torch.Tensor, grads: torch.Tensor, lr: float, eps: float = 0.0,
                  beta1: float = 0.0, beta2: float = 0.0,
                  weight_decay: float = 0.0) -> None:
    """`update` on CUDA tensors: one launch of the update kernel.

    Args:
        kind, weights, state, rows, grads, lr, eps, beta1, beta2, weight_decay:
            as for `update`.

    Example:

    ```python
    update_triton(ROWWISE_ADAGRAD, weights, state, rows, grads, lr=0.05, eps=1e-8)
    ```
    """
    starts = torch.arange(rows.numel(), device=rows.device)
    _launch(kind, weights, state, rows,
            (grads, grads, grads, grads, starts, starts + 1, False, 1),
            (lr, eps, beta1, beta2, weight_decay))


def aggregate_and_update_triton(kind: int, weights: torch.Tensor, state: torch.Tensor,
                                rows: torch.Tensor, grad_out: torch.Tensor,
                                unique_index: torch.Tensor, destination: torch.Tensor,
                                id_weight: torch.Tensor, lr: float, eps: float = 0.0,
                                beta1: float = 0.0, beta2: float = 0.0,
                                weight_decay: float = 0.0) -> None:
    """`aggregate_and_update` on CUDA tensors: the update kernel sums every
    row's gradient from the pooled gradient itself (hot rows' pieces first,
    by `aggregation.segment_sums`).

    Args:
        kind, weights, state, rows, grad_out, unique_index, destination,
            id_weight, lr, eps, beta1, beta2, weight_decay: as for
            `aggregate_and_update`.

    Example:

    ```python
    aggregate_and_update_triton(SGD, weights, state, rows, grad_out, unique_index,
                                destination, id_weight, lr=0.1)
    ```
    """
    order, offsets = group_by(unique_index, rows.numel())
    starts, ends = offsets[:-1], offsets[1:]
    block_n = ids_per_step(order.numel(), rows.numel())
    pieces = split_segments(starts, ends, block_n)
    if pieces is None:
        segments = (grad_out, destination, id_weight, order, starts, ends, True, block_n)
    else:       # hot rows: their pieces summed first, then the pieces per row
        piece_starts, piece_ends, piece_offsets = pieces
        partial = segment_sums(grad_out, destination, id_weight, order, piece_starts,
                               piece_ends, True, block_n)
        segments = (partial, partial, partial, partial, piece_offsets[:-1],
                    piece_offsets[1:], False, MAX_BLOCK_N)
    _launch(kind, weights, state, rows, segments, (lr, eps, beta1, beta2, weight_decay))


# ---- public entry points ---------------------------------------------------------------

def update(kind: int, weights: torch.Tensor, state: torch.Tensor, rows: torch.Tensor,
           grads: torch.Tensor, lr: float, eps: float = 0.0, beta1: float = 0.0,
           beta2: float = 0.0, weight_decay: float = 0.0) -> None:
    """Applies optimizer `kind` to the distinct `rows`, given their gradients.

    What `reckeras.optimizers.SparseOptimizer.apply` runs. CUDA tensors run
    the Triton kernel; CPU tensors the native kernel (SGD, Adagrad,
    RowWiseAdagrad of float32 tables) or the torch reference.

    Args:
        kind: `SGD`, `ADAGRAD`, `ROWWISE_ADAGRAD`, `ADAM` or `ADAMW`.
        weights: float32 or bfloat16 `[num_rows, D]`, updated in place.
        state: float32 `[num_rows, state_width(kind, D)]`, updated in place.
        rows: int64 `[U]`, distinct rows.
        grads: float32 `[U, D]`, the gradient of every row.
        lr, eps, beta1, beta2, weight_decay: the hyperparameters (those a
            kind does not use are ignored).

    Example:

    ```python
    weights, state = torch.ones(4, 2), torch.zeros(4, 1)
    update(ROWWISE_ADAGRAD, weights, state, torch.tensor([3]),
           torch.tensor([[1.0, -1.0]]), lr=0.1)
    # state[3] = 1.0; weights[3] = [0.9, 1.1]
    ```
    """
    if kind in _NATIVE_KINDS and use_native(weights, state, rows, grads):
        from reckeras.backend_kernels import cpu_native
        cpu_native.apply_update(_NATIVE_KINDS[kind], weights, state, rows, grads, lr, eps)
        return
    fn = update_triton if use_triton(weights) else update_reference
    fn(kind, weights, state, rows, grads, lr, eps, beta1, beta2, weight_decay)


def aggregate_and_update(kind: int, weights: torch.Tensor, state: torch.Tensor,
                         rows: torch.Tensor, grad_out: torch.Tensor,
                         unique_index: torch.Tensor, destination: torch.Tensor,
                         id_weight: torch.Tensor, lr: float, eps: float = 0.0,
                         beta1: float = 0.0, beta2: float = 0.0,
                         weight_decay: float = 0.0) -> None:
    """`aggregation.aggregate_row_grads`, then `update`: fused on CUDA.

    What `reckeras.optimizers.SparseOptimizer.apply_pooled` runs: one Triton
    kernel on CUDA tensors, which never writes the rows' gradients to memory.

    Args:
        kind, weights, state, lr, eps, beta1, beta2, weight_decay: as for
            `update`.
        rows: int64 `[U]`, the batch's unique rows.
        grad_out: float32 `[num_slots, D]`, the gradient of the pooled output.
        unique_index, destination, id_weight: the forward index, as for
            `aggregate_row_grads`.

    Example:

    ```python
    # Two ids of row 5 pooled into slot 0, with weights 1 and 0.5.
    aggregate_and_update(SGD, weights, state, torch.tensor([5]), grad_out,
                         torch.tensor([0, 0]), torch.tensor([0, 0]),
                         torch.tensor([1.0, 0.5]), lr=0.1)
    # weights[5] -= 0.1 * 1.5 * grad_out[0]
    ```
    """
    if use_triton(weights):
        aggregate_and_update_triton(kind, weights, state, rows, grad_out, unique_index,
                                    destination, id_weight, lr, eps, beta1, beta2,
                                    weight_decay)
        return
    grads = aggregate_row_grads(grad_out, unique_index, destination, id_weight,
                                rows.numel())
    update(kind, weights, state, rows, grads, lr, eps, beta1, beta2, weight_decay)
