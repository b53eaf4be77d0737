"""Host-side encoding and its errors."""

import decimal

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import reckeras as rk
from reckeras.backend_kernels.hashing import hash_strings
from reckeras.features.encode import FeatureInputError, encode, rows_to_columns
from reckeras.features.specs import LENGTHS, deserialize, serialize

SPECS = [rk.features.Numeric("n", default=2.0),
         rk.features.Categorical("c", dim=4),
         rk.features.Categorical("s", dim=4, dtype="string"),
         rk.features.Categorical("b", dim=4, boundaries=[0.0]),
         rk.features.Sequence("q", dim=4, max_len=3)]


def batch(**overrides):
    columns = {"n": pa.array([1.5, None, 3.0]),
               "c": pa.array([7, None, 0], pa.int64()),
               "s": pa.array(["a", None, "é1"]),
               "b": pa.array([None, -1.0, 2.0]),
               "q": pa.array([[1, 2, 3, 4, 5], [], None], pa.list_(pa.int64()))}
    columns.update(overrides)
    return pa.table(columns)


def string_hash(text):
    data = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    return int(hash_strings(data, np.array([0, len(data)]))[0])


def test_encode_values():
    out = encode(SPECS, batch())
    np.testing.assert_array_equal(out["n"], np.array([1.5, np.nan, 3.0], np.float32))
    # A null has no id: 0 in the ids, length 0 in LENGTHS.
    assert out["c"].tolist() == [7, 0, 0]
    assert out["s"].tolist() == [string_hash("a"), 0, string_hash("é1")]
    assert np.isnan(out["b"][0]) and out["b"][1:].tolist() == [-1.0, 2.0]
    # Longer sequences keep their last max_len ids; rows are left-aligned.
    assert out["q"].tolist() == [[3, 4, 5], [0, 0, 0], [0, 0, 0]]
    # Columns of LENGTHS: the id Categoricals c, s, then the Sequence q.
    assert out[LENGTHS].dtype == np.int32
    assert out[LENGTHS].tolist() == [[1, 1, 3], [0, 0, 0], [1, 1, 0]]


def test_every_int64_value_is_an_id():
    extremes = [-2**63, -1, 0, 2**63 - 1, -5]
    out = encode([rk.features.Categorical("c", dim=4),
                  rk.features.Sequence("q", dim=4, max_len=4)],
                 {"c": pa.array(extremes, pa.int64()),
                  "q": pa.array([[-1, -1], [-2**63], [], [0, -1, 2**63 - 1], None])})
    assert out["c"].tolist() == extremes
    assert out["q"][:, :3].tolist() == [[-1, -1, 0], [-2**63, 0, 0], [0, 0, 0],
                                        [0, -1, 2**63 - 1], [0, 0, 0]]
    assert out[LENGTHS].tolist() == [[1, 2], [1, 1], [1, 0], [1, 3], [1, 0]]


def test_uint64_ids_keep_their_64_bits():
    # An unsigned 64-bit hash (Spark's xxhash64 read as uint64) is the same
    # bit pattern as the signed one: both name the same row.
    unsigned = np.array([2**64 - 1, 2**63, 5], dtype=np.uint64)
    out = encode([rk.features.Categorical("c", dim=4)], {"c": pa.array(unsigned)})
    assert out["c"].tolist() == unsigned.view(np.int64).tolist() == [-1, -2**63, 5]


def test_string_hash_is_fnv1a_then_mix():
    # FNV-1a 64 of "a" is 0xaf63dc4c8601ec8c (published test vector).
    from reckeras.backend_kernels.hashing import mix64_numpy, INT64_MAX
    fnv = np.array([0xAF63DC4C8601EC8C], dtype=np.uint64)
    assert string_hash("a") == int(mix64_numpy(fnv)[0] & INT64_MAX)
    assert string_hash("a") >= 0


