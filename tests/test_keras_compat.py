"""One test per shim of `reckeras._keras_compat`, the one door into Keras
internals: a Keras release that moves or changes one fails here first."""

import re

import keras
import numpy as np
import pytest
import torch

import reckeras as rk
from reckeras import _keras_compat as compat


def features():
    """`(columns, inputs, joined)`: `n` and `a`'s embedding, concatenated."""
    columns = rk.layers.FeatureColumns([rk.features.Numeric("n"),
                                        rk.features.Categorical("a", dim=4)])
    inputs = columns.inputs()
    dense, sparse = columns(inputs)
    embedded = rk.layers.ShardedEmbedding(columns, output="concat")(sparse)
    return columns, inputs, keras.layers.Concatenate()([dense, embedded])


def small_model():
    columns, inputs, joined = features()
    hidden = keras.layers.Dense(3, name="hidden")(joined)
    return rk.Model(inputs, keras.layers.Dense(1)(hidden)), columns


def tensors(n=5):
    return {"n": torch.linspace(0, 1, n), "a": torch.arange(n, dtype=torch.int64),
            rk.features.LENGTHS: torch.ones(n, 1, dtype=torch.int32)}


def test_keras_device_and_torch_dtype():
    assert compat.keras_device() == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert compat.torch_dtype("float32") is torch.float32
    assert compat.torch_dtype("int64") is torch.int64


def test_in_stateless_scope():
    assert compat.in_stateless_scope() is False
    with keras.StatelessScope():
        assert compat.in_stateless_scope() is True


def test_accept_raw_inputs_passes_lists_through_unconverted():
    seen = []

    class Raw(keras.layers.Layer):
        def __init__(self):
            super().__init__()
            compat.accept_raw_inputs(self)

        def call(self, x):
            seen.append(type(x))
            return torch.as_tensor(x, dtype=torch.float32)

    Raw()([1.0, 2.0])
    assert seen == [list]


