"""train_on_batch, test_on_batch and predict_on_batch: one batch through the
loops' preparation, each equal to fit/evaluate/predict on that batch."""

import numpy as np
import pytest

import reckeras as rk
from test_model import assert_same, build, snapshot, synthetic


def arrays(table):
    return {name: table.column(name).to_numpy() for name in ("n", "a", "b")}, \
        table.column("label").to_numpy()


def test_train_on_batch_equals_fit_on_that_batch():
    first, second = synthetic(256), synthetic(256, seed=1)
    by_fit = build()
    fit_logs = [by_fit.fit(batch, batch_size=256, shuffle=False, verbose=0).history
                for batch in (first, second)]
    on_batch = build()
    x, y = arrays(first)
    logs = [on_batch.train_on_batch(x, y, return_dict=True),      # arrays and labels
            on_batch.train_on_batch(second, return_dict=True)]    # a Table with a label column
    assert_same(snapshot(by_fit), snapshot(on_batch))
    for history, batch_logs in zip(fit_logs, logs):
        assert batch_logs == {name: values[0] for name, values in history.items()}


def test_train_on_batch_returns_this_batchs_loss_and_metrics_in_order():
    model = build()
    data = synthetic(128)
    loss, auc = model.train_on_batch(data)
    reference = build()
    history = reference.fit(data, batch_size=128, shuffle=False, verbose=0).history
    assert (loss, auc) == (history["loss"][0], history["auc"][0])


def test_train_on_batch_weights_like_fit():
    data = synthetic(256)
    weights = np.linspace(0, 2, 256).astype(np.float32)
    by_fit, on_batch = build(), build()
    by_fit.fit(data, batch_size=256, verbose=0, sample_weight=weights, shuffle=False)
    on_batch.train_on_batch(data, sample_weight=weights)
    assert_same(snapshot(by_fit), snapshot(on_batch))
    by_fit, on_batch = build(), build()
    by_fit.fit(data, batch_size=256, verbose=0, class_weight={1: 3.0}, shuffle=False)
    on_batch.train_on_batch(data, class_weight={1: 3.0})
    assert_same(snapshot(by_fit), snapshot(on_batch))
    with pytest.raises(ValueError, match="class_weight and sample_weight"):
        on_batch.train_on_batch(data, sample_weight=weights, class_weight={1: 3.0})


def test_test_on_batch_equals_evaluate_and_resets_the_metrics():
    model = build()
    model.fit(synthetic(512), batch_size=128, verbose=0)
    before = snapshot(model)
    batches = synthetic(200, seed=1), synthetic(100, seed=2)
    for batch in batches:
        expected = model.evaluate(batch, batch_size=1000, verbose=0, return_dict=True)
        assert model.test_on_batch(batch, return_dict=True) == expected
        x, y = arrays(batch)
        # The list in Keras's order (the loss first), as evaluate gives it.
        assert model.test_on_batch(x, y) == model.evaluate(batch, batch_size=1000, verbose=0)
        assert model.test_on_batch(x, y)[0] == expected["loss"]
    assert_same(before, snapshot(model))


def test_predict_on_batch_equals_predict_and_creates_no_rows():
    model = build()
    model.fit(synthetic(256), batch_size=128, verbose=0)
    rows = model.embedding_layers[0].engine.num_rows
    unseen = synthetic(64, seed=5)
    x, _ = arrays(unseen)
    x["a"] = x["a"] + 1000                      # ids never trained on
    np.testing.assert_array_equal(model.predict_on_batch(x),
                                  model.predict(x, batch_size=1000, verbose=0))
    assert model.embedding_layers[0].engine.num_rows == rows


def test_on_batch_methods_refuse_what_keras_refuses_and_datasets():
    model = build()
    model.compiled = False
    with pytest.raises(ValueError, match=r"compile\(\) before train_on_batch"):
        model.train_on_batch(synthetic(8))
    with pytest.raises(ValueError, match=r"compile\(\) before test_on_batch"):
        model.test_on_batch(synthetic(8))
    dataset = rk.datasets.load("criteo_synth", split="test")
    with pytest.raises(TypeError, match=r"predict_on_batch\(\) takes one batch.*use predict"):
        build().predict_on_batch(dataset)
    with pytest.raises(TypeError, match=r"train_on_batch\(\) takes one batch.*use fit"):
        build().train_on_batch(dataset)
    with pytest.raises(ValueError, match=r"train_on_batch\(\) needs labels"):
        build().train_on_batch(arrays(synthetic(8))[0])
    with pytest.raises(rk.features.FeatureInputError, match="feature 'b'"):
        build().train_on_batch(synthetic(8).drop(["b"]))
