"""The on-disk format: checkpoints written by the code before
`reckeras.checkpoint` (format 4, `data/format4/`, made by
`data/make_format4.py`) load with every row, tag, count and window, and a
delta saved on a loaded one chains to them; the index's fields are checked."""

import json
import os
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file

from checkpoint.old_model import build, window
from reckeras.checkpoint import CheckpointError
from reckeras.checkpoint.format import FORMAT_VERSION, index_crc, read_index

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "format4")


@pytest.fixture
def old(tmp_path):
    """A copy of the fixture (a load may not write, but a delta is saved
    beside it)."""
    shutil.copytree(DATA, tmp_path / "format4")
    return tmp_path / "format4"


def assert_same(actual, expected, exact, err_msg=""):
    if exact or not np.issubdtype(np.asarray(expected).dtype, np.floating):
        np.testing.assert_array_equal(actual, expected, err_msg=err_msg)
    else:
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6, err_msg=err_msg)


def assert_holds(model, directory, which, exact=True):
    """The model holds the save's dense variables (its dense file, read by
    the safetensors library) and rows (`expected.npz`, by the old code):
    bit for bit, or, with `exact=False`, its float values to float32
    rounding (for a model trained again here)."""
    dense = load_file(os.path.join(directory, which, "dense.safetensors"))
    variables = [*model.variables, *model.optimizer.variables]
    assert len(dense) == len(variables)
    for i, variable in enumerate(model.variables):
        assert_same(variable.numpy(), dense[f"model/{i}"], exact)
    for i, variable in enumerate(model.optimizer.variables):
        assert_same(variable.numpy(), dense[f"optimizer/{i}"], exact)
    expected = np.load(os.path.join(directory, "expected.npz"))
    for t, state in enumerate(model.embedding_layers[0].table_states()):
        order = np.argsort(state.keys)
        arrays = state.arrays()
        names = [k.split(".", 1)[1] for k in expected if k.startswith(f"{which}/T{t}.")]
        assert set(names) - {"window"} == set(arrays), (t, names)
        for name in arrays:
            assert_same(arrays[name][order], expected[f"{which}/T{t}.{name}"], exact,
                        err_msg=name)
        if state.layout.ages_by_windows:
            assert state.window == int(expected[f"{which}/T{t}.window"])
        else:
            assert state.window is None


@pytest.mark.parametrize("which", ["full", "delta"])
def test_a_checkpoint_of_the_old_code_loads(old, which):
    assert read_index(old / which)["format_version"] == 4 < FORMAT_VERSION
    model = build()
    model.fit(window(9), batch_size=16, epochs=1, verbose=0)   # other rows, built optimizer
    report = model.load_checkpoint(old / which)
    assert report.chain == [str(old / "full"), str(old / "delta")][:1 + (which == "delta")]
    assert_holds(model, old, which)


def test_a_delta_on_an_old_checkpoint_chains_to_it(old, tmp_path):
    model = build()
    model.fit(window(9), batch_size=16, epochs=1, verbose=0)
    model.load_checkpoint(old / "full")
    model.fit_windows([window(2), window(3)], batch_size=16, verbose=0)
    model.save_checkpoint(tmp_path / "new_delta", base=old / "full")
    fresh = build()
    fresh.fit(window(9), batch_size=16, epochs=1, verbose=0)
    fresh.load_checkpoint(tmp_path / "new_delta")
    # The same training from the same state: the old code's own delta (to
    # float32 rounding: the old code ran every float32 matmul of the
    # forward in oneDNN, this one only the model's Dense layers'; the rows
    # changed and their keys, counts and windows are the same).
    assert_holds(fresh, old, "delta", exact=False)


def test_the_index_names_its_faults(old):
    path = old / "full" / "index.json"
    index = json.loads(path.read_text())
    index["windows"] = [[None]]                  # one layer of two tables
    path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="index.json is damaged"):
        read_index(old / "full")
    index["index_crc32"] = index_crc(index)
    path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"windows \[\[None\]\] do not give"):
        read_index(old / "full")
    index = json.loads(path.read_text())
    index["windows"] = [[None, None]]
    for bad in (-1, 1.5, "2"):
        index["epochs_fitted"] = bad
        index["index_crc32"] = index_crc(index)
        path.write_text(json.dumps(index))
        with pytest.raises(CheckpointError, match=f"epochs_fitted {bad!r} is not a count"):
            read_index(old / "full")


def test_the_epochs_fitted_are_saved_and_restored(old, tmp_path):
    """`fit`'s shuffle goes on from a checkpoint's count of epochs; an index
    without it (format 4) counts 0; a warm start keeps the model's own."""
    model = build()
    model.fit(window(1), batch_size=16, epochs=2, verbose=0)
    model.save_checkpoint(tmp_path / "ckpt")
    assert read_index(tmp_path / "ckpt")["epochs_fitted"] == 2
    fresh = build()
    fresh.fit(window(9), batch_size=16, epochs=3, verbose=0)
    fresh.load_checkpoint(tmp_path / "ckpt")
    assert fresh.loop_state.epochs_fitted == 2
    fresh.load_checkpoint(old / "full")
    assert fresh.loop_state.epochs_fitted == 0
    fresh.fit(window(9), batch_size=16, epochs=1, verbose=0)
    with pytest.warns(UserWarning, match="warm start"):    # another model's names
        fresh.load_checkpoint(tmp_path / "ckpt", warm_start=True)
    assert fresh.loop_state.epochs_fitted == 1


def test_tags_are_written_in_the_narrowest_int_that_holds_the_tables(tmp_path):
    # old_model packs several logical tables into one physical table: its
    # tags take one byte a row (format 5), and load back as they were.
    model = build()
    model.fit(window(1), batch_size=16, epochs=1, verbose=0)
    model.save_checkpoint(tmp_path / "ckpt")
    tables = load_file(str(tmp_path / "ckpt" / "tables-00000-of-00001.safetensors"))
    tagged = [name for name in tables if name.endswith(".tags")]
    assert tagged and all(tables[name].dtype == np.int8 for name in tagged)
    before = [state.tags for state in model.embedding_layers[0].table_states()
              if state.tags is not None]
    fresh = build()
    fresh.fit(window(9), batch_size=16, epochs=1, verbose=0)
    fresh.load_checkpoint(tmp_path / "ckpt")
    after = [state.tags for state in fresh.embedding_layers[0].table_states()
             if state.tags is not None]
    for saved, loaded in zip(before, after, strict=True):
        np.testing.assert_array_equal(np.sort(loaded), np.sort(saved))
        assert loaded.dtype == np.int32


def test_narrow_tags_picks_int8_int16_or_int32():
    from reckeras.checkpoint.format import narrow_tags
    tags = np.array([-1, 0, 5], np.int32)
    assert narrow_tags(tags, 128).dtype == np.int8
    assert narrow_tags(tags, 129).dtype == np.int16
    assert narrow_tags(tags, 32768).dtype == np.int16
    assert narrow_tags(tags, 32769).dtype == np.int32
    np.testing.assert_array_equal(narrow_tags(tags, 26), tags)