class CountedCalls(keras.layers.Layer):
    """Doubles in training; counts the calls that go through `__call__`."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.keras_calls = 0

    def __call__(self, *args, **kwargs):
        self.keras_calls += 1
        return super().__call__(*args, **kwargs)

    def call(self, inputs, training=False):
        return inputs * 2.0 if training else inputs


def test_call_built_runs_call_directly_only_where_call_changes_nothing():
    x = torch.ones(3, 2)
    layer = CountedCalls()
    assert torch.equal(compat.call_built(layer, x, training=True), 2 * x)
    assert layer.keras_calls == 1                       # not built yet: __call__ builds
    assert torch.equal(compat.call_built(layer, {"a": x}["a"], training=True), 2 * x)
    assert torch.equal(compat.call_built(layer, x), x)
    assert layer.keras_calls == 1                       # built, eager, float32: direct
    symbolic = compat.call_built(layer, keras.KerasTensor((None, 2)))
    assert isinstance(symbolic, keras.KerasTensor) and layer.keras_calls == 2
    handle = layer.register_forward_hook(lambda module, args, output: output + 1)
    assert torch.equal(compat.call_built(layer, x), x + 1)     # hooks: __call__
    handle.remove()
    regularized = CountedCalls(activity_regularizer="l2")
    regularized(x)
    compat.call_built(regularized, x)
    assert regularized.keras_calls == 2 and len(regularized.losses) == 1
    mixed = CountedCalls(dtype="mixed_float16")
    mixed(x)
    assert compat.call_built(mixed, x).dtype == torch.float16   # autocast: __call__
    assert mixed.keras_calls == 2


def test_deferred_assignments_hold_a_forwards_state_and_losses_until_commit():
    class Penalized(keras.layers.Layer):
        def call(self, x):
            self.add_loss(keras.ops.sum(x))
            return x

    inputs = keras.Input((2,))
    norm = keras.layers.BatchNormalization(momentum=0.5)
    model = keras.Model(inputs, Penalized()(norm(inputs)))
    x = torch.tensor([[1.0, 2.0], [3.0, 6.0]])
    with compat.DeferredAssignments() as assigned:
        model(x, training=True)
        # Inside, the scope's values are read; the variables do not move.
        assert compat.in_stateless_scope()
        np.testing.assert_allclose(keras.ops.convert_to_numpy(norm.moving_mean.value),
                                   [1.0, 2.0])
        assert len(model.losses) == 1
        layer = CountedCalls()
        layer(x)
        compat.call_built(layer, x)
        assert layer.keras_calls == 1                   # the direct path stays open
    np.testing.assert_array_equal(norm.moving_mean.numpy(), [0.0, 0.0])
    assert model.losses == []
    assigned.commit(model)
    np.testing.assert_allclose(norm.moving_mean.numpy(), [1.0, 2.0])   # 0.5 * mean
    assert len(model.losses) == 1
    # A scope never committed changes nothing.
    with compat.DeferredAssignments():
        model(x, training=True)
    np.testing.assert_allclose(norm.moving_mean.numpy(), [1.0, 2.0])


def test_defer_write_waits_for_the_commit_only_inside_a_training_step():
    written = []
    assert compat.defer_write(lambda: written.append("now")) is False
    with keras.StatelessScope():                   # another scope: not a training step
        assert compat.defer_write(lambda: written.append("other")) is False
    with compat.DeferredAssignments() as step:
        assert compat.defer_write(lambda: written.append("step")) is True
    assert written == []                           # the callers wrote the others
    step.commit(keras.Sequential())
    assert written == ["step"]


def test_walk_layers_finds_nested_layers_once():
    model, columns = small_model()
    inner = keras.Sequential([keras.layers.Dense(2, name="inner_dense")])
    outer = keras.Model(model.inputs, inner(model.outputs[0]))
    names = [layer.name for layer in compat.walk_layers(outer)]
    assert "inner_dense" in names and columns.name in names and "hidden" in names
    assert len(names) == len(set(names)) and outer.name not in names


def test_update_loss_tracker_feeds_the_loss_metric():
    model, _ = small_model()
    model.compile(optimizer="sgd", loss="mse", embedding_optimizer="sgd")
    compat.update_loss_tracker(model, torch.tensor(2.0), 3)
    compat.update_loss_tracker(model, torch.tensor(4.0), 1)
    assert float(model.get_metrics_result()["loss"]) == pytest.approx(2.5)


def test_initial_epoch_prefers_a_callbacks_choice(tmp_path):
    model, _ = small_model()
    assert compat.initial_epoch(model, 2) == 2
    # BackupAndRestore sets Keras's private attribute when it restores.
    model._initial_epoch = 4
    assert compat.initial_epoch(model, 0) == 4


def test_run_functional_graph_equals_call_and_replaces_layers():
    model, columns = small_model()
    x = tensors()
    expected = model(x).detach().numpy()
    flat = model.inputs_as_declared(x)
    out = compat.run_functional_graph(model, flat, False, {})
    np.testing.assert_array_equal(out.detach().numpy(), expected)
    # A replaced layer is not called; its stand-in's output flows on.
    packed = columns.pack(x)
    calls = []
    out = compat.run_functional_graph(
        model, flat, False, {columns: lambda *a, **k: calls.append(1) or packed})
    assert calls == [1]
    np.testing.assert_array_equal(out.detach().numpy(), expected)
    # Inside another layer's call the caller must call the model itself.
    with _open_context(model):
        assert compat.run_functional_graph(model, flat, False, {}) is None


class _open_context:
    """The model's call context held open, as when it runs inside a layer."""

    def __init__(self, model):
        self.model = model

    def __enter__(self):
        self.model._get_call_context()

    def __exit__(self, *exc):
        self.model._maybe_reset_call_context()


