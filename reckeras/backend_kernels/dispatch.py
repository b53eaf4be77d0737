"""The one place that decides where a kernel runs.

Every kernel family registers its entry points as torch ops in the
`reckeras` namespace (`register`), so torch's dispatcher picks the device
and `torch.compile` / `torch.export` trace through them (each op has a fake
implementation for tracing):

* CUDA tensors run the Triton kernels (the torch reference where triton is
  not installed);
* CPU tensors run the native CPU kernels (`cpu_native`: C loops compiled on
  first use, `native_build`) where one exists and `cpu_native.usable` holds
  for the op's tensors, else the torch references, which define the
  semantics that both are tested against.

Triton kernels are written as plain functions marked with `@kernel`, which
makes each a `Kernel`: a handle that `triton.jit`s its function on first
launch, in a namespace of its own (triton's language as `tl`, the module
numbers the function reads as compile-time constants, the other `Kernel`s
it calls jitted), so importing reckeras defines no kernel, imports no
triton and no module's globals are ever rewritten. Kernels use only
Triton's public language (`tl.sum`, `tl.max`, ...).

Tests send CPU tensors down the Triton route with `triton_on_cpu()`, in
Triton's interpreter, to check a caller's Triton path on a machine without a
GPU (the CPU implementation of every op consults it). The interpreter needs
`TRITON_INTERPRET=1` before `triton` is first imported (torch imports it):
`triton.language` makes its own functions interpreted or compiled then,
once (`interpreted()` tells which).
"""

import builtins
import contextlib
import importlib.util
import types
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, overload

import torch

from reckeras.backend_kernels import cpu_native

