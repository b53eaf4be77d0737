"""Host memory for row arrays: how much there is, and address space reserved
without being committed, so that a large CPU table grows without moving.
"""

from __future__ import annotations

import math
import mmap
import os

import torch


def physical_host_bytes() -> int:
    """The host's physical memory in bytes: the most one array can hold.

    Returns:
        `SC_PHYS_PAGES * SC_PAGE_SIZE`.
    """
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def reserve_memory(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor over fresh anonymous memory that is reserved, not committed.

    Its pages read zeros and take host memory only once written, so a table
    can reserve room for all the rows the host could hold and grow into it
    without moving.

    Args:
        shape: the tensor's shape.
        dtype: its dtype.

    Returns:
        A writable tensor of that shape; its memory is unmapped when the
        last view of it is freed.

    Example:

    ```python
    from reckeras.embedding.host_memory import reserve_memory

    rows = reserve_memory((10**9, 16), torch.float32)   # 64 GB of address space
    rows[:3] = 1.0                                        # one page committed
    ```
    """
    nbytes = max(1, math.prod(shape)) * torch.empty(0, dtype=dtype).element_size()
    buffer = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
                       | getattr(mmap, "MAP_NORESERVE", 0))
    return torch.frombuffer(buffer, dtype=dtype).view(shape)


def available_host_bytes() -> int | None:
    """Host memory the kernel reports available (Linux), else None.

    Returns:
        Bytes of `MemAvailable` in `/proc/meminfo`, or None where it cannot
        be read.
    """
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None

