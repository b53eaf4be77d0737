"""Keras's EarlyStopping(restore_best_weights=True) and BackupAndRestore give
a model whose tables and dense weights come from the same epoch."""

import keras
import numpy as np
import pyarrow as pa
import pytest

import reckeras as rk
from test_model import assert_same, snapshot, synthetic


def noisy(n, seed):
    # Labels without signal: with a large learning rate the validation loss
    # is best after the first epoch and worsens as the model memorizes.
    rng = np.random.default_rng(seed)
    return pa.table({"n": rng.normal(size=n).astype(np.float32),
                     "a": rng.integers(0, 200, n), "b": rng.integers(0, 200, n),
                     "label": (rng.random(n) < 0.5).astype(np.float32)})


def build(optimizer="adam", seed=0):
    keras.utils.set_random_seed(seed)
    columns = rk.layers.FeatureColumns([rk.features.Numeric("n"),
                                        rk.features.Categorical("a", dim=8),
                                        rk.features.Categorical("b", dim=8)])
    model = rk.models.dlrm(columns, bottom_units=(16, 8), top_units=(32, 1),
                           dropout=0.0, embedding_l2=0.0)
    model.compile(optimizer=optimizer, loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.Adagrad(0.5))
    return model


def test_get_weights_carries_the_tables_and_set_weights_restores_them():
    model = build()
    data = synthetic(512)
    model.fit(data, batch_size=128, verbose=0)
    saved = model.get_weights()
    assert len(saved) == len(model.weights)          # a Keras weights list
    before = snapshot(model)
    model.fit(data, batch_size=128, verbose=0)
    assert not np.array_equal(before[1][0]["weights"], snapshot(model)[1][0]["weights"])
    model.set_weights(saved)
    assert_same(before, snapshot(model))
    # A plain list (no tables) sets the dense weights only, as in Keras.
    model.set_weights(list(saved))
    assert_same(before, snapshot(model))


@pytest.mark.slow
def test_early_stopping_restores_tables_of_the_best_epoch():
    train, test = noisy(2000, 0), noisy(1000, 1)
    model = build(keras.optimizers.Adam(0.05))
    stopper = keras.callbacks.EarlyStopping(monitor="val_loss", patience=1,
                                            restore_best_weights=True)
    history = model.fit(train, batch_size=250, epochs=8, verbose=0, validation_data=test,
                        callbacks=[stopper]).history["val_loss"]
    best = int(np.argmin(history))
    assert best < len(history) - 1 and len(history) < 8     # it stopped, later was worse
    restored = model.evaluate(test, batch_size=1000, verbose=0, return_dict=True)["loss"]
    assert restored == pytest.approx(history[best], rel=1e-6)


class Interrupt(keras.callbacks.Callback):
    def __init__(self, at_epoch):
        super().__init__()
        self.at_epoch = at_epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.at_epoch:
            raise RuntimeError("interrupted")


@pytest.mark.slow
def test_backup_and_restore_resumes_with_the_tables_of_the_last_backup(tmp_path):
    # Dense SGD without momentum: BackupAndRestore (model.save_weights) keeps
    # no dense optimizer state, the tables keep theirs (Adagrad accumulators).
    data = synthetic(1024)
    never_stopped = build("sgd")
    never_stopped.fit(data, batch_size=256, epochs=4, verbose=0)

    interrupted = build("sgd")
    backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
    with pytest.raises(RuntimeError, match="interrupted"):
        interrupted.fit(data, batch_size=256, epochs=4, verbose=0,
                        callbacks=[backup, Interrupt(2)])
    resumed = build("sgd", seed=1)           # another process: other initial weights
    epochs = []
    history = resumed.fit(data, batch_size=256, epochs=4, verbose=0, callbacks=[
        keras.callbacks.BackupAndRestore(str(tmp_path / "backup")),
        keras.callbacks.LambdaCallback(on_epoch_begin=lambda e, logs: epochs.append(e))])
    assert epochs == [2, 3] and len(history.history["loss"]) == 2
    expected, got = snapshot(never_stopped), snapshot(resumed)
    for a, b in zip(expected[0], got[0]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(expected[1], got[1]):
        np.testing.assert_array_equal(a["keys"], b["keys"])
        np.testing.assert_allclose(a["weights"], b["weights"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(a["state"], b["state"], rtol=1e-5, atol=1e-6)


def test_backup_and_restore_is_refused_under_several_ranks(monkeypatch, tmp_path):
    import dataclasses
    from reckeras import distributed
    model = build()
    two_ranks = dataclasses.replace(distributed.world(), size=2)
    monkeypatch.setattr(distributed, "world", lambda: two_ranks)
    with pytest.raises(ValueError, match="BackupAndRestore writes one weights file"):
        model.fit(synthetic(64), verbose=0,
                  callbacks=[keras.callbacks.BackupAndRestore(str(tmp_path))])
