"""The predictor's rewrite of dense layers onto prepacked oneDNN weights:
what it rewrites, what it leaves, and that outputs stay those of the
program as exported (against the unrewritten program and plain torch)."""

import numpy as np
import pytest
import torch

from reckeras.backend_kernels import dense_matmul
from reckeras.serving import packed_linear

pytestmark = pytest.mark.skipif(not dense_matmul.available(),
                                reason="torch without oneDNN")

MKLDNN_LINEAR = torch.ops.mkldnn._linear_pointwise.default


class DenseStack(torch.nn.Module):
    """What Keras's Dense layers export as: matmul, add of the bias, relu."""

    def __init__(self, widths, seed=0):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.kernels = [torch.randn(a, b, generator=generator) / a ** 0.5
                        for a, b in zip(widths, widths[1:])]
        self.biases = [torch.randn(b, generator=generator) for b in widths[1:]]

    def forward(self, x):
        for index, (kernel, bias) in enumerate(zip(self.kernels, self.biases)):
            x = torch.matmul(x, kernel.to(torch.float32)) + bias
            if index < len(self.kernels) - 1:
                x = torch.relu(x)
        return x


def exported(module, *example, dynamic_batch=True):
    shapes = tuple({0: torch.export.Dim.AUTO} for _ in example) if dynamic_batch else None
    return torch.export.export(module, example, dynamic_shapes=shapes).module()


def calls(program, target):
    return sum(node.op == "call_function" and node.target is target
               for node in program.graph.nodes)


def test_dense_layers_become_one_linear_each_and_compute_the_same():
    module = DenseStack([13, 64, 32, 1])
    program = exported(module, torch.randn(8, 13))
    assert packed_linear.pack_linear_layers(program) == 3
    assert calls(program, MKLDNN_LINEAR) == 3
    assert calls(program, torch.ops.aten.matmul.default) == 0
    assert calls(program, torch.ops.aten.add.Tensor) == 0     # biases folded in
    assert calls(program, torch.ops.aten.relu.default) == 0   # activations too
    for batch in (1, 7, 256):                                 # any batch size
        x = torch.randn(batch, 13, dtype=torch.float64)
        reference = x
        for index, (kernel, bias) in enumerate(zip(module.kernels, module.biases)):
            reference = reference @ kernel.double() + bias.double()
            if index < 2:
                reference = reference.clamp_min(0)
        with torch.inference_mode():
            np.testing.assert_allclose(program(x.float()).numpy(), reference.numpy(),
                                       rtol=1e-5, atol=1e-5)


def test_sequence_inputs_of_three_dimensions():
    module = DenseStack([6, 5])
    program = exported(module, torch.randn(4, 3, 6))
    x = torch.randn(2, 3, 6)
    expected = module(x)
    assert packed_linear.pack_linear_layers(program) == 1
    with torch.inference_mode():
        np.testing.assert_allclose(program(x).numpy(),
                                   expected.numpy(), rtol=1e-6, atol=1e-6)


def test_a_matmul_of_two_inputs_is_left_alone():
    class Bilinear(torch.nn.Module):
        def forward(self, x, y):
            return torch.matmul(x, y) + 1.0

    program = exported(Bilinear(), torch.randn(3, 4), torch.randn(4, 5), dynamic_batch=False)
    assert packed_linear.pack_linear_layers(program) == 0
    assert calls(program, torch.ops.aten.matmul.default) == 1


def test_an_add_that_is_not_the_bias_and_a_shared_output_stay_outside():
    kernel, bias = torch.randn(4, 3), torch.randn(3)

    class Residual(torch.nn.Module):
        def forward(self, x, skip):
            projected = torch.matmul(x, kernel) + skip      # not a constant bias
            shifted = torch.matmul(x, kernel) + bias        # read twice below
            return torch.relu(shifted) + projected, shifted

    x, skip = torch.randn(5, 4), torch.randn(5, 3)
    expected = Residual()(x, skip)
    program = exported(Residual(), x, skip)
    assert packed_linear.pack_linear_layers(program) == 2
    assert calls(program, torch.ops.aten.relu.default) == 1   # `shifted` has two readers
    with torch.inference_mode():
        for actual, wanted in zip(program(x, skip), expected):
            np.testing.assert_allclose(actual.numpy(), wanted.numpy(), rtol=1e-6, atol=1e-6)


def test_without_onednn_the_program_is_left_as_exported(monkeypatch):
    monkeypatch.setattr(dense_matmul, "available", lambda: False)
    program = exported(DenseStack([3, 2]), torch.randn(2, 3))
    before = program.code
    assert packed_linear.pack_linear_layers(program) == 0
    assert program.code == before


def test_the_predictor_runs_a_keras_model_on_packed_layers(tmp_path):
    import keras
    import reckeras as rk
    import reckeras.serving

    specs = [rk.features.Numeric("x"), rk.features.Categorical("c", dim=4)]
    columns = rk.layers.FeatureColumns(specs)
    inputs = columns.inputs()
    dense, sparse = columns(inputs)
    embedded = rk.layers.ShardedEmbedding(columns, output="concat")(sparse)
    hidden = keras.layers.Dense(8, activation="relu")(
        keras.layers.Concatenate()([dense, embedded]))
    model = rk.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(hidden))
    model.compile(optimizer="adam", loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.05))
    rng = np.random.default_rng(0)
    data = {"x": rng.normal(size=64).astype("float32"), "c": rng.integers(0, 20, 64),
            "label": rng.integers(0, 2, 64).astype("float32")}
    model.fit({k: v for k, v in data.items() if k != "label"}, data["label"],
              batch_size=16, verbose=0)
    predictor = rk.serving.load(model.export_serving(tmp_path / "artifact"))
    assert calls(predictor.served.program, MKLDNN_LINEAR) == 2
    assert calls(predictor.served.program, torch.ops.aten.matmul.default) == 0
    features = {"x": data["x"], "c": data["c"]}
    np.testing.assert_allclose(predictor.predict(features),
                               model.predict(features, verbose=0), atol=1e-6)
