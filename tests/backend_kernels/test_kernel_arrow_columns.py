"""`arrow_columns.read_block` (native kernel where built, else the reference)
and its reference, against numpy: the values and nulls a batch was built
from. Run under the sanitizers by scripts/test_sanitized.sh."""

import itertools

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reckeras.backend_kernels import arrow_columns, cpu_native

ROUTES = {
    "native": arrow_columns.read_block_native,
    "reference": arrow_columns.read_block_reference,
}
ID_TYPES = {"int64": np.int64, "int32": np.int32}
NUMBER_TYPES = {**ID_TYPES, "float32": np.float32, "float64": np.float64}
NULLS = ["none", "drawn", "all"]


def route(name):
    if name == "native" and not cpu_native.available():
        pytest.skip("no native kernels here")
    return ROUTES[name]


def drawn_columns(rng, rows, types, nulls):
    """`{name: (values, missing)}` numpy arrays of `rows` rows."""
    columns = {}
    for j, (type_name, null_kind) in enumerate(zip(types, nulls, strict=True)):
        dtype = NUMBER_TYPES[type_name]
        if np.issubdtype(dtype, np.integer):
            info = np.iinfo(dtype)
            values = rng.integers(info.min, info.max, size=rows, dtype=dtype, endpoint=True)
        else:
            values = (rng.standard_normal(rows) * 1e3).astype(dtype)
        missing = {"none": np.zeros(rows, bool), "all": np.ones(rows, bool),
                   "drawn": rng.random(rows) < 0.4}[null_kind]
        columns[f"c{j}"] = (values, missing)
    return columns


def as_batch(columns, offset, chunks):
    """A Table of the columns, sliced `offset` rows in (unaligned bitmaps)
    and cut into `chunks` chunks; a column without a null has no bitmap."""
    arrays = {name: pa.array(values, mask=missing if missing.any() else None)
              for name, (values, missing) in columns.items()}
    table = pa.table(arrays).slice(offset)
    rows, cuts = table.num_rows, np.linspace(0, table.num_rows, chunks + 1).astype(int)
    if chunks > 1 and rows:
        table = pa.Table.from_batches([table.slice(a, b - a).to_batches()[0]
                                       for a, b in itertools.pairwise(cuts)
                                       if b > a] or table.to_batches())
    return table


