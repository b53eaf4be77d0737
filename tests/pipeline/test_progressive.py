"""rk.Model.fit_windows: progressive validation over time windows."""

import keras
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import reckeras as rk
from test_model import assert_same, build, snapshot

DATES = ["2026-12-01", "2026-12-02", "2026-12-03"]
BATCH = 250


def day_table(day, n=1000):
    """A day of a drifting log: the effect of `a` changes sign on day 2."""
    rng = np.random.default_rng(day)
    data = {"n": rng.normal(size=n).astype(np.float32),
            "a": rng.integers(0, 20, n), "b": rng.integers(0, 20, n)}
    sign = -1.0 if day == 2 else 1.0
    logit = 2.0 * sign * (2 * (data["a"] % 2) - 1) + np.cos(data["b"]) + data["n"]
    data["label"] = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    return pa.table(data)


@pytest.fixture(scope="module")
def days(tmp_path_factory):
    root = tmp_path_factory.mktemp("logs")
    for day, date in enumerate(DATES):
        (root / f"dt={date}").mkdir()
        pq.write_table(day_table(day), root / f"dt={date}" / "part-0.parquet",
                       row_group_size=400)
    return rk.datasets.from_parquet(root).windows("dt")


@pytest.mark.slow
def test_each_window_is_evaluated_with_the_weights_before_training_on_it(days):
    model = build()
    history = model.fit_windows(days, batch_size=BATCH, verbose=0, seed=5)
    manual = build()
    expected = {"progressive_loss": [], "progressive_auc": [], "loss": [], "auc": [],
                "after_auc": []}
    for index, day in enumerate(days):
        before = manual.evaluate(day, batch_size=BATCH, verbose=0, return_dict=True)
        trained = manual.fit(day, batch_size=BATCH, epochs=1, verbose=0, seed=5 + index)
        after = manual.evaluate(day, batch_size=BATCH, verbose=0, return_dict=True)
        expected["progressive_loss"].append(before["loss"])
        expected["progressive_auc"].append(before["auc"])
        expected["loss"].append(trained.history["loss"][0])
        expected["auc"].append(trained.history["auc"][0])
        expected["after_auc"].append(after["auc"])
    assert_same(snapshot(model), snapshot(manual))
    assert history.history["window"] == [f"dt={date}" for date in DATES]
    assert set(history.history) == {"window", "loss", "auc", "progressive_loss",
                                    "progressive_auc"}
    for key in ("progressive_loss", "progressive_auc", "loss", "auc"):
        np.testing.assert_allclose(history.history[key], expected[key], rtol=1e-6)
    assert history.epoch == [0, 1, 2]
    assert model.history is history
    # The progressive figures are not those of the trained weights: each day
    # ranks better once trained on, day 2 (its effect flipped) most of all.
    progressive = history.history["progressive_auc"]
    assert all(p < a for p, a in zip(progressive, expected["after_auc"]))
    assert progressive[1] > progressive[0] + 0.05
    assert progressive[2] < expected["after_auc"][2] - 0.1


class Recorder(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.events = []

    def on_train_begin(self, logs=None):
        self.events.append(("train_begin",))

    def on_epoch_begin(self, epoch, logs=None):
        self.events.append(("epoch_begin", epoch, dict(logs)))

    def on_test_begin(self, logs=None):
        self.events.append(("test_begin",))

    def on_test_batch_end(self, batch, logs=None):
        self.events.append(("test_batch",))

    def on_train_batch_end(self, batch, logs=None):
        self.events.append(("train_batch",))

    def on_epoch_end(self, epoch, logs=None):
        self.events.append(("epoch_end", epoch, sorted(logs)))

    def on_train_end(self, logs=None):
        self.events.append(("train_end",))


@pytest.mark.slow
def test_callbacks_see_one_epoch_per_window(days):
    recorder = Recorder()
    build().fit_windows(days, batch_size=BATCH, verbose=0, callbacks=[recorder])
    expected = [("train_begin",)]
    for index, date in enumerate(DATES):
        expected += [("epoch_begin", index, {"window": f"dt={date}"}), ("test_begin",)]
        expected += [("test_batch",)] * 4 + [("train_batch",)] * 4
        expected.append(("epoch_end", index, ["auc", "loss", "progressive_auc",
                                              "progressive_loss"]))
    expected.append(("train_end",))
    assert recorder.events == expected


@pytest.mark.slow
def test_early_stopping_on_a_progressive_metric(days):
    # Keras infers the direction of "loss" and "val_*" names only: give mode.
    stopper = keras.callbacks.EarlyStopping(monitor="progressive_loss", mode="min",
                                            patience=0, min_delta=10.0)
    history = build().fit_windows(days, batch_size=BATCH, verbose=0, callbacks=[stopper])
    assert history.history["window"] == ["dt=2026-12-01", "dt=2026-12-02"]
    assert len(history.history["progressive_loss"]) == 2


def test_in_memory_windows_and_one_line_per_window(capsys):
    tables = [day_table(day, 500) for day in range(2)]
    history = build().fit_windows(tables, batch_size=BATCH, verbose=2, shuffle=False)
    assert history.history["window"] == ["0", "1"]
    lines = [line for line in capsys.readouterr().out.splitlines() if "Window" in line]
    assert len(lines) == 2
    assert lines[1].startswith("Window 2/2 1: ")
    assert "progressive_auc=" in lines[1]


def test_bad_calls(days):
    with pytest.raises(ValueError, match="at least one window"):
        build().fit_windows([], verbose=0)
    with pytest.raises(ValueError, match="BackupAndRestore"):
        build().fit_windows(days, verbose=0, callbacks=[
            keras.callbacks.BackupAndRestore("/tmp/never-written")])
    uncompiled = rk.models.dlrm(rk.layers.FeatureColumns(
        [rk.features.Numeric("n"), rk.features.Categorical("a", dim=4)]),
        bottom_units=(4,), top_units=(4, 1))
    with pytest.raises(RuntimeError, match="compile"):
        uncompiled.fit_windows(days, verbose=0)
