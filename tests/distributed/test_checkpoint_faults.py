"""Checked checkpoints: a truncated, altered, missing or foreign file is named
at load, and the model stays as it was (dense weights, optimizer state, every
table's keys, rows and state), in one process and on 2 ranks."""

import json
import os
import pathlib
import shutil
import zlib

import keras
import numpy as np
import pyarrow as pa
import pytest

import reckeras as rk
from launch import torchrun
from reckeras.checkpoint import CheckpointError
from reckeras.checkpoint.format import FORMAT_VERSION
from workers import damage

pytestmark = pytest.mark.slow  # spawns torchrun processes


def data(n=1500, seed=0):
    rng = np.random.default_rng(seed)
    a, b, c = rng.integers(0, 300, n), rng.integers(0, 300, n), rng.integers(0, 50, n)
    logit = np.sin(a) + np.cos(b) * np.sin(c)
    return pa.table({"n": rng.normal(size=n).astype(np.float32), "a": a, "b": b, "c": c,
                     "label": (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)})


def build(seed=0):
    keras.utils.set_random_seed(seed)
    # Two physical tables (dims 8 and 4), Adagrad state as wide as the rows.
    columns = rk.layers.FeatureColumns([rk.features.Numeric("n"),
                                        rk.features.Categorical("a", dim=8),
                                        rk.features.Categorical("b", dim=8),
                                        rk.features.Categorical("c", dim=4)])
    model = rk.models.dcn_v2(columns, cross_layers=1, deep_units=(16,),
                             dropout=0.0, embedding_l2=0.0)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.Adagrad(0.1))
    return model


def state(model):
    return {"dense": [v.numpy().copy() for v in model.variables],
            "optimizer": [v.numpy().copy() for v in model.optimizer.variables],
            "tables": [layer.engine.table_states() for layer in model.embedding_layers]}


def flat(snapshot):
    arrays = snapshot["dense"] + snapshot["optimizer"]
    for layer in snapshot["tables"]:
        for table in layer:
            arrays += [getattr(table, name) for name in ("keys", "weights", "state")]
    return arrays


