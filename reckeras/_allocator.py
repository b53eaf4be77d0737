"""Keeps freed tensor memory in the process instead of returning it to the OS.

A training step on CPU allocates and frees the same large buffers every batch
(pooled embeddings, activations, their gradients: megabytes each). glibc's
defaults serve blocks above a dynamic threshold with `mmap` and give them
back with `munmap` when freed, so every step touches fresh pages and pays a
page fault per 4 KiB: on the `wide` benchmark workload that was a fifth of
the step. This is why PyTorch's CPU performance guide suggests jemalloc or
tcmalloc; reckeras gets the same effect from glibc itself with four
`mallopt` settings, applied when training starts (`rk.Model.fit` and
`fit_windows` call `tune_malloc`), never at `import reckeras`:

* `M_MMAP_THRESHOLD` 32 MiB (glibc's maximum): smaller blocks come from
  the heap and are reused;
* `M_MMAP_MAX` 0: larger blocks too. The threshold cannot go above 32 MiB,
  and at a thousand fields a step's largest buffers are over it (the pooled
  `[2048, 8000]` float32 output, its concatenation with the dense tower and
  their gradients: 65 MB each); served by `mmap`, each cost its 16k page
  faults again every step, ~15% of the `huge` workload's step;
* `M_TRIM_THRESHOLD` 2 GiB - 1 (mallopt takes an int): freed heap memory
  stays with the process;
* `M_TOP_PAD` 256 MiB: the heap grows in large steps.

The process keeps its peak memory until it exits, which is what a training
job does anyway, with one exception: an embedding table that grows frees
its old arrays, which at 10^8 rows are gigabytes never needed again, and
`release_free_memory` hands those pages back to the OS. The settings are
process-wide and stay for the rest of the process: turn the option off with
`rk.config.set(malloc_tuning=False)` (or `RECKERAS_MALLOC_TUNING=0`) before
the first `fit` to leave the allocator alone. On a libc other than glibc
nothing changes. Measured on the `wide` workload: ~5,800 page faults a step
with glibc's defaults, ~1,000 tuned (docs/performance.md).
"""

import ctypes
import ctypes.util
import platform

from reckeras import config

# mallopt parameter numbers from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4

_SETTINGS = ((_M_MMAP_THRESHOLD, 32 * 2**20), (_M_MMAP_MAX, 0),
             (_M_TRIM_THRESHOLD, 2**31 - 1), (_M_TOP_PAD, 256 * 2**20))


def tune_malloc() -> bool:
    """Applies the `mallopt` settings above to this process, when the
    `malloc_tuning` option (`rk.config`) is on.

    Does nothing when the option is off or the libc is not glibc. `fit`
    calls it before training; once applied, calling it again changes nothing.

    Returns:
        Whether the settings are in force (applied now or by an earlier
        call) and glibc accepted them all.

    Example:

    ```python
    from reckeras._allocator import tune_malloc

    tune_malloc()   # True on glibc, False elsewhere
    ```
    """
    global _tuned_libc
    if _tuned_libc is not None:
        return True
    if not config.options().malloc_tuning:
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = _glibc()
    tuned = all(libc.mallopt(ctypes.c_int(parameter), ctypes.c_int(value)) == 1
                for parameter, value in _SETTINGS)
    _tuned_libc = libc if tuned else None
    return tuned


_tuned_libc: ctypes.CDLL | None = None


def _glibc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")


def release_free_memory() -> bool:
    """Returns the heap's free pages to the OS (glibc's `malloc_trim`).

    With the settings above freed memory stays in the process; an embedding
    table calls this after it grows, when it has just freed its old arrays.
    It takes a few milliseconds on a heap of gigabytes (tables grow by
    doubling, so it runs a few dozen times in a job).

    Returns:
        Whether memory was handed back (False when the settings are not in
        force, or when nothing was free).

    Example:

    ```python
    from reckeras._allocator import release_free_memory

    release_free_memory()
    ```
    """
    return bool(_tuned_libc is not None and _tuned_libc.malloc_trim(ctypes.c_size_t(0)))
