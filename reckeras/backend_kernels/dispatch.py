"""The one place that decides whether a kernel runs in Triton or in torch.

CUDA tensors go to the Triton kernels; everything else (CPU tensors, and the
interpreter-free CPU path of the library) goes to the torch references, which
define the semantics that the Triton kernels are tested against.
"""

import importlib.util

import torch

TRITON_AVAILABLE = importlib.util.find_spec("triton") is not None


def use_triton(tensor: torch.Tensor) -> bool:
    """True when ``tensor`` lives on a CUDA device and Triton is installed."""
    return TRITON_AVAILABLE and tensor.is_cuda
