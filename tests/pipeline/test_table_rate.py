"""Keras's learning-rate callbacks slow the tables down with the dense weights
(`reckeras.pipeline.table_rate`)."""

import keras
import numpy as np
import pytest

import reckeras as rk
from reckeras.pipeline.table_rate import TableRate
import test_model
from test_model import synthetic

DENSE, TABLES = 0.01, 0.1


def build(dense_rate=DENSE):
    model = test_model.build()
    # SGD on the tables: a row's step is proportional to the rate.
    model.compile(optimizer=keras.optimizers.Adam(dense_rate), loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.SGD(TABLES))
    return model


def rows(model):
    table = model.embedding_layers[0].tables[0].export()
    order = np.argsort(table["keys"])
    return table["keys"][order], table["weights"][order]


def dense_rate(model):
    return float(keras.ops.convert_to_numpy(model.optimizer.learning_rate))


def test_a_step_after_the_dense_rate_is_halved_moves_the_rows_half_as_far():
    data = synthetic(256)
    first, second = data.slice(0, 128), data.slice(128)
    models = [build(), build()]
    before = []
    for model in models:
        model.train_on_batch(first)
        before.append(rows(model))
    models[1].optimizer.learning_rate = DENSE / 2
    deltas = []
    for model, (keys, start) in zip(models, before):
        model.train_on_batch(second)
        after_keys, after = rows(model)
        np.testing.assert_array_equal(after_keys, keys)   # `second` adds no key
        deltas.append(after - start)
    # SGD on the tables: the same gradient at half the rate.
    assert np.abs(deltas[0]).max() > 1e-4
    np.testing.assert_allclose(deltas[1], deltas[0] / 2, rtol=1e-4, atol=1e-7)
    assert models[1].embedding_optimizer.learning_rate == pytest.approx(TABLES / 2)
    assert models[0].embedding_optimizer.learning_rate == TABLES


def test_reduce_lr_on_plateau_reduces_the_tables_rate_too():
    model = build()
    # min_delta so large that no epoch after the first improves: the rate
    # halves at the end of the second and the third.
    plateau = keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=0,
                                                min_delta=100.0, min_lr=0.0)
    seen = []
    record = keras.callbacks.LambdaCallback(on_epoch_begin=lambda epoch, logs: seen.append(
        model.embedding_optimizer.learning_rate))
    model.fit(synthetic(512), batch_size=128, epochs=3, verbose=0,
              callbacks=[plateau, record])
    assert dense_rate(model) == pytest.approx(DENSE / 4)
    assert seen == [TABLES, TABLES, pytest.approx(TABLES / 2)]
    # Followed at the end of the epoch, not only at the next step.
    assert model.embedding_optimizer.learning_rate == pytest.approx(TABLES / 4)


def test_learning_rate_scheduler_scales_the_tables_by_the_same_factor():
    model = build()
    schedule = keras.callbacks.LearningRateScheduler(lambda epoch, rate: DENSE * 0.1 ** epoch)
    model.fit(synthetic(256), batch_size=128, epochs=3, verbose=0, callbacks=[schedule])
    assert model.embedding_optimizer.learning_rate == pytest.approx(TABLES * 0.01)


def test_a_rate_set_on_the_tables_is_kept_and_scaled_from():
    model = build()
    set_tables = keras.callbacks.LambdaCallback(on_epoch_begin=lambda epoch, logs: setattr(
        model.embedding_optimizer, "learning_rate", 0.3) if epoch == 0 else None)
    model.fit(synthetic(256), batch_size=128, epochs=2, verbose=0, callbacks=[set_tables])
    assert model.embedding_optimizer.learning_rate == 0.3
    model.optimizer.learning_rate = DENSE / 10
    model.train_on_batch(synthetic(128))
    assert model.embedding_optimizer.learning_rate == pytest.approx(0.03)
    # Back to the dense rate of the anchor: back to the rate set, exactly.
    model.optimizer.learning_rate = DENSE
    model.train_on_batch(synthetic(128))
    assert model.embedding_optimizer.learning_rate == 0.3


def test_a_dense_rate_set_to_zero_and_back():
    dense, tables = keras.optimizers.SGD(0.5), rk.optimizers.SGD(0.2)
    rate = TableRate(dense, tables)
    dense.learning_rate = 0.0
    rate.follow()
    assert tables.learning_rate == 0.0
    dense.learning_rate = 0.25
    rate.follow()
    # The anchor stays the compiled pair: 0.2 * 0.25 / 0.5.
    assert tables.learning_rate == pytest.approx(0.1)


def test_a_dense_schedule_is_not_followed():
    model = build(dense_rate=keras.optimizers.schedules.ExponentialDecay(
        DENSE, decay_steps=1, decay_rate=0.5))
    model.fit(synthetic(512), batch_size=128, epochs=2, verbose=0)
    assert model.embedding_optimizer.learning_rate == TABLES


def trained_at_a_quarter():
    """A model trained, then a step after its dense rate is set to a quarter."""
    model = build()
    model.fit(synthetic(256), batch_size=128, epochs=1, verbose=0)
    model.optimizer.learning_rate = DENSE / 4
    model.train_on_batch(synthetic(128))
    return model


def test_an_exact_checkpoint_load_restores_the_tables_rate(tmp_path):
    model = trained_at_a_quarter()
    assert model.embedding_optimizer.learning_rate == pytest.approx(TABLES / 4)
    model.save_checkpoint(tmp_path / "ckpt")

    resumed = build()
    resumed.load_checkpoint(tmp_path / "ckpt")
    assert dense_rate(resumed) == pytest.approx(DENSE / 4)
    assert resumed.embedding_optimizer.learning_rate == pytest.approx(TABLES / 4)
    warm = build()
    with pytest.warns(UserWarning, match="warm start"):     # the layers' names differ
        warm.load_checkpoint(tmp_path / "ckpt", warm_start=True)
    assert warm.embedding_optimizer.learning_rate == TABLES


def test_a_saved_model_keeps_both_rates(tmp_path):
    model = trained_at_a_quarter()
    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    assert dense_rate(loaded) == pytest.approx(DENSE / 4)
    assert loaded.embedding_optimizer.learning_rate == pytest.approx(TABLES / 4)
    # Reloaded, it goes on following from there.
    loaded.optimizer.learning_rate = DENSE / 8
    loaded.train_on_batch(synthetic(128))
    assert loaded.embedding_optimizer.learning_rate == pytest.approx(TABLES / 8)
