"""Smoke test of benchmarks/throughput.py: the reckeras models and their
dense-only floors (small workloads, and the `huge` one at batch 16), from
memory and from parquet files with nulls; one run of the command in parquet
mode; the floor/overhead arithmetic of its table, the pair ratios, the
fastest configuration of a family and the scaling grid's table."""

import argparse
import re
import sys

import keras
import pytest

import baselines
import reckeras as rk
import throughput
from workloads import make_batches, write_parquet

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


def test_reckeras_compact_puts_every_table_on_the_compact_index(small_workload):
    model = throughput.reckeras_model(small_workload, index="compact")
    options = model.embedding_layers[0].table_options
    assert sorted(options) == sorted(f"C{f + 1}" for f in range(small_workload.num_fields))
    assert {o.index for o in options.values()} == {"compact"}
    assert throughput.reckeras_model(small_workload).embedding_layers[0].table_options == {}
    batches = make_batches(small_workload, batch_size=32, num_batches=3)
    assert throughput.run_reckeras(small_workload, batches, warmup=1, pipeline=False,
                                   index="compact") > 0


@pytest.mark.parametrize("floor", [False, True], ids=["model", "floor"])
def test_reckeras_fit_reads_parquet_files_with_nulls(small_workload, tmp_path, floor):
    batches = make_batches(small_workload, batch_size=32, num_batches=3)
    write_parquet(batches, small_workload, str(tmp_path), warmup=1)
    rate = throughput.run_reckeras(small_workload, batches, warmup=1, pipeline=False,
                                   floor=floor, parquet_dir=str(tmp_path))
    assert rate > 0


@pytest.mark.parametrize("source", ["memory", "parquet"])
@pytest.mark.parametrize("system", ["reckeras", "reckeras_floor", "plain_pytorch_floor",
                                    "plain_pytorch_concat"])
def test_huge_workload_runs_at_a_tiny_batch(system, source):
    assert throughput.measure("huge", system, batch_size=16, steps=1, warmup=1,
                              source=source) > 0


def test_unknown_system_is_named():
    with pytest.raises(ValueError, match="'tensorflow'"):
        throughput.measure("wide", "tensorflow", batch_size=16, steps=1, warmup=1)


def test_every_system_has_a_measured_floor():
    assert set(throughput.FLOOR_OF) == {*throughput.RECKERAS_SYSTEMS, throughput.RECKERAS_MEMORY,
                                        *throughput.BASELINE_SYSTEMS}
    assert set(throughput.FLOOR_OF.values()) == set(throughput.FLOOR_RUN_BY)
    assert set(throughput.FLOOR_OF.values()) <= set(throughput.SYSTEMS)


def test_systems_to_run_adds_floors_and_keeps_reckeras_memory_for_parquet():
    chosen = throughput.systems_to_run(["reckeras", "torchrec_ebc_fused",
                                        "reckeras_memory"], "memory")
    assert chosen == ["reckeras", "torchrec_ebc_fused", "reckeras_floor",
                      "plain_pytorch_floor"]
    everything = throughput.systems_to_run(None, "parquet")
    assert "reckeras_memory" in everything and "torchrec_floor" in everything
    assert throughput.systems_to_run(["plain_keras", "reckeras"], "parquet") == [
        "plain_keras", "reckeras", "reckeras_memory", "plain_keras_floor", "reckeras_floor"]
    assert "reckeras_memory" not in throughput.systems_to_run(None, "memory")
    with pytest.raises(ValueError, match="'tensorflow'"):
        throughput.systems_to_run(["tensorflow"], "memory")


