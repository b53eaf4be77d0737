"""Dense layers' matmuls on CPU through oneDNN.

Keras's `Dense` (and every layer built on `keras.ops.matmul`) computes
`torch.matmul(x, kernel)`, which torch sends to MKL's sgemm on CPU. On the
AMD EPYC machines this project runs on, MKL takes its generic code path and
oneDNN, which torch also carries and which picks its kernels from the CPU's
features, runs the same float32 products 1.3-3.4x faster at the shapes of
recommender MLPs (`python benchmarks/dense_matmul.py`, batch 2048, 2 threads:
the forward of `[2048, 8008] @ [8008, 64]` 14.3 ms in MKL, 5.8 ms in oneDNN;
of `[2048, 367] @ [367, 512]` 4.6 ms and 2.4 ms).

`RoutedKernels(kernels)` is a block in which a `torch.matmul(x, kernel)` of
CPU float32 operands, `kernel` one of the given matrices, runs as
`OneDNNMatmul`, forward and backward on `torch.ops.mkldnn._linear_pointwise`
(the op torch's own compiler emits for CPU linears). Every other call, a
product with any other tensor included, goes to torch unchanged. `rk.Model`
opens it only around its own `Dense` layers, with their kernels
(`reckeras.pipeline.dense_routing`), so a user's layer that calls
`torch.matmul` always runs torch's. The arithmetic is float32 as before;
only the order of the sums differs, so results move by float32 rounding.

The reference is `torch.matmul` itself; tests compare both with float64.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
from torch.autograd.function import once_differentiable
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


class _MatmulContext(Protocol):
    """What `OneDNNMatmul` uses of torch's context of a call."""

    saved_tensors: tuple[torch.Tensor, ...]
    needs_input_grad: tuple[bool, ...]

    def save_for_backward(self, *tensors: torch.Tensor) -> None: ...


class OneDNNMatmul(torch.autograd.Function):
    """`x @ kernel` for float32 CPU `x` `[..., i]` and `kernel` `[i, o]`,
    forward and backward in oneDNN.

    Example:

    ```python
    y = OneDNNMatmul.apply(x, kernel)      # == torch.matmul(x, kernel)
    ```
    """

    @staticmethod
    def forward(ctx: _MatmulContext, x: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
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
    def backward(ctx: _MatmulContext, grad: torch.Tensor
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


class RoutedKernels(TorchFunctionMode):
    """A block in which `torch.matmul(x, kernel)` runs in oneDNN for the
    given kernels only: float32 CPU `x` `[..., i]`, `kernel` `[i, o]`,
    forward and backward (`OneDNNMatmul`).

    A kernel is recognized by identity (the tensor object, as `Dense`
    passes its kernel variable's value). Enter it only around code that
    multiplies by those kernels: every torch function called inside the
    block passes through it. Not for a block that `torch.export` or
    `torch.compile` traces. Where torch lacks oneDNN (`available()`),
    nothing is routed.

    Args:
        kernels: the `[i, o]` matrices whose products are routed.

    Example:

    ```python
    dense = keras.layers.Dense(64)
    dense.build((None, 32))
    with RoutedKernels([dense.kernel.value]):
        y = dense(x)                    # its matmul in oneDNN on CPU
    ```
    """

    def __init__(self, kernels: Sequence[torch.Tensor]):
        super().__init__()
        # By id, holding the tensors: an id stays theirs while they live.
        self._kernels = {id(kernel): kernel for kernel in kernels} if available() else {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if (func is torch.matmul and len(args) == 2 and not kwargs
                and self._kernels.get(id(args[1])) is args[1] and _routable(*args)):
            return OneDNNMatmul.apply(*args)
        return func(*args, **(kwargs or {}))
