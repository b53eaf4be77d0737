"""Several labels and dict outputs, with Keras's conventions: dict losses,
`loss_weights`, per-output metrics (AUC and GAUC), labels from `y` or from
named columns."""

import keras
import numpy as np
import pyarrow as pa
import pytest

import reckeras as rk


def two_task_data(n=2000, seed=0):
    rng = np.random.default_rng(seed)
    data = {"n": rng.normal(size=n).astype(np.float32),
            "user": rng.integers(0, 40, n), "item": rng.integers(0, 60, n)}
    p_click = 1 / (1 + np.exp(-(np.sin(data["item"]) + data["n"])))
    click = (rng.random(n) < p_click).astype(np.float32)
    p_conv = 1 / (1 + np.exp(-np.cos(data["user"])))
    data["click"] = click
    data["conv"] = click * (rng.random(n) < p_conv).astype(np.float32)
    return pa.table(data)


def build(seed=0, metrics=None, loss_weights=None):
    keras.utils.set_random_seed(seed)
    columns = rk.layers.FeatureColumns([rk.features.Numeric("n"),
                                        rk.features.Categorical("user", dim=4),
                                        rk.features.Categorical("item", dim=4)])
    inputs = columns.inputs()
    dense, sparse = columns(inputs)
    embedded = rk.layers.ShardedEmbedding(columns, output="concat")(sparse)
    shared = keras.layers.Dense(16, activation="relu")(
        keras.layers.Concatenate()([dense, embedded]))
    outputs = {"click": keras.layers.Dense(1, activation="sigmoid", name="click")(shared),
               "conv": keras.layers.Dense(1, activation="sigmoid", name="conv")(shared)}
    model = rk.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.Adam(0.02),
                  loss={"click": "binary_crossentropy", "conv": "binary_crossentropy"},
                  loss_weights=loss_weights,
                  metrics=metrics or {"click": [rk.metrics.AUC()], "conv": [rk.metrics.AUC()]},
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.1))
    return model


def features(table):
    return {name: table.column(name).to_numpy() for name in ("n", "user", "item")}


def bce(y, p):
    p = np.clip(p.astype(np.float64), 1e-7, 1 - 1e-7)
    return -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))


@pytest.mark.slow
def test_y_dict_equals_label_columns_and_both_tasks_learn():
    train, test = two_task_data(), two_task_data(1000, seed=1)
    by_y = build()
    history = by_y.fit(features(train), {"click": train.column("click").to_numpy(),
                                         "conv": train.column("conv").to_numpy()},
                       batch_size=250, epochs=3, verbose=0)
    by_columns = build()
    again = by_columns.fit(train, labels={"click": "click", "conv": "conv"}, batch_size=250,
                           epochs=3, verbose=0,
                           validation_data=test)
    for name in ("loss", "click_auc", "conv_auc"):
        assert history.history[name] == again.history[name]
    assert "val_click_auc" in again.history and "val_conv_auc" in again.history
    predictions = by_columns.predict(test, batch_size=500)
    assert set(predictions) == {"click", "conv"} and predictions["click"].shape == (1000, 1)
    for a, b in zip(by_y.get_weights(), by_columns.get_weights()):
        np.testing.assert_array_equal(a, b)
    # Each task's AUC, recomputed from the predictions, is learned (> 0.6).
    logs = by_columns.evaluate(test, labels={"click": "click", "conv": "conv"},
                               batch_size=500, verbose=0, return_dict=True)
    for task in ("click", "conv"):
        y, p = test.column(task).to_numpy(), predictions[task][:, 0]
        pos, neg = p[y == 1], p[y == 0]
        auc = (pos[:, None] > neg[None, :]).mean() + 0.5 * (pos[:, None] == neg[None, :]).mean()
        assert logs[f"{task}_auc"] == pytest.approx(auc, rel=1e-6)
        assert auc > 0.6


