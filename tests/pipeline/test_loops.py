import threading

import keras
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import reckeras as rk


def data(n=64):
    rng = np.random.default_rng(0)
    return pa.table({"n": rng.normal(size=n).astype(np.float32),
                     "a": rng.integers(0, 10, n),
                     "label": rng.integers(0, 2, n).astype(np.float32)})


def build():
    keras.utils.set_random_seed(0)
    columns = rk.layers.FeatureColumns([rk.features.Numeric("n"),
                                        rk.features.Categorical("a", dim=4)])
    model = rk.models.dlrm(columns, bottom_units=(4,), top_units=(8, 1), dropout=0.0,
                           embedding_l2=0.0)
    model.compile(optimizer="adam", loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.1))
    return model


def executor_threads():
    return {t.ident for t in threading.enumerate() if t.name.startswith("ThreadPoolExecutor")}


class EpochThreads(keras.callbacks.Callback):
    """Only `on_epoch_end` and `on_test_end` of its own: records the thread
    pools' workers alive then."""

    def on_epoch_end(self, epoch, logs=None):
        self.seen = executor_threads()

    def on_test_end(self, logs=None):
        self.seen_test = executor_threads()


def test_no_worker_thread_when_no_callback_has_a_batch_end():
    model, before = build(), executor_threads()
    callback = EpochThreads()
    model.fit(data(), batch_size=8, verbose=0, callbacks=[callback])
    model.evaluate(data(), batch_size=8, verbose=0, callbacks=[callback])
    # Keras hands each step's no-op batch end to a worker thread.
    assert callback.seen - before == set()
    assert callback.seen_test - before == set()


def test_every_kind_of_batch_end_still_runs_each_step():
    class OwnBatchEnd(keras.callbacks.Callback):      # Keras's default calls it
        def __init__(self):
            super().__init__()
            self.steps = []

        def on_batch_end(self, batch, logs=None):
            self.steps.append((batch, float(logs["loss"])))

    model, own = build(), OwnBatchEnd()
    train, test, predicted = [], [], []
    callbacks = [own, keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: train.append(batch),
        on_test_batch_end=lambda batch, logs: test.append(batch),
        on_predict_batch_end=lambda batch, logs: predicted.append(logs["outputs"].shape))]
    history = model.fit(data(), batch_size=8, verbose=0, callbacks=callbacks)
    model.evaluate(data(24), batch_size=8, verbose=0, callbacks=callbacks)
    model.predict(data(20), batch_size=8, verbose=0, callbacks=callbacks)
    assert train == list(range(8)) and [b for b, _ in own.steps] == list(range(8))
    # The last step's logs hold the epoch's running loss, as `fit` returns it.
    np.testing.assert_allclose(own.steps[-1][1], history.history["loss"][-1], rtol=1e-6)
    assert test == [0, 1, 2]
    assert predicted == [(8, 1), (8, 1), (4, 1)]


def test_data_without_rows_is_named_in_every_loop(tmp_path):
    model = build()
    model.fit(data(), batch_size=32, verbose=0)
    empty = data().slice(0, 0)
    for loop in (lambda d: model.fit(d, verbose=0), lambda d: model.evaluate(d, verbose=0),
                 lambda d: model.predict(d, verbose=0)):
        with pytest.raises(ValueError, match="gives no batch in this process: it holds "
                                             "no rows"):
            loop(empty)
    pq.write_table(empty, tmp_path / "empty.parquet")
    with pytest.raises(ValueError, match="empty.parquet gives no batch"):
        model.fit(rk.datasets.from_parquet(tmp_path / "empty.parquet"), verbose=0)
    x = {name: empty.column(name).to_numpy() for name in ("n", "a")}
    with pytest.raises(ValueError, match="gives no batch"):
        model.fit(x, np.zeros(0, np.float32), verbose=0)
