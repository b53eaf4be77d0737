"""Delta checkpoints: a chain (full, then deltas) restores exactly the state
of its last save, faults in any link are named and change nothing, and
training on from a chain equals training without a stop."""

import json
import os
import shutil

import keras
import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401 -- pa.compute
import pytest

import reckeras as rk
from reckeras.checkpoint import CheckpointError

pytestmark = pytest.mark.slow  # trains and checkpoints chains of models


def data(n=800, seed=0, shift=0):
    """Ids of "a" and "b" move by `shift`: a later window's new ids."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 150, n) + shift
    b = rng.integers(0, 150, n) + shift
    c, d = rng.integers(0, 30, n), rng.integers(0, 20, n)
    logit = np.sin(a) + np.cos(b) * np.sin(c) + np.cos(d)
    return pa.table({"n": rng.normal(size=n).astype(np.float32), "a": a, "b": b, "c": c,
                     "d": d,
                     "label": (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)})


def build(storage="device", evict=False):
    """Two physical tables: dim 8 packs tables "a" and "shared" (features b
    and c), dim 4 holds "n4" (feature d). With `evict`, "a" frees rows idle for 6 steps."""
    keras.utils.set_random_seed(0)
    columns = rk.layers.FeatureColumns([
        rk.features.Numeric("n"),
        rk.features.Categorical("a", dim=8),
        rk.features.Categorical("b", dim=8, table="shared"),
        rk.features.Categorical("c", dim=8, table="shared"),
        rk.features.Categorical("d", dim=4, table="n4")])
    options = {}
    if evict:
        options["a"] = rk.embedding.TableOptions(evict_idle_steps=6, evict_every=4)
    if storage == "host_cached":
        for name in ("a", "shared", "n4"):
            base = options.get(name, rk.embedding.TableOptions())
            options[name] = rk.embedding.TableOptions(
                storage="host_cached", cache_rows=120, evict_idle_steps=base.evict_idle_steps,
                evict_every=base.evict_every)
    model = rk.models.dcn_v2(columns, cross_layers=1, deep_units=(16,),
                             table_options=options or None, dropout=0.0, embedding_l2=0.0)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.Adagrad(0.1))
    return model


def fit(model, table):
    model.fit(table, batch_size=100, epochs=1, verbose=0)


def tables_by_key(model):
    """Per layer and physical table: {key: (row, state, tag)}."""
    result = []
    for layer in model.embedding_layers:
        for table in layer.engine.table_states():
            tags = np.full(table.keys.size, -2) if table.tags is None else table.tags
            result.append({int(k): (w, s, int(g)) for k, w, s, g in
                           zip(table.keys, table.weights, table.state, tags)})
    return result


def state(model):
    return {"dense": [v.numpy().copy() for v in model.variables],
            "optimizer": [v.numpy().copy() for v in model.optimizer.variables],
            "tables": tables_by_key(model)}


def assert_same_state(a, b):
    assert len(a["dense"]) == len(b["dense"])
    for x, y in zip(a["dense"] + a["optimizer"], b["dense"] + b["optimizer"]):
        np.testing.assert_array_equal(x, y)
    assert len(a["tables"]) == len(b["tables"])
    for mine, theirs in zip(a["tables"], b["tables"]):
        assert sorted(mine) == sorted(theirs)
        for key, (row, value, tag) in mine.items():
            np.testing.assert_array_equal(row, theirs[key][0])
            np.testing.assert_array_equal(value, theirs[key][1])
            assert tag == theirs[key][2]


def table_bytes(path):
    return sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path)
               if n.startswith("tables-"))


def index_of(path):
    with open(os.path.join(path, "index.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module", params=["device", "host_cached"])
def chain(request, tmp_path_factory):
    """Three windows trained with eviction; a full checkpoint after the
    first, deltas after the second (base: the full) and third (base: the
    first delta), a cumulative delta (base: the full) and a full
    checkpoint after the third."""
    root = tmp_path_factory.mktemp(f"chain-{request.param}")
    model = build(request.param, evict=True)
    fit(model, data(seed=0))
    model.save_checkpoint(root / "full1")
    fit(model, data(seed=1, shift=100))
    model.save_checkpoint(root / "delta2", base=root / "full1")
    fit(model, data(seed=2, shift=200))
    model.save_checkpoint(root / "delta3", base=root / "delta2")
    model.save_checkpoint(root / "cumulative3", base=root / "full1")
    model.save_checkpoint(root / "full3")
    return model, root, state(model)


def test_a_chain_restores_the_state_of_a_full_checkpoint_of_the_same_step(chain):
    model, root, at_save = chain
    assert [index_of(root / n)["kind"] for n in ("full1", "delta2", "delta3", "full3")] \
        == ["full", "delta", "delta", "full"]
    assert index_of(root / "delta3")["base"] == {"id": index_of(root / "delta2")["id"],
                                                 "path": "delta2"}
    rows_freed = model.embedding_layers[0].engine.tables[1].evicted
    assert rows_freed > 0                     # ids of the first window aged out
    for name in ("delta3", "cumulative3", "full3"):
        fresh = build(model.embedding_layers[0].table_options["a"].storage, evict=True)
        fit(fresh, data(seed=5))              # something to overwrite
        report = fresh.load_checkpoint(root / name)
        assert_same_state(at_save, state(fresh))
        assert len(report.chain) == {"delta3": 3, "cumulative3": 2, "full3": 1}[name]
    # The deltas hold the rows written since their base, which is most of a
    # small model's rows here, but fewer than the full checkpoint.
    assert table_bytes(root / "delta3") < table_bytes(root / "full3")


def test_a_delta_records_the_keys_freed_since_its_base(tmp_path):
    from safetensors.numpy import load_file
    model = build(evict=True)
    fit(model, data(seed=0))
    model.save_checkpoint(tmp_path / "full1")
    fit(model, data(seed=1, shift=100))
    model.save_checkpoint(tmp_path / "delta2", base=tmp_path / "full1")
    model.save_checkpoint(tmp_path / "full2")

    def arrays(name):
        return load_file(str(tmp_path / name / "tables-00000-of-00001.safetensors"))

    full1, delta2, full2 = arrays("full1"), arrays("delta2"), arrays("full2")
    # Table "a" shares the dim-8 physical table (L0.T1) with "shared".
    gone = np.setdiff1d(full1["L0.T1.keys"], full2["L0.T1.keys"])
    tombstones = delta2["L0.T1.deleted"]
    assert gone.size > 0 and np.isin(gone, tombstones).all()
    # Also keys created and freed between the two saves; none that lives.
    assert not np.isin(tombstones, full2["L0.T1.keys"]).any()
    assert set(np.unique(full1["L0.T1.tags"])) == {0, 1}


def test_training_on_from_a_chain_equals_training_without_a_stop(tmp_path):
    straight = build()
    fit(straight, data(seed=0))
    straight.save_checkpoint(tmp_path / "full")
    fit(straight, data(seed=1, shift=40))
    straight.save_checkpoint(tmp_path / "delta", base=tmp_path / "full")
    fit(straight, data(seed=2, shift=80))
    resumed = build()
    resumed.load_checkpoint(tmp_path / "delta")
    fit(resumed, data(seed=2, shift=80))
    a, b = state(straight), state(resumed)
    for x, y in zip(a["dense"] + a["optimizer"], b["dense"] + b["optimizer"]):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    for mine, theirs in zip(a["tables"], b["tables"]):
        assert sorted(mine) == sorted(theirs)
        for key, (row, value, _) in mine.items():
            np.testing.assert_allclose(row, theirs[key][0], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(value, theirs[key][1], rtol=1e-5, atol=1e-6)


def test_a_delta_holds_only_the_rows_written_since_its_base(tmp_path):
    model = build()
    fit(model, data(seed=0))
    model.save_checkpoint(tmp_path / "full")
    before = tables_by_key(model)
    # Only ids 0..9 of "a" (and every "b", "c" in the batch) are looked up.
    window = data(seed=1)
    fit(model, window.filter(pa.compute.less(window["a"], 10)))
    model.save_checkpoint(tmp_path / "delta", base=tmp_path / "full")
    after = tables_by_key(model)
    from safetensors.numpy import load_file
    saved = load_file(str(tmp_path / "delta" / "tables-00000-of-00001.safetensors"))
    for t, (old, new) in enumerate(zip(before, after)):
        changed = sorted(k for k in new if k not in old or not np.array_equal(
            new[k][0], old[k][0]) or not np.array_equal(new[k][1], old[k][1]))
        assert sorted(saved[f"L0.T{t}.keys"].tolist()) == changed
        assert 0 < len(changed) < len(new)


def test_save_refuses_a_base_this_model_did_not_save_or_load(tmp_path):
    model, other = build(), build()
    fit(model, data())
    fit(other, data(seed=1))
    other.save_checkpoint(tmp_path / "other")
    with pytest.raises(ValueError, match="not one this model saved") as error:
        model.save_checkpoint(tmp_path / "delta", base=tmp_path / "other")
    assert str(tmp_path / "other" / "index.json") in str(error.value)
    model.save_checkpoint(tmp_path / "first")
    model.save_checkpoint(tmp_path / "second")          # a full save after "first"
    with pytest.raises(ValueError, match="since its last full"):
        model.save_checkpoint(tmp_path / "delta", base=tmp_path / "first")
    with pytest.raises(ValueError, match="its own base"):
        model.save_checkpoint(tmp_path / "second", base=tmp_path / "second")
    assert not os.path.exists(tmp_path / "delta")
    # A model that loaded a checkpoint exactly may save deltas against it.
    model.load_checkpoint(tmp_path / "other")
    model.save_checkpoint(tmp_path / "delta", base=tmp_path / "other")
    assert index_of(tmp_path / "delta")["base"]["id"] == index_of(tmp_path / "other")["id"]


@pytest.fixture
def links(tmp_path):
    """A model, a chain full -> delta1 -> delta2 of it, and a model that
    trained on since (so a write of a failed load would show)."""
    model = build()
    fit(model, data(seed=0))
    model.save_checkpoint(tmp_path / "full")
    fit(model, data(seed=1, shift=30))
    model.save_checkpoint(tmp_path / "delta1", base=tmp_path / "full")
    fit(model, data(seed=2, shift=60))
    model.save_checkpoint(tmp_path / "delta2", base=tmp_path / "delta1")
    fit(model, data(seed=3))
    return model, tmp_path


def fails_naming(model, path, filename, *words):
    before = state(model)
    with pytest.raises(CheckpointError) as error:
        model.load_checkpoint(path)
    assert str(filename) in str(error.value)
    for word in words:
        assert word in str(error.value)
    assert_same_state(before, state(model))


def test_a_missing_base_is_named_and_changes_nothing(links):
    model, root = links
    shutil.rmtree(root / "delta1")
    fails_naming(model, root / "delta2", root / "delta2" / "index.json", "missing")


def test_a_base_replaced_by_another_save_is_named_and_changes_nothing(links):
    model, root = links
    model.save_checkpoint(root / "delta1")       # another save at the base's path
    fails_naming(model, root / "delta2", root / "delta1" / "index.json", "another save")


def test_a_truncated_delta_file_is_named_and_changes_nothing(links):
    model, root = links
    target = root / "delta2" / "tables-00000-of-00001.safetensors"
    os.truncate(target, os.path.getsize(target) * 2 // 3)
    fails_naming(model, root / "delta2", target, "truncated")


def test_a_damaged_file_of_an_earlier_link_is_named_and_changes_nothing(links):
    model, root = links
    target = root / "full" / "tables-00000-of-00001.safetensors"
    with open(target, "r+b") as f:                 # 64 bytes of its data inverted
        f.seek(os.path.getsize(target) - 200)
        chunk = f.read(64)
        f.seek(os.path.getsize(target) - 200)
        f.write(bytes(b ^ 0xFF for b in chunk))
    fails_naming(model, root / "delta2", target, "CRC-32")


def test_model_checkpoint_writes_deltas_between_fulls(tmp_path):
    model = build()
    callback = rk.callbacks.ModelCheckpoint(str(tmp_path / "epoch{epoch}"), full_every=2)
    model.fit(data(), batch_size=100, epochs=4, verbose=0, callbacks=[callback])
    kinds = [index_of(p)["kind"] for p in callback.saved]
    assert kinds == ["full", "delta", "full", "delta"]
    assert index_of(callback.saved[3])["base"]["id"] == index_of(callback.saved[2])["id"]
    at_end = state(model)
    fresh = build()
    assert fresh.load_checkpoint(callback.saved[3]).chain == callback.saved[2:]
    assert_same_state(at_end, state(fresh))
    with pytest.raises(ValueError, match="epoch"):
        rk.callbacks.ModelCheckpoint(str(tmp_path / "same"), full_every=3)
