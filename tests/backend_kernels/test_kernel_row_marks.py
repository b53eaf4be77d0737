"""A training lookup's change marks: the torch reference and the native
kernel against a loop over the rows (written in the generation, counted
once per call however often a row repeats, row -1 in the spare last
entry), on one thread and on several."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reckeras.backend_kernels import cpu_native, row_marks


def loop_marks(written_at, seen_steps, rows, generation):
    written, seen = written_at.numpy().copy(), seen_steps.numpy().astype(np.int64)
    for row in set(rows.tolist()):
        seen[row] = min(seen[row] + 1, row_marks.INT32_MAX)
    for row in rows.tolist():
        written[row] = generation
    return written, seen.astype(np.int32)


def case(draw):
    length = draw(st.integers(1, 40))
    rows = torch.tensor(draw(st.lists(st.integers(-1, length - 2), max_size=80))
                        if length > 1 else draw(st.lists(st.just(-1), max_size=5)),
                        dtype=torch.int64)
    written = torch.tensor(draw(st.lists(st.integers(0, 9), min_size=length,
                                         max_size=length)), dtype=torch.int32)
    seen = torch.tensor(draw(st.lists(st.integers(0, 1000), min_size=length,
                                      max_size=length)), dtype=torch.int32)
    return written, seen, rows, draw(st.integers(0, 2**31 - 1))


KERNELS = [row_marks.mark_written_reference]
if cpu_native.available():
    KERNELS.append(cpu_native.mark_written)


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.__module__.split(".")[-1])
@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_marks_match_a_loop(kernel, data):
    written, seen, rows, generation = case(data.draw)
    expected = loop_marks(written, seen, rows, generation)
    kernel(written, seen, rows, generation)
    np.testing.assert_array_equal(written.numpy(), expected[0])
    np.testing.assert_array_equal(seen.numpy(), expected[1])


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.__module__.split(".")[-1])
@pytest.mark.parametrize("threads", [1, 2])
def test_many_repeated_rows_on_several_threads(kernel, threads):
    # Enough rows for the native kernel to split them over threads, each row
    # repeated in both halves: still counted once.
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(threads)
        rows = torch.randint(-1, 999, (200_000,), generator=g)
        written = torch.zeros(1000, dtype=torch.int32)
        seen = torch.randint(0, 50, (1000,), generator=g, dtype=torch.int32)
        expected = loop_marks(written, seen, rows, 7)
        kernel(written, seen, rows, 7)
        kernel(written, seen, rows[:0], 8)               # no rows: nothing changes
    finally:
        torch.set_num_threads(previous)
    np.testing.assert_array_equal(written.numpy(), expected[0])
    np.testing.assert_array_equal(seen.numpy(), expected[1])


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.__module__.split(".")[-1])
def test_counts_saturate(kernel):
    seen = torch.tensor([row_marks.INT32_MAX, row_marks.INT32_MAX - 1, 0], dtype=torch.int32)
    kernel(torch.zeros(3, dtype=torch.int32), seen, torch.tensor([0, 1, 0, 1]), 1)
    assert seen.tolist() == [row_marks.INT32_MAX, row_marks.INT32_MAX, 0]


@pytest.mark.skipif(not cpu_native.available(), reason="no C compiler")
def test_a_row_past_the_table_writes_nothing():
    written, seen = torch.zeros(5, dtype=torch.int32), torch.zeros(5, dtype=torch.int32)
    with pytest.raises(ValueError, match="mark_written: rows holds 1 values outside"):
        cpu_native.mark_written(written, seen, torch.tensor([0, 1, 4]), 3)
    assert not written.any() and not seen.any()


def test_dispatch_sends_cpu_tensors_to_the_native_kernel(monkeypatch):
    calls = []
    monkeypatch.setattr(cpu_native, "mark_written", lambda *args: calls.append(args))
    written, seen = torch.zeros(3, dtype=torch.int32), torch.zeros(3, dtype=torch.int32)
    row_marks.mark_written(written, seen, torch.tensor([0]), 1)
    assert len(calls) == (1 if cpu_native.available() else 0)
