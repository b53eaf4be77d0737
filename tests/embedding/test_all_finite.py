"""`all_finite`, the guard's one-reduction finiteness flag."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from reckeras.embedding.updates import all_finite


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), max_size=50))
def test_equals_numpy_isfinite_for_values_whose_sum_fits(values):
    tensor = torch.tensor(values, dtype=torch.float32)
    finite = np.isfinite(np.asarray(values, np.float32)).all()
    if finite and np.abs(np.asarray(values, np.float64)).sum() > 3.4e38:
        return                          # the documented overflow case, below
    flag = all_finite(tensor)
    assert flag.dim() == 0 and flag.dtype == torch.bool
    assert bool(flag) == bool(finite)


@pytest.mark.parametrize("values, expected", [
    ([], True), ([1.0, -1.0], True), ([float("nan")], False), ([float("inf")], False),
    ([float("inf"), float("-inf")], False), ([3e38, 3e38], False)])  # overflow counts
def test_edge_cases(values, expected):
    assert bool(all_finite(torch.tensor(values, dtype=torch.float32))) is expected


def test_half_precision_sums_in_float32():
    big = torch.full((100,), 60000.0, dtype=torch.float16)     # sum > fp16's max
    assert bool(all_finite(big))
    assert not bool(all_finite(torch.tensor([1.0, float("nan")], dtype=torch.float16)))