def test_overhead_rows_subtract_the_floor_step_time():
    rates = {"reckeras": 40_960.0, "reckeras_floor": 102_400.0,     # 50 ms, 20 ms
             "reckeras_no_pipeline": 20_480.0,                       # 100 ms
             "torchrec_tw_fused": 32_768.0, "torchrec_floor": 81_920.0,   # 62.5 ms, 25 ms
             "plain_keras": 1000.0, "plain_keras_floor": None,       # floor not run
             "plain_pytorch_per_field": None,                         # not installed
             "plain_pytorch_floor": 5000.0}
    rows = {row["system"]: row for row in throughput.overhead_rows(rates, batch_size=2048)}
    assert sorted(rows) == ["reckeras", "reckeras_no_pipeline", "torchrec_tw_fused"]
    assert rows["reckeras"]["step_ms"] == pytest.approx(50.0)
    assert rows["reckeras"]["floor_ms"] == pytest.approx(20.0)
    assert rows["reckeras"]["sparse_ms"] == pytest.approx(30.0)
    assert rows["reckeras_no_pipeline"]["sparse_ms"] == pytest.approx(80.0)
    assert rows["torchrec_tw_fused"]["sparse_ms"] == pytest.approx(37.5)
    assert rows["torchrec_tw_fused"]["floor_examples_per_s"] == 81_920.0


def test_pair_ratios_pair_runs_of_one_repeat():
    ratio = throughput.pair_ratios([10.0, 30.0, 12.0, 8.0, 20.0], [5.0, 10.0, 10.0, 8.0, 40.0])
    # pairs: 2.0, 3.0, 1.2, 1.0, 0.5 (the medians' ratio would be 12 / 10 = 1.2)
    assert ratio == {"median": 1.2, "min": 0.5, "max": 3.0, "pairs": 5}
    with pytest.raises(ValueError):
        throughput.pair_ratios([1.0, 2.0], [1.0])


def test_fastest_configuration_of_each_family_by_median():
    runs = {"torchrec_tw_fused": [10.0, 30.0, 20.0], "torchrec_dp": [25.0, 1.0, 21.0],
            "torchrec_ebc_fused": None, "plain_pytorch_per_field": [5.0, 5.0, 5.0],
            "plain_pytorch_concat": [6.0, 4.0, 7.0]}
    assert throughput.fastest_configurations(runs) == {
        "torchrec": "torchrec_dp", "plain_pytorch": "plain_pytorch_concat"}


def test_one_run_reports_pair_ratios_and_the_parquet_cost(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [
        "throughput.py", "--workloads", "dlrm", "--source", "parquet", "--batch", "32",
        "--steps", "1", "--warmup", "1", "--repeats", "2", "--same-process",
        "--systems", "reckeras", "plain_pytorch_concat", "torchrec_ebc_fused"])
    throughput.main()
    out = capsys.readouterr().out
    assert out.startswith("source=parquet\n")
    for system in ["reckeras", "reckeras_memory", "plain_pytorch_concat", "reckeras_floor",
                   "plain_pytorch_floor"]:
        assert re.search(rf"^dlrm {system} examples_per_s=\d+$", out, re.M), system
    assert re.search(r"^dlrm best_plain_pytorch=plain_pytorch_concat$", out, re.M)
    for label in ["reckeras_over_best_plain_pytorch", "reckeras_parquet_over_memory"]:
        assert re.search(rf"^dlrm {label} median=[\d.]+ min=[\d.]+ max=[\d.]+ pairs=2$",
                         out, re.M), label


def test_scaling_prints_cost_per_example_and_the_best_baseline(monkeypatch, capsys, tmp_path):
    rates = {"reckeras": 4e4, "plain_pytorch_concat": 2e4, "torchrec_ebc_fused": 1e4}
    calls = []

    def fake_run(name, system, batch_size, steps, warmup, source, data_dir):
        calls.append((name, batch_size, steps, system))
        return rates[system]

    monkeypatch.setattr(throughput, "SCALING_WORKLOADS", ("dlrm",))
    monkeypatch.setattr(throughput, "SCALING_BATCHES", (512, 2048))
    args = argparse.Namespace(scaling_baselines=["torchrec_ebc_fused", "plain_pytorch_concat"],
                              repeats=1, warmup=1, source="memory")
    throughput.run_scaling(args, fake_run, str(tmp_path))
    out = capsys.readouterr().out
    assert [call[:3] for call in calls[::3]] == [("dlrm", 512, 120), ("dlrm", 2048, 30)]
    assert ("scaling fields=26 batch=512 reckeras_us_per_example=25.00 "
            "torchrec_ebc_fused_us_per_example=100.00 "
            "plain_pytorch_concat_us_per_example=50.00") in out
    assert "| 26 | 2048 | 25.00 | plain_pytorch_concat | 50.00 | 2.00 | 30 |" in out
