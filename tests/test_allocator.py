"""The glibc allocator settings applied when reckeras is imported."""

import os
import platform

import pytest

from reckeras._allocator import tune_malloc

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


@pytest.mark.skipif(not GLIBC, reason="the settings exist only in glibc")
def test_glibc_accepts_every_setting():
    assert tune_malloc() is True


def test_opt_out_leaves_the_allocator_alone(monkeypatch):
    monkeypatch.setenv("RECKERAS_MALLOC_TUNING", "0")
    assert tune_malloc() is False



def _mapped(address):
    """Whether `address` lies in one of this process's mappings."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            low, high = (int(bound, 16) for bound in line.split()[0].split("-"))
            if low <= address < high:
                return True
    return False


def _resident_mb():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(not GLIBC, reason="the settings exist only in glibc")
def test_a_buffer_above_the_mmap_threshold_stays_mapped_when_freed():
    # A step's 65 MB buffers: served by mmap, each is unmapped when freed and
    # the next step faults in its 16k pages again; from the malloc arena, a
    # freed one stays mapped for the next.
    import torch
    assert tune_malloc() is True
    buffer = torch.empty(64 * 2**18)                 # float32: 64 MB
    middle = buffer.data_ptr() + 32 * 2**20
    del buffer
    assert _mapped(middle)


@pytest.mark.skipif(not GLIBC, reason="the settings exist only in glibc")
def test_freed_memory_stays_until_released():
    import torch

    from reckeras._allocator import release_free_memory
    assert tune_malloc() is True
    buffer = torch.empty(512 * 2**18).fill_(1.0)      # 512 MB
    del buffer
    kept = _resident_mb()
    assert release_free_memory() is True
    assert kept - _resident_mb() > 400, (kept, _resident_mb())
