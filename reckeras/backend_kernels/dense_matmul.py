"""Dense layers' matmuls on CPU through oneDNN.

Keras's `Dense` (and every layer built on `keras.ops.matmul`) computes
`torch.matmul(x, kernel)`, which torch sends to MKL's sgemm on CPU. On the
AMD EPYC machines this project runs on, MKL takes its generic code path and
oneDNN, which torch also carries and which picks its kernels from the CPU's
features, runs the same float32 products 1.3-3.4x faster at the shapes of
recommender MLPs (`python benchmarks/dense_matmul.py`, batch 2048, 2 threads:
the forward of `[2048, 8008] @ [8008, 64]` 14.3 ms in MKL, 5.8 ms in oneDNN;
of `[2048, 367] @ [367, 512]` 4.6 ms and 2.4 ms).

`routed_to_onednn()` is the block in which the model's steps run
(`rk.Model`'s train, test and predict steps): inside it a `torch.matmul` of
CPU float32 operands whose second operand is a matrix runs as `OneDNNMatmul`,
forward and backward on `torch.ops.mkldnn._linear_pointwise` (the op torch's
own compiler emits for CPU linears). Everything else, and every call where
torch lacks oneDNN, goes to torch unchanged. The arithmetic is float32 as
before; only the order of the sums differs, so results move by float32
rounding.

The reference is `torch.matmul` itself; tests compare both with float64.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch.autograd.function import FunctionCtx, once_differentiable
from torch.overrides import TorchFunctionMode


def available() -> bool:
    """Whether torch has the oneDNN linear this module runs.

    Returns:
        True when oneDNN is usable on this CPU and torch has
        `torch.ops.mkldnn._linear_pointwise` and its weight reorder.

    Example:

    ```python
    available()   # True on an x86 build of torch
    ```
    """
    mkldnn = torch.ops.mkldnn
    return (torch.backends.mkldnn.is_available()
            and hasattr(mkldnn, "_linear_pointwise")
            and hasattr(mkldnn, "_reorder_linear_weight"))


def linear(inputs: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`inputs @ weight.T` in oneDNN (no autograd).

    Args:
        inputs: float32 `[..., k]` CPU tensor, any strides.
        weight: float32 `[n, k]` CPU tensor, any strides.

    Returns:
        Float32 `[..., n]`.

    Example:

    ```python
    linear(torch.ones(2, 3), torch.ones(4, 3))   # [2, 4] of 3.0
    ```
    """
    return torch.ops.mkldnn._linear_pointwise.default(inputs, weight, None, "none", [], "")


class OneDNNMatmul(torch.autograd.Function):
    """`x @ kernel` for float32 CPU `x` `[..., i]` and `kernel` `[i, o]`,
    forward and backward in oneDNN.

    Example:

    ```python
    y = OneDNNMatmul.apply(x, kernel)      # == torch.matmul(x, kernel)
    ```
    """

    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
        """`x @ kernel`; keeps both for the backward.

        Args:
            ctx: torch's context of this call.
            x: float32 `[..., i]` CPU tensor.
            kernel: float32 `[i, o]` CPU tensor.

        Returns:
            Float32 `[..., o]`.
        """
        ctx.save_for_backward(x, kernel)
        return linear(x, kernel.t())

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad: torch.Tensor
                 ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The gradients of `x` and `kernel` (those that are needed).

        Args:
            ctx: the context `forward` filled.
            grad: float32 `[..., o]`, the gradient of the output.

        Returns:
            `(grad_x, grad_kernel)`, None for an input that needs none.
        """
        x, kernel = ctx.saved_tensors
        grad_x = grad_kernel = None
        if ctx.needs_input_grad[0]:
            grad_x = linear(grad, kernel)                       # grad @ kernel.T
        if ctx.needs_input_grad[1]:
            rows, grads = x.reshape(-1, x.shape[-1]), grad.reshape(-1, grad.shape[-1])
            # x.T @ grad, in whichever orientation oneDNN runs faster: with
            # the long side as its output's rows (measured: [8008, 64]
            # kernels 2.7x faster as (grad.T @ x).T, [13, 512] 4x slower).
            if kernel.shape[0] > kernel.shape[1]:
                grad_kernel = linear(grads.t(), rows.t()).t()
            else:
                grad_kernel = linear(rows.t(), grads.t())
        return grad_x, grad_kernel


def _routable(x, kernel) -> bool:
    return (isinstance(x, torch.Tensor) and isinstance(kernel, torch.Tensor)
            and x.dtype == torch.float32 and kernel.dtype == torch.float32
            and x.device.type == "cpu" and kernel.device.type == "cpu"
            and kernel.dim() == 2 and x.dim() >= 2 and x.shape[-1] == kernel.shape[0]
            and x.numel() > 0 and kernel.numel() > 0)


class _OneDNNMatmuls(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.matmul and len(args) == 2 and not kwargs and _routable(*args):
            return OneDNNMatmul.apply(*args)
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def routed_to_onednn() -> Iterator[None]:
    """Runs the block's `torch.matmul(x, kernel)` calls of float32 CPU
    tensors (kernel a matrix) in oneDNN, forward and backward.

    A no-op where torch lacks oneDNN. Not for a block that `torch.export`
    or `torch.compile` traces.

    Example:

    ```python
    with routed_to_onednn():
        y = keras.layers.Dense(64)(x)       # oneDNN on CPU
    ```
    """
    if not available():
        yield
        return
    with _OneDNNMatmuls():
        yield
