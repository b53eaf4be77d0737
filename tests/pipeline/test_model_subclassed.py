"""A subclassed rk.Model (layers made in __init__, used in call) trains,
evaluates, predicts, saves and checkpoints as the functional one does."""

import keras
import numpy as np
import pytest

import reckeras as rk
from test_model import assert_same, snapshot, synthetic


def specs():
    return [rk.features.Numeric("n"), rk.features.Categorical("a", dim=4),
            rk.features.Categorical("b", dim=4)]


@keras.saving.register_keras_serializable(package="tests")
class Ranker(rk.Model):
    def __init__(self, columns, units=8, **kwargs):
        super().__init__(**kwargs)
        self.columns = columns
        self.units = units
        self.embedding = rk.layers.ShardedEmbedding(columns, output="concat")
        self.hidden = keras.layers.Dense(units, activation="relu")
        self.score = keras.layers.Dense(1, activation="sigmoid")

    def call(self, inputs):
        dense, sparse = self.columns(inputs)
        features = keras.ops.concatenate([dense, self.embedding(sparse)], axis=-1)
        return self.score(self.hidden(features))

    def get_config(self):
        return {**super().get_config(), "units": self.units,
                "columns": keras.saving.serialize_keras_object(self.columns)}

    @classmethod
    def from_config(cls, config):
        config["columns"] = keras.saving.deserialize_keras_object(config["columns"])
        return cls(**config)


def functional_ranker():
    columns = rk.layers.FeatureColumns(specs())
    inputs = columns.inputs()
    dense, sparse = columns(inputs)
    embedded = rk.layers.ShardedEmbedding(columns, output="concat")(sparse)
    hidden = keras.layers.Dense(8, activation="relu")(
        keras.layers.Concatenate()([dense, embedded]))
    return rk.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(hidden))


def compiled(model):
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.1),
                  metrics=[rk.metrics.AUC()])
    return model


def pair():
    keras.utils.set_random_seed(3)
    functional = compiled(functional_ranker())
    keras.utils.set_random_seed(3)
    return functional, compiled(Ranker(rk.layers.FeatureColumns(specs())))


def test_subclassed_model_trains_like_the_functional_one():
    # A functional model's own Dense layers run in oneDNN (dense_routing); a
    # subclassed model's `call` runs as written, in torch: bit for bit equal
    # with the routing off.
    rk.config.set(onednn_dense=False)
    functional, subclassed = pair()
    assert not subclassed.built and isinstance(functional, rk.Model)
    assert subclassed.feature_columns is subclassed.columns
    assert subclassed.embedding_layers == [subclassed.embedding]
    train, test = synthetic(1024), synthetic(300, seed=1)
    histories = [m.fit(train, batch_size=128, epochs=2, verbose=0, validation_data=test)
                 .history for m in (functional, subclassed)]
    assert histories[0] == histories[1]
    assert_same(snapshot(functional), snapshot(subclassed))
    np.testing.assert_array_equal(functional.predict(test, verbose=0),
                                  subclassed.predict(test, verbose=0))
    assert functional.evaluate(test, verbose=0) == subclassed.evaluate(test, verbose=0)


def test_a_step_packs_each_batch_once():
    _, model = pair()
    packed = []
    original = model.columns.pack
    model.columns.pack = lambda inputs: packed.append(1) or original(inputs)
    model.fit(synthetic(512), batch_size=128, verbose=0, pipeline=False)
    # One forward to build the model on the first batch, then one pack per step.
    assert len(packed) == 1 + 4


def test_subclassing_does_not_change_rk_model():
    functional_ranker()
    assert rk.Model.__bases__[-1] is keras.Model
    Ranker(rk.layers.FeatureColumns(specs()))      # still a plain subclass


def test_model_save_and_load_model(tmp_path):
    _, model = pair()
    data = synthetic(512)
    model.fit(data, batch_size=128, verbose=0)
    model.save(tmp_path / "ranker.keras")
    loaded = keras.models.load_model(tmp_path / "ranker.keras")
    assert type(loaded) is Ranker and loaded.units == 8
    assert_same(snapshot(model), snapshot(loaded))
    np.testing.assert_array_equal(loaded.predict(data, verbose=0),
                                  model.predict(data, verbose=0))
    # It trains on as the original does.
    for m in (model, loaded):
        m.fit(data, batch_size=128, verbose=0, shuffle=False)
    assert_same(snapshot(model), snapshot(loaded))


def test_checkpoint_round_trip(tmp_path):
    _, model = pair()
    data = synthetic(512)
    model.fit(data, batch_size=128, verbose=0)
    model.save_checkpoint(str(tmp_path / "ckpt"))
    _, restored = pair()
    restored.predict_on_batch(synthetic(4))      # builds it, as Keras asks of a subclass
    restored.load_checkpoint(str(tmp_path / "ckpt"))
    assert_same(snapshot(model), snapshot(restored))


def test_labels_of_a_subclassed_model_are_checked_by_its_loss():
    _, model = pair()
    with pytest.raises(ValueError, match=r"fit\(\) needs labels"):
        model.fit(synthetic(64).drop(["label"]), verbose=0)


def test_export_serving_of_a_subclassed_model_is_refused(tmp_path):
    _, model = pair()
    model.predict_on_batch(synthetic(4))
    with pytest.raises(NotImplementedError, match=r"export_serving\(\) .* subclassed"):
        model.export_serving(tmp_path / "artifact")


@pytest.mark.parametrize("kind", ["functional", "subclassed"])
def test_calling_the_model_on_a_raw_batch_gives_what_predict_gives(kind):
    keras.utils.set_random_seed(0)
    model = compiled(functional_ranker() if kind == "functional" else
                     Ranker(rk.layers.FeatureColumns(specs())))
    model.fit(synthetic(256), batch_size=64, verbose=0)
    batch = synthetic(40, seed=5).drop(["label"])
    expected = model.predict(batch, verbose=0)
    as_dict = {name: batch.column(name).to_numpy() for name in batch.column_names}
    for raw in (batch, as_dict):
        np.testing.assert_allclose(model(raw).detach().numpy(), expected, rtol=1e-5)
    # Encoded inputs go to call as they are.
    encoded = model.feature_columns.encode(batch)
    np.testing.assert_allclose(model(encoded).detach().numpy(), expected, rtol=1e-5)
