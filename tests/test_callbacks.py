import os

import keras
import numpy as np
import pytest

import reckeras as rk


def small_model():
    keras.utils.set_random_seed(0)
    columns = rk.layers.FeatureColumns([rk.features.Numeric("n"),
                                        rk.features.Categorical("a", dim=4)])
    model = rk.models.dlrm(columns, bottom_units=(4,), top_units=(4, 1),
                           dropout=0.0, embedding_l2=0.0)
    model.compile(optimizer="adam", loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.Adagrad(0.1),
                  metrics=[rk.metrics.AUC()])
    return model


def data(n=400):
    rng = np.random.default_rng(0)
    x = {"n": rng.normal(size=n).astype(np.float32), "a": rng.integers(0, 10, n)}
    return x, (x["a"] % 2).astype(np.float32)


def test_model_checkpoint_best_only_and_reload(tmp_path):
    x, y = data()
    template = str(tmp_path / "ck{epoch}")
    best = rk.callbacks.ModelCheckpoint(template, monitor="auc", save_best_only=True)
    every = rk.callbacks.ModelCheckpoint(str(tmp_path / "all{epoch}"))
    model = small_model()
    history = model.fit(x, y, batch_size=100, epochs=3, verbose=0, callbacks=[best, every])
    aucs = history.history["auc"]
    expected = [f"ck{e + 1}" for e in range(3) if aucs[e] == max(aucs[:e + 1])]
    assert [os.path.basename(p) for p in best.saved] == expected
    assert [os.path.basename(p) for p in every.saved] == ["all1", "all2", "all3"]
    other = small_model()
    other.load_checkpoint(every.saved[-1])
    np.testing.assert_allclose(other.predict(x), model.predict(x), rtol=1e-6)
    with pytest.raises(ValueError, match="mode"):
        rk.callbacks.ModelCheckpoint(template, mode="up")


@pytest.mark.parametrize("update_freq", [0, True, "batch"])
def test_tensorboard_refuses_a_bad_update_freq(tmp_path, update_freq):
    with pytest.raises(ValueError, match="update_freq must be 'epoch' or a positive int"):
        rk.callbacks.TensorBoard(tmp_path, update_freq=update_freq)


def test_tensorboard_event_files_are_readable(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    x, y = data()
    model = small_model()
    model.fit(x, y, batch_size=100, epochs=2, verbose=0,
              callbacks=[rk.callbacks.TensorBoard(tmp_path, update_freq=2)])
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"epoch_loss", "epoch_auc", "batch_loss"} <= tags
    losses = [e.value for e in events.Scalars("epoch_loss")]
    assert len(losses) == 2 and losses[1] < losses[0] + 1.0
