"""Shared setup of the benchmark smoke tests: `benchmarks/` on the import
path, and the workloads' structure at a size that trains in well under a
second."""

import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from workloads import WORKLOADS  # noqa: E402

# The interaction and MLP depth of each workload, with small tables; dims stay
# multiples of 4, as fbgemm's kernels need.
SMALL = {
    "dlrm": dataclasses.replace(WORKLOADS["dlrm"], name="dlrm_small",
                                vocabs=(1000,) * 4 + (10,) * 2, dim=4,
                                bottom=(16, 8, 4), top=(16, 8, 1)),
    "wide": dataclasses.replace(WORKLOADS["wide"], name="wide_small",
                                vocabs=(500,) * 10 + (10,) * 10, dim=4,
                                bottom=(8, 4), top=(8, 1)),
}


@pytest.fixture
def small_wide():
    """The small `Workload` with the structure of `wide` (concat interaction)."""
    return SMALL["wide"]


@pytest.fixture(params=sorted(SMALL))
def small_workload(request):
    """A small `Workload` with the structure of `dlrm`, then of `wide`."""
    return SMALL[request.param]
