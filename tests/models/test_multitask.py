"""ESMM and MMoE: outputs, their structure read back from the layers, argument
checks, learning a two-task problem of a known teacher, save / load."""

import keras
import numpy as np
import pyarrow as pa
import pytest

import reckeras as rk

F = rk.features
USERS, ITEMS = 40, 60


def columns(dim=8):
    return rk.layers.FeatureColumns([
        F.Numeric("price", transform="log1p"),
        F.Categorical("user", dim=dim),
        F.Categorical("item", dim=dim),
    ])


def teacher_table(rows, seed):
    """Impressions of a known teacher: a conversion only follows a click.

    `p(click) = sigmoid(f(user, item))`, `p(conversion | click) =
    sigmoid(g(user, item, price))` with `f` and `g` of their own per-id terms
    (one fixed teacher, `seed` draws the impressions). Returns the table and
    the teacher's `p(click)`, `p(click and conversion)` and `p(conversion |
    click)` of every row.
    """
    teacher = np.random.default_rng(1234)
    item_click, user_click = teacher.normal(0, 1.5, ITEMS), teacher.normal(0, 1.0, USERS)
    item_conv, user_conv = teacher.normal(0, 1.5, ITEMS), teacher.normal(0, 1.5, USERS)
    rng = np.random.default_rng(seed)
    user, item = rng.integers(0, USERS, rows), rng.integers(0, ITEMS, rows)
    price = rng.lognormal(0, 1, rows).astype(np.float32)
    p_click = 1 / (1 + np.exp(-(item_click[item] + user_click[user] - 0.5)))
    p_conv = 1 / (1 + np.exp(-(item_conv[item] + user_conv[user] - 0.5 * np.log1p(price))))
    click = (rng.random(rows) < p_click).astype(np.float32)
    conversion = click * (rng.random(rows) < p_conv).astype(np.float32)
    table = pa.table({"price": price, "user": user, "item": item, "click": click,
                      "conversion": conversion})
    return table, p_click, p_click * p_conv, p_conv


def features(table):
    return {name: table.column(name).to_numpy() for name in ("price", "user", "item")}


def auc(y, p):
    pos, neg = p[y == 1], p[y == 0]
    return (pos[:, None] > neg[None, :]).mean() + 0.5 * (pos[:, None] == neg[None, :]).mean()


def outputs_of(model, names, x):
    """The named layers' outputs, read with a sub-model sharing the weights."""
    sub = rk.Model(model.input, {name: model.get_layer(name).output for name in names})
    return sub.predict(x, batch_size=1000, verbose=0)


def compile_two_tasks(model):
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss={"ctr": "binary_crossentropy", "ctcvr": "binary_crossentropy"},
                  loss_weights={"ctr": 1.0, "ctcvr": 1.0},
                  metrics={"ctr": [rk.metrics.AUC()], "ctcvr": [rk.metrics.AUC()]},
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.1))
    return model


BUILD = {
    "esmm": lambda: rk.models.esmm(columns(), tower_units=(16,), dropout=0.0, embedding_l2=0.0),
    "mmoe": lambda: rk.models.mmoe(columns(), tasks=("ctr", "ctcvr"), num_experts=3,
                                   expert_units=(16,), tower_units=(8,),
                                   dropout=0.0, embedding_l2=0.0),
}


@pytest.fixture(scope="module", params=sorted(BUILD))
def trained(request):
    """Each model trained on 6,000 impressions, 4 epochs: ESMM from the
    table's label columns, MMoE from `y` arrays."""
    keras.utils.set_random_seed(0)
    model = compile_two_tasks(BUILD[request.param]())
    train, *_ = teacher_table(6000, seed=0)
    if request.param == "esmm":
        history = model.fit(train, labels={"ctr": "click", "ctcvr": "conversion"},
                            batch_size=200, epochs=4, verbose=0)
    else:
        history = model.fit(features(train),
                            y={"ctr": train.column("click").to_numpy(),
                               "ctcvr": train.column("conversion").to_numpy()},
                            batch_size=200, epochs=4, verbose=0)
    return request.param, model, history


def test_esmm_outputs_ctr_and_ctcvr_the_product_of_the_towers():
    keras.utils.set_random_seed(0)
    model = rk.models.esmm(columns(), tower_units=(16, 8))
    assert isinstance(model, rk.Model) and model.name == "esmm"
    table, *_ = teacher_table(500, seed=3)
    predictions = model.predict(table, batch_size=1000, verbose=0)
    assert set(predictions) == {"ctr", "ctcvr"}
    towers = outputs_of(model, ("ctr", "cvr"), table)
    for p in (*predictions.values(), *towers.values()):
        assert p.shape == (500, 1) and p.dtype == np.float32
        assert ((p > 0) & (p < 1)).all()
    np.testing.assert_array_equal(predictions["ctr"], towers["ctr"])
    # The towers are separate (their own weights), and ctcvr is their product.
    assert not np.array_equal(towers["ctr"], towers["cvr"])
    np.testing.assert_array_equal(predictions["ctcvr"], towers["ctr"] * towers["cvr"])
    assert (predictions["ctcvr"] <= predictions["ctr"]).all()
    # The towers read the same embeddings (one lookup) and dense features.
    assert len(model.embedding_layers) == 1
    assert model.get_layer("ctr").input is model.get_layer("cvr").input


