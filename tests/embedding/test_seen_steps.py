"""Per-row sighting counts (`PhysicalTable.seen_counts`): one per training
lookup however often an id occurs, kept through growth, compaction and
loads, saved in full and delta checkpoints, and 0 for rows of a checkpoint
saved before rows were counted (format 3)."""

import json
import os
import pathlib
import zlib

import keras
import numpy as np
import pyarrow as pa
import pytest
import torch
from safetensors.numpy import load_file, save_file

import reckeras as rk
from reckeras.backend_kernels.hashing import mix64
from reckeras.checkpoint.format import FORMAT_VERSION
from reckeras.embedding import physical_table as table_module
from reckeras.embedding.packing import table_salt
from reckeras.embedding.physical_table import PhysicalTable

# Three training steps of 4 examples. Feature "a" and feature "b" (which
# shares table "a") see id 1 in step 1 only (six times), id 2 in steps 1 and
# 2, id 3 in all three: 1, 2 and 3 steps, however often and through whichever
# feature an id occurs within a step.
STEPS_A = [[1, 1, 2, 3], [2, 3, 3, 3], [3, 3, 3, 3]]
STEPS_B = [[1, 1, 1, 1], [3, 3, 2, 2], [3, 3, 3, 3]]
HAND_COUNTS = {1: 1, 2: 2, 3: 3}


def steps_table(steps=range(3)):
    """The examples of the given steps, in order (one batch of 4 per step)."""
    a = [i for s in steps for i in STEPS_A[s]]
    b = [i for s in steps for i in STEPS_B[s]]
    rng = np.random.default_rng(len(a))
    return pa.table({"n": rng.normal(size=len(a)).astype(np.float32), "a": a, "b": b,
                     "label": (np.arange(len(a)) % 2).astype(np.float32)})


def build(storage="device"):
    keras.utils.set_random_seed(0)
    columns = rk.layers.FeatureColumns([rk.features.Numeric("n"),
                                        rk.features.Categorical("a", dim=4),
                                        rk.features.Categorical("b", dim=4, table="a")])
    options = {"a": rk.embedding.TableOptions(storage="host_cached", cache_rows=8)} \
        if storage == "host_cached" else None
    model = rk.models.dlrm(columns, bottom_units=(8, 4), top_units=(8, 1),
                           table_options=options, dropout=0.0, embedding_l2=0.0)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.1))
    return model


def train(model, steps):
    model.fit(steps_table(steps), batch_size=4, epochs=1, shuffle=False, verbose=0)


def key(raw_id, table="a"):
    return int(mix64(torch.tensor([raw_id]))[0] ^ table_salt(table))


def counts_by_id(model):
    """{raw id: seen_steps} of the model's one table."""
    layer, = model.embedding_layers
    table, = layer.table_states()
    by_key = dict(zip(table.keys.tolist(), table.seen_steps.tolist()))
    assert table.seen_steps.dtype == np.int32
    return {raw: by_key[key(raw)] for raw in HAND_COUNTS if key(raw) in by_key}


def test_a_lookup_counts_each_row_once_however_often_it_occurs():
    table = PhysicalTable(dim=2)
    rows = table.find_or_insert(torch.tensor([10, 20, 30]))
    table.mark_written(torch.cat([rows[[0, 0, 0, 1]], torch.tensor([-1, -1])]))
    table.mark_written(rows[[1, 1]])
    assert table.seen_counts()[rows].tolist() == [1, 2, 0]
    assert table.export()["seen_steps"].tolist() == [1, 2, 0]


@pytest.mark.parametrize("reserve_from", [2**20, 64])
def test_counts_survive_growth_compaction_and_load(monkeypatch, reserve_from):
    # 64: the arrays move into reserved memory and grow inside it.
    monkeypatch.setattr(table_module, "RESERVE_FROM_ROWS", reserve_from)
    table = PhysicalTable(dim=2)
    first = table.find_or_insert(torch.arange(40))
    table.mark_written(first)
    table.mark_written(first[:10])
    table.find_or_insert(torch.arange(40, 3000))                     # grows twice or more
    expected = np.zeros(3000, np.int32)
    expected[:40] += 1
    expected[:10] += 1
    rows = table.find(torch.arange(3000))
    np.testing.assert_array_equal(table.seen_counts()[rows].numpy(), expected)
    keep = torch.arange(0, 3000, 3)
    moved = table.compact(keep)
    np.testing.assert_array_equal(table.seen_counts()[moved].numpy(), expected[::3])
    other = PhysicalTable(dim=2)
    other.load(table.export())
    loaded = other.find(torch.arange(0, 3000, 3))
    np.testing.assert_array_equal(other.seen_counts()[loaded].numpy(), expected[::3])
    exported = table.export()
    del exported["seen_steps"]                     # an export saved before rows were counted
    other.load(exported)
    assert int(other.seen_counts().abs().sum()) == 0
    # A new row starts at 0 after the loads too.
    new = other.find_or_insert(torch.tensor([10**6]))
    assert other.seen_counts()[new].tolist() == [0]


