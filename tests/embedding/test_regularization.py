"""Embedding regularization (`ShardedEmbedding(embeddings_regularizer=...)`,
`TableOptions(embeddings_regularizer=..., regularize=...)`): the penalty of
the rows a batch looks up, in the loss and in the rows' one update, against
Keras's dense `Embedding`, a dense torch reference and hand-computed cases.
(Several ranks: tests/distributed/test_regularization_on_ranks.py.)"""

import keras
import numpy as np
import pytest
import torch

import reckeras as rk
from reckeras.embedding.regularization import RowPenalty

VOCAB, DIM, L2 = 6, 3, 0.05


@keras.saving.register_keras_serializable(package="test_regularization")
class HalfSquares(keras.regularizers.Regularizer):
    """A regularizer of one's own: a sum over rows, 0 for a zero row."""

    def __init__(self, scale=0.1):
        self.scale = scale

    def __call__(self, x):
        return self.scale * keras.ops.sum(keras.ops.square(x)) / 2

    def get_config(self):
        return {"scale": self.scale}


def _model(regularizer=None, regularize="distinct", table_options=None, dense=False,
           optimizer=None, dense_kernel=None):
    columns = rk.layers.FeatureColumns([rk.features.Categorical("c", dim=DIM)])
    inputs = columns.inputs()
    layer = rk.layers.ShardedEmbedding(columns, output="concat", seed=4,
                                       embeddings_regularizer=regularizer,
                                       regularize=regularize, table_options=table_options)
    out = layer(columns(inputs)[1])
    if dense:
        out = keras.layers.Dense(1, use_bias=False, kernel_initializer=keras.initializers
                                 .Constant(dense_kernel))(out)
    model = rk.Model(inputs, out)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse",
                  embedding_optimizer=optimizer or rk.optimizers.SGD(0.1))
    return model, columns, layer


def _rows(columns, layer, ids=None):
    """The rows of `ids` (every id by default), as inference reads them."""
    ids = np.arange(VOCAB) if ids is None else ids
    packed = columns.plan.packed_sparse({"c": torch.as_tensor(ids)})
    (pooled, _), = layer.engine.lookup(packed["ids"], packed["offsets"], training=False)
    return pooled[:, 0].detach().clone()


def _created(columns, layer):
    """Creates every row (a training lookup, no backward: nothing is
    updated) and returns the rows."""
    packed = columns.plan.packed_sparse({"c": torch.arange(VOCAB)})
    layer.engine.lookup(packed["ids"], packed["offsets"], training=True)
    return _rows(columns, layer)


def _batches(steps, seed=0):
    """Batches of twice every id, shuffled, with random targets."""
    rng = np.random.default_rng(seed)
    return [(rng.permutation(np.repeat(np.arange(VOCAB), 2)),
             rng.normal(size=(2 * VOCAB, DIM)).astype(np.float32)) for _ in range(steps)]


def test_equals_keras_dense_embedding_when_every_row_is_looked_up():
    """Every batch looks up every row: the loss `train_on_batch` reports and
    the rows and dense weights after each SGD step equal a Keras model with
    `Embedding(embeddings_regularizer=L2)` started from the same rows."""
    kernel = np.array([[0.3], [-0.2], [0.5]], np.float32)
    model, columns, layer = _model(keras.regularizers.L2(L2), dense=True,
                                   dense_kernel=kernel)
    initial = _created(columns, layer).numpy()
    ids = keras.Input((), dtype="int64")
    embedding = keras.layers.Embedding(
        VOCAB, DIM, embeddings_initializer=keras.initializers.Constant(initial),
        embeddings_regularizer=keras.regularizers.L2(L2))
    out = keras.layers.Dense(1, use_bias=False,
                             kernel_initializer=keras.initializers.Constant(kernel))(
        embedding(ids))
    reference = keras.Model(ids, out)
    reference.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    for batch, y in _batches(3):
        target = y[:, :1]
        loss = model.train_on_batch({"c": batch}, target)
        # Keras 3.10 reports the mean over the calls since the last reset
        # (3.15 this batch's loss, as rk.Model does): this batch's is compared.
        reference.reset_metrics()
        expected = reference.train_on_batch(batch, target)
        np.testing.assert_allclose(loss, expected, rtol=1e-5)
        np.testing.assert_allclose(_rows(columns, layer).numpy(),
                                   keras.ops.convert_to_numpy(embedding.embeddings),
                                   rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model.layers[-1].kernel),
                               keras.ops.convert_to_numpy(reference.layers[-1].kernel),
                               rtol=1e-5)
    # The penalty changed the rows: an unregularized run ends elsewhere.
    plain, plain_columns, plain_layer = _model(dense=True, dense_kernel=kernel)
    _created(plain_columns, plain_layer)
    for batch, y in _batches(3):
        plain.train_on_batch({"c": batch}, y[:, :1])
    assert float(_rows(plain_columns, plain_layer).square().sum()) > \
        float(_rows(columns, layer).square().sum()) + 1e-3


