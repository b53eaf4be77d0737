"""The one place that decides where a kernel runs.

CUDA tensors go to the Triton kernels (`use_triton`). CPU tensors go to the
native CPU kernels (`use_native`; `cpu_native`: C loops compiled on first
use) where one exists and can be built, else to the torch references, which
define the semantics that both are tested against.

Triton kernels are written as plain functions marked with `@kernel` and
annotated with this module's `constexpr`; the first launch of any kernel of a
module (`TritonKernels.ready`) imports triton and turns every marked function
of that module into a `triton.jit` function in place. So importing reckeras
defines no kernel. Kernels use only Triton's public language (`tl.sum`,
`tl.max`, ...).

Tests send CPU tensors down the Triton route with `triton_on_cpu()`, in
Triton's interpreter, to check a caller's Triton path on a machine without a
GPU. The interpreter needs `TRITON_INTERPRET=1` before `triton` is first
imported (torch imports it): `triton.language` makes its own functions
interpreted or compiled then, once (`interpreted()` tells which).
"""

import contextlib
import importlib.util
from collections.abc import Callable, Iterable, Iterator

import torch

TRITON_AVAILABLE = importlib.util.find_spec("triton") is not None

_triton_on_cpu = False        # set by triton_on_cpu(), for tests


def use_triton(tensor: torch.Tensor) -> bool:
    """Whether the Triton kernel serves `tensor`.

    Args:
        tensor: the tensor an entry point is called on.

    Returns:
        True when Triton is installed and `tensor` lives on a CUDA device
        (or on any device inside `triton_on_cpu()`).

    Example:

    ```python
    fn = bucketize_triton if use_triton(values) else bucketize_reference
    ```
    """
    return TRITON_AVAILABLE and (tensor.is_cuda or _triton_on_cpu)


def use_native(*tensors: torch.Tensor, table: torch.Tensor | None = None) -> bool:
    """Whether the native CPU kernels (`cpu_native`) serve these tensors.

    Args:
        *tensors: the tensors an entry point is called on.
        table: the table rows it reads or updates (float32, float16 or
            bfloat16), if any.

    Returns:
        True when they are CPU tensors the native kernels take and those
        kernels are built (never inside `triton_on_cpu()`).

    Example:

    ```python
    if use_native(unique_rows, table=weights):
        cpu_native.pool_forward(...)
    ```
    """
    if _triton_on_cpu:
        return False
    from reckeras.backend_kernels import cpu_native
    return cpu_native.usable(*tensors, table=table)


@contextlib.contextmanager
def triton_on_cpu() -> Iterator[None]:
    """Sends CPU tensors to the Triton kernels, in Triton's interpreter.

    For tests: inside the block every entry point takes its Triton route for
    CPU tensors as it does for CUDA tensors, so a caller's Triton path (for
    example `features.plan.TransformPlan`'s) runs on a machine without a
    GPU. `TRITON_INTERPRET=1` must be set before `triton` is first imported
    (torch imports it, so before `import torch`): Triton's own functions
    (`tl.sum`, `tl.max`, ...) are made interpreted or compiled when
    `triton.language` is imported. The switch is process-wide: do not use
    it while other threads run kernels.

    Raises:
        RuntimeError: when Triton is not installed, or `triton.language` was
            imported without `TRITON_INTERPRET=1`.

    Example:

    ```python
    # TRITON_INTERPRET=1 python -m pytest ...   (set before torch is imported)
    with dispatch.triton_on_cpu():
        packed = plan.packed_sparse(cpu_inputs)     # the Triton kernels ran
    ```
    """
    global _triton_on_cpu
    if not TRITON_AVAILABLE:
        raise RuntimeError("triton_on_cpu() needs triton installed")
    if not interpreted():
        raise RuntimeError("triton_on_cpu() runs Triton's interpreter: set "
                           "TRITON_INTERPRET=1 before triton is first imported "
                           "(torch imports it: set it before `import torch`)")
    previous, _triton_on_cpu = _triton_on_cpu, True
    try:
        yield
    finally:
        _triton_on_cpu = previous


def interpreted() -> bool:
    """Whether Triton's language was set up for its interpreter.

    `triton.language` makes its own functions (`tl.sum`, `tl.max`, ...)
    interpreted or compiled once, when it is imported, by
    `TRITON_INTERPRET`; kernels calling them run in the interpreter only if
    that variable was `1` then.

    Returns:
        True when Triton is installed and its language was imported (now, if
        it was not yet) in interpreter mode.

    Example:

    ```python
    if not dispatch.interpreted():
        print("set TRITON_INTERPRET=1 before importing torch")
    ```
    """
    if not TRITON_AVAILABLE:
        return False
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    return isinstance(tl.sum, InterpretedFunction)


class constexpr:  # noqa: N801 - read by name, as triton.language.constexpr
    """Annotation of a compile-time kernel argument (`BLOCK: constexpr`).

    `TritonKernels.ready` replaces it by `triton.language.constexpr` in the
    module's namespace, which is what the compiler resolves.

    Example:

    ```python
    @kernel
    def _scale_kernel(x_ptr, n, BLOCK: constexpr):
        ...
    ```
    """


def kernel(fn: Callable | None = None, *,
           do_not_specialize: Iterable[str] = ()) -> Callable:
    """Marks `fn` as the source of a Triton kernel or device function.

    Args:
        fn: the function; omitted when the decorator takes arguments.
        do_not_specialize: integer arguments that vary with the data (counts,
            lengths): Triton would otherwise compile one variant per value
            class (1, multiple of 16, other) of each.

    Returns:
        `fn` itself, marked (or the decorator that marks it).

    Example:

    ```python
    @kernel(do_not_specialize=("n",))
    def _copy_kernel(src_ptr, dst_ptr, n, BLOCK: constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < n), mask=offs < n)
    ```
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
        namespace: the module's `globals()`.
        constants: name -> int or float of module constants the kernels read
            (made `tl.constexpr` values, as compiled Triton requires of
            globals).

    Example:

    ```python
    _triton = TritonKernels(globals(), {"_SCALE": 2})

    def copy_triton(src):
        ns = _triton.ready()
        ns["_copy_kernel"][(blocks(src.numel(), 1024),)](src, out, src.numel(), BLOCK=1024)
    ```
    """

    def __init__(self, namespace: dict, constants: dict | None = None):
        self.namespace = namespace
        self.constants = dict(constants or {})
        self._ready = False
        _MODULES[namespace["__name__"]] = self

    def ready(self) -> dict:
        """Jits the module's kernels on first use.

        Returns:
            The module's namespace, where every `@kernel` function is now a
            `triton.jit` function.
        """
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


def next_power_of_2(n: int) -> int:
    """The smallest power of two `>= n` (1 for `n <= 1`).

    Args:
        n: a count.

    Returns:
        The power of two, for block sizes.

    Example:

    ```python
    next_power_of_2(100)   # 128
    ```
    """
    return 1 << max(int(n) - 1, 0).bit_length()


def blocks(n: int, block: int) -> int:
    """The number of programs covering `n` items, `block` per program.

    Args:
        n: the items.
        block: the items per program.

    Returns:
        `ceil(n / block)`, at least 1.

    Example:

    ```python
    blocks(2049, 1024)   # 3
    ```
    """
    return max(1, -(-int(n) // block))
