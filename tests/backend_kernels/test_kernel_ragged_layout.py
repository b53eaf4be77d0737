"""`ragged_layout`'s entry points (the ops: native kernels where built, else
the references) and its references, against numpy."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reckeras.backend_kernels import ragged_layout

ENTRY_POINTS = {
    "op": (ragged_layout.compact_present, ragged_layout.bag_of_ids),
    "reference": (ragged_layout.compact_present_reference,
                  ragged_layout.bag_of_ids_reference),
}


def numpy_compaction(values, present):
    values, present = np.asarray(values, dtype=np.int64), np.asarray(present, dtype=bool)
    return values[present], np.concatenate([[0], np.cumsum(present, dtype=np.int64)])


@pytest.mark.parametrize("route", sorted(ENTRY_POINTS))
@settings(max_examples=40, deadline=None)
@given(rows=st.integers(0, 40), slots=st.integers(1, 6), seed=st.integers(0, 2**32 - 1),
       pattern=st.sampled_from(["drawn", "all present", "all absent", "a column absent"]))
def test_compact_present_against_numpy(route, rows, slots, seed, pattern):
    # The plan's case: a [slots, rows] id matrix and where each id is present.
    compact_present, _ = ENTRY_POINTS[route]
    rng = np.random.default_rng(seed)
    values = rng.integers(-(2**63), 2**63 - 1, size=(slots, rows), dtype=np.int64)
    present = rng.random((slots, rows)) < 0.7
    if pattern == "all present":
        present[:] = True
    elif pattern == "all absent":
        present[:] = False
    elif pattern == "a column absent":
        present[rng.integers(slots)] = False
    ids, offsets = compact_present(torch.from_numpy(values).reshape(-1),
                                   torch.from_numpy(present).reshape(-1))
    kept, expected_offsets = numpy_compaction(values.reshape(-1), present.reshape(-1))
    assert ids.dtype == offsets.dtype == torch.int64
    assert ids.tolist() == kept.tolist()
    assert offsets.tolist() == expected_offsets.tolist()


@pytest.mark.parametrize("route", sorted(ENTRY_POINTS))
@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(0, 5), max_size=200))
def test_bag_of_ids_against_numpy(route, lengths):
    _, bag_of_ids = ENTRY_POINTS[route]
    offsets = torch.tensor([0, *np.cumsum(lengths, dtype=np.int64)], dtype=torch.int64)
    bags = bag_of_ids(offsets, sum(lengths))
    assert bags.tolist() == np.repeat(np.arange(len(lengths)), lengths).tolist()


@pytest.mark.parametrize("route", sorted(ENTRY_POINTS))
def test_one_row_and_an_empty_batch(route):
    compact_present, bag_of_ids = ENTRY_POINTS[route]
    ids, offsets = compact_present(torch.tensor([5, -6, 7]), torch.tensor([True, False, True]))
    assert ids.tolist() == [5, 7] and offsets.tolist() == [0, 1, 1, 2]
    ids, offsets = compact_present(torch.zeros(0, dtype=torch.int64),
                                   torch.zeros(0, dtype=torch.bool))
    assert ids.tolist() == [] and offsets.tolist() == [0]
    assert bag_of_ids(torch.tensor([0, 1, 1, 2]), 2).tolist() == [0, 2]
    assert bag_of_ids(torch.tensor([0]), 0).tolist() == []
