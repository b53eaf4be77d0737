"""Warm start: a checkpoint loaded into a changed model (a feature added,
one removed, a table renamed), rows compared per id through the embedding
layer's own lookup, dense weights by path; what cannot load is named."""

import keras
import numpy as np
import pyarrow as pa
import pytest

import reckeras as rk
from reckeras.checkpoint import CheckpointError
from reckeras.features.encode import as_tensors

SAVED = {"a": ("a", 8), "b": ("old_b", 8), "c": ("c", 4)}
CHANGED = {"a": ("a", 8), "b": ("new_b", 8), "e": ("e", 4)}


def data(n=600, seed=0):
    rng = np.random.default_rng(seed)
    columns = {name: rng.integers(0, 80, n) for name in "abce"}
    logit = np.sin(columns["a"]) + np.cos(columns["b"]) * np.sin(columns["c"])
    return pa.table({"n": rng.normal(size=n).astype(np.float32), **columns,
                     "label": (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)})


def build(features, hidden=16, seed=0):
    """n plus `features` ({column: (table, dim)}), embeddings concatenated
    with the dense input, then named Dense layers (their paths match)."""
    keras.utils.set_random_seed(seed)
    columns = rk.layers.FeatureColumns(
        [rk.features.Numeric("n")] + [rk.features.Categorical(name, dim=dim, table=table)
                                      for name, (table, dim) in features.items()],
        name="columns")
    inputs = columns.inputs()
    dense, sparse = columns(inputs)
    embedded = rk.layers.ShardedEmbedding(columns, output="concat", name="embedding")(sparse)
    x = keras.layers.Concatenate(name="joined")([dense, embedded])
    x = keras.layers.Dense(hidden, activation="relu", name="hidden")(x)
    model = rk.Model(inputs, keras.layers.Dense(1, activation="sigmoid", name="out")(x))
    model.compile(optimizer="adam", loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.Adagrad(0.1))
    return model


def embeddings(model, table):
    """Each feature's embedding of every row of `table`, by the layer's
    inference lookup: {feature: [n, dim]}."""
    columns = next(layer for layer in model.layers
                   if isinstance(layer, rk.layers.FeatureColumns))
    encoded = columns.encode({name: table[name].to_numpy() for name in table.column_names
                              if name != "label"})
    _, sparse = columns.pack(as_tensors(encoded))
    flat = model.embedding_layers[0](sparse, training=False).detach().numpy()
    out, start = {}, 0
    for spec in columns.sparse_specs:
        out[spec.name] = flat[:, start:start + spec.dim]
        start += spec.dim
    return out


def rows(model):
    return sum(table.num_rows for table in model.embedding_layers[0].tables)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    model = build(SAVED)
    model.fit(data(), batch_size=100, epochs=2, verbose=0)
    path = tmp_path_factory.mktemp("warm") / "ckpt"
    model.save_checkpoint(path)
    return model, path


def test_a_changed_model_warm_starts_with_the_saved_rows(saved, tmp_path):
    original, path = saved
    changed = build(CHANGED, seed=3)
    with pytest.warns(UserWarning, match="skipped tables \\['c'\\]"):
        report = changed.load_checkpoint(path, warm_start=True,
                                         rename_tables={"old_b": "new_b"})
    assert report.added_tables == ["e"] and report.removed_tables == ["c"]
    assert report.renamed_tables == {"old_b": "new_b"}
    assert report.added_variables == report.removed_variables == []
    probe = data(seed=7)
    before, after = embeddings(original, probe), embeddings(changed, probe)
    np.testing.assert_array_equal(after["a"], before["a"])
    np.testing.assert_array_equal(after["b"], before["b"])      # renamed: same rows per id
    assert np.abs(before["b"]).sum() > 0
    np.testing.assert_array_equal(after["e"], 0.0)              # a new table: no row yet
    # Rows of "c" were dropped: the model holds a's and old_b's rows only.
    dims = {table.dim: table.num_rows for table in changed.embedding_layers[0].tables}
    assert dims[4] == 0 and dims[8] == rows(original) - \
        original.embedding_layers[0].tables[0].num_rows
    saved_weights = {v.path: v.numpy() for v in original.weights}
    for variable in changed.weights:
        np.testing.assert_array_equal(variable.numpy(), saved_weights[variable.path])
    # Each row kept its optimizer state: the accumulators equal the saved ones.
    for old_table, new_table in zip(original.embedding_layers[0].tables[1:],
                                    changed.embedding_layers[0].tables[1:]):
        np.testing.assert_array_equal(
            np.sort(old_table.export()["state"].sum(axis=1)),
            np.sort(new_table.export()["state"].sum(axis=1)))
    changed.fit(data(seed=1), batch_size=100, epochs=1, verbose=0)   # it trains on
    assert embeddings(changed, probe)["e"].any()
    # A warm-started model is not the checkpoint's state: no delta on it.
    with pytest.raises(ValueError, match="not one this model saved"):
        changed.save_checkpoint(tmp_path / "delta", base=path)