@pytest.mark.parametrize("regularize", ["distinct", "occurrence"])
def test_distinct_and_occurrence_by_hand(regularize):
    """Ids [0, 0, 0, 1] (B = 4), output the rows, mse against zeros, SGD:
    distinct counts rows 0 and 1 once, occurrence 3/4 and 1/4 times."""
    lr = 0.1
    model, columns, layer = _model(keras.regularizers.L2(L2), regularize)
    e0, e1 = _created(columns, layer)[:2]
    counts = {"distinct": (1.0, 1.0), "occurrence": (3 / 4, 1 / 4)}[regularize]
    data = (3 * e0.square().sum() + e1.square().sum()) / (4 * DIM)
    penalty = L2 * (counts[0] * e0.square().sum() + counts[1] * e1.square().sum())
    loss = model.train_on_batch({"c": np.array([0, 0, 0, 1])}, np.zeros((4, DIM)))
    np.testing.assert_allclose(loss, float(data + penalty), rtol=1e-6)
    # d(data)/d(e0) = 2 * 3 * e0 / (4 * DIM); d(penalty)/d(e0) = 2 * L2 * count * e0.
    expected0 = e0 - lr * (6 / (4 * DIM) + 2 * L2 * counts[0]) * e0
    expected1 = e1 - lr * (2 / (4 * DIM) + 2 * L2 * counts[1]) * e1
    got = _rows(columns, layer)
    torch.testing.assert_close(got[0], expected0)
    torch.testing.assert_close(got[1], expected1)
    assert [float(x.detach()) for x in model.losses] == pytest.approx([float(penalty)])


OPTIMIZERS = [rk.optimizers.SGD(0.1), rk.optimizers.Adagrad(0.1),
              rk.optimizers.RowWiseAdagrad(0.1, initial_accumulator_value=0.1),
              rk.optimizers.Adam(0.05), rk.optimizers.AdamW(0.05, weight_decay=0.01)]


def _dense_reference(initial, optimizer, regularizer, regularize, batches):
    """Losses and rows of a dense copy of the table: torch autograd of the mse
    plus the penalty of the looked-up rows, and one `optimizer.apply` per
    step on the rows the batch looked up."""
    weights = initial.clone()
    state = torch.full((VOCAB, optimizer.state_width(DIM)),
                       getattr(optimizer, "initial_accumulator_value", 0.0))
    losses = []
    for batch, y in batches:
        ids = torch.as_tensor(batch)
        leaf = weights.clone().requires_grad_()
        looked_up = torch.unique(ids)
        if regularize == "distinct":
            penalty = regularizer(leaf[looked_up])
        else:
            penalty = regularizer(leaf[ids]) / ids.numel()
        loss = (leaf[ids] - torch.as_tensor(y)).square().mean() + penalty
        loss.backward()
        losses.append(float(loss.detach()))
        optimizer.apply(weights, state, looked_up, leaf.grad[looked_up])
    return losses, weights


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=lambda o: type(o).__name__)
@pytest.mark.parametrize("regularize", ["distinct", "occurrence"])
def test_every_sparse_optimizer_applies_data_and_penalty_in_one_update(optimizer,
                                                                       regularize):
    """Batches that miss some ids: the rows equal one optimizer step per batch
    with the sum of the data and penalty gradients (not two steps), and the
    reported losses include the penalty."""
    regularizer = keras.regularizers.L2(L2)
    model, columns, layer = _model(regularizer, regularize,
                                   optimizer=type(optimizer).from_config(
                                       optimizer.get_config()))
    initial = _created(columns, layer)
    rng = np.random.default_rng(1)
    batches = [(rng.integers(0, VOCAB - 2, 8), rng.normal(size=(8, DIM)).astype(np.float32))
               for _ in range(3)]
    losses = [model.train_on_batch({"c": b}, y) for b, y in batches]
    expected_losses, expected = _dense_reference(initial, optimizer, regularizer,
                                                 regularize, batches)
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-5)
    torch.testing.assert_close(_rows(columns, layer), expected, rtol=1e-5, atol=1e-6)
    # Ids 4 and 5 were never looked up: no penalty touched them.
    torch.testing.assert_close(_rows(columns, layer)[4:], initial[4:], rtol=0, atol=0)


@pytest.mark.parametrize("regularizer", [
    keras.regularizers.L1(0.02), keras.regularizers.L1L2(0.01, 0.03), HalfSquares(0.2)],
    ids=["L1", "L1L2", "custom"])
def test_other_keras_regularizers_and_a_custom_one(regularizer):
    model, columns, layer = _model(regularizer)
    initial = _created(columns, layer)
    batches = _batches(2, seed=3)
    losses = [model.train_on_batch({"c": b}, y) for b, y in batches]
    expected_losses, expected = _dense_reference(initial, rk.optimizers.SGD(0.1),
                                                 regularizer, "distinct", batches)
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-5)
    torch.testing.assert_close(_rows(columns, layer), expected, rtol=1e-5, atol=1e-6)


