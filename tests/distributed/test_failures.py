"""A hung rank or mismatched configs fail clearly instead of hanging."""

import pytest

from launch import torchrun

pytestmark = pytest.mark.slow  # spawns torchrun processes


def test_hung_rank_makes_others_fail_within_timeout():
    result = torchrun("failures.py", 2, "hang", check=False, timeout=150)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "PeerFailureError" in output
    assert "hung for more than 5 s" in output
    elapsed = float(output.split("FAILED_AFTER=")[1].split()[0])
    assert elapsed < 60


def test_different_table_configs_are_detected():
    result = torchrun("failures.py", 2, "config", check=False, timeout=150)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "configuration differs across ranks" in output
    assert "('a', 'a', 4)" in output and "('a', 'a', 8)" in output
