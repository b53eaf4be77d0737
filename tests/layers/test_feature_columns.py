import keras
import numpy as np
import pyarrow as pa
import pytest
import torch

import reckeras as rk
from reckeras.features.encode import as_table


def make_columns():
    return rk.layers.FeatureColumns([
        rk.features.Numeric("n1", transform="log1p"),
        rk.features.Numeric("n2", transform="standardize", default=1.0),
        rk.features.Categorical("c", dim=4),
        rk.features.Sequence("s", dim=4, max_len=3)])


def test_inputs_dtypes_and_shapes():
    inputs = make_columns().inputs()
    assert list(inputs) == ["n1", "n2", "c", "s", rk.features.LENGTHS]
    assert inputs["c"].dtype == "int64" and inputs["n1"].dtype == "float32"
    assert tuple(inputs["s"].shape) == (None, 3)
    # The lengths of c and s, one column each.
    lengths = inputs[rk.features.LENGTHS]
    assert lengths.dtype == "int32" and tuple(lengths.shape) == (None, 2)


def test_sequence_mask_follows_the_lengths():
    columns = make_columns()
    inputs = columns.inputs()
    # The mask reads the lengths only (Keras 3.10 refuses a model with
    # inputs its outputs do not use).
    lengths = {rk.features.LENGTHS: inputs[rk.features.LENGTHS]}
    mask_model = keras.Model(lengths, columns.sequence_mask(lengths, "s"))
    raw = columns.encode({"n1": [1.0] * 3, "n2": [1.0] * 3, "c": [1, 2, 3],
                          "s": pa.array([[-1, -1], [], [4, 5, 6, 7]])})
    mask = mask_model({rk.features.LENGTHS: torch.tensor(raw[rk.features.LENGTHS])})
    assert keras.ops.convert_to_numpy(mask).tolist() == [
        [True, True, False], [False, False, False], [True, True, True]]
    with pytest.raises(ValueError, match="'c' is not a Sequence feature"):
        columns.sequence_mask(inputs, "c")


def test_call_in_functional_model_and_values():
    columns = make_columns()
    columns.adapt([pa.table({"n1": [1.0], "n2": [1.0, 3.0][:1], "c": [1], "s": [[1]]}),
                   pa.table({"n1": [1.0], "n2": [3.0], "c": [1], "s": [[1]]})])
    np.testing.assert_allclose(columns.mean.numpy()[1], 2.0)
    np.testing.assert_allclose(columns.std.numpy()[1], 1.0)
    inputs = columns.inputs()
    dense, sparse = columns(inputs)
    assert tuple(dense.shape) == (None, 2)
    model = keras.Model(inputs, [dense, sparse["ids"], sparse["offsets"]])
    raw = columns.encode({"n1": [np.e - 1, 0.0], "n2": [np.nan, 4.0], "c": [5, 6],
                          "s": pa.array([[7, 8], []], pa.list_(pa.int64()))})
    out_dense, ids, offsets = model({k: torch.tensor(v) for k, v in raw.items()})
    np.testing.assert_allclose(out_dense.numpy(), [[1.0, -1.0], [0.0, 2.0]], rtol=1e-6)
    assert ids.tolist() == [5, 6, 7, 8] and offsets.tolist() == [0, 1, 2, 4, 4]


def test_missing_input_raises_with_name():
    columns = make_columns()
    with pytest.raises(rk.features.FeatureInputError, match="'s'"):
        columns({"n1": torch.zeros(2), "n2": torch.zeros(2), "c": torch.zeros(2, dtype=torch.int64)})


def test_absent_columns_encode_as_missing_values():
    """`encode(absent=...)`: a named column the batch lacks is read as all
    missing, as a null column is; a lacking column not named still fails."""
    columns = make_columns()
    present = {"n1": [1.0, 2.0], "c": [3, 4]}
    nulls = {**present, "n2": pa.nulls(2, pa.float64()), "s": pa.nulls(2, pa.list_(pa.int64()))}
    encoded = columns.encode(present, absent=("n2", "s", "c"))
    expected = columns.encode(nulls)
    assert encoded.keys() == expected.keys()
    for name, values in expected.items():
        np.testing.assert_array_equal(encoded[name], values, err_msg=name)
    assert np.isnan(encoded["n2"]).all()             # missing: the model fills its default
    assert encoded[rk.features.LENGTHS][:, 1].tolist() == [0, 0]   # s: empty rows
    with pytest.raises(rk.features.FeatureInputError, match="'s'"):
        columns.encode(present, absent=("n2",))
    # String ids, a weighted sequence (two columns) and a vector.
    other = rk.layers.FeatureColumns([
        rk.features.Categorical("site", dim=4, dtype="string"),
        rk.features.Sequence("tags", dim=4, max_len=2, weights="tag_weights"),
        rk.features.Numeric("v", shape=(3,)), rk.features.Categorical("k", dim=4)])
    encoded = other.encode({"k": [1, 2]}, absent=("site", "tags", "v"))
    # LENGTHS: the id Categoricals (site, k), then the Sequences (tags).
    assert encoded[rk.features.LENGTHS].tolist() == [[0, 1, 0], [0, 1, 0]]
    assert np.isnan(encoded["v"]).all()


def test_config_round_trip():
    columns = make_columns()
    again = rk.layers.FeatureColumns.from_config(columns.get_config())
    assert again.specs == columns.specs