def test_functional_inputs_are_the_declared_dict():
    model, columns = small_model()
    declared = compat.functional_inputs(model)
    assert set(declared) == {"n", "a", rk.features.LENGTHS}
    assert all(isinstance(t, keras.KerasTensor) for t in declared.values())


def test_functional_outputs_keep_their_structure():
    model, columns = small_model()
    assert isinstance(compat.functional_outputs(model), keras.KerasTensor)
    two = rk.Model(model.inputs, {"a": model.outputs[0], "b": model.outputs[0] * 2})
    assert set(compat.functional_outputs(two)) == {"a", "b"}


def test_declared_inputs_shortcut_keeps_keras_checks_for_other_inputs():
    model, _ = small_model()
    x = tensors()
    assert model.inputs_as_declared(x) is not None
    np.testing.assert_allclose(model({k: v.numpy() for k, v in x.items()}).detach().numpy(),
                               model(x).detach().numpy())
    with pytest.raises(Exception, match="a"):
        model({"n": x["n"]})                  # Keras's own message for a missing input


def test_declared_inputs_shortcut_clears_every_layers_losses_but_visits_no_input():
    """Each call starts from no loss: the model's own, its layers' and a
    nested layer's are cleared (inside a loss-collecting stateless scope
    too), and no InputLayer is visited."""
    class Penalized(keras.layers.Layer):
        def call(self, x):
            self.add_loss(keras.ops.sum(x))
            return x

    class Block(keras.layers.Layer):
        def __init__(self):
            super().__init__()
            self.inner = Penalized()

        def call(self, x):
            return self.inner(x)

    _, inputs, joined = features()
    model = rk.Model(inputs, keras.layers.Dense(1)(Block()(Penalized()(joined))))
    x = tensors()
    first = [float(keras.ops.convert_to_numpy(v)) for v in (model(x), model.losses)[1]]
    second = [float(keras.ops.convert_to_numpy(v)) for v in (model(x), model.losses)[1]]
    assert len(first) == 2 and first == second        # replaced, not accumulated
    visited = []
    for layer in model._layers:
        if isinstance(layer, keras.layers.InputLayer):
            layer._clear_losses = lambda layer=layer: visited.append(layer.name)
    model(x)
    assert visited == [] and len(model.losses) == 2
    with keras.StatelessScope(collect_losses=True) as scope:
        model(x)
        model(x)
        assert len(scope.losses) == 2                 # the first call's were removed


def test_freeze_input_spec_keeps_one_spec_object():
    model, _ = small_model()
    spec = model.input_spec
    compat.freeze_input_spec(model)
    assert model.input_spec is model.input_spec
    assert len(model.input_spec) == len(spec)


def test_called_once_on_outputs_of():
    model, columns = small_model()
    embedding = model.embedding_layers[0]
    assert compat.called_once_on_outputs_of(embedding, columns)
    assert not compat.called_once_on_outputs_of(model.get_layer("hidden"), columns)
    assert not compat.called_once_on_outputs_of(embedding, model.get_layer("hidden"))
    inputs = columns.inputs()
    embedding(columns(inputs)[1])                 # a second call
    assert not compat.called_once_on_outputs_of(embedding, columns)


# Private Keras members reckeras once used directly: each now has a shim here.
PRIVATE_KERAS_MEMBERS = (
    "_inbound_nodes", "_run_through_graph", "_get_call_context", "_loss_tracker",
    "_compute_loss", "_flatten_layers", "_convert_input_args",
    "_allow_non_tensor_positional_args", "_inputs_struct", "_get_metrics_result_or_logs",
    "_maybe_reset_call_context", "_standardize_inputs", "_assert_input_compatibility",
    "_maybe_warn_inputs_struct_mismatch", "_initial_epoch", "_call_context_args",
    "_outputs_struct")


