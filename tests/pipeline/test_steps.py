"""The steps take the batch the pipeline prepared from their data
(`stream.StepData`), not from the model."""

import keras
import numpy as np
import pytest

import reckeras as rk
from reckeras.layers.feature_columns import FeatureColumns
from reckeras.pipeline import steps
from reckeras.pipeline.batches import Targets, to_tensors
from reckeras.pipeline.stream import PreparedBatch, StepData
from test_model import synthetic
from test_model_subclassed import Ranker, compiled, functional_ranker, specs


def encoded(model, seed):
    table = synthetic(32, seed=seed).drop(["label"])
    inputs, _, _ = to_tensors(model.feature_columns, table, Targets())
    return inputs


def test_step_data_is_keras_data_carrying_its_batch():
    x, y, w = {"n": np.zeros(2)}, np.ones(2), None
    batch = PreparedBatch(2, x, y, w)
    data = batch.data
    assert isinstance(data, StepData) and isinstance(data, tuple)
    unpacked = keras.utils.unpack_x_y_sample_weight(data)
    assert unpacked[0] is x and unpacked[1] is y and unpacked[2] is None
    assert steps.prepared_batch(data) is batch
    assert steps.prepared_batch((x, y, w)) is None       # a step called by hand


@pytest.mark.parametrize("kind", ["functional", "subclassed"])
def test_forward_uses_the_prepared_packed_output_of_its_inputs_only(kind):
    rk.config.set(onednn_dense=False)       # the graph and Keras's call compared exactly
    keras.utils.set_random_seed(0)
    model = compiled(functional_ranker() if kind == "functional" else
                     Ranker(rk.layers.FeatureColumns(specs())))
    model.fit(synthetic(256), batch_size=64, verbose=0)   # rows for the ids to read
    inputs, other = encoded(model, 1), encoded(model, 2)
    columns = model.feature_columns
    expected, other_expected = (model(x).detach().numpy() for x in (inputs, other))
    assert not np.allclose(expected, other_expected)
    # The stand-in output is the other batch's: the forward must return its
    # outputs, i.e. it did not pack `inputs` again.
    batch = PreparedBatch(32, inputs, None, None, packed=columns.pack(other))
    np.testing.assert_allclose(steps.forward(model, inputs, False, batch).detach().numpy(),
                               other_expected, rtol=1e-6)
    # No batch, or a batch of other inputs: `inputs` are packed as a call packs them.
    for prepared in (None, PreparedBatch(32, other, None, None, packed=columns.pack(other))):
        np.testing.assert_allclose(
            steps.forward(model, inputs, False, prepared).detach().numpy(), expected,
            rtol=1e-6)


def test_fit_packs_once_per_batch_and_keeps_no_batch_on_the_model(monkeypatch):
    seen = []

    class Checked(Ranker):
        def train_step(self, data):
            # A user's step gets Keras data; the prepared batch travels in it.
            assert isinstance(data, StepData)
            seen.append([name for name, value in vars(self).items()
                         if isinstance(value, PreparedBatch)])
            return super().train_step(data)

    model = compiled(Checked(rk.layers.FeatureColumns(specs())))
    train = synthetic(512)
    model.fit(train, batch_size=128, epochs=1, verbose=0, pipeline=False)
    packs = []
    pack = FeatureColumns.pack
    monkeypatch.setattr(FeatureColumns, "pack",
                        lambda self, inputs: packs.append(1) or pack(self, inputs))
    model.fit(train, batch_size=128, epochs=1, verbose=0, pipeline=False)
    assert len(packs) == 4                    # by the pipeline, not again in the step
    assert seen == [[]] * 8


def test_a_step_that_returns_other_logs_gives_them_as_keras_does():
    # Keras's rule: the epoch's logs are the metrics' results, unless the
    # last step returned other names; then they are that step's logs.
    class Logging(Ranker):
        def train_step(self, data):
            logs = super().train_step(data)
            self.steps_taken = getattr(self, "steps_taken", 0) + 1
            return {**logs, "steps_taken": self.steps_taken}

        def test_step(self, data):
            return {"constant": 2.5}

    model = compiled(Logging(rk.layers.FeatureColumns(specs())))
    history = model.fit(synthetic(512), batch_size=128, epochs=2, verbose=0)
    assert history.history["steps_taken"] == [4.0, 8.0]
    assert set(history.history) == {"loss", "auc", "steps_taken"}
    assert model.evaluate(synthetic(256), batch_size=128, verbose=0,
                          return_dict=True) == {"constant": 2.5}
    assert model.evaluate(synthetic(256), batch_size=128, verbose=0) == 2.5
    # Steps that return the metrics' names give the metrics over the epoch.
    plain = compiled(Ranker(rk.layers.FeatureColumns(specs())))
    logs = plain.evaluate(synthetic(256), batch_size=128, verbose=0, return_dict=True)
    assert set(logs) == {"loss", "auc"}
