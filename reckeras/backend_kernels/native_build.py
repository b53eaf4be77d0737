"""The build of the native CPU kernels: `cpu_native.c` and `arrow_columns.c` ->
one shared library.

The one place that compiles C. `cpu_native.library()` calls `build` on its
first use; the library is compiled with the system C compiler (`$CC`, else
`cc`) into `rk.config`'s `cache_dir` (`RECKERAS_CACHE_DIR`, default
`~/.cache/reckeras`), named by a hash of the source and the flags, so a
build happens once per source version and later processes load the file:

* optimized: `-O3 -fopenmp` (the parallel loops run on torch's own OpenMP
  threads, see cpu_native.c), or `-O3` alone where the compiler has no
  OpenMP (the same loops, one thread);
* sanitized (`RECKERAS_NATIVE_SANITIZE=1`, `rk.config`'s
  `native_sanitize`): AddressSanitizer and UndefinedBehaviorSanitizer, a
  file of its own, and no fallback.

A failed build raises `BuildError`, whose message names what is missing and
what to install; `cpu_native.library()` turns it into a warning (the torch
references run instead) or, for the sanitized build, an error.
"""

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from reckeras import config

# The C sources, compiled together: the sparse kernels, and the Arrow columns'
# conversion (`arrow_columns`).
SOURCES = tuple(Path(__file__).with_name(name) for name in ("cpu_native.c", "arrow_columns.c"))
_FLAGS = ["-fPIC", "-shared", "-std=gnu99"]
_OPTIMIZED = ["-O3"]
# -O1 keeps the reports' stack traces readable; -fno-sanitize-recover makes
# undefined behaviour abort like a memory error instead of printing and going on.
# -U__SSE2__: the sanitized build compiles the portable code where the C has an
# SSE2 path (x86-64 always has SSE2), so that the tests run both.
_SANITIZE_FLAGS = ["-O1", "-g", "-fsanitize=address,undefined", "-fno-omit-frame-pointer",
                   "-fno-sanitize-recover=all", "-U__SSE2__"]
_INSTALL = ("install a C compiler (Debian/Ubuntu: `apt-get install gcc`; Fedora: "
            "`dnf install gcc`; macOS: `xcode-select --install`) or set CC to one")


class BuildError(RuntimeError):
    """The native kernels could not be compiled; the message says why.

    Example:

    ```python
    try:
        native_build.build(sanitize=False)
    except native_build.BuildError as error:
        print(error)   # e.g. "no C compiler: `cc` is not on PATH; install ..."
    ```
    """


def compiler() -> str:
    """The path of the C compiler the build runs.

    Returns:
        The path of `$CC` (a name looked up on `PATH`, or a path), else of `cc`.

    Raises:
        BuildError: when that compiler cannot be found, naming it and what to
            install.

    Example:

    ```python
    native_build.compiler()   # '/usr/bin/cc'
    ```
    """
    name = os.environ.get("CC") or "cc"
    found = shutil.which(name)
    if found is None:
        origin = "CC" if os.environ.get("CC") else "the default C compiler"
        raise BuildError(f"no C compiler: {name!r} ({origin}) is not an executable "
                         f"on PATH; the native CPU kernels are compiled from C on first "
                         f"use: {_INSTALL}")
    return found


def build(sanitize: bool) -> Path:
    """The compiled library, built into the cache directory if not there yet.

    Args:
        sanitize: build with AddressSanitizer and UndefinedBehaviorSanitizer
            (and OpenMP, with no fallback) instead of optimized.

    Returns:
        The path of the shared library.

    Raises:
        BuildError: when no compiler is found or the compiler fails (its
            error output in the message).

    Example:

    ```python
    from reckeras.backend_kernels import native_build

    native_build.build(sanitize=False)   # ~/.cache/reckeras/cpu_native-<hash>-linux.so
    ```
    """
    if sanitize:
        # No fallback: a sanitized run that quietly lost OpenMP (or the
        # sanitizers) would test something else than it says.
        return _build(_FLAGS + _SANITIZE_FLAGS + ["-fopenmp"])
    try:
        return _build(_FLAGS + _OPTIMIZED + ["-fopenmp"])
    except _CompileError:
        return _build(_FLAGS + _OPTIMIZED)      # no OpenMP here: the same loops, one thread


class _CompileError(BuildError):
    """The compiler ran and failed (as opposed to: none was found)."""


def _build(flags: list[str]) -> Path:
    """The library for `flags`, compiled once into the cache directory."""
    source = b"".join(path.read_bytes() for path in SOURCES)
    digest = hashlib.sha256(source + " ".join(flags).encode()).hexdigest()[:16]
    kind = "-sanitized" if "-fsanitize=address,undefined" in flags else ""
    target = config.options().cache_dir / f"cpu_native{kind}-{digest}-{sys.platform}.so"
    if target.exists():
        return target
    command = [compiler(), *flags, *map(str, SOURCES), "-o", "<target>", "-lm"]
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            built = Path(tmp) / target.name
            command[-2] = str(built)
            subprocess.run(command, check=True, capture_output=True, timeout=120)
            os.replace(built, target)      # atomic: concurrent builders agree
    except subprocess.CalledProcessError as error:
        detail = (error.stderr or b"").decode(errors="replace").strip()[:600]
        raise _CompileError(f"{' '.join(command)} failed (exit {error.returncode}): "
                         f"{detail}") from error
    except (OSError, subprocess.SubprocessError) as error:
        raise BuildError(f"{' '.join(command)} could not run: {error}") from error
    return target
