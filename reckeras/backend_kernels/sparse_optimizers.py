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

State is float32 (`[num_rows, width]`); weights keep the table's dtype
(float32, float16 or bfloat16) and are updated in float32. A half row is
stored back by *stochastic rounding* (`stochastic_round_reference`): to the
half value above or below, the one above with probability (distance to the
one below) / (their gap), so that an update smaller than half a step still
moves the row by the right amount on average (round-to-nearest would drop
it, and bfloat16's 8 significant bits make such updates common: a row of
0.1 moves in steps of 2^-11, and Adagrad's steps shrink as its accumulator
grows). The random bits are a hash of the unrounded value, the column and a
`round_seed` the caller derives from the table's seed and the training step
(`rounding_seed`), so an update is deterministic given the seed and step,
and the torch reference, the native kernel and the Triton kernel round
alike.

On CUDA tensors one Triton kernel does every update (a program updates
GROUPS rows, whole rows at once, so the row-wise mean needs no second pass);
`aggregate_and_update` also fuses the backward aggregation into it: each
program sums its rows' gradients from the pooled gradient through the CSR of
`aggregation.group_by` (the tile of `aggregation.segment_tile`) and
updates the rows, so the per-row gradients never go to memory.
"""

import math
from typing import TYPE_CHECKING

import torch

from reckeras.backend_kernels import cpu_native
from reckeras.backend_kernels.aggregation import (
    MAX_BLOCK_N,
    aggregate_row_grads,
    group_by,
    groups_per_program,
    ids_per_step,
    segment_sums,
    segment_tile,
    split_segments,
)
from reckeras.backend_kernels.dispatch import constexpr, kernel, next_power_of_2, register

if TYPE_CHECKING:
    # The kernels' `tl`: `dispatch.Kernel.jit` binds it when it jits them, so
    # importing this module imports no triton.
    import triton.language as tl

SGD, ADAGRAD, ROWWISE_ADAGRAD, ADAM, ADAMW = range(5)

# Stochastic rounding: the float32 bits a half type drops.
ROUNDED_BITS = {torch.bfloat16: 16, torch.float16: 13}
_FMIX_1, _FMIX_2 = 0x85EBCA6B, 0xC2B2AE35        # murmur3's 32-bit finalizer
_COLUMN_MIX = 0x9E3779B9                         # 2^32 / golden ratio
_UINT32 = 0xFFFFFFFF
_UINT64 = 2**64 - 1

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


# ---- stochastic rounding of half rows ------------------------------------------------

def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _UINT64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _UINT64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _UINT64
    return x ^ (x >> 31)


def rounding_seed(seed: int, step: int, stream: int = 0) -> int:
    """The `round_seed` of one update: a hash of a table's seed and the step.

    Args:
        seed: the table's seed.
        step: the training step of the update.
        stream: tells apart tables that share `seed` (their index).

    Returns:
        A 31-bit non-negative int.

    Example:

    ```python
    rounding_seed(0, 1), rounding_seed(0, 2)   # two unrelated seeds
    ```
    """
    mixed = _splitmix64((seed ^ (stream * 0x632BE59BD9B4E019)) & _UINT64)
    return _splitmix64(mixed ^ (step & _UINT64)) & 0x7FFFFFFF


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    """murmur3's finalizer of uint32 values held in int64 (products wrap,
    their low 32 bits are exact)."""
    h = h ^ (h >> 16)
    h = (h * _FMIX_1) & _UINT32
    h = h ^ (h >> 13)
    h = (h * _FMIX_2) & _UINT32
    return h ^ (h >> 16)


def stochastic_round_reference(values: torch.Tensor, dtype: torch.dtype,
                               round_seed: int) -> torch.Tensor:
    """float32 rows rounded stochastically to a half `dtype`.

    A pseudo-random number below the unit of the bits `dtype` drops (16 for
    bfloat16, 13 for float16), the top bits of `fmix32((bits ^ round_seed) +
    column * 0x9E3779B9)`, is added to each value's float32 bits and the
    dropped bits are cleared: the value rounds away from zero with
    probability (its distance to the half value below) / (the half step).
    Values a half type holds exactly are unchanged. The bits are a function
    of the value, so equal values of one column round alike in one update;
    over updates (seeds) the rounding is unbiased. Below float16's normal
    range (2^-14) the final conversion rounds to the nearest. The native and
    Triton update kernels compute the same bits.

    Args:
        values: float32 `[U, D]`.
        dtype: `torch.float16` or `torch.bfloat16` (`torch.float32`: returned
            as they are).
        round_seed: the update's seed (`rounding_seed`), in `[0, 2^32)`.

    Returns:
        `[U, D]` of `dtype`.

    Example:

    ```python
    tiny = torch.full((1, 1), 1.0 + 2.0**-10)        # 1/8 of a bfloat16 step above 1
    rounded = torch.cat([stochastic_round_reference(tiny, torch.bfloat16,
                                                    rounding_seed(0, step))
                         for step in range(1000)])
    (rounded > 1).float().mean()                      # ~0.125, not 0
    ```
    """
    if dtype == torch.float32:
        return values
    dropped = ROUNDED_BITS[dtype]
    bits = values.float().contiguous().view(torch.int32).to(torch.int64) & _UINT32
    column = (torch.arange(values.shape[-1], device=values.device) * _COLUMN_MIX) & _UINT32
    noise = _fmix32(((bits ^ round_seed) + column) & _UINT32) >> (32 - dropped)
    rounded = (((bits + noise) >> dropped) << dropped) & _UINT32
    rounded = torch.where(rounded > 0x7FFFFFFF, rounded - 2**32, rounded)
    return rounded.to(torch.int32).view(torch.float32).to(dtype)


# ---- torch reference -----------------------------------------------------------------

def update_reference(kind: int, weights: torch.Tensor, state: torch.Tensor,
                     rows: torch.Tensor, grads: torch.Tensor, lr: float, eps: float = 0.0,
                     beta1: float = 0.0, beta2: float = 0.0, weight_decay: float = 0.0,
                     round_seed: int = 0) -> None:
    """The torch reference of `update` (the formulas of this module's docstring).

    Args:
        kind, weights, state, rows, grads, lr, eps, beta1, beta2, weight_decay,
            round_seed: as for `update`.

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
    weights.index_copy_(0, rows, stochastic_round_reference(w, weights.dtype, round_seed))


# ---- Triton kernel ----------------------------------------------------------------------

@kernel
def _stochastic_round(w, cols, round_seed, ROUNDED: constexpr):
    """`stochastic_round_reference`'s float32 bits of a `[GROUPS, BLOCK_D]`
    tile (ROUNDED: the dropped bits); the caller's cast is then exact."""
    bits = w.to(tl.uint32, bitcast=True)
    h = (bits ^ round_seed) + cols.to(tl.uint32)[None, :] * 0x9E3779B9
    h = h ^ (h >> 16)
    h = h * 0x85EBCA6B
    h = h ^ (h >> 13)
    h = h * 0xC2B2AE35
    h = h ^ (h >> 16)
    rounded = ((bits + (h >> (32 - ROUNDED))) >> ROUNDED) << ROUNDED
    return rounded.to(tl.float32, bitcast=True)


@kernel(do_not_specialize=("num_rows", "state_width", "round_seed"))
def _update_kernel(weights_ptr, state_ptr, rows_ptr, source_ptr, source_row_ptr,
                   scale_ptr, order_ptr, starts_ptr, ends_ptr, num_rows, dim, state_width,
                   lr, eps, beta1, beta2, log2_beta1, log2_beta2, weight_decay, round_seed,
                   KIND: constexpr, INDIRECT: constexpr, BLOCK_N: constexpr,
                   GROUPS: constexpr, BLOCK_D: constexpr, ROUNDED: constexpr):
    index = tl.program_id(0).to(tl.int64) * GROUPS + tl.arange(0, GROUPS)
    valid = index < num_rows
    cols = tl.arange(0, BLOCK_D)
    in_row = cols < dim
    inside = valid[:, None] & in_row[None, :]
    # Each row's gradient: a segment sum over its ids (see aggregation).
    starts = tl.load(starts_ptr + index, mask=valid, other=0)
    ends = tl.load(ends_ptr + index, mask=valid, other=0)
    g = segment_tile(source_ptr, source_row_ptr, scale_ptr, order_ptr, starts, ends,
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
        s = tl.load(s_ptr, mask=valid, other=0.0) + tl.sum(g * g, 1) / dim
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
    if ROUNDED > 0:
        w = _stochastic_round(w, cols, round_seed.to(tl.uint32), ROUNDED)
    tl.store(w_ptr, w.to(weights_ptr.dtype.element_ty), mask=inside)


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
    lr, eps, beta1, beta2, weight_decay, round_seed = hyper
    state = state if state.numel() else weights      # never read by SGD
    _update_kernel[(-(-rows.numel() // groups),)](
        weights, state, rows.contiguous(), source.contiguous(), source_row.contiguous(),
        scale.contiguous(), order.contiguous(), starts, ends, rows.numel(), dim,
        state.shape[1], float(lr), float(eps), float(beta1), float(beta2), _log2(beta1),
        _log2(beta2), float(weight_decay), int(round_seed), KIND=kind, INDIRECT=indirect,
        BLOCK_N=block_n, GROUPS=groups, BLOCK_D=block_d,
        ROUNDED=ROUNDED_BITS.get(weights.dtype, 0))


def update_triton(kind: int, weights: torch.Tensor, state: torch.Tensor,
                  rows: torch.Tensor, grads: torch.Tensor, lr: float, eps: float = 0.0,
                  beta1: float = 0.0, beta2: float = 0.0, weight_decay: float = 0.0,
                  round_seed: int = 0) -> None:
    """`update` on CUDA tensors: one launch of the update kernel.

    Args:
        kind, weights, state, rows, grads, lr, eps, beta1, beta2, weight_decay,
            round_seed: as for `update`.

    Example:

    ```python
    update_triton(ROWWISE_ADAGRAD, weights, state, rows, grads, lr=0.05, eps=1e-8)
    ```
    """
    starts = torch.arange(rows.numel(), device=rows.device)
    _launch(kind, weights, state, rows,
            (grads, grads, grads, grads, starts, starts + 1, False, direct_block_n()),
            (lr, eps, beta1, beta2, weight_decay, round_seed))


def direct_block_n() -> int:
    """BLOCK_N of the update kernel reading one gradient row per table row.

    One would do (a segment is one row long), but Triton 3.6's compiler
    fails on that kernel with BLOCK_N=1 and direct rows for sm_90
    (`TritonGPURemoveLayoutConversions`: "PassManager::run failed"; found
    by the first GPU check, reproduced here by
    `tests/backend_kernels/compile_kernels.py`); Triton 3.9 compiles it. So
    before 3.9 the kernel takes two lanes a row, one of them masked off.

    Returns:
        1 on Triton 3.9 and later, else 2.

    Example:

    ```python
    direct_block_n()   # 2 on Triton 3.6
    ```
    """
    import triton
    major, minor = (int(part) for part in triton.__version__.split(".")[:2])
    return 1 if (major, minor) >= (3, 9) else 2


def aggregate_and_update_triton(kind: int, weights: torch.Tensor, state: torch.Tensor,
                                rows: torch.Tensor, grad_out: torch.Tensor,
                                unique_index: torch.Tensor, destination: torch.Tensor,
                                id_weight: torch.Tensor, lr: float, eps: float = 0.0,
                                beta1: float = 0.0, beta2: float = 0.0,
                                weight_decay: float = 0.0, round_seed: int = 0) -> None:
    """`aggregate_and_update` on CUDA tensors: the update kernel sums every
    row's gradient from the pooled gradient itself (hot rows' pieces first,
    by `aggregation.segment_sums`).

    Args:
        kind, weights, state, rows, grad_out, unique_index, destination,
            id_weight, lr, eps, beta1, beta2, weight_decay, round_seed: as
            for `aggregate_and_update`.

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
    _launch(kind, weights, state, rows, segments,
            (lr, eps, beta1, beta2, weight_decay, round_seed))


# ---- the torch ops (dispatch.register) ----------------------------------------------

def _update_native(kind, weights, state, rows, grads, lr, eps, beta1, beta2, weight_decay,
                   round_seed):
    cpu_native.apply_update(_NATIVE_KINDS[kind], weights, state, rows, grads, lr, eps,
                            round_seed)


def _aggregate_then_update(kind, weights, state, rows, grad_out, unique_index, destination,
                           id_weight, lr, eps, beta1, beta2, weight_decay, round_seed):
    """`aggregate_and_update` on CPU: the two ops one after the other."""
    grads = aggregate_row_grads(grad_out, unique_index, destination, id_weight,
                                rows.numel())
    update(kind, weights, state, rows, grads, lr, eps, beta1, beta2, weight_decay,
           round_seed)


_HYPER = "float lr, float eps, float beta1, float beta2, float weight_decay, int round_seed"
_update = register(
    "update(int kind, Tensor(a!) weights, Tensor(b!) state, Tensor rows, Tensor grads, "
    f"{_HYPER}) -> ()",
    reference=update_reference, triton=update_triton, native=_update_native,
    native_usable=lambda kind, weights, state, rows, grads, *hyper:
        kind in _NATIVE_KINDS and cpu_native.usable(state, rows, grads, table=weights),
    fake=lambda *args: None)
_aggregate_and_update = register(
    "aggregate_and_update(int kind, Tensor(a!) weights, Tensor(b!) state, Tensor rows, "
    f"Tensor grad_out, Tensor unique_index, Tensor destination, Tensor id_weight, {_HYPER}"
    ") -> ()",
    reference=_aggregate_then_update, triton=aggregate_and_update_triton,
    fake=lambda *args: None)


# ---- public entry points ---------------------------------------------------------------

def update(kind: int, weights: torch.Tensor, state: torch.Tensor, rows: torch.Tensor,
           grads: torch.Tensor, lr: float, eps: float = 0.0, beta1: float = 0.0,
           beta2: float = 0.0, weight_decay: float = 0.0, round_seed: int = 0) -> None:
    """Applies optimizer `kind` to the distinct `rows`, given their gradients.

    What `reckeras.optimizers.SparseOptimizer.apply` runs. CUDA tensors run
    the Triton kernel; CPU tensors the native kernel (SGD, Adagrad,
    RowWiseAdagrad) or the torch reference.

    Args:
        kind: `SGD`, `ADAGRAD`, `ROWWISE_ADAGRAD`, `ADAM` or `ADAMW`.
        weights: float32, float16 or bfloat16 `[num_rows, D]`, updated in
            place (half rows in float32, stored by stochastic rounding).
        state: float32 `[num_rows, state_width(kind, D)]`, updated in place.
        rows: int64 `[U]`, distinct rows.
        grads: float32 `[U, D]`, the gradient of every row.
        lr, eps, beta1, beta2, weight_decay: the hyperparameters (those a
            kind does not use are ignored).
        round_seed: the seed of the stochastic rounding of half rows
            (`rounding_seed`; unused for float32 rows).

    Example:

    ```python
    weights, state = torch.ones(4, 2), torch.zeros(4, 1)
    update(ROWWISE_ADAGRAD, weights, state, torch.tensor([3]),
           torch.tensor([[1.0, -1.0]]), lr=0.1)
    # state[3] = 1.0; weights[3] = [0.9, 1.1]
    ```
    """
    _update(kind, weights, state, rows, grads, lr, eps, beta1, beta2, weight_decay,
            round_seed)


def aggregate_and_update(kind: int, weights: torch.Tensor, state: torch.Tensor,
                         rows: torch.Tensor, grad_out: torch.Tensor,
                         unique_index: torch.Tensor, destination: torch.Tensor,
                         id_weight: torch.Tensor, lr: float, eps: float = 0.0,
                         beta1: float = 0.0, beta2: float = 0.0,
                         weight_decay: float = 0.0, round_seed: int = 0) -> None:
    """`aggregation.aggregate_row_grads`, then `update`: fused on CUDA.

    What `reckeras.optimizers.SparseOptimizer.apply_pooled` runs: one Triton
    kernel on CUDA tensors, which never writes the rows' gradients to memory.

    Args:
        kind, weights, state, lr, eps, beta1, beta2, weight_decay, round_seed:
            as for `update`.
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
    _aggregate_and_update(kind, weights, state, rows, grad_out, unique_index, destination,
                          id_weight, lr, eps, beta1, beta2, weight_decay, round_seed)
