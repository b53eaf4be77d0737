"""Reserved host memory: address space whose pages are committed only when written."""

import os

import torch

from reckeras.embedding.host_memory import reserve_memory


def _resident_bytes():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_reserved_memory_is_committed_only_where_written():
    before = _resident_bytes()
    rows = reserve_memory((2**27, 16), torch.float32)      # 8 GiB of address space
    assert _resident_bytes() - before < 2**24
    assert rows.shape == (2**27, 16) and float(rows[2**26].sum()) == 0.0
    rows[:2**16] = 1.0                                       # 4 MiB written
    assert 2**22 <= _resident_bytes() - before < 2**24
    assert float(rows[:2**16].mean()) == 1.0