def test_mmoe_gates_are_softmaxes_over_the_shared_experts():
    keras.utils.set_random_seed(0)
    tasks = ("click", "like", "share")
    model = rk.models.mmoe(columns(), tasks=tasks, num_experts=3, expert_units=(12, 6),
                           tower_units=(4,))
    assert isinstance(model, rk.Model) and model.name == "mmoe"
    table, *_ = teacher_table(400, seed=4)
    predictions = model.predict(table, batch_size=1000, verbose=0)
    assert set(predictions) == set(tasks)
    for p in predictions.values():
        assert p.shape == (400, 1) and ((p > 0) & (p < 1)).all()
    names = ["features", "experts"] + [f"{t}_{part}" for t in tasks for part in ("gate", "mix")]
    layers = outputs_of(model, names, table)
    assert layers["experts"].shape == (400, 3, 6)
    shared = layers["features"].astype(np.float64)
    for task in tasks:
        gate = layers[f"{task}_gate"]
        assert gate.shape == (400, 3)
        np.testing.assert_allclose(gate.sum(axis=1), 1.0, rtol=0, atol=1e-6)
        # One forward pass of the gate and the mixture, in numpy, from the weights.
        kernel, bias = model.get_layer(f"{task}_gate").get_weights()
        logits = shared @ kernel + bias
        expected = np.exp(logits - logits.max(axis=1, keepdims=True))
        expected /= expected.sum(axis=1, keepdims=True)
        np.testing.assert_allclose(gate, expected, rtol=1e-5, atol=1e-6)
        mixture = np.einsum("be,bed->bd", gate.astype(np.float64), layers["experts"])
        np.testing.assert_allclose(layers[f"{task}_mix"], mixture, rtol=1e-5, atol=1e-6)
    # Each task weighs the experts its own way.
    assert not np.allclose(layers["click_gate"], layers["like_gate"])
    # One task and towers of no hidden layer build too.
    single = rk.models.mmoe(columns(), tasks=("ctr",), num_experts=2, expert_units=(4,),
                            tower_units=())
    assert set(single.predict(table, batch_size=1000, verbose=0)) == {"ctr"}


def test_esmm_checks_its_arguments():
    with pytest.raises(ValueError, match="esmm: tower_units must be a list of positive"):
        rk.models.esmm(columns(), tower_units=(16, 0))
    with pytest.raises(ValueError, match="tower_units must be"):
        rk.models.esmm(columns(), tower_units=16)
    with pytest.raises(ValueError, match="tower_units must be"):
        rk.models.esmm(columns(), tower_units=(8, True))
    with pytest.raises(ValueError, match=r"dropout must be a rate in \[0, 1\)"):
        rk.models.esmm(columns(), dropout=1.0)
    with pytest.raises(ValueError, match="esmm reads pooled features only"):
        rk.models.esmm(rk.layers.FeatureColumns([
            F.Categorical("item", dim=4, table="item"),
            F.Sequence("history", dim=4, max_len=3, table="item", combiner=None)]))
    with pytest.raises(ValueError, match=r"features \['ctr'\] are named like layers"):
        rk.models.esmm(rk.layers.FeatureColumns([F.Numeric("ctr"),
                                                 F.Categorical("item", dim=4)]))
    with pytest.raises(ValueError, match="esmm needs at least one sparse feature"):
        rk.models.esmm(rk.layers.FeatureColumns([F.Numeric("price")]))
    # Towers of no hidden layer, and columns without Numeric features, build.
    table, *_ = teacher_table(50, seed=5)
    plain = rk.models.esmm(columns(), tower_units=())
    assert plain.predict(table, verbose=0)["ctr"].shape == (50, 1)
    sparse_only = rk.models.esmm(rk.layers.FeatureColumns([F.Categorical("item", dim=4)]))
    assert sparse_only.predict(table, verbose=0)["ctcvr"].shape == (50, 1)