def test_keras_internals_only_through_the_compat_module():
    import pathlib
    package = pathlib.Path(rk.__file__).parent
    offenders = []
    for path in sorted(package.rglob("*.py")):
        if path.name == "_keras_compat.py":
            continue
        text = path.read_text()
        offenders += [f"{path.relative_to(package)}: keras.src"] if "keras.src" in text else []
        offenders += [f"{path.relative_to(package)}: {name}" for name in PRIVATE_KERAS_MEMBERS
                      if re.search(rf"\b{name}\b", text)]
    assert not offenders, offenders


def test_symbolic_shapes_kept_lets_torch_export_keep_a_dynamic_batch():
    dense = keras.layers.Dense(3)
    dense.build((None, 4))

    class Packed(torch.nn.Module):
        # The rows kept by a mask: a data-dependent size, as in a TransformerBlock.
        def forward(self, x, keep):
            return dense(x.index_select(0, keep.nonzero().squeeze(1)))

    x, keep = torch.randn(5, 4), torch.tensor([1, 0, 1, 1, 0])
    with compat.symbolic_shapes_kept():
        program = torch.export.export(Packed(), (x, keep), strict=False,
                                      dynamic_shapes=({0: torch.export.Dim.AUTO},
                                                      {0: torch.export.Dim.AUTO}))
    other, other_keep = torch.randn(7, 4), torch.tensor([1, 1, 0, 0, 0, 1, 1])
    np.testing.assert_allclose(program.module()(other, other_keep).detach().numpy(),
                               dense(other[[0, 1, 5, 6]]).detach().numpy(), rtol=1e-6)
    # Outside the context Keras's own function is back.
    assert backend_standardize_shape() is _ORIGINAL_STANDARDIZE_SHAPE


def backend_standardize_shape():
    from keras.src import backend
    return backend.standardize_shape


_ORIGINAL_STANDARDIZE_SHAPE = backend_standardize_shape()


def test_functional_init_arguments_is_keras_signature_detection():
    inputs = keras.Input((2,))
    outputs = keras.layers.Dense(1)(inputs)
    assert compat.functional_init_arguments((inputs, outputs), {})
    assert compat.functional_init_arguments((inputs,), {"outputs": outputs})
    assert compat.functional_init_arguments((), {"inputs": inputs, "outputs": outputs})
    assert not compat.functional_init_arguments((), {"name": "m"})


def test_init_functional_model_does_not_rebase_classes():
    class Base(keras.Model):
        pass

    class Graph(Base, compat.Functional):
        def __init__(self, *args, **kwargs):
            compat.init_functional_model(self, args, kwargs)

    inputs = keras.Input((2,))
    model = Graph(inputs, keras.layers.Dense(1)(inputs))
    assert Base.__bases__ == (keras.Model,)
    assert model.compiled is False and model.train_function is None   # the trainer's state
    model.compile(optimizer="sgd", loss="mse")
    np.testing.assert_allclose(model.predict(np.ones((3, 2)), verbose=0).shape, (3, 1))


def test_metrics_in_order_puts_the_loss_first_whatever_the_dict_order():
    import keras

    from reckeras import _keras_compat
    inputs = keras.Input((2,))
    model = keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(inputs))
    model.compile(loss="binary_crossentropy", metrics=[keras.metrics.AUC(name="auc")])
    model.evaluate(np.zeros((4, 2), "float32"), np.array([0, 1, 0, 1], "float32"),
                   verbose=0)     # builds the compiled metrics
    assert _keras_compat.metrics_in_order(model, {"auc": 0.5, "loss": 0.7}) == [0.7, 0.5]
    assert _keras_compat.metrics_in_order(model, {"loss": 0.7}) == 0.7


def test_writing_legacy_hdf5_is_true_only_inside_kerass_legacy_scope(tmp_path):
    seen = []

    class Probe(keras.Model):
        def get_config(self):
            seen.append(compat.writing_legacy_hdf5())
            return {}

    probe = Probe()
    assert not compat.writing_legacy_hdf5()
    keras.saving.save_model(probe, tmp_path / "m.h5")
    assert seen == [True] and not compat.writing_legacy_hdf5()