def test_per_table_options_override_the_layer_default():
    """Table "a" takes the layer's L2 with occurrence counting; table "b"
    (its own dim) its own L1, counted by distinct rows."""
    columns = rk.layers.FeatureColumns([rk.features.Categorical("a", dim=2),
                                        rk.features.Categorical("b", dim=3)])
    layer = rk.layers.ShardedEmbedding(
        columns, output="concat", embeddings_regularizer="l2", regularize="occurrence",
        table_options={"b": rk.embedding.TableOptions(
            embeddings_regularizer=keras.regularizers.L1(0.5), regularize="distinct")})
    x = {"a": torch.tensor([1, 1, 2, 1]), "b": torch.tensor([7, 7, 7, 8])}
    out = layer(columns.plan.packed_sparse(x), training=True)
    a, b = out[:, :2].detach(), out[:, 2:].detach()
    expected = 0.01 * a.square().sum() / 4 + 0.5 * b[[0, 3]].abs().sum()
    (penalty,) = layer.losses
    torch.testing.assert_close(penalty.detach(), expected)


@pytest.mark.parametrize("options", [
    {"storage": "host_cached", "cache_rows": 8},
    {"dtype": "float16"}, {"dtype": "bfloat16"}], ids=["host_cached", "float16", "bfloat16"])
def test_host_cached_and_half_precision_tables(options):
    """The same training as on float32 device rows: exact behind a host cache;
    within rounding for half rows (the penalty reads the stored rows)."""
    regularizer = keras.regularizers.L2(L2)
    model, columns, layer = _model(
        table_options={"c": rk.embedding.TableOptions(embeddings_regularizer=regularizer,
                                                      **options)})
    initial = _created(columns, layer)
    batches = _batches(3, seed=5)
    first = model.train_on_batch({"c": batches[0][0]}, batches[0][1])
    # The first step's loss is computed from the stored rows exactly.
    stored = initial[torch.as_tensor(batches[0][0])]
    np.testing.assert_allclose(first, float(
        (stored - torch.as_tensor(batches[0][1])).square().mean()
        + L2 * initial.square().sum()), rtol=1e-6)
    for batch, y in batches[1:]:
        model.train_on_batch({"c": batch}, y)
    _, expected = _dense_reference(initial, rk.optimizers.SGD(0.1), regularizer,
                                   "distinct", batches)
    exact = "dtype" not in options
    torch.testing.assert_close(_rows(columns, layer), expected,
                               rtol=1e-5 if exact else 2e-2, atol=1e-6 if exact else 1e-2)
    if exact:
        assert layer.engine.caches[0] is not None


def test_frozen_layer_adds_no_penalty_and_evaluate_counts_it():
    model, columns, layer = _model(keras.regularizers.L2(L2))
    rows = _created(columns, layer)
    x, y = {"c": np.arange(VOCAB)}, np.zeros((VOCAB, DIM), np.float32)
    data = float(rows.square().mean())
    # evaluate counts the penalty as Keras counts its weight regularizers.
    np.testing.assert_allclose(model.evaluate(x, y, verbose=0),
                               data + L2 * float(rows.square().sum()), rtol=1e-6)
    layer.trainable = False
    model.compile(loss="mse", embedding_optimizer=rk.optimizers.SGD(0.1))
    np.testing.assert_allclose(model.evaluate(x, y, verbose=0), data, rtol=1e-6)
    assert model.losses == []


def test_no_regularizer_adds_no_loss():
    model, columns, layer = _model()
    assert not layer.engine.regularizes
    _created(columns, layer)
    assert model.losses == []


def test_row_penalty_counts_occurrences_over_the_batch():
    rows = torch.tensor([[1.0, 2.0], [0.0, 3.0]])
    unique_index = torch.tensor([0, 0, 1, 0])
    distinct = RowPenalty(keras.regularizers.L2(0.5), "distinct")
    occurrence = RowPenalty(keras.regularizers.L2(0.5), "occurrence")
    assert float(distinct(rows, unique_index, 4, 1)) == pytest.approx(0.5 * 14)
    assert float(distinct(rows, unique_index, 4, 3)) == pytest.approx(3 * 0.5 * 14)
    assert float(occurrence(rows, unique_index, 4, 3)) == pytest.approx(
        0.5 * (3 * 5 + 9) / 4)
    assert float(occurrence(rows, unique_index[:0], 0, 1)) == 0.0


@pytest.mark.parametrize("regularize", ["distinct", "occurrence"])
def test_ids_without_a_row_add_no_penalty(regularize):
    """Id 99 has no row (never trained): it reads zeros and adds nothing."""
    model, columns, layer = _model(keras.regularizers.L2(L2), regularize)
    rows = _created(columns, layer)
    x, y = {"c": np.array([0, 1, 1, 99])}, np.zeros((4, DIM), np.float32)
    data = float((rows[0].square().sum() + 2 * rows[1].square().sum()) / (4 * DIM))
    counts = (1.0, 1.0) if regularize == "distinct" else (1 / 4, 2 / 4)
    penalty = L2 * float(counts[0] * rows[0].square().sum()
                         + counts[1] * rows[1].square().sum())
    np.testing.assert_allclose(model.evaluate(x, y, verbose=0), data + penalty, rtol=1e-6)
