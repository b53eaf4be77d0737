import keras
import numpy as np
import pyarrow as pa
import pytest
import torch

import reckeras as rk


def make_columns():
    return rk.layers.FeatureColumns([
        rk.features.Numeric("n1", transform="log1p"),
        rk.features.Numeric("n2", transform="standardize", default=1.0),
        rk.features.Categorical("c", dim=4),
        rk.features.Sequence("s", dim=4, max_len=3)])


def test_inputs_dtypes_and_shapes():
    inputs = make_columns().inputs()
    assert set(inputs) == {"n1", "n2", "c", "s"}
    assert inputs["c"].dtype == "int64" and inputs["n1"].dtype == "float32"
    assert tuple(inputs["s"].shape) == (None, 3)


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


def test_config_round_trip():
    columns = make_columns()
    again = rk.layers.FeatureColumns.from_config(columns.get_config())
    assert again.specs == columns.specs