def test_dict_input_and_padded_sequences():
    # A 2-D array holds full rows (-1 is an id like any other) ...
    out = encode(SPECS, {"n": [1.0], "c": [3], "s": ["x"], "b": [0.5],
                         "q": np.array([[9, -1]])})
    assert out["q"].tolist() == [[9, -1, 0]] and out[LENGTHS][:, 2].tolist() == [2]
    # ... a masked one is padded: masked entries are not ids.
    padded = np.ma.masked_array([[9, -1, 4, 5], [7, 0, 0, 0], [0, 8, 0, 6]],
                                mask=[[0, 0, 0, 0], [0, 1, 1, 1], [1, 0, 1, 0]])
    out = encode([SPECS[4]], {"q": padded})
    assert out["q"].tolist() == [[-1, 4, 5], [7, 0, 0], [8, 6, 0]]
    assert out[LENGTHS].tolist() == [[3], [1], [2]]


def test_rows_are_their_columns_and_must_all_hold_every_column():
    rows = [{"n": 1.0, "c": 3, "s": "x", "b": 0.5, "q": [9, 4]},
            {"n": None, "c": None, "s": "y", "b": 1.5, "q": []}]
    columns = encode(SPECS, {key: [row[key] for row in rows] for key in rows[0]})
    from_rows = encode(SPECS, rows)
    assert from_rows.keys() == columns.keys()
    for name in columns:
        np.testing.assert_array_equal(from_rows[name], columns[name])
    assert rows_to_columns(rows, ["s", "zz"]) == {"s": ["x", "y"]}
    with pytest.raises(FeatureInputError, match="feature 'q': instance 1 has no value"):
        encode(SPECS, [rows[0], {k: v for k, v in rows[1].items() if k != "q"}])
    with pytest.raises(FeatureInputError, match="instance 0 is not an object"):
        encode(SPECS, [[1.0, 3]])
    with pytest.raises(TypeError, match="list of dicts"):
        encode(SPECS, [])


@pytest.mark.parametrize("overrides, message", [
    ({"c": pa.array(["1", "2", "3"])}, "feature 'c' is declared int64 but the column holds strings"),
    ({"s": pa.array([1, 2, 3])}, "feature 's' is declared string"),
    ({"n": pa.array(["x", "y", "z"])}, "feature 'n': expected a numeric column, got "
                                        "string; .* from_csv\\(null_values=...\\)"),
    ({"n": pa.array([1.0, np.inf, 0.0])}, "feature 'n': column holds \\+-inf"),
    ({"q": pa.array([1, 2, 3])}, "feature 'q': expected a list column"),
    ({"q": pa.array([[1, None], [], []], pa.list_(pa.int64()))}, "feature 'q': null inside"),
    ({"c": pa.array([1.0, 2.5, 3.0])}, "feature 'c': float ids must be whole numbers"),
    ({"c": pa.array([1.0, 2.0**60, 3.0])}, "feature 'c': float ids must be whole numbers"),
    ({"s": pa.array([1.0, 2.0, 3.0])}, "feature 's' is declared string"),
    ({"c": pa.array([True, False, True])}, "feature 'c': expected integer, string, whole "
                                           "float or dictionary-encoded ids, got bool"),
])
def test_bad_input_names_the_feature(overrides, message):
    with pytest.raises(FeatureInputError, match=message):
        encode(SPECS, batch(**overrides))


@settings(max_examples=60, deadline=None)
@given(entries=st.lists(st.one_of(st.none(), st.text(max_size=3)), max_size=6),
       rows=st.lists(st.one_of(st.none(), st.integers(0, 5)), min_size=1, max_size=20),
       as_ints=st.booleans())
def test_dictionary_encoded_ids_are_the_ids_of_their_values(entries, rows, as_ints):
    # A pandas categorical or a parquet dictionary page: the ids (and which
    # are missing) are those of the decoded column.
    if as_ints:
        entries = [None if e is None else len(e) * 1000 + sum(map(ord, e)) for e in entries]
    values = pa.array(entries, pa.int64() if as_ints else pa.string())
    indices = [None if i is None or i >= len(entries) else i for i in rows]
    column = pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()), values)
    spec = rk.features.Categorical("c", dim=4, dtype="int64" if as_ints else "string")
    encoded = encode([spec], {"c": column})
    decoded = encode([spec], {"c": column.dictionary_decode()})
    np.testing.assert_array_equal(encoded["c"], decoded["c"])
    np.testing.assert_array_equal(encoded[LENGTHS], decoded[LENGTHS])