@pytest.mark.parametrize("storage", ["device", "host_cached"])
def test_training_counts_the_steps_each_id_was_seen_in(storage):
    model = build(storage)
    train(model, range(3))
    assert counts_by_id(model) == HAND_COUNTS
    model.predict(steps_table(), batch_size=4, verbose=0)     # inference counts nothing
    model.evaluate(steps_table(), batch_size=4, verbose=0)
    assert counts_by_id(model) == HAND_COUNTS


def saved_chain(tmp_path):
    """A model trained on steps 0-1, saved full, trained on step 2, saved
    as a delta and as a full checkpoint."""
    model = build()
    train(model, range(2))
    model.save_checkpoint(tmp_path / "full")
    assert counts_by_id(model) == {1: 1, 2: 2, 3: 2}
    train(model, [2])
    model.save_checkpoint(tmp_path / "delta", base=tmp_path / "full")
    model.save_checkpoint(tmp_path / "full3")
    return model


def loaded(path):
    model = build()
    train(model, [1])                 # rows and counts that the load must replace
    model.load_checkpoint(path)
    return counts_by_id(model)


def test_counts_survive_a_full_checkpoint_and_a_delta_chain(tmp_path):
    saved_chain(tmp_path)
    assert loaded(tmp_path / "full3") == HAND_COUNTS
    assert loaded(tmp_path / "full") == {1: 1, 2: 2, 3: 2}
    # Step 2 trained only id 3: the delta carries its row and count.
    delta = load_file(str(tmp_path / "delta" / "tables-00000-of-00001.safetensors"))
    assert delta["L0.T0.keys"].tolist() == [key(3)]
    assert delta["L0.T0.seen_steps"].tolist() == [3]
    assert loaded(tmp_path / "delta") == HAND_COUNTS


def as_format_3(ckpt):
    """Rewrites a checkpoint as format 3 wrote it: no per-row counts, no
    windows."""
    path = os.path.join(ckpt, "index.json")
    index = json.loads(pathlib.Path(path).read_text())
    del index["windows"]
    for name in index["table_files"]:
        filename = os.path.join(ckpt, name)
        arrays = {k: v for k, v in load_file(filename).items()
                  if not k.endswith((".seen_steps", ".last_window"))}
        save_file(arrays, filename)
        data = pathlib.Path(filename).read_bytes()
        index["files"][name] = {"bytes": len(data), "crc32": zlib.crc32(data)}
    index["format_version"] = 3
    del index["index_crc32"]
    index["index_crc32"] = zlib.crc32(json.dumps(index, sort_keys=True).encode())
    pathlib.Path(path).write_text(json.dumps(index))


def test_a_format_3_checkpoint_loads_with_counts_0_also_under_a_newer_delta(tmp_path):
    saved_chain(tmp_path)
    as_format_3(tmp_path / "full")
    assert loaded(tmp_path / "full") == {1: 0, 2: 0, 3: 0}
    # The format 3 base gives ids 1 and 2 (no counts), the delta id 3 (its count).
    assert loaded(tmp_path / "delta") == {1: 0, 2: 0, 3: 3}


def test_counts_survive_model_save_and_get_weights(tmp_path):
    model = build()
    train(model, range(2))
    snapshot = model.get_weights()
    model.save(tmp_path / "m.keras")
    train(model, [2])
    assert counts_by_id(keras.models.load_model(tmp_path / "m.keras")) == {1: 1, 2: 2, 3: 2}
    model.set_weights(snapshot)
    assert counts_by_id(model) == {1: 1, 2: 2, 3: 2}


def test_an_index_without_window_counts_is_refused(tmp_path):
    saved_chain(tmp_path)
    path = tmp_path / "full" / "index.json"
    index = json.loads(path.read_text())
    assert index["format_version"] == FORMAT_VERSION and index["windows"] == [[None]]
    index["windows"] = [[None, None]]                 # two tables of one
    del index["index_crc32"]
    index["index_crc32"] = zlib.crc32(json.dumps(index, sort_keys=True).encode())
    path.write_text(json.dumps(index))
    with pytest.raises(rk.checkpoint.CheckpointError, match="index.json is damaged or not a "
                                                          "reckeras index: windows"):
        build().load_checkpoint(tmp_path / "full")
