"""Every zoo model builds, trains, and round-trips model.save / load_model."""

import inspect
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import reckeras as rk
import keras

F = rk.features


def columns(combiner, dim=4):
    return rk.layers.FeatureColumns([
        F.Numeric("hist_len", transform="log1p"),
        F.Categorical("user_age", dim=dim),
        F.Categorical("item", dim=dim, table="item"),
        F.Categorical("category", dim=dim, table="category"),
        F.Sequence("hist_items", dim=dim, max_len=6, table="item", combiner=combiner),
        F.Sequence("hist_cats", dim=dim, max_len=6, table="category",
                   combiner=combiner),
    ])


def behaviour_table(rows=300, seed=0):
    """Rows like taobao_synth's: the label says whether the target was seen."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 9, rows)            # 0 to 8: some rows are cut to 6
    items = [rng.integers(0, 30, n) for n in lengths]
    item = rng.integers(0, 30, rows)
    return pa.table({
        "hist_len": lengths,
        "user_age": rng.integers(0, 5, rows),
        "item": item,
        "category": item % 7,
        "hist_items": pa.array([list(h) for h in items], pa.list_(pa.int64())),
        "hist_cats": pa.array([list(h % 7) for h in items], pa.list_(pa.int64())),
        "label": np.array([float(t in h) for t, h in zip(item, items)]),
    })


MODELS = {
    "dlrm": lambda: rk.models.dlrm(columns("sum"), bottom_units=(8, 4),
                                   top_units=(8, 1)),
    "dcn_v2": lambda: rk.models.dcn_v2(columns("sum"), cross_layers=2, low_rank=3,
                                       deep_units=(8,)),
    "dcn_v2_parallel": lambda: rk.models.dcn_v2(columns("mean"), deep_units=(8,),
                                                structure="parallel"),
    "deepfm": lambda: rk.models.deepfm(columns("mean"), deep_units=(8,)),
    "din": lambda: rk.models.din(columns(None), attention_units=(8,),
                                 top_units=(8, 1)),
    "bst": lambda: rk.models.bst(columns(None), num_heads=2, ff_dim=8,
                                 top_units=(8, 1)),
    # Batch normalization's moving statistics and dropout round-trip too.
    "deepfm_batch_norm": lambda: rk.models.deepfm(columns("mean"), deep_units=(8, 8),
                                                  dropout=0.2, norm="batch"),
    "dlrm_batch_norm": lambda: rk.models.dlrm(columns("sum"), bottom_units=(8, 4),
                                              top_units=(8, 1), dropout=0.1,
                                              norm="batch"),
}

# Every zoo model with towers of hidden layers, built with tower options.
TOWER_MODELS = {
    "dlrm": lambda **towers: rk.models.dlrm(columns("sum"), bottom_units=(8, 4),
                                            top_units=(8, 1), **towers),
    "dcn_v2": lambda **towers: rk.models.dcn_v2(columns("sum"), deep_units=(8, 8),
                                                **towers),
    "dcn_v2_parallel": lambda **towers: rk.models.dcn_v2(
        columns("sum"), deep_units=(8, 8), structure="parallel", **towers),
    "deepfm": lambda **towers: rk.models.deepfm(columns("mean"), deep_units=(8,),
                                                **towers),
    "din": lambda **towers: rk.models.din(columns(None), top_units=(8, 1), **towers),
    "bst": lambda **towers: rk.models.bst(columns(None), num_heads=2, top_units=(8, 1),
                                          **towers),
    "esmm": lambda **towers: rk.models.esmm(columns("mean"), tower_units=(8,), **towers),
    "mmoe": lambda **towers: rk.models.mmoe(columns("mean"), expert_units=(8, 8),
                                            tower_units=(4,), **towers),
}


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.slow
def test_train_save_load_identical_predictions(name, tmp_path):
    keras.utils.set_random_seed(0)
    model = MODELS[name]()
    assert isinstance(model, rk.Model)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.1),
                  metrics=[rk.metrics.AUC()])
    data = behaviour_table()
    history = model.fit(data, batch_size=100, epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    predictions = model.predict(data, batch_size=128)
    assert predictions.shape == (data.num_rows, 1) and np.isfinite(predictions).all()
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    np.testing.assert_array_equal(loaded.predict(data, batch_size=128), predictions)
    for before, after in zip(model.embedding_layers, loaded.embedding_layers):
        for table, loaded_table in zip(before.tables, after.tables):
            exported, reloaded = table.export(), loaded_table.export()
            for key in exported:
                np.testing.assert_array_equal(exported[key], reloaded[key])


def test_sequence_models_pair_histories_with_targets():
    with pytest.raises(ValueError, match="needs a behaviour history"):
        rk.models.din(columns("sum"))
    with pytest.raises(ValueError, match="cannot pick the target of history"):
        rk.models.din(rk.layers.FeatureColumns([
            F.Categorical("a", dim=4, table="t"), F.Categorical("b", dim=4, table="t"),
            F.Sequence("h", dim=4, max_len=3, table="t", combiner=None)]))
    explicit = rk.models.din(rk.layers.FeatureColumns([
        F.Categorical("a", dim=4, table="t"), F.Categorical("b", dim=4, table="t"),
        F.Sequence("h", dim=4, max_len=3, table="t", combiner=None)]),
        history={"h": "b"})
    assert isinstance(explicit, rk.Model)
    with pytest.raises(ValueError, match="one max_len"):
        rk.models.bst(rk.layers.FeatureColumns([
            F.Categorical("a", dim=4), F.Categorical("b", dim=4),
            F.Sequence("ha", dim=4, max_len=3, table="a", combiner=None),
            F.Sequence("hb", dim=4, max_len=5, table="b", combiner=None)]))
    with pytest.raises(ValueError, match="must share one dim"):
        rk.models.din(rk.layers.FeatureColumns([
            F.Categorical("a", dim=4),
            F.Sequence("h", dim=8, max_len=3, combiner=None)]), history={"h": "a"})
    with pytest.raises(ValueError, match="must divide the width of a behaviour"):
        rk.models.bst(columns(None), num_heads=3)


def test_pooled_models_check_their_columns():
    with pytest.raises(ValueError, match="structure must be one of"):
        rk.models.dcn_v2(columns("sum"), structure="serial")
    with pytest.raises(ValueError, match="one dim"):
        rk.models.deepfm(rk.layers.FeatureColumns([
            F.Categorical("a", dim=4), F.Categorical("b", dim=8)]))
    with pytest.raises(ValueError, match="unpooled sequence features"):
        rk.models.dcn_v2(columns(None))


@pytest.mark.parametrize("name", TOWER_MODELS)
def test_tower_options_reach_every_hidden_layer_of_the_towers(name):
    model = TOWER_MODELS[name](dropout=0.25, norm="batch")
    towers = [layer for layer in model.layers if isinstance(layer, rk.layers.MLP)
              and len(layer.units) > 1]
    assert towers
    for tower in towers:
        assert (tower.dropout, tower.norm) == (0.25, "batch")
        hidden = len(tower.units) - 1
        kinds = [type(layer).__name__ for layer in tower._stack]
        assert kinds.count("BatchNormalization") == hidden
        assert kinds.count("Dropout") == hidden
    plain = TOWER_MODELS[name]()
    for tower in plain.layers:
        if isinstance(tower, rk.layers.MLP) and len(tower.units) > 1:
            assert tower.norm is None
            assert tower.dropout == (0.1 if name == "bst" else 0.2)


# The zoo's defaults, chosen by the sweep of docs/models.md ("The tower sweep"),
# which states them; bst keeps its blocks' dropout.
SWEPT_DEFAULTS = {"dropout": 0.2, "norm": None, "embedding_l2": 1e-4}
ZOO = ("dlrm", "dcn_v2", "deepfm", "din", "bst", "esmm", "mmoe")


@pytest.mark.parametrize("model", ZOO)
def test_defaults_are_the_sweeps_choice(model):
    parameters = inspect.signature(getattr(rk.models, model)).parameters
    expected = dict(SWEPT_DEFAULTS, dropout=0.1) if model == "bst" else SWEPT_DEFAULTS
    assert {name: parameters[name].default for name in expected} == expected


def test_the_models_doc_states_the_defaults():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "models.md").read_text()
    assert "defaults are `dropout=0.2`, `norm=None` and `embedding_l2=1e-4`" in doc


@pytest.mark.parametrize("name", TOWER_MODELS)
def test_tower_options_are_checked_naming_the_model(name):
    model = name.split("_parallel")[0]
    for bad in (1.0, -0.1, True, "0.1"):
        with pytest.raises(ValueError,
                           match=rf"{model}: dropout must be a rate in \[0, 1\)"):
            TOWER_MODELS[name](dropout=bad)
    with pytest.raises(ValueError, match=rf"{model}: norm must be one of"):
        TOWER_MODELS[name](norm="group")


@pytest.mark.parametrize("name", TOWER_MODELS)
def test_embedding_l2_regularizes_every_table_of_the_model(name):
    model = TOWER_MODELS[name](embedding_l2=0.05)
    assert model.embedding_layers
    for layer in model.embedding_layers:
        assert isinstance(layer.embeddings_regularizer, keras.regularizers.L2)
        assert layer.embeddings_regularizer.l2 == pytest.approx(0.05)
    for layer in TOWER_MODELS[name]().embedding_layers:
        assert layer.embeddings_regularizer.l2 == pytest.approx(1e-4)
    for layer in TOWER_MODELS[name](embedding_l2=0.0).embedding_layers:
        assert layer.embeddings_regularizer is None


@pytest.mark.parametrize("name", TOWER_MODELS)
def test_embedding_l2_is_checked_naming_the_model(name):
    model = name.split("_parallel")[0]
    for bad in (-0.1, float("inf"), float("nan"), True, "0.1"):
        with pytest.raises(ValueError, match=rf"{model}: embedding_l2 must be a finite"):
            TOWER_MODELS[name](embedding_l2=bad)


def test_embedding_l2_counts_in_the_loss():
    data = behaviour_table(rows=300)
    losses = {}
    for l2 in (0.0, 0.5):
        keras.utils.set_random_seed(0)
        model = TOWER_MODELS["dlrm"](embedding_l2=l2, dropout=0.0)
        model.compile(optimizer="adam", loss="binary_crossentropy",
                      embedding_optimizer=rk.optimizers.SGD(0.1))
        # One step: its loss is the forward's, on the rows it creates.
        losses[l2] = model.fit(data, batch_size=300, verbose=0).history["loss"][0]
    # The same weights and rows; the penalty of the rows looked up is added.
    assert losses[0.5] > losses[0.0] > 0