@settings(max_examples=60, deadline=None)
@given(ids=st.lists(st.one_of(st.none(), st.integers(-2**53, 2**53)), min_size=1,
                    max_size=20))
def test_whole_float_ids_are_the_int_ids_and_nan_is_missing(ids):
    # pandas turns an int column with missing values into float64 with NaN.
    floats = np.array([np.nan if i is None else float(i) for i in ids])
    spec = rk.features.Categorical("c", dim=4)
    from_floats = encode([spec], {"c": floats})
    from_ints = encode([spec], {"c": pa.array(ids, pa.int64())})
    np.testing.assert_array_equal(from_floats["c"], from_ints["c"])
    np.testing.assert_array_equal(from_floats[LENGTHS], from_ints[LENGTHS])


def test_missing_column_and_empty_batch():
    with pytest.raises(FeatureInputError, match="feature 'c': the batch has no column 'c'"):
        encode(SPECS, batch().drop(["c"]))
    with pytest.raises(FeatureInputError, match="empty batch"):
        encode(SPECS, batch().slice(0, 0))


def test_large_integer_counts_become_float32():
    out = encode([rk.features.Numeric("n")], {"n": pa.array([17431178, 2**40, None])})
    np.testing.assert_allclose(out["n"][:2], [17431178.0, 2.0**40], rtol=1e-7)
    assert np.isnan(out["n"][2])


def _wide_table(rng, rows, num_ids, num_floats, chunks, nulls, id_type=pa.int64(),
                number_type=pa.float32()):
    columns = {}
    for j in range(num_ids):
        values = rng.integers(-50, 50, rows)
        mask = (rng.random(rows) < 0.3) if nulls else None
        columns[f"c{j}"] = pa.array(values, id_type, mask=mask)
    for j in range(num_floats):
        mask = (rng.random(rows) < 0.3) if nulls else None
        # Under a null the buffer keeps its value: encoding must not read it.
        values = rng.normal(size=rows) * 100
        columns[f"f{j}"] = pa.array(values if pa.types.is_floating(number_type)
                                    else values.astype(np.int64), number_type, mask=mask)
    table = pa.table(columns)
    if chunks > 1:          # the same rows in several record batches
        bounds = np.linspace(0, rows, chunks + 1).astype(int)
        table = pa.Table.from_batches(
            [b for lo, hi in zip(bounds[:-1], bounds[1:])
             for b in table.slice(lo, hi - lo).to_batches()])
    return table


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 40), num_ids=st.integers(0, 6), num_floats=st.integers(0, 4),
       chunks=st.integers(1, 3), nulls=st.booleans(), start=st.integers(0, 11),
       seed=st.integers(0, 2**16), id_type=st.sampled_from([pa.int64(), pa.int32()]),
       number_type=st.sampled_from([pa.float32(), pa.float64(), pa.int64(), pa.int32()]))