def vector_columns():
    return rk.layers.FeatureColumns([
        rk.features.Numeric("n", transform="log1p"),
        rk.features.Numeric("v", shape=(3,), transform="standardize", default=-2.0),
        rk.features.Numeric("w", shape=(64,)),
        rk.features.Categorical("c", dim=4)])


def test_vector_inputs_and_dense_width():
    columns = vector_columns()
    inputs = columns.inputs()
    assert tuple(inputs["v"].shape) == (None, 3) and inputs["v"].dtype == "float32"
    assert tuple(inputs["n"].shape) == (None,)
    assert columns.plan.dense_width == 68
    assert columns.mean.shape == (68,) and columns.std.shape == (68,)
    dense, _ = columns(inputs)
    assert tuple(dense.shape) == (None, 68)


def test_adapt_is_per_element_and_counts_missing_as_the_default():
    rng = np.random.default_rng(0)
    columns = vector_columns()
    rows = 50
    values = rng.normal(loc=[1.0, -3.0, 10.0], scale=[0.5, 2.0, 4.0], size=(2 * rows, 3))
    values[7, 1] = np.nan                                  # a NaN element
    vectors = [list(row) for row in values]
    vectors[11] = None                                     # a missing vector
    vectors[12] = [None, 1.0, 2.0]                         # a null element
    batches = [pa.table({"n": np.zeros(rows), "c": np.zeros(rows, np.int64),
                         "w": pa.array([[0.0] * 64] * rows),
                         "v": pa.array(vectors[i:i + rows], pa.list_(pa.float64()))})
               for i in (0, rows)]
    columns.adapt(batches)
    expected = np.array([[-2.0 if v is None or np.isnan(v) else np.float32(v)
                          for v in (row or [None] * 3)] for row in vectors])
    np.testing.assert_allclose(columns.mean.numpy()[1:4], expected.mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(columns.std.numpy()[1:4], expected.std(axis=0), rtol=1e-5)
    # A constant column gets std 1, not a division by zero.
    assert (columns.std.numpy()[4:] == 1.0).all()
    assert not columns.needs_adapt


def vector_data(n=1200, seed=0):
    rng = np.random.default_rng(seed)
    v = rng.normal(size=(n, 3)) * [1.0, 5.0, 0.1] + [0.0, 20.0, -1.0]
    a = rng.integers(0, 10, n)
    logit = 2.0 * (v[:, 0] - (v[:, 1] - 20.0) / 5.0) + np.where(a % 2 == 0, 1.0, -1.0)
    return pa.table({
        "v": pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1)), 3),
        "n": rng.exponential(size=n), "a": a,
        "label": (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)})


def vector_model():
    keras.utils.set_random_seed(0)
    columns = rk.layers.FeatureColumns([
        rk.features.Numeric("v", shape=(3,), transform="standardize"),
        rk.features.Numeric("n", transform="log1p"),
        rk.features.Categorical("a", dim=4)])
    model = rk.models.dlrm(columns, bottom_units=(8, 4), top_units=(8, 1),
                           dropout=0.0, embedding_l2=0.0)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.1),
                  metrics=[rk.metrics.AUC()])
    return model, columns


@pytest.mark.slow
def test_model_with_a_vector_feature_fits_saves_and_loads(tmp_path):
    model, columns = vector_model()
    data = vector_data()
    history = model.fit(data, batch_size=100, epochs=3, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert history.history["auc"][-1] > 0.7
    v = data.column("v").combine_chunks().flatten().to_numpy().reshape(-1, 3)
    np.testing.assert_allclose(columns.mean.numpy()[:3], v.mean(axis=0), rtol=1e-4)
    np.testing.assert_allclose(columns.std.numpy()[:3], v.std(axis=0), rtol=1e-4)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    probe = vector_data(300, seed=1)
    predictions = model.predict(probe, batch_size=128)
    np.testing.assert_array_equal(loaded.predict(probe, batch_size=128), predictions)
    # A dict with the vectors as a 2-D array predicts the same.
    as_dict = {"v": probe.column("v").combine_chunks().flatten().to_numpy().reshape(-1, 3),
               "n": probe.column("n").to_numpy(), "a": probe.column("a").to_numpy()}
    np.testing.assert_allclose(loaded.predict(as_dict, batch_size=128), predictions,
                               rtol=1e-6)


@pytest.mark.parametrize("vectors, message", [
    (np.ones((8, 4)), "feature 'v': expected vectors of width 3, got width 4"),
    (pa.array([[1.0, 2.0, 3.0]] * 7 + [[1.0]]), "feature 'v': row 7 has length 1"),
])
def test_vectors_of_the_wrong_width_change_no_weight(vectors, message):
    model, _ = vector_model()
    model.fit(vector_data(64), batch_size=64, verbose=0)
    before = [w.numpy().copy() for w in model.weights]
    tables = [t.export() for layer in model.embedding_layers for t in layer.tables]
    bad = vector_data(8).set_column(0, "v", as_table({"v": vectors}).column("v"))
    with pytest.raises(rk.features.FeatureInputError, match=message):
        model.fit(bad, batch_size=8, verbose=0)
    for old, new in zip(before, model.weights):
        np.testing.assert_array_equal(old, new.numpy())
    for old, new in zip(tables, [t.export() for layer in model.embedding_layers
                                 for t in layer.tables]):
        for key in old:
            np.testing.assert_array_equal(old[key], new[key])
