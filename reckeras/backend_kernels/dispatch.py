"""The one place that decides where a kernel runs.

CUDA tensors go to the Triton kernels. CPU tensors go to the native CPU
kernels (``cpu_native``: C loops compiled on first use) where one exists and
can be built, else to the torch references, which define the semantics that
both are tested against.

Triton kernels are written as plain functions marked with ``@kernel`` and
annotated with this module's ``constexpr``; the first launch of any kernel of a
module (``TritonKernels.ready``) imports triton and turns every marked function
of that module into a ``triton.jit`` function in place. So importing reckeras
defines no kernel, and ``TRITON_INTERPRET`` (read by ``triton.jit``) may be
set any time before the first launch.
"""

import importlib.util

import torch

TRITON_AVAILABLE = importlib.util.find_spec("triton") is not None


def use_triton(tensor: torch.Tensor) -> bool:
    """True when ``tensor`` lives on a CUDA device and Triton is installed."""
    return TRITON_AVAILABLE and tensor.is_cuda


def use_native(*tensors: torch.Tensor) -> bool:
    """True when the native CPU kernels serve these tensors."""
    from reckeras.backend_kernels import cpu_native
    return cpu_native.usable(*tensors)


class constexpr:  # noqa: N801 - read by name, as triton.language.constexpr
    """Annotation of a compile-time kernel argument (``BLOCK: constexpr``)."""


def kernel(fn=None, *, do_not_specialize=()):
    """Marks ``fn`` as the source of a Triton kernel or device function.

    Args:
        do_not_specialize: integer arguments that vary with the data (counts,
            lengths): Triton would otherwise compile one variant per value
            class (1, multiple of 16, other) of each.
    """
    if fn is None:
        return lambda f: kernel(f, do_not_specialize=do_not_specialize)
    fn.__triton_source__ = True
    fn.__triton_do_not_specialize__ = tuple(do_not_specialize)
    return fn


# One jit'ed function per source function, shared by every module using it,
# and the TritonKernels of every kernel module, by module name.
_JITTED = {}
_MODULES = {}


class TritonKernels:
    """The Triton side of one kernel-family module.

    Args:
        namespace: the module's ``globals()``.
        constants: name -> int of module constants the kernels read (made
            ``tl.constexpr`` values, as compiled Triton requires of globals).
    """

    def __init__(self, namespace, constants=None):
        self.namespace = namespace
        self.constants = dict(constants or {})
        self._ready = False
        _MODULES[namespace["__name__"]] = self

    def ready(self):
        """Jits the module's kernels on first use; returns the namespace."""
        if self._ready:
            return self.namespace
        import triton
        import triton.language as tl

        ns = self.namespace
        ns["tl"] = tl
        ns["constexpr"] = tl.constexpr      # what the compiler resolves annotations to
        wrap = (lambda v: v) if triton.knobs.runtime.interpret else tl.constexpr
        for name, value in self.constants.items():
            ns[name] = wrap(value)
        self._ready = True
        for name, value in list(ns.items()):
            if not getattr(value, "__triton_source__", False):
                continue
            if value.__module__ != ns["__name__"]:
                _MODULES[value.__module__].ready()     # a helper's own globals
            if value not in _JITTED:
                _JITTED[value] = triton.jit(
                    value, do_not_specialize=value.__triton_do_not_specialize__)
            ns[name] = _JITTED[value]
        return ns


# Reductions of kernels go through triton's own combine functions, which the
# interpreter recognises (and runs as numpy's): when triton was imported
# before TRITON_INTERPRET was set (torch._dynamo imports it), ``tl.sum`` and
# friends stay compiled-mode functions that the interpreter cannot call.

@kernel
def reduce_sum(x, axis: constexpr):
    return tl.reduce(x, axis, tl.standard._sum_combine)


@kernel
def reduce_max(x, axis: constexpr):
    return tl.reduce(x, axis, tl.standard._elementwise_max)


@kernel
def cumulative_sum(x, axis: constexpr):
    return tl.associative_scan(x, axis, tl.standard._sum_combine)


_triton = TritonKernels(globals())


def next_power_of_2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def blocks(n: int, block: int) -> int:
    """Number of programs covering ``n`` items, ``block`` per program (>= 1)."""
    return max(1, -(-int(n) // block))