def test_a_warm_start_from_a_chain_loads_its_last_state(saved, tmp_path):
    original = build(SAVED)
    original.load_checkpoint(saved[1])
    original.fit(data(seed=2), batch_size=100, epochs=1, verbose=0)
    original.save_checkpoint(tmp_path / "delta", base=saved[1])
    changed = build(CHANGED, seed=3)
    with pytest.warns(UserWarning):
        report = changed.load_checkpoint(tmp_path / "delta", warm_start=True,
                                         rename_tables={"old_b": "new_b"})
    assert len(report.chain) == 2
    probe = data(seed=8)
    before, after = embeddings(original, probe), embeddings(changed, probe)
    np.testing.assert_array_equal(after["a"], before["a"])
    np.testing.assert_array_equal(after["b"], before["b"])


def snapshot(model):
    return [v.numpy().copy() for v in model.weights] + [
        array for table in model.embedding_layers[0].engine.table_states()
        for array in table.arrays().values()]


def unchanged(before, model):
    return all(np.array_equal(x, y) for x, y in zip(before, snapshot(model)))


def test_a_table_whose_dim_changed_is_named_and_changes_nothing(saved):
    other = build({"a": ("a", 16), "b": ("old_b", 8), "c": ("c", 4)})
    other.fit(data(seed=1), batch_size=100, epochs=1, verbose=0)
    before = snapshot(other)
    with pytest.raises(CheckpointError, match="table 'a' has dim 8, the model's table "
                                              "'a' has dim 16"):
        other.load_checkpoint(saved[1], warm_start=True)
    assert unchanged(before, other)
    # Mapped to None, the table is skipped and starts fresh.
    with pytest.warns(UserWarning):
        report = other.load_checkpoint(saved[1], warm_start=True,
                                       rename_tables={"a": None}, skip_mismatch=True)
    assert report.removed_tables == ["a"] and report.added_tables == ["a"]
    assert {t.dim: t.num_rows for t in other.embedding_layers[0].tables}[16] == 0


def test_a_dense_variable_of_another_shape_is_named_unless_skipped(saved):
    original, path = saved
    wider = build(SAVED, hidden=32)
    before = snapshot(wider)
    with pytest.raises(CheckpointError, match="'hidden/kernel'") as error:
        wider.load_checkpoint(path, warm_start=True)
    assert "skip_mismatch=True" in str(error.value)
    assert unchanged(before, wider)
    with pytest.warns(UserWarning, match="of another shape"):
        report = wider.load_checkpoint(path, warm_start=True, skip_mismatch=True)
    assert report.skipped_variables == ["hidden/kernel", "hidden/bias", "out/kernel"]
    np.testing.assert_array_equal(wider.get_layer("out").bias.numpy(),
                                  original.get_layer("out").bias.numpy())


def test_an_exact_load_of_a_changed_model_points_to_warm_start(saved):
    changed = build(CHANGED)
    with pytest.raises(CheckpointError, match="warm_start=True"):
        changed.load_checkpoint(saved[1])
    with pytest.raises(ValueError, match="'nope'"):
        changed.load_checkpoint(saved[1], warm_start=True, rename_tables={"nope": "a"})
    with pytest.raises(ValueError, match="warm_start=True"):
        changed.load_checkpoint(saved[1], rename_tables={"old_b": "new_b"})
    with pytest.raises(CheckpointError, match="both load into table 'a'"):
        changed.load_checkpoint(saved[1], warm_start=True, rename_tables={"old_b": "a"})