@pytest.mark.parametrize("name", sorted(ROUTES))
@settings(max_examples=60, deadline=None)
@given(data=st.data(), rows=st.integers(1, 70), offset=st.integers(0, 17),
       chunks=st.integers(1, 3), numbers=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_read_block_against_numpy(name, data, rows, offset, chunks, numbers, seed):
    read = route(name)
    types = NUMBER_TYPES if numbers else ID_TYPES
    width = data.draw(st.integers(1, 5))
    kinds = data.draw(st.lists(st.sampled_from(sorted(types)), min_size=width,
                               max_size=width))
    nulls = data.draw(st.lists(st.sampled_from(NULLS), min_size=width, max_size=width))
    rng = np.random.default_rng(seed)
    columns = drawn_columns(rng, rows + offset, kinds, nulls)
    table = as_batch(columns, offset, chunks)
    # Read in a drawn order, beside a column the block does not read.
    table = table.append_column("other", pa.array(["x"] * rows))
    order = rng.permutation(width)
    lengths = np.full((rows, width + 2), -7, np.int32, order="F")
    lengths_columns = (order + 1).astype(np.int64)
    block = read(table, order.astype(np.int64), numbers,
                 None if numbers else lengths, None if numbers else lengths_columns)

    missing = np.stack([columns[f"c{j}"][1][offset:] for j in order], axis=1)
    values = [columns[f"c{j}"][0][offset:] for j in order]
    if numbers:
        expected = np.stack(values, axis=1).astype(np.float32)
        expected[missing] = np.nan
        assert block.matrix.dtype == np.float32
        np.testing.assert_array_equal(block.matrix, expected)     # NaN == NaN here
        infinite = np.isinf(expected).any(axis=0)
        assert block.first_infinite == (int(infinite.argmax()) if infinite.any() else -1)
    else:
        expected = np.where(missing, 0, np.stack(values, axis=1).astype(np.int64))
        assert block.matrix.dtype == np.int64
        assert block.matrix.tolist() == expected.tolist()
        written = lengths[:, lengths_columns]
        if missing.any():
            assert written.tolist() == (~missing).astype(np.int32).tolist()
        else:
            assert (written == -7).all()                      # not written
        assert (lengths[:, [0, width + 1]] == -7).all()       # other columns untouched
    assert block.matrix.flags.f_contiguous and block.matrix.shape == (rows, width)
    assert block.with_nulls == int(missing.any(axis=0).sum())


@pytest.mark.parametrize("name", sorted(ROUTES))
def test_infinite_numbers_are_reported_where_they_first_are(name):
    read = route(name)
    batch = pa.record_batch({"a": pa.array([1.0, 2.0]), "b": pa.array([3, None]),
                             "c": pa.array([np.inf, 0.0], pa.float32()),
                             # finite as float64, +inf once cast to float32
                             "d": pa.array([1e300, 0.0])})
    assert read(batch, np.array([0, 1]), True).first_infinite == -1
    assert read(batch, np.array([1, 3, 2]), True).first_infinite == 1
    assert read(batch, np.array([2, 3]), True).first_infinite == 0


@pytest.mark.parametrize("name", sorted(ROUTES))
def test_columns_a_block_cannot_read_are_refused_naming_them(name):
    read = route(name)
    batch = pa.record_batch({"ids": pa.array([1, 2]), "x": pa.array([0.5, 1.0]),
                             "s": pa.array(["a", "b"]), "u": pa.array([1, 2], pa.uint64())})
    lengths = np.full((2, 1), -7, np.int32, order="F")
    for position, numbers in ((1, False), (2, True), (3, False)):
        column = batch.schema.names[position]
        with pytest.raises(ValueError, match=f"column '{column}'"):
            read(batch, np.array([0, position]), numbers,
                 *(() if numbers else (np.pad(lengths, ((0, 0), (0, 1))).copy(order="F"),
                                       np.array([0, 1]))))
    with pytest.raises(ValueError, match="position 4 is not a column"):
        read(batch, np.array([0, 4]), False)
    assert (lengths == -7).all()


@pytest.mark.parametrize("name", sorted(ROUTES))
def test_outputs_that_do_not_fit_are_refused(name):
    read = route(name)
    batch = pa.record_batch({"a": pa.array([1, None]), "b": pa.array([3, 4])})
    positions = np.array([0, 1])
    good = np.zeros((2, 2), np.int32, order="F")
    bad_lengths = {
        "rows": np.zeros((3, 2), np.int32, order="F"),
        "dtype": np.zeros((2, 2), np.int64, order="F"),
        "layout": np.zeros((2, 2), np.int32, order="C"),
    }
    for lengths in bad_lengths.values():
        with pytest.raises(ValueError, match="lengths must be"):
            read(batch, positions, False, lengths, np.array([0, 1]))
    for columns in (np.array([0, 2]), np.array([-1, 0]), np.array([0, 1], np.int32),
                    np.array([0])):
        with pytest.raises(ValueError, match="lengths_columns must"):
            read(batch, positions, False, good, columns)
    with pytest.raises(ValueError, match="go together"):
        read(batch, positions, False, good)
    with pytest.raises(TypeError, match="RecordBatch or Table"):
        read({"a": [1]}, positions, False)
    assert (good == 0).all()


def test_the_entry_point_takes_the_native_kernel_where_built(monkeypatch):
    called = []
    monkeypatch.setattr(arrow_columns, "read_block_native",
                        lambda *args: called.append("native"))
    monkeypatch.setattr(arrow_columns, "read_block_reference",
                        lambda *args: called.append("reference"))
    arrow_columns.read_block(pa.record_batch({"a": [1]}), np.array([0]), False)
    assert called == ["native" if cpu_native.available() else "reference"]
