"""fit/evaluate/predict take the arguments a Keras user passes, with Keras's
meaning (each compared with an equivalent, independently written call)."""

import keras
import numpy as np
import pyarrow as pa
import pytest

import reckeras as rk
from test_model import assert_same, build, snapshot, synthetic


def arrays(table):
    x = {name: table.column(name).to_numpy() for name in ("n", "a", "b")}
    return x, table.column("label").to_numpy()


class Hooks(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.calls = []

    def __getattribute__(self, name):
        if name.startswith("on_"):
            calls = object.__getattribute__(self, "calls")
            return lambda *args, **kwargs: calls.append((name, args + tuple(kwargs.values())))
        return object.__getattribute__(self, name)


@pytest.mark.slow
def test_validation_data_as_x_y_and_x_y_w_tuples():
    train, test = synthetic(1024), synthetic(512, seed=1)
    weights = np.linspace(0, 2, 512).astype(np.float32)
    runs = {}
    for kind in ("table", "tuple", "weighted"):
        model = build()
        val_x, val_y = arrays(test)
        validation = {"table": test, "tuple": (val_x, val_y),
                      "weighted": (val_x, val_y, weights)}[kind]
        runs[kind] = model.fit(train, batch_size=256, epochs=2, verbose=0,
                               validation_data=validation).history
        if kind == "weighted":
            direct = model.evaluate(val_x, val_y, sample_weight=weights, batch_size=4096,
                                    verbose=0, return_dict=True)
            assert runs[kind]["val_loss"][-1] == pytest.approx(direct["loss"], rel=1e-6)
    assert runs["table"]["val_loss"] == runs["tuple"]["val_loss"]
    assert runs["table"]["val_auc"] == runs["tuple"]["val_auc"]
    assert runs["weighted"]["val_loss"] != runs["tuple"]["val_loss"]


@pytest.mark.slow
def test_validation_split_holds_out_the_last_rows():
    data = synthetic(1000)
    split = build().fit(data, batch_size=200, epochs=2, verbose=0, validation_split=0.2)
    manual = build().fit(data.slice(0, 800), batch_size=200, epochs=2, verbose=0,
                         validation_data=data.slice(800))
    assert split.history == manual.history
    x, y = arrays(data)
    from_arrays = build().fit(x, y, batch_size=200, epochs=2, verbose=0,
                              validation_split=0.2)
    assert from_arrays.history == manual.history


def test_validation_split_of_a_streamed_dataset_is_refused():
    dataset = rk.datasets.load("criteo_synth", split="test")
    with pytest.raises(ValueError, match="validation_split needs in-memory data"):
        build().fit(dataset, batch_size=256, verbose=0, validation_split=0.1)
    with pytest.raises(ValueError, match="validation_split must be in"):
        build().fit(synthetic(100), verbose=0, validation_split=1.5)


def test_validation_freq():
    history = build().fit(synthetic(512), batch_size=256, epochs=4, verbose=0,
                          validation_data=synthetic(256, seed=1), validation_freq=2)
    # Keras logs val_ only at the epochs it validated (2 and 4).
    assert len(history.history["loss"]) == 4
    assert len(history.history["val_loss"]) == 2
    with pytest.raises(ValueError, match="validation_freq"):
        build().fit(synthetic(64), verbose=0, validation_freq=0)


@pytest.mark.slow
def test_class_weight_equals_the_matching_sample_weights():
    data = synthetic(1024)
    y = data.column("label").to_numpy()
    by_class = build()
    by_class.fit(data, batch_size=256, epochs=2, verbose=0, class_weight={0: 1.0, 1: 3.0})
    by_sample = build()
    by_sample.fit(data, batch_size=256, epochs=2, verbose=0,
                  sample_weight=np.where(y == 1, 3.0, 1.0))
    assert_same(snapshot(by_class), snapshot(by_sample))
    # A class missing from the mapping weighs 1, as in Keras.
    only_one = build()
    only_one.fit(data, batch_size=256, epochs=2, verbose=0, class_weight={1: 3.0})
    assert_same(snapshot(only_one), snapshot(by_sample))
    plain = build()
    plain.fit(data, batch_size=256, epochs=2, verbose=0)
    assert not np.array_equal(snapshot(plain)[0][-1], snapshot(by_class)[0][-1])


@pytest.mark.parametrize("class_weight, message", [
    ({"zero": 1.0}, "class indices"), ({0: -1.0}, "finite number >= 0"),
    ({0: float("nan")}, "finite number >= 0"), ({}, "non-empty dict")])
def test_bad_class_weight_is_refused(class_weight, message):
    with pytest.raises(ValueError, match=message):
        build().fit(synthetic(64), verbose=0, class_weight=class_weight)


def test_class_weight_and_sample_weight_together_are_refused():
    with pytest.raises(ValueError, match="class_weight and sample_weight"):
        build().fit(synthetic(64), verbose=0, class_weight={0: 1.0},
                    sample_weight=np.ones(64))


def test_sample_weight_array_equals_a_weight_column():
    data = synthetic(512)
    weights = np.where(np.arange(512) % 3 == 0, 2.0, 0.5).astype(np.float32)
    as_array = build()
    as_array.fit(data, batch_size=128, epochs=2, verbose=0, sample_weight=weights)
    as_column = build()
    as_column.fit(data.append_column("w", pa.array(weights)), batch_size=128, epochs=2,
                  verbose=0, sample_weight="w")
    assert_same(snapshot(as_array), snapshot(as_column))
    with pytest.raises(ValueError, match="one weight per example"):
        build().fit(data, verbose=0, sample_weight=weights[:10])
    with pytest.raises(ValueError, match="must name one of its columns"):
        build().fit(rk.datasets.load("criteo_synth", split="test"), verbose=0,
                    sample_weight=np.ones(3))


@pytest.mark.parametrize("verbose", ["auto", 0, 1, 2])
def test_verbose_values(verbose, capsys):
    build().fit(synthetic(256), batch_size=128, verbose=verbose)
    printed = capsys.readouterr()
    assert ("Epoch 1/1:" in printed.out) == (verbose != 0)
    assert ("it/s" in printed.err or "step/s" in printed.err or "s/step" in printed.err) \
        == (verbose in ("auto", 1))


def test_bad_verbose_and_batch_size_are_refused():
    with pytest.raises(ValueError, match="verbose"):
        build().fit(synthetic(64), verbose=3)
    with pytest.raises(ValueError, match="batch_size"):
        build().fit(synthetic(64), verbose=0, batch_size=0)


def test_fit_validation_calls_the_callbacks_test_hooks():
    hooks = Hooks()
    build().fit(synthetic(512), batch_size=256, epochs=2, verbose=0,
                validation_data=synthetic(256, seed=1), callbacks=[hooks])
    names = [name for name, _ in hooks.calls]
    assert names.count("on_test_begin") == 2 and names.count("on_test_end") == 2
    assert names.count("on_test_batch_end") == 2        # one 256-row batch per epoch
    # Validation runs after the epoch's last batch, before its end.
    first_test = names.index("on_test_begin")
    assert names[first_test - 1] == "on_train_batch_end"
    assert names.index("on_epoch_end") > first_test


def test_predict_step_and_predict_callbacks():
    data = synthetic(300)
    model = build()
    model.fit(data, batch_size=100, verbose=0)
    expected = model.predict(data, batch_size=100)
    hooks = Hooks()
    out = model.predict(data, batch_size=100, callbacks=[hooks])
    np.testing.assert_array_equal(out, expected)
    names = [name for name, _ in hooks.calls]
    assert names == ["on_predict_begin"] + ["on_predict_batch_begin",
                                            "on_predict_batch_end"] * 3 + ["on_predict_end"]
    batch_logs = [args[1] for name, args in hooks.calls if name == "on_predict_batch_end"]
    np.testing.assert_array_equal(np.concatenate([logs["outputs"] for logs in batch_logs]),
                                  expected)

    class Doubled(rk.Model):
        def predict_step(self, data):
            return super().predict_step(data) * 2

    doubled = Doubled(model.inputs, model.outputs)
    np.testing.assert_allclose(doubled.predict(data, batch_size=100), 2 * expected,
                               rtol=1e-6)


def test_jit_compile_and_steps_per_execution_are_refused_at_compile():
    model = build()
    with pytest.raises(ValueError, match="jit_compile=True"):
        model.compile(optimizer="adam", loss="binary_crossentropy",
                      embedding_optimizer="adagrad", jit_compile=True)
    with pytest.raises(ValueError, match="steps_per_execution"):
        model.compile(optimizer="adam", loss="binary_crossentropy",
                      embedding_optimizer="adagrad", steps_per_execution=4)
    model.compile(optimizer="adam", loss="binary_crossentropy",
                  embedding_optimizer="adagrad", jit_compile="auto", steps_per_execution=1)
    assert model.jit_compile is False


@pytest.mark.parametrize("x", [(row for row in range(3)), [1, 2, 3], np.zeros(3)])
def test_data_keras_takes_but_reckeras_does_not_is_refused_clearly(x):
    with pytest.raises(TypeError, match="x must be a reckeras dataset .* got"):
        build().fit(x, verbose=0)


def test_loss_scaling_is_refused_at_compile():
    model = build()
    with pytest.raises(ValueError, match="loss scaling"):
        model.compile(optimizer=keras.optimizers.LossScaleOptimizer(
            keras.optimizers.Adam()), loss="binary_crossentropy", embedding_optimizer="sgd")


def test_pandas_dataframes_train_evaluate_and_predict_as_their_table():
    """A DataFrame (and Series labels and weights) is read as the Table of its
    columns: NaN and None are missing values, a categorical column is
    dictionary-encoded, the index is dropped."""
    pd = pytest.importorskip("pandas")
    table = synthetic(600)
    frame = table.to_pandas()
    frame.index = frame.index * 3 + 7                   # an index that is not 0..n-1
    frame.loc[frame.index[::5], "n"] = np.nan
    with_nulls = pa.Table.from_pandas(frame, preserve_index=False)
    assert with_nulls.column("n").null_count == 120
    features, labels = frame[["n", "a", "b"]], frame["label"]
    weights = pd.Series(np.linspace(0.5, 1.5, 600), index=frame.index)

    from_frame = build().fit(features, labels, sample_weight=weights, batch_size=200,
                             epochs=2, verbose=0, shuffle=False)
    model = build()
    x = {name: with_nulls.column(name) for name in ("n", "a", "b")}
    y = with_nulls.column("label").to_numpy()
    from_table = model.fit(x, y, sample_weight=weights.to_numpy(), batch_size=200, epochs=2,
                           verbose=0, shuffle=False)
    assert from_frame.history == from_table.history
    np.testing.assert_array_equal(model.predict(features, verbose=0),
                                  model.predict(with_nulls, verbose=0))
    assert model.evaluate(frame, verbose=0) == model.evaluate(with_nulls, verbose=0)
    np.testing.assert_array_equal(model(features).detach().cpu().numpy(),
                                  model.predict(features, batch_size=600, verbose=0))
    # A categorical column reads as its values.
    categorical = features.assign(a=features["a"].astype("category"))
    np.testing.assert_array_equal(model.predict(categorical, verbose=0),
                                  model.predict(features, verbose=0))


def test_fit_called_epoch_by_epoch_reshuffles_as_one_fit_of_many_epochs():
    """Keras reshuffles on every `fit` call: `fit(epochs=1)` in a loop (to
    evaluate between epochs) trains as `fit(epochs=3)`, not on one order
    three times; a given seed repeats its order."""
    train = synthetic(1000)
    whole = build()
    whole.fit(train, batch_size=128, epochs=3, verbose=0)
    looped = build()
    for _ in range(3):
        looped.fit(train, batch_size=128, epochs=1, verbose=0)
    assert looped.loop_state.epochs_fitted == 3
    assert_same(snapshot(looped), snapshot(whole))
    fixed = build()
    for _ in range(3):
        fixed.fit(train, batch_size=128, epochs=1, verbose=0, seed=0)
    with pytest.raises(AssertionError):
        assert_same(snapshot(fixed), snapshot(whole))
    with pytest.raises(ValueError, match="seed must be an int or None"):
        fixed.fit(train, batch_size=128, epochs=1, verbose=0, seed=1.5)