def test_block_encoding_equals_one_feature_at_a_time(rows, num_ids, num_floats, chunks,
                                                     nulls, start, seed, id_type,
                                                     number_type):
    # Many int Categoricals / numeric Numerics are encoded as blocks (with
    # nulls too: their buffers are read in place, from the slice's offset);
    # one feature alone goes column by column: both must give the same arrays.
    table = _wide_table(np.random.default_rng(seed), rows + start, num_ids, num_floats,
                        chunks, nulls, id_type, number_type).slice(start)
    specs = [rk.features.Categorical(f"c{j}", dim=4) for j in range(num_ids)] \
        + [rk.features.Numeric(f"f{j}") for j in range(num_floats)]
    if not specs:
        return
    together = encode(specs, table)
    assert set(together) == {s.name for s in specs} | ({LENGTHS} if num_ids else set())
    for spec in specs:
        alone = encode([spec], table)
        assert together[spec.name].dtype == alone[spec.name].dtype
        np.testing.assert_array_equal(together[spec.name], alone[spec.name])
    for j in range(num_ids):     # column j of LENGTHS: 0 at a null of c{j}, its id 0
        values = table.column(f"c{j}").to_pylist()
        np.testing.assert_array_equal(together[LENGTHS][:, j],
                                      [value is not None for value in values])
        np.testing.assert_array_equal(together[f"c{j}"],
                                      [0 if value is None else value for value in values])
    for j in range(num_floats):  # a null float is NaN (its default is applied later)
        values = table.column(f"f{j}").to_pylist()
        np.testing.assert_array_equal(
            together[f"f{j}"], np.array([np.nan if v is None else v for v in values],
                                        np.float32))


def test_lengths_of_a_null_free_block_beside_a_feature_with_nulls():
    # The block writes no LENGTHS without a null; a string Categorical read
    # alone has one: the block's columns must then be 1, the null's 0.
    table = pa.table({"c0": [1, 2, 3], "c1": [4, 5, 6],
                      "s": pa.array(["a", None, "b"]), "c2": [7, 8, 9]})
    specs = [rk.features.Categorical("c0", dim=4), rk.features.Categorical("c1", dim=4),
             rk.features.Categorical("s", dim=4, dtype="string"),
             rk.features.Categorical("c2", dim=4)]
    out = encode(specs, table)
    assert out[LENGTHS].tolist() == [[1, 1, 1, 1], [1, 1, 0, 1], [1, 1, 1, 1]]
    assert out["c2"].tolist() == [7, 8, 9]


def test_block_errors_name_the_feature():
    rng = np.random.default_rng(0)
    table = _wide_table(rng, 8, 4, 3, 1, False)
    specs = [rk.features.Categorical(f"c{j}", dim=4) for j in range(4)] \
        + [rk.features.Numeric(f"f{j}") for j in range(3)]
    values = table.column("f1").to_numpy().copy()
    values[3] = -np.inf
    bad_values = table.set_column(5, "f1", pa.array(values))
    with pytest.raises(FeatureInputError, match="feature 'f1': column holds \\+-inf"):
        encode(specs, bad_values)


VECTOR = rk.features.Numeric("v", shape=(3,), default=9.0)


@pytest.mark.parametrize("column", [
    pa.array([[1, 2, 3], None, [4, None, 6], [7, 8, np.nan]], pa.list_(pa.float64())),
    pa.array([[1, 2, 3], None, [4, None, 6], [7, 8, np.nan]], pa.list_(pa.float32(), 3)),
    pa.array([[1, 2, 3], None, [4, None, 6], [7, 8, None]], pa.large_list(pa.int32())),
])
def test_vectors_from_list_columns_keep_missing_elements_as_nan(column):
    # NaN marks every missing element (the model fills the default): a null
    # vector is k of them, a null or NaN element one.
    out = encode([VECTOR], pa.table({"v": column}))["v"]
    assert out.dtype == np.float32 and out.shape == (4, 3)
    np.testing.assert_array_equal(out, [[1, 2, 3], [np.nan] * 3, [4, np.nan, 6],
                                        [7, 8, np.nan]])


def test_vectors_from_a_2d_array_and_from_sliced_columns():
    values = np.arange(12, dtype=np.float64).reshape(4, 3)
    values[1, 2] = np.nan
    np.testing.assert_array_equal(encode([VECTOR], {"v": values})["v"],
                                  values.astype(np.float32))
    # A slice of a column (a batch of a larger table) starts at its own row.
    for column in (pa.array(values.tolist()),
                   pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), 3)):
        sliced = pa.table({"v": column}).slice(1, 2)
        np.testing.assert_array_equal(encode([VECTOR], sliced)["v"], values[1:3])


def test_vector_width_one_is_a_column():
    out = encode([rk.features.Numeric("w", shape=(1,))], {"w": np.array([[2.0], [3.0]])})
    assert out["w"].shape == (2, 1) and out["w"].tolist() == [[2.0], [3.0]]