def same(a, b):
    x, y = flat(a), flat(b)
    return len(x) == len(y) and all(
        p.shape == q.shape and np.array_equal(p, q) for p, q in zip(x, y))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A model, a checkpoint of it after one epoch, its state then; the model
    has trained on since, so any write of a load would show."""
    model = build()
    model.fit(data(), batch_size=100, epochs=1, verbose=0)
    original = tmp_path_factory.mktemp("saved") / "ckpt"
    model.save_checkpoint(original)
    at_save = state(model)
    model.fit(data(seed=1), batch_size=100, epochs=1, verbose=0)
    assert not same(at_save, state(model))
    return model, original, at_save


@pytest.fixture
def ckpt(trained, tmp_path):
    path = tmp_path / "ckpt"
    shutil.copytree(trained[1], path)
    return str(path)


def assert_fails_naming(model, ckpt, filename, *words):
    before = state(model)
    with pytest.raises(CheckpointError) as error:
        model.load_checkpoint(ckpt)
    assert filename in str(error.value)
    for word in words:
        assert word in str(error.value)
    assert same(before, state(model))
    return str(error.value)


def test_an_intact_checkpoint_restores_the_state_of_the_save(trained, ckpt):
    model, _, at_save = trained
    fresh = build(seed=5)
    fresh.fit(data(seed=2), batch_size=100, epochs=1, verbose=0)
    fresh.load_checkpoint(ckpt)
    assert same(at_save, state(fresh))
    index = json.loads(pathlib.Path(os.path.join(ckpt, "index.json")).read_text())
    assert index["format_version"] == FORMAT_VERSION
    for name, entry in index["files"].items():
        assert entry["bytes"] == os.path.getsize(os.path.join(ckpt, name))


@pytest.mark.parametrize("fault", sorted(damage.TABLE_FAULTS))
def test_a_damaged_table_file_is_named_and_changes_nothing(trained, ckpt, fault):
    target = damage.largest_table_file(ckpt)
    damage.TABLE_FAULTS[fault](target)
    assert_fails_naming(trained[0], ckpt, target)


def test_flipped_dense_bytes_are_named_and_change_nothing(trained, ckpt):
    target = os.path.join(ckpt, "dense.safetensors")
    damage.flip_data(target)
    assert_fails_naming(trained[0], ckpt, target, "CRC-32")


def test_a_table_file_of_another_save_is_named(trained, ckpt, tmp_path):
    model = trained[0]
    other = str(tmp_path / "other")
    model.save_checkpoint(other)             # the model has trained on: other rows
    target = damage.largest_table_file(ckpt)
    shutil.copy(damage.largest_table_file(other), target)
    assert_fails_naming(model, ckpt, target)


def test_the_index_of_another_save_is_found(trained, ckpt, tmp_path):
    model = trained[0]
    other = str(tmp_path / "other")
    model.save_checkpoint(other)
    shutil.copy(os.path.join(other, "index.json"), os.path.join(ckpt, "index.json"))
    # The first file it checks (the dense one) does not match it.
    assert_fails_naming(model, ckpt, os.path.join(ckpt, "dense.safetensors"),
                        "the index is another save's")


@pytest.mark.parametrize("fault", [damage.truncate_index, damage.flip_index_checksum])
def test_a_damaged_index_is_named_and_changes_nothing(trained, ckpt, fault):
    fault(ckpt)
    assert_fails_naming(trained[0], ckpt, os.path.join(ckpt, "index.json"), "damaged")


def test_an_index_of_another_format_is_refused(trained, ckpt):
    path = os.path.join(ckpt, "index.json")
    index = json.loads(pathlib.Path(path).read_text())
    del index["index_crc32"]                 # a format this reckeras does not know
    pathlib.Path(path).write_text(json.dumps({**index, "format_version": FORMAT_VERSION + 1}))
    assert_fails_naming(trained[0], ckpt, path, f"format_version {FORMAT_VERSION + 1}")


def test_a_flipped_format_version_is_damage(trained, ckpt):
    path = os.path.join(ckpt, "index.json")
    text = pathlib.Path(path).read_text()
    current = f'"format_version": {FORMAT_VERSION}'
    assert current in text
    pathlib.Path(path).write_text(text.replace(current, '"format_version": 3'))
    assert_fails_naming(trained[0], ckpt, path, "damaged")


def test_a_model_with_other_tables_is_refused(trained, ckpt):
    keras.utils.set_random_seed(0)
    columns = rk.layers.FeatureColumns([rk.features.Numeric("n"),
                                        rk.features.Categorical("a", dim=8),
                                        rk.features.Categorical("b", dim=8),
                                        rk.features.Categorical("c", dim=6)])
    other = rk.models.dcn_v2(columns, cross_layers=1, deep_units=(16,),
                             dropout=0.0, embedding_l2=0.0)
    other.compile(optimizer="adam", loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.Adagrad(0.1))
    other.fit(data(), batch_size=100, epochs=1, verbose=0)
    message = assert_fails_naming(other, ckpt, ckpt, "dims")
    assert "[[4, 8]]" in message and "[[6, 8]]" in message


def version_1(ckpt):
    """Rewrites the index as format 1 wrote it (no sizes, no checksums),
    and the table files without per-row counts."""
    from safetensors.numpy import load_file, save_file
    path = os.path.join(ckpt, "index.json")
    index = json.loads(pathlib.Path(path).read_text())
    for name in index["table_files"]:
        filename = os.path.join(ckpt, name)
        save_file({k: v for k, v in load_file(filename).items()
                   if not k.endswith(".seen_steps")}, filename)
    for field in ("files", "index_crc32"):
        del index[field]
    pathlib.Path(path).write_text(json.dumps({**index, "format_version": 1}))


def test_a_version_1_checkpoint_loads_with_its_structure_checked(trained, ckpt):
    model, _, at_save = trained
    version_1(ckpt)
    fresh = build(seed=5)
    fresh.load_checkpoint(ckpt)
    assert same(at_save, state(fresh))
    # Without a recorded size, the safetensors header still finds the cut.
    damage.truncate(damage.largest_table_file(ckpt))
    assert_fails_naming(model, ckpt, damage.largest_table_file(ckpt), "truncated")


def version_2(ckpt):
    """Rewrites the checkpoint as format 2 wrote it: no kind, id, table
    names, dense paths, per-row tags or counts."""
    from safetensors.numpy import load_file, save_file
    path = os.path.join(ckpt, "index.json")
    index = json.loads(pathlib.Path(path).read_text())
    for name in index["table_files"]:
        filename = os.path.join(ckpt, name)
        arrays = {k: v for k, v in load_file(filename).items()
                  if not k.endswith((".tags", ".seen_steps"))}
        save_file(arrays, filename)
        data = pathlib.Path(filename).read_bytes()
        index["files"][name] = {"bytes": len(data), "crc32": zlib.crc32(data)}
    for field in ("kind", "id", "dense_paths", "index_crc32"):
        del index[field]
    for layer in index["layers"]:
        for table in layer:
            del table["tables"], table["tags"]
    index["format_version"] = 2
    index["index_crc32"] = zlib.crc32(json.dumps(index, sort_keys=True).encode())
    pathlib.Path(path).write_text(json.dumps(index))


def test_a_version_2_checkpoint_loads_into_its_model_only(trained, ckpt, tmp_path):
    model, _, at_save = trained
    version_2(ckpt)
    fresh = build(seed=5)
    fresh.load_checkpoint(ckpt)
    assert same(at_save, state(fresh))
    # Its rows carry no table: unknown (-1) in the packed dim-8 table.
    assert set(fresh.embedding_layers[0].engine.table_states()[1].tags) == {-1}
    with pytest.raises(CheckpointError, match="format 2"):
        build(seed=5).load_checkpoint(ckpt, warm_start=True)
    with pytest.raises(ValueError, match="no checkpoint id"):
        fresh.save_checkpoint(tmp_path / "delta", base=ckpt)


def test_a_fault_one_rank_finds_fails_the_load_on_every_rank(tmp_path):
    # On 2 ranks from a 2-rank save each rank reads only its own file: the
    # rank that reads the damaged file finds it, the other hears of it.
    torchrun("checkpoint_faults.py", 2, tmp_path / "ckpt", tmp_path / "rank")
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for report in reports:
        assert report["intact_load_restores_the_save"]
        assert set(report["faults"]) == set(damage.TABLE_FAULTS)
    for fault in damage.TABLE_FAULTS:
        outcomes = [report["faults"][fault] for report in reports]
        target = outcomes[0]["file"]
        finder = int(target.split("tables-")[1][:5])      # the rank that reads it
        for rank, outcome in enumerate(outcomes):
            assert outcome["error"] == "CheckpointError" and outcome["unchanged"], outcome
            assert target in outcome["message"]
            if rank != finder:
                assert f"rank {finder} of 2 could not load it" in outcome["message"]
