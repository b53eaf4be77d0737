"""Keras methods that cannot see the sharded tables are refused, each with a
message naming the method and what to use instead; the others work."""

import dataclasses

import keras
import numpy as np
import pytest

import reckeras as rk
from reckeras.pipeline import refused
from test_model import build, synthetic


@pytest.fixture(scope="module")
def model():
    model = build()
    model.fit(synthetic(256), batch_size=128, verbose=0)
    return model


@pytest.mark.parametrize("method, call, instead", [
    ("stateless_call", lambda m: m.stateless_call([], [], {}), "predict_on_batch"),
    ("get_state_tree", lambda m: m.get_state_tree(), r"get_weights\(\)/set_weights"),
    ("set_state_tree", lambda m: m.set_state_tree({}), "load_checkpoint"),
    ("export", lambda m: m.export("/nonexistent/model"), r"export_serving\(path\)"),
])
def test_methods_blind_to_the_tables_are_refused(model, method, call, instead):
    with pytest.raises(NotImplementedError, match=rf"{method}\(\): .*{instead}"):
        call(model)


@pytest.mark.parametrize("name", ["m.h5", "M.HDF5"])
def test_a_legacy_hdf5_save_is_refused_and_writes_nothing(model, tmp_path, name):
    """Keras writes `.h5` in its legacy format, which holds no table and
    does not load back: refused, no file left."""
    with pytest.raises(NotImplementedError, match=r"does not save to '.*': Keras's legacy "
                                                  r"HDF5 format .*embedding tables.*"
                                                  r"save\('model\.keras'\)"):
        model.save(tmp_path / name)
    with pytest.raises(NotImplementedError, match="legacy HDF5"):
        model.save(filepath=str(tmp_path / name))
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("save", [keras.saving.save_model, keras.models.save_model])
def test_keras_save_model_to_hdf5_is_refused_before_any_weight(model, tmp_path, save):
    """`keras.saving.save_model` writes `.h5` without calling `model.save`:
    the config it asks for first is refused, so no weight is written."""
    with pytest.raises(NotImplementedError, match=r"legacy HDF5 .*embedding tables.*"
                                                  r"save\('model\.keras'\)"):
        save(model, tmp_path / "m.h5")
    import h5py
    with h5py.File(tmp_path / "m.h5") as written:
        assert "model_weights" not in written
    save(model, tmp_path / "m.keras")
    assert (tmp_path / "m.keras").stat().st_size > 0


def test_a_model_without_tables_still_saves_to_hdf5(tmp_path):
    inputs = keras.Input((3,))
    plain = rk.Model(inputs, keras.layers.Dense(1)(inputs))
    keras.saving.save_model(plain, tmp_path / "plain.h5")
    import h5py
    with h5py.File(tmp_path / "plain.h5") as written:
        assert "model_weights" in written


@dataclasses.dataclass
class TwoRanks:
    size: int = 2
    rank: int = 0


@pytest.mark.parametrize("method, call, instead", [
    ("save", lambda m, p: m.save(p / "m.keras"), "save_checkpoint"),
    ("save_weights", lambda m, p: m.save_weights(p / "m.weights.h5"), "save_checkpoint"),
    ("load_weights", lambda m, p: m.load_weights(p / "m.weights.h5"), "load_checkpoint"),
])
def test_keras_files_of_one_rank_are_refused_under_torchrun(model, tmp_path, monkeypatch,
                                                            method, call, instead):
    monkeypatch.setattr(refused.distributed, "world", TwoRanks)
    with pytest.raises(ValueError, match=rf"{method}\(\) under torchrun.*{instead}"):
        call(model, tmp_path)
    assert not list(tmp_path.iterdir())


class DenseOnly(rk.Model):
    def __init__(self):
        super().__init__()
        self.columns = rk.layers.FeatureColumns([rk.features.Numeric("n")])
        self.score = keras.layers.Dense(1)

    def call(self, inputs):
        return self.score(self.columns(inputs)[0])


def test_a_model_without_tables_keeps_keras_state_tree():
    model = DenseOnly()
    model.compile(optimizer="sgd", loss="mse")
    model.predict_on_batch({"n": np.zeros(2, np.float32)})
    tree = model.get_state_tree()
    assert set(tree) >= {"trainable_variables", "non_trainable_variables"}
    model.set_state_tree(tree)


def test_what_works_on_one_rank(model, tmp_path):
    weights = model.get_weights()
    model.save_weights(tmp_path / "m.weights.h5")
    model.load_weights(tmp_path / "m.weights.h5")
    np.testing.assert_array_equal(model.get_weights()[0], weights[0])
    assert model.get_layer(index=1).name and model.count_params() > 0
    assert type(keras.models.model_from_json(model.to_json())) is type(model)
    model.summary(print_fn=lambda *args, **kwargs: None)