def test_loss_weights_weigh_the_tasks_losses():
    data = two_task_data(500)
    model = build(loss_weights={"click": 0.25, "conv": 2.0})
    model.fit(data, labels={"click": "click", "conv": "conv"}, batch_size=500, verbose=0)
    logs = model.evaluate(data, labels={"click": "click", "conv": "conv"}, batch_size=500,
                          verbose=0, return_dict=True)
    p = model.predict(data, batch_size=500)
    expected = 0.25 * bce(data.column("click").to_numpy(), p["click"][:, 0]) \
        + 2.0 * bce(data.column("conv").to_numpy(), p["conv"][:, 0])
    assert logs["loss"] == pytest.approx(expected, rel=1e-4)


def test_gauc_per_output_and_save_load(tmp_path):
    data = two_task_data(800)
    model = build(metrics={"click": [rk.metrics.AUC(), rk.metrics.GAUC("user", name="click_gauc")],
                           "conv": [rk.metrics.GAUC("user", name="conv_gauc")]})
    history = model.fit(data, labels={"click": "click", "conv": "conv"}, batch_size=200,
                        verbose=0).history
    assert {"click_gauc", "conv_gauc", "click_auc"} <= set(history)
    expected = rk.metrics.GAUC("user")
    p = model.predict(data, batch_size=200)
    logs = model.evaluate(data, labels={"click": "click", "conv": "conv"}, batch_size=200,
                          verbose=0, return_dict=True)
    expected.update_state(data.column("conv").to_numpy(), p["conv"],
                          groups=data.column("user").to_numpy())
    assert logs["conv_gauc"] == pytest.approx(float(expected.result()), rel=1e-6)
    model.save(tmp_path / "two.keras")
    loaded = keras.models.load_model(tmp_path / "two.keras")
    again = loaded.predict(data, batch_size=200)
    for task in ("click", "conv"):
        np.testing.assert_allclose(again[task], p[task], rtol=1e-6)
    relogged = loaded.evaluate(data, labels={"click": "click", "conv": "conv"},
                               batch_size=200, verbose=0, return_dict=True)
    assert relogged["conv_gauc"] == pytest.approx(logs["conv_gauc"], rel=1e-6)


def test_gaucs_of_several_outputs_need_names_of_their_own():
    with pytest.raises(ValueError, match="GAUC needs a name of its own"):
        build(metrics={"click": [rk.metrics.GAUC("user")], "conv": [rk.metrics.GAUC("user")]})


@pytest.mark.parametrize("labels, message", [
    ("click", "give one label per output"),
    ({"click": "click"}, "labels name outputs"),
    ({"click": "click", "conv": "conv", "extra": "conv"}, "labels name outputs")])
def test_labels_must_match_the_outputs(labels, message):
    with pytest.raises(ValueError, match=message):
        build().fit(two_task_data(100), labels=labels, verbose=0)


def test_missing_label_column_names_it():
    with pytest.raises(rk.features.FeatureInputError, match="label column 'nope'"):
        build().fit(two_task_data(100), labels={"click": "click", "conv": "nope"}, verbose=0)


def test_class_weight_needs_a_single_output():
    with pytest.raises(ValueError, match="single output"):
        build().fit(two_task_data(100), labels={"click": "click", "conv": "conv"},
                    class_weight={0: 1.0, 1: 2.0}, verbose=0)


def test_dict_labels_for_a_single_output_model_are_refused():
    from test_model import build as single, synthetic
    with pytest.raises(ValueError, match="has a single output"):
        single().fit(synthetic(64), labels={"a": "label"}, verbose=0)


def test_a_label_outside_0_1_under_a_binary_loss_names_its_column():
    data = two_task_data(200)
    conv = data.column("conv").to_numpy().copy()
    conv[7] = 2.0
    bad = data.set_column(data.column_names.index("conv"), "conv", pa.array(conv))
    model = build()
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(rk.features.FeatureInputError,
                       match=r"label column 'conv' has values outside \[0, 1\] \(such as 2\)"):
        model.fit(bad, labels={"click": "click", "conv": "conv"}, verbose=0)
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    # Under another loss the same labels are taken as they are.
    model.compile(optimizer="adam", loss={"click": "binary_crossentropy", "conv": "mse"},
                  metrics={"click": [rk.metrics.AUC()], "conv": ["mae"]},
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.1))
    model.fit(bad, labels={"click": "click", "conv": "conv"}, verbose=0)