def test_mmoe_checks_its_arguments():
    with pytest.raises(ValueError, match="mmoe needs at least one task"):
        rk.models.mmoe(columns(), tasks=())
    with pytest.raises(ValueError, match="mmoe needs at least one task"):
        rk.models.mmoe(columns(), tasks="ctr")
    with pytest.raises(ValueError, match=r"task names must be unique; \['ctr'\] repeat"):
        rk.models.mmoe(columns(), tasks=("ctr", "cvr", "ctr"))
    for bad in ("a/b", "", "1st", 3):
        with pytest.raises(ValueError, match="task names must be strings"):
            rk.models.mmoe(columns(), tasks=("ctr", bad))
    for bad in (1, 0, -1, 2.0, True):
        with pytest.raises(ValueError, match="num_experts must be an int >= 2"):
            rk.models.mmoe(columns(), num_experts=bad)
    with pytest.raises(ValueError, match="expert_units must be a non-empty list"):
        rk.models.mmoe(columns(), expert_units=())
    with pytest.raises(ValueError, match="expert_units must be"):
        rk.models.mmoe(columns(), expert_units=(8, -2))
    with pytest.raises(ValueError, match="mmoe: tower_units must be a list"):
        rk.models.mmoe(columns(), tower_units=(0,))
    with pytest.raises(ValueError, match=r"dropout must be a rate in \[0, 1\)"):
        rk.models.mmoe(columns(), dropout=-0.1)
    with pytest.raises(ValueError, match=r"task names \['expert_0'\] are names of other"):
        rk.models.mmoe(columns(), tasks=("ctr", "expert_0"))
    with pytest.raises(ValueError, match=r"task names \['ctr_gate'\] are names of other"):
        rk.models.mmoe(columns(), tasks=("ctr", "ctr_gate"))
    with pytest.raises(ValueError, match=r"features \['user'\] are named like layers"):
        rk.models.mmoe(columns(), tasks=("user", "ctr"))
    with pytest.raises(ValueError, match="mmoe reads pooled features only"):
        rk.models.mmoe(rk.layers.FeatureColumns([
            F.Sequence("history", dim=4, max_len=3, combiner=None)]))


@pytest.mark.slow
def test_both_models_learn_a_two_task_teacher(trained):
    name, model, history = trained
    for key in ("loss", "ctr_loss", "ctcvr_loss", "ctr_auc", "ctcvr_auc"):
        assert len(history.history[key]) == 4 and np.isfinite(history.history[key]).all()
    assert history.history["loss"][-1] < history.history["loss"][0]
    test, p_click, p_ctcvr, p_conv = teacher_table(2000, seed=1)
    click, conversion = test.column("click").to_numpy(), test.column("conversion").to_numpy()
    # The teacher's own AUCs (the Bayes AUCs) are about 0.87 on both tasks.
    assert auc(click, p_click) > 0.85 and auc(conversion, p_ctcvr) > 0.85
    predictions = model.predict(test, batch_size=1000, verbose=0)
    assert set(predictions) == {"ctr", "ctcvr"}
    assert auc(click, predictions["ctr"][:, 0]) > 0.8
    assert auc(conversion, predictions["ctcvr"][:, 0]) > 0.8
    logs = model.evaluate(test, labels={"ctr": "click", "ctcvr": "conversion"},
                          batch_size=1000, verbose=0, return_dict=True)
    assert logs["ctr_auc"] == pytest.approx(auc(click, predictions["ctr"][:, 0]), rel=1e-6)
    assert logs["ctcvr_auc"] == pytest.approx(
        auc(conversion, predictions["ctcvr"][:, 0]), rel=1e-6)
    if name == "esmm":
        assert (predictions["ctcvr"] <= predictions["ctr"]).all()
        # pCVR took no loss of its own, yet ranks the conversions of the clicks.
        cvr = outputs_of(model, ["cvr"], test)["cvr"][:, 0]
        clicked = click == 1
        assert auc(conversion[clicked], p_conv[clicked]) > 0.85
        assert auc(conversion[clicked], cvr[clicked]) > 0.75


@pytest.mark.slow
def test_save_and_load_predict_the_same(trained, tmp_path):
    name, model, _ = trained
    test, *_ = teacher_table(1000, seed=2)
    predictions = model.predict(test, batch_size=500, verbose=0)
    model.save(tmp_path / f"{name}.keras")
    loaded = keras.models.load_model(tmp_path / f"{name}.keras")
    assert isinstance(loaded, rk.Model)
    again = loaded.predict(test, batch_size=500, verbose=0)
    assert set(again) == {"ctr", "ctcvr"}
    for key in predictions:
        np.testing.assert_array_equal(again[key], predictions[key])
    # The compile config (dict losses and metrics) comes back too.
    labels = {"ctr": "click", "ctcvr": "conversion"}
    before = model.evaluate(test, labels=labels, batch_size=500, verbose=0, return_dict=True)
    after = loaded.evaluate(test, labels=labels, batch_size=500, verbose=0, return_dict=True)
    assert after.keys() == before.keys() and "ctcvr_auc" in after
    for key in before:
        assert after[key] == pytest.approx(before[key], rel=1e-6)