@pytest.mark.parametrize("values, message", [
    (pa.array([[1.0, 2.0, 3.0, 4.0]], pa.list_(pa.float64(), 4)),
     "feature 'v': expected vectors of width 3, got width 4"),
    (np.ones((2, 2)), "feature 'v': expected vectors of width 3, got width 2"),
    (pa.array([[1.0, 2.0, 3.0], [1.0, 2.0]]),
     "feature 'v': row 1 has length 2; expected vectors of width 3"),
    (pa.array([[1.0, 2.0, 3.0], []], pa.list_(pa.float64())), "feature 'v': row 1 has length 0"),
    (pa.array([1.0, 2.0]), "feature 'v': expected a list column of 3 numbers per row, got double"),
    (pa.array([["a", "b", "c"]]), "feature 'v': expected a list column of 3 numbers"),
    (pa.array([[1.0, np.inf, 0.0]]), "feature 'v': column holds \\+-inf"),
    (np.array([[1.0, 2.0, -np.inf]]), "feature 'v': column holds \\+-inf"),
])
def test_bad_vectors_name_the_feature(values, message):
    with pytest.raises(FeatureInputError, match=message):
        encode([rk.features.Numeric("n"), VECTOR], {"n": np.zeros(len(values)), "v": values})


def test_booleans_and_decimals_are_numbers():
    """A bool column reads as 0 and 1, a decimal one as its float32 value;
    nulls stay missing (NaN) in both."""
    specs = [rk.features.Numeric("flag"), rk.features.Numeric("price"),
             rk.features.Numeric("v", shape=(2,))]
    prices = pa.array([decimal.Decimal("1.25"), None, decimal.Decimal("-3.5")],
                      pa.decimal128(6, 2))
    out = encode(specs, {"flag": pa.array([True, False, None]), "price": prices,
                         "v": pa.array([[True, False], None, [False, True]])})
    np.testing.assert_array_equal(out["flag"], [1.0, 0.0, np.nan])
    np.testing.assert_array_equal(out["price"], [1.25, np.nan, -3.5])
    np.testing.assert_array_equal(out["v"], [[1.0, 0.0], [np.nan, np.nan], [0.0, 1.0]])


def test_a_scalar_numeric_given_vectors_says_to_declare_a_shape():
    with pytest.raises(FeatureInputError, match="feature 'n': expected a numeric column, "
                                                "got fixed_size_list.*declare shape=\\(k,\\)"):
        encode([rk.features.Numeric("n")], {"n": np.ones((2, 3))})


def test_vector_features_stay_out_of_the_scalar_block():
    # float32 scalar Numerics are encoded as one block; a vector feature
    # handed a scalar float32 column must still be refused, not stacked.
    specs = [rk.features.Numeric("a"), rk.features.Numeric("b"),
             rk.features.Numeric("v", shape=(2,))]
    table = pa.table({name: pa.array([1.0, 2.0], pa.float32()) for name in "abv"})
    with pytest.raises(FeatureInputError, match="feature 'v': expected a list column"):
        encode(specs, table)


WEIGHTED = rk.features.Sequence("tags", dim=4, max_len=3, combiner="mean",
                                weights="tag_weights")


def test_weighted_sequence_weights_align_with_the_kept_ids():
    out = encode([WEIGHTED], {
        "tags": pa.array([[1, 2, 3, 4], [], None, [-9]]),
        "tag_weights": pa.array([[0.1, 0.2, 0.3, 0.4], [], None, [2.5]])})
    assert out["tags"].tolist() == [[2, 3, 4], [0, 0, 0], [0, 0, 0], [-9, 0, 0]]
    np.testing.assert_array_equal(out["tag_weights"], np.array(
        [[0.2, 0.3, 0.4], [0, 0, 0], [0, 0, 0], [2.5, 0, 0]], np.float32))
    assert out[LENGTHS].tolist() == [[3], [0], [0], [1]]