TRITON_AVAILABLE = importlib.util.find_spec("triton") is not None
NAMESPACE = "reckeras"          # of the torch ops: torch.ops.reckeras.<name>
LIBRARY = torch.library.Library(NAMESPACE, "DEF")

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
        ...   # the backward of PooledLookup takes the native kernels' shape
    ```
    """
    return not _triton_on_cpu and cpu_native.usable(*tensors, table=table)


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


def register(schema: str, *, reference: Callable, fake: Callable,
             triton: Callable | None = None, native: Callable | None = None,
             native_usable: Callable[..., bool] | None = None,
             backward: Callable | None = None,
             setup_context: Callable | None = None) -> Callable[..., Any]:
    """Defines the torch op `reckeras::<name>` of a kernel family's entry point.

    The op's CPU implementation runs `triton` inside `triton_on_cpu()`, else
    `native` where `native_usable(*args)` holds, else `reference`; its CUDA
    implementation runs `triton` (`reference` without triton installed);
    `fake` gives the shapes and dtypes of the outputs (Meta and fake
    tensors: tracing). The lower-level `torch.library.Library` API is used,
    not `torch.library.custom_op`: a call through it costs ~2 us over the
    plain function where `custom_op` costs ~10 us (measured on this
    project's CPU machine), and the sparse step calls these ops a few times.

    Args:
        schema: the op's schema without namespace, e.g. `"mix64(Tensor x) ->
            Tensor"`; arguments a kernel writes are annotated `Tensor(a!)`.
        reference: the torch reference, called with the op's arguments.
        fake: the fake implementation (`torch.library.register_fake`).
        triton: the Triton implementation (None: `reference`, which then
            serves both devices, e.g. when it calls other ops).
        native: the native CPU implementation, if any.
        native_usable: whether `native` serves these arguments.
        backward: the op's gradient formula, if it has one
            (`torch.library.register_autograd`): `backward(ctx, *grads)`
            returns one gradient (or None) per argument.
        setup_context: `setup_context(ctx, inputs, output)`, what the
            forward keeps for `backward`.

    Returns:
        The op (`torch.ops.reckeras.<name>.default`), what the entry point calls.

    Example:

    ```python
    _mix64 = register("mix64(Tensor x) -> Tensor", reference=mix64_reference,
                      triton=mix64_triton, fake=torch.empty_like)
    _mix64(torch.arange(3))       # the reference on CPU, the kernel on CUDA
    ```
    """
    name = schema[:schema.index("(")]
    triton = triton or reference
    on_cuda = triton if TRITON_AVAILABLE else reference

    def on_cpu(*args: Any) -> Any:
        if _triton_on_cpu:
            return triton(*args)
        if native is not None and native_usable is not None and native_usable(*args):
            return native(*args)
        return reference(*args)

    LIBRARY.define(schema)
    LIBRARY.impl(name, on_cpu, "CPU")
    LIBRARY.impl(name, on_cuda, "CUDA")
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=LIBRARY)
    if backward is not None:
        torch.library.register_autograd(f"{NAMESPACE}::{name}", backward,
                                        setup_context=setup_context, lib=LIBRARY)
    return getattr(torch.ops.reckeras, name).default


if TYPE_CHECKING:
    # To a type checker a compile-time argument is the number or flag it is
    # launched with, which the kernel's body computes with (`range(0, n, BLOCK)`).
    constexpr = Any
else:
    class constexpr:  # noqa: N801 - read by name, as triton.language.constexpr
        """Annotation of a compile-time kernel argument (`BLOCK: constexpr`).

        Triton reads a parameter whose annotation is named `constexpr` as a
        compile-time argument, so this stand-in serves without importing triton.

        Example:

        ```python
        @kernel
        def _scale_kernel(x_ptr, n, BLOCK: constexpr):
            ...
        ```
        """


class Kernel:
    """A Triton kernel or device function, jitted on its first launch.

    What `@kernel` makes of a plain function; the module stores this handle.
    `kernel[grid](...)` launches it as a `triton.jit` function; another
    kernel's body calls it by its name, as Triton device functions are
    called (`jit` binds that name to the callee's jitted function; calling
    the handle calls that function, which Triton allows inside kernels only).

    Args:
        fn: the function, written in Triton's language as `tl`.
        do_not_specialize: integer arguments that vary with the data.

    Example:

    ```python
    @kernel
    def _copy_kernel(src_ptr, dst_ptr, n, BLOCK: constexpr):
        ...

    _copy_kernel[(blocks(n, 1024),)](src, dst, n, BLOCK=1024)
    ```
    """

    def __init__(self, fn: Callable, do_not_specialize: Iterable[str] = ()):
        self.fn = fn
        self.do_not_specialize = tuple(do_not_specialize)
        self._jitted = None

    def __repr__(self) -> str:
        return f"<Kernel {self.fn.__module__}.{self.fn.__qualname__}>"

    def __getitem__(self, grid: tuple[int, ...] | Callable[..., tuple[int, ...]]
                    ) -> Callable[..., Any]:
        return self.jit()[grid]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.jit()(*args, **kwargs)

    def jit(self) -> Any:
        """The `triton.jit` function of this kernel (made on the first call).

        Its function is a copy of `fn` over its own globals: the names `fn`
        reads from its module, the `Kernel`s among them jitted and the int
        and float numbers made `tl.constexpr` (compiled Triton reads globals
        only as compile-time constants; the interpreter reads them as they
        are), `tl` bound to `triton.language` and `constexpr` to
        `tl.constexpr` (the compiler resolves annotations by name). Interpreted or compiled
        follows `TRITON_INTERPRET`, as `triton.jit` does.

        Returns:
            The `triton.jit` function.
        """
        if self._jitted is None:
            import triton
            import triton.language as tl

            constant = (lambda v: v) if triton.knobs.runtime.interpret else tl.constexpr
            namespace = {"__builtins__": builtins, "__name__": self.fn.__module__, "tl": tl,
                         "constexpr": tl.constexpr}     # what annotations resolve to
            for name in self.fn.__code__.co_names:
                value = self.fn.__globals__.get(name)
                if isinstance(value, Kernel):
                    namespace[name] = value.jit()
                elif isinstance(value, (int, float)) and not isinstance(value, bool):
                    namespace[name] = constant(value)
                elif name in self.fn.__globals__:
                    namespace[name] = value
            source = types.FunctionType(self.fn.__code__, namespace, self.fn.__name__,
                                        self.fn.__defaults__, self.fn.__closure__)
            source.__qualname__ = self.fn.__qualname__
            source.__annotations__ = self.fn.__annotations__
            source.__doc__ = self.fn.__doc__
            self._jitted = triton.jit(source, do_not_specialize=self.do_not_specialize)
        return self._jitted


@overload
def kernel(fn: Callable) -> Kernel: ...


@overload
def kernel(*, do_not_specialize: Iterable[str]) -> Callable[[Callable], Kernel]: ...


def kernel(fn: Callable | None = None, *,
           do_not_specialize: Iterable[str] = ()) -> Kernel | Callable[[Callable], Kernel]:
    """Makes `fn` a Triton kernel or device function (a `Kernel` handle).

    Args:
        fn: the function; omitted when the decorator takes arguments.
        do_not_specialize: integer arguments that vary with the data (counts,
            lengths): Triton would otherwise compile one variant per value
            class (1, multiple of 16, other) of each.

    Returns:
        The `Kernel` of `fn` (or the decorator that makes it).

    Example:

    ```python
    @kernel(do_not_specialize=("n",))
    def _copy_kernel(src_ptr, dst_ptr, n, BLOCK: constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < n), mask=offs < n)
    ```
    """
    if fn is None:
        return lambda f: Kernel(f, do_not_specialize)
    return Kernel(fn, do_not_specialize)


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
