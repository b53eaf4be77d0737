"""A model that reads every feature kind and has two tasks trains, saves,
loads and predicts the same values; the ids it learns span the whole int64
range and the missing values it meets embed as zeros."""

import keras
import numpy as np
import pyarrow as pa
import pytest

import reckeras as rk
from reckeras.features.encode import as_tensors

pytestmark = pytest.mark.slow  # trains a two-task model on every feature kind

F = rk.features
ROWS = 1200


def every_kind_table(seed):
    """A batch of every column kind; click depends on a negative-id
    Categorical and on a weighted tag list, conversion on a vector."""
    rng = np.random.default_rng(seed)
    user = rng.integers(-2**63, 2**63 - 1, 30, dtype=np.int64)[rng.integers(0, 30, ROWS)]
    site = rng.choice(np.array(["a.com", "b.org", "c.net"]), ROWS)
    tags = [rng.integers(-5, 5, rng.integers(0, 6)).tolist() for _ in range(ROWS)]
    tag_weights = [rng.uniform(0.1, 2.0, len(t)).round(2).tolist() for t in tags]
    history = [rng.integers(-3, 40, rng.integers(0, 12)).tolist() for _ in range(ROWS)]
    image = rng.normal(size=(ROWS, 4)).astype(np.float32)
    price = rng.lognormal(0, 1, ROWS).astype(np.float32)
    age = rng.uniform(15, 70, ROWS)
    user_effect = {int(u): e for u, e in zip(np.unique(user),
                                             rng.normal(0, 1.5, len(np.unique(user))))}
    tag_score = np.array([sum(w * (1 if t < 0 else -1) for t, w in zip(ts, ws))
                          for ts, ws in zip(tags, tag_weights)])
    logit = np.array([user_effect[int(u)] for u in user]) + tag_score
    click = (rng.random(ROWS) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    conversion = click * (rng.random(ROWS) < 1 / (1 + np.exp(-2 * image[:, 0])))
    nulls = rng.random(ROWS) < 0.1          # missing users: empty bags
    return pa.table({
        "price": price, "image": pa.FixedSizeListArray.from_arrays(
            pa.array(image.reshape(-1)), 4),
        "user": pa.array(user, mask=nulls), "site": site, "age": age,
        "tags": pa.array(tags, pa.list_(pa.int64())),
        "tag_weights": pa.array(tag_weights, pa.list_(pa.float32())),
        "history": pa.array(history, pa.list_(pa.int64())),
        "click": click, "conversion": conversion.astype(np.float32)})


def every_kind_model():
    columns = rk.layers.FeatureColumns([
        F.Numeric("price", transform="log1p"),
        F.Numeric("image", shape=(4,), transform="standardize"),
        F.Categorical("user", dim=8),
        F.Categorical("site", dim=8, dtype="string"),
        F.Categorical("age", dim=8, boundaries=[25, 40, 55]),
        F.Cross(["user", "age"], dim=8, hash_buckets=500),
        F.Sequence("tags", dim=8, max_len=4, combiner="sqrtn", weights="tag_weights"),
        F.Sequence("history", dim=8, max_len=8, combiner=None, table="history")])
    inputs = columns.inputs()
    dense, sparse = columns(inputs)
    embedded = rk.layers.ShardedEmbedding(columns, output="dict")(sparse)
    mask = keras.ops.cast(columns.sequence_mask(inputs, "history"), "float32")
    history = keras.ops.sum(embedded["history"] * keras.ops.expand_dims(mask, -1), axis=1) \
        / keras.ops.maximum(keras.ops.sum(mask, axis=1, keepdims=True), 1.0)
    pooled = [embedded[name] for name in ("user", "site", "age", "user_x_age", "tags")]
    x = keras.ops.concatenate([dense, history, *pooled], axis=1)
    x = keras.layers.Dense(32, activation="relu")(x)
    outputs = {"ctr": keras.layers.Dense(1, activation="sigmoid", name="ctr")(x),
               "cvr": keras.layers.Dense(1, activation="sigmoid", name="cvr")(x)}
    model = rk.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.Adam(5e-3),
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.1),
                  loss={"ctr": "binary_crossentropy", "cvr": "binary_crossentropy"},
                  metrics={"ctr": [rk.metrics.AUC(name="auc")],
                           "cvr": [rk.metrics.AUC(name="auc")]})
    return model


LABELS = {"ctr": "click", "cvr": "conversion"}


@pytest.fixture(scope="module")
def trained():
    keras.utils.set_random_seed(0)
    model = every_kind_model()
    model.fit(every_kind_table(0), labels=LABELS, batch_size=100, epochs=4, verbose=0)
    return model


def test_every_kind_learns_both_tasks(trained):
    logs = trained.evaluate(every_kind_table(1), labels=LABELS, batch_size=300, verbose=0,
                            return_dict=True)
    # Users with ids spread over the int64 range and weighted tags drive
    # clicks; the image vector drives conversions.
    assert logs["ctr_auc"] > 0.75 and logs["cvr_auc"] > 0.75


def test_every_kind_saves_loads_and_predicts_the_same(trained, tmp_path):
    test = every_kind_table(2)
    trained.save(tmp_path / "every_kind.keras")
    loaded = keras.models.load_model(tmp_path / "every_kind.keras")
    before, after = trained.predict(test, verbose=0), loaded.predict(test, verbose=0)
    for task in ("ctr", "cvr"):
        np.testing.assert_allclose(after[task], before[task], rtol=1e-6, atol=1e-7)


def test_a_missing_user_reads_zeros_and_its_cross_too(trained):
    columns = trained.feature_columns
    row = every_kind_table(3).slice(0, 2)
    user = pa.array([None, None], pa.int64())
    encoded = columns.encode(row.set_column(row.schema.get_field_index("user"), "user", user))
    layer = next(layer for layer in trained.layers
                 if isinstance(layer, rk.layers.ShardedEmbedding))
    import torch
    _, sparse = columns.pack(as_tensors(encoded))
    out = layer(sparse)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(out["user"]), 0.0)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(out["user_x_age"]), 0.0)
    assert np.abs(keras.ops.convert_to_numpy(out["age"])).sum() > 0
