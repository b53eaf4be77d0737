"""The glibc allocator settings applied when reckeras is imported."""

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
