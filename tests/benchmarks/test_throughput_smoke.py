"""Smoke test of benchmarks/throughput.py: the reckeras models and their
dense-only floors (small workloads, and the `huge` one at batch 16), and the
floor/overhead arithmetic of its table."""

import keras

import reckeras as rk
import pytest

import baselines
import throughput
from workloads import make_batches

pytestmark = pytest.mark.slow  # runs the benchmarks' workloads


def _dense_kernel_shapes(model):
    return [tuple(layer.kernel.shape) for layer in model.layers
            if isinstance(layer, keras.layers.Dense)]


def test_floor_model_keeps_the_dense_network_and_drops_the_lookup(small_workload):
    workload = small_workload
    model = throughput.reckeras_model(workload)
    floor = throughput.reckeras_model(workload, floor=True)
    assert len(model.embedding_layers) == 1 and floor.embedding_layers == []
    assert any(isinstance(layer, baselines.ConstantEmbeddings) for layer in floor.layers)
    widths = [*workload.bottom, *workload.top]
    assert [shape[1] for shape in _dense_kernel_shapes(model)] == widths
    assert _dense_kernel_shapes(floor) == _dense_kernel_shapes(model)
    assert sorted(floor.feature_columns.input_names) == sorted(
        [f"I{i}" for i in range(1, 14)] + ["C1", rk.features.LENGTHS])


@pytest.mark.parametrize("floor", [False, True], ids=["model", "floor"])
def test_reckeras_fit_gives_throughput(small_workload, floor):
    batches = make_batches(small_workload, batch_size=32, num_batches=3)
    rate = throughput.run_reckeras(small_workload, batches, warmup=1, pipeline=False,
                                   floor=floor)
    assert rate > 0


@pytest.mark.parametrize("system", ["reckeras", "reckeras_floor", "plain_pytorch_floor"])
def test_huge_workload_runs_at_a_tiny_batch(system):
    assert throughput.measure("huge", system, batch_size=16, steps=1, warmup=1) > 0


def test_unknown_system_is_named():
    with pytest.raises(ValueError, match="'tensorflow'"):
        throughput.measure("wide", "tensorflow", batch_size=16, steps=1, warmup=1)


def test_every_system_has_a_measured_floor():
    assert set(throughput.FLOOR_OF) == {*throughput.RECKERAS_SYSTEMS,
                                        *throughput.BASELINE_SYSTEMS}
    assert set(throughput.FLOOR_OF.values()) <= set(throughput.SYSTEMS)


def test_overhead_rows_subtract_the_floor_step_time():
    rates = {"reckeras": 40_960.0, "reckeras_floor": 102_400.0,     # 50 ms, 20 ms
             "reckeras_no_pipeline": 20_480.0,                       # 100 ms
             "torchrec": 32_768.0, "torchrec_floor": 81_920.0,       # 62.5 ms, 25 ms
             "plain_keras": 1000.0, "plain_keras_floor": None,       # floor not run
             "plain_pytorch": None, "plain_pytorch_floor": 5000.0}   # not installed
    rows = {row["system"]: row for row in throughput.overhead_rows(rates, batch_size=2048)}
    assert sorted(rows) == ["reckeras", "reckeras_no_pipeline", "torchrec"]
    assert rows["reckeras"]["step_ms"] == pytest.approx(50.0)
    assert rows["reckeras"]["floor_ms"] == pytest.approx(20.0)
    assert rows["reckeras"]["sparse_ms"] == pytest.approx(30.0)
    assert rows["reckeras_no_pipeline"]["sparse_ms"] == pytest.approx(80.0)
    assert rows["torchrec"]["sparse_ms"] == pytest.approx(37.5)
    assert rows["torchrec"]["floor_examples_per_s"] == 81_920.0
