"""The non-finite guard: a step whose loss, or any dense or embedding
gradient, is NaN or inf changes no dense weight, no table row and no
optimizer state; `compile(nonfinite=...)` says whether fit raises or skips."""

import keras
import numpy as np
import pyarrow as pa
import pytest

import reckeras as rk
from test_model import synthetic

POISON = 7.0            # a label value that marks the batch the loss poisons


def poisoned_loss(y_true, y_pred):
    # Finite except in a batch holding a POISON label: there NaN.
    bce = keras.losses.binary_crossentropy(keras.ops.minimum(y_true, 1.0), y_pred)
    poisoned = keras.ops.any(keras.ops.equal(y_true, POISON))
    return bce * keras.ops.where(poisoned, float("nan"), 1.0)


def build(loss=poisoned_loss, nonfinite="raise", embedding_nan=False, seed=0,
          batch_norm=False):
    keras.utils.set_random_seed(seed)
    columns = rk.layers.FeatureColumns([rk.features.Numeric("n"),
                                        rk.features.Categorical("a", dim=4),
                                        rk.features.Categorical("b", dim=4)])
    inputs = columns.inputs()
    dense, sparse = columns(inputs)
    embedded = rk.layers.ShardedEmbedding(columns, output="concat")(sparse)
    if embedding_nan:
        # Forward adds exactly 0; backward: d sqrt(0 * e) / de = inf * 0 = NaN,
        # so only the embedding gradients are non-finite.
        embedded = keras.layers.Lambda(
            lambda e: e + keras.ops.sqrt(keras.ops.abs(e) * 0.0))(embedded)
    hidden = keras.layers.Dense(8, activation="relu")(
        keras.layers.Concatenate()([dense, embedded]))
    if batch_norm:
        # State a forward assigns: the moving statistics, a seeded Dropout's seed
        # (an unseeded one draws from torch's global generator, not a variable).
        hidden = keras.layers.Dropout(0.2, seed=1)(keras.layers.BatchNormalization()(hidden))
    model = rk.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(hidden))
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss=loss,
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.1),
                  nonfinite=nonfinite)
    return model


def state(model):
    """Dense weights, dense optimizer variables and every table's export."""
    return ([v.numpy().copy() for v in model.weights],
            [v.numpy().copy() for v in model.optimizer.variables],
            [t for layer in model.embedding_layers for t in layer.table_states()])


def assert_unchanged(before, after):
    for a, b in zip(before[0] + before[1], after[0] + after[1]):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(before[2], after[2]):
        np.testing.assert_array_equal(a.keys, b.keys)
        np.testing.assert_array_equal(a.weights, b.weights)
        np.testing.assert_array_equal(a.state, b.state)


def poison(table, rows):
    labels = table.column("label").to_numpy().copy()
    labels[rows] = POISON
    return table.set_column(table.column_names.index("label"), "label", pa.array(labels))


@pytest.mark.parametrize("batch_norm", [False, True])
def test_raise_names_the_step_and_changes_nothing(batch_norm):
    data = synthetic(512)
    model = build(batch_norm=batch_norm)
    model.fit(data.slice(0, 256), batch_size=128, verbose=0)      # warm: rows, Adam state
    before = state(model)
    with pytest.raises(rk.NonFiniteStepError, match="training step 1 of epoch 1: the loss"):
        model.fit(poison(data.slice(256), [3]), batch_size=256, verbose=0, shuffle=False)
    assert_unchanged(before, state(model))


def test_nan_embedding_gradient_alone_is_caught():
    model = build(loss="binary_crossentropy", embedding_nan=True)
    data = synthetic(256)
    before = state(model)
    with pytest.raises(rk.NonFiniteStepError, match="embedding gradient"):
        model.fit(data, batch_size=256, verbose=0)
    after = state(model)
    # Rows first seen in the refused step exist (at their initial values);
    # no dense weight or optimizer variable changed.
    assert_unchanged(before[:2] + ([],), after[:2] + ([],))
    for table in after[2]:
        assert np.isfinite(table.weights).all()
        assert (table.state == table.state.flat[0]).all()    # never updated


@pytest.mark.parametrize("batch_norm", [False, True])
def test_skip_equals_training_without_the_bad_batch(batch_norm):
    data = synthetic(768)
    bad = poison(data, [300])                        # in the second of three batches
    skipped = build(nonfinite="skip", batch_norm=batch_norm)
    history = skipped.fit(bad, batch_size=256, epochs=1, verbose=0, shuffle=False)
    assert skipped.pipeline_stats["nonfinite_skipped"] == 1
    assert np.isfinite(history.history["loss"]).all()
    reference = build(nonfinite="skip", batch_norm=batch_norm)
    reference.fit(pa.concat_tables([data.slice(0, 256), data.slice(512)]), batch_size=256,
                  epochs=1, verbose=0, shuffle=False)
    a, b = state(skipped), state(reference)
    for x, y in zip(a[0] + a[1], b[0] + b[1]):
        np.testing.assert_array_equal(x, y)
    # Same rows for every key the reference holds; keys only the refused batch
    # brought are still at their initial values (never updated).
    for got, want in zip(a[2], b[2]):
        index = {key: i for i, key in enumerate(got.keys)}
        rows = [index[key] for key in want.keys]
        np.testing.assert_array_equal(got.weights[rows], want.weights)
        np.testing.assert_array_equal(got.state[rows], want.state)


def test_nonfinite_policy_is_validated():
    with pytest.raises(ValueError, match="nonfinite must be one of"):
        build(nonfinite="ignore")


def test_a_model_without_a_loss_says_so_and_changes_nothing():
    """compile() without a loss, the tables' regularization the only loss:
    Keras's 'Provide a `loss`' message (not the optimizer's 'No gradients'),
    and the step changes no weight, optimizer variable or row."""
    keras.utils.set_random_seed(0)
    columns = rk.layers.FeatureColumns([rk.features.Numeric("n"),
                                        rk.features.Categorical("a", dim=4),
                                        rk.features.Categorical("b", dim=4)])
    model = rk.models.dlrm(columns, bottom_units=(8, 4), top_units=(8, 1),
                           embedding_l2=1e-4)
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.1))
    data = synthetic(256)
    model.predict(data, verbose=0)                     # creates nothing; builds the model
    before = state(model)
    with pytest.raises(ValueError, match="Provide a `loss` argument in `compile\\(\\)`"):
        model.fit(data, batch_size=128, verbose=0)
    after = state(model)
    assert_unchanged(before[:2] + ([],), after[:2] + ([],))
    for table in after[2]:
        assert (table.state == table.state.flat[0]).all()    # never updated
