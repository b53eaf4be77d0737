"""Keeps freed tensor memory in the process instead of returning it to the OS.

A training step on CPU allocates and frees the same large buffers every batch
(pooled embeddings, activations, their gradients: megabytes each). glibc's
defaults serve blocks above a dynamic threshold with `mmap` and give them
back with `munmap` when freed, so every step touches fresh pages and pays a
page fault per 4 KiB: on the `wide` benchmark workload that was a fifth of
the step. This is why PyTorch's CPU performance guide suggests jemalloc or
tcmalloc; reckeras gets the same effect from glibc itself with three
`mallopt` settings, applied once when reckeras is imported:

* `M_MMAP_THRESHOLD` 32 MiB (glibc's maximum): smaller blocks come from
  the heap and are reused;
* `M_TRIM_THRESHOLD` 2 GiB - 1 (mallopt takes an int): freed heap memory
  stays with the process;
* `M_TOP_PAD` 256 MiB: the heap grows in large steps.

The process keeps its peak memory until it exits, which is what a training
job does anyway. The settings are process-wide. Set
`RECKERAS_MALLOC_TUNING=0` to leave the allocator alone; on a libc other
than glibc nothing changes.
"""

import ctypes
import ctypes.util
import os
import platform

# mallopt parameter numbers from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3

_SETTINGS = ((_M_MMAP_THRESHOLD, 32 * 2**20), (_M_TRIM_THRESHOLD, 2**31 - 1),
             (_M_TOP_PAD, 256 * 2**20))


def tune_malloc() -> bool:
    """Applies the `mallopt` settings above to this process.

    Does nothing when `RECKERAS_MALLOC_TUNING=0` or the libc is not glibc.
    `import reckeras` calls it once; calling it again changes nothing.

    Returns:
        Whether the settings were applied and glibc accepted them all.

    Example:

    ```python
    from reckeras._allocator import tune_malloc

    tune_malloc()   # True on glibc, False elsewhere
    ```
    """
    if os.environ.get("RECKERAS_MALLOC_TUNING", "1") == "0":
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    return all(libc.mallopt(ctypes.c_int(parameter), ctypes.c_int(value)) == 1
               for parameter, value in _SETTINGS)