@pytest.mark.parametrize("weights, message", [
    (pa.array([[0.5, 1.0], [1.0]]), "feature 'tags': weights column 'tag_weights': row 0 "
                                    "has 2 weights for 1 ids"),
    (pa.array([[0.5], None]), "row 1 has 0 weights for 2 ids"),
    (pa.array([[np.nan], [1.0, 2.0]]), "holds a non-finite weight \\(nan\\)"),
    (pa.array([[np.inf], [1.0, 2.0]]), "holds a non-finite weight \\(inf\\)"),
    (pa.array([[None], [1.0, 2.0]], pa.list_(pa.float64())), "null inside the weights"),
    (pa.array([["a"], ["b", "c"]]), "holds list<item: string>, expected a list of numbers"),
    (pa.array([1.0, 2.0]), "feature 'tags': expected a list column of weights"),
])
def test_bad_weights_name_the_feature_and_column(weights, message):
    with pytest.raises(FeatureInputError, match=message):
        encode([WEIGHTED], {"tags": pa.array([[4], [5, 6]]), "tag_weights": weights})


def test_missing_weights_column_names_it():
    with pytest.raises(FeatureInputError,
                       match="feature 'tags': the batch has no column 'tag_weights'"):
        encode([WEIGHTED], {"tags": pa.array([[4]])})


def test_as_tensors_views_one_block_and_the_plan_takes_it_whole():
    from reckeras.features.encode import as_tensors
    from reckeras.features.plan import _stacked
    specs = [rk.features.Categorical(f"c{i}", dim=4) for i in range(5)] + \
        [rk.features.Numeric("x")]
    table = pa.table({**{f"c{i}": np.arange(3) * 10 + i for i in range(5)},
                      "x": np.array([1.0, 2.0, 3.0], np.float32)})
    arrays = encode(specs, table)
    tensors = as_tensors(arrays)
    for name, array in arrays.items():
        np.testing.assert_array_equal(tensors[name].numpy(), array)
    ids = [tensors[f"c{i}"] for i in range(5)]
    assert all(np.shares_memory(t.numpy(), arrays[f"c{i}"]) for i, t in enumerate(ids))
    stacked = _stacked(ids)
    assert stacked.data_ptr() == ids[0].data_ptr()          # no copy
    assert torch.equal(stacked, torch.stack(ids))
    # Out of their order, or from different blocks: a copy, the same values.
    shuffled = [ids[1], ids[0], *ids[2:]]
    assert torch.equal(_stacked(shuffled), torch.stack(shuffled))
    assert _stacked(shuffled).data_ptr() != ids[1].data_ptr()
    apart = [torch.arange(3), torch.arange(3)]
    assert torch.equal(_stacked(apart), torch.stack(apart))


def test_one_specs_list_over_batches_of_changing_schemas_and_nulls():
    # encode plans its blocks once per (specs, schema) and keeps the plan:
    # batches of another schema, or with a null in a block, must still give
    # what a fresh list of the same specs gives.
    specs = [rk.features.Categorical(f"c{j}", dim=4) for j in range(3)] + \
        [rk.features.Numeric(f"f{j}") for j in range(2)]
    rng = np.random.default_rng(1)
    clean = _wide_table(rng, 6, 3, 2, 1, False)
    narrow = clean.set_column(1, "c1", clean.column("c1").cast(pa.int32()))
    with_null = clean.set_column(0, "c0", pa.array([1, None, 3, 4, 5, 6], pa.int64()))
    missing = clean.drop_columns(["f1"])
    for table in (clean, narrow, with_null, clean, narrow, with_null):
        fresh = [deserialize(serialize(spec)) for spec in specs]    # new objects
        expected = encode(fresh, table)
        got = encode(specs, table)
        assert list(got) == list(expected)
        for name in expected:
            np.testing.assert_array_equal(got[name], expected[name])
    with pytest.raises(FeatureInputError, match="f1"):
        encode(specs, missing)
    assert encode(specs, clean)["c1"].tolist() == clean.column("c1").to_pylist()
