"""Aging out by windows in fit_windows: rows unseen for K windows are freed
at a window's end, the History counts rows added, evicted and kept, a
delta checkpoint after aging out loads to the state of a full one, and a job
restarted from a checkpoint (full or a chain) ages out as one that never
stopped."""

import json
import sys
from pathlib import Path

import keras
import numpy as np
import pyarrow as pa
import pytest
import torch

import reckeras as rk
from reckeras.backend_kernels.hashing import mix64
from reckeras.embedding.packing import table_salt

sys.path.insert(0, str(Path(__file__).parents[1] / "embedding"))
from test_seen_steps import as_format_3  # noqa: E402

K = 2
BATCH = 16
ROWS = 64
# (rows_added, rows_evicted, rows_kept) of windows 0-3, by hand: 13 ids of a
# and 5 of b, then a=100+w and b=10+w each window; window 2 ends without
# a=100 (last trained in window 0), window 3 without a=101 and a=50-53
# (last trained in window 1).
HAND_COUNTS = [(18, 0, 18), (2, 0, 20), (2, 1, 21), (2, 5, 18)]


def window_ids(window):
    """Ids of `a` in window w: 0-7 always, 100+w only in window w, and 50-53
    in windows 0 and 1 only; `b` (no aging) sees 0-3 always and 10+w."""
    always, once = list(range(8)), [100 + window]
    early = list(range(50, 54)) if window < 2 else []
    return always + once + early, list(range(4)) + [10 + window]


def window_table(window):
    a_ids, b_ids = window_ids(window)
    rng = np.random.default_rng(window)
    a = np.resize(np.array(a_ids), ROWS)
    b = np.resize(np.array(b_ids), ROWS)
    n = rng.normal(size=ROWS).astype(np.float32)
    label = (rng.random(ROWS) < 1 / (1 + np.exp(-(a % 2 - 0.5) * 2 - n))).astype(np.float32)
    return pa.table({"n": n, "a": rng.permutation(a), "b": rng.permutation(b), "label": label})


def build(storage="device"):
    keras.utils.set_random_seed(0)
    columns = rk.layers.FeatureColumns([rk.features.Numeric("n"),
                                        rk.features.Categorical("a", dim=4),
                                        rk.features.Categorical("b", dim=4)])
    cache = {"storage": "host_cached", "cache_rows": 40} if storage == "host_cached" else {}
    options = {"a": rk.embedding.TableOptions(evict_idle_windows=K, **cache),
               "b": rk.embedding.TableOptions(**cache)}
    model = rk.models.dlrm(columns, bottom_units=(8, 4), top_units=(8, 1),
                           table_options=options, dropout=0.0, embedding_l2=0.0)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.1),
                  metrics=[rk.metrics.AUC()])
    return model


def key(table, raw_id):
    return int(mix64(torch.tensor([raw_id]))[0] ^ table_salt(table))


def reference(num_windows):
    """Per window: (added, evicted, kept) and the keys held, by hand."""
    held, last_seen, counts, keys = set(), {}, [], []
    for w in range(num_windows):
        a_ids, b_ids = window_ids(w)
        seen = {("a", i) for i in a_ids} | {("b", i) for i in b_ids}
        added = len(seen - held)
        held |= seen
        last_seen.update({row: w for row in seen})
        stale = {row for row in held if row[0] == "a" and w - last_seen[row] >= K}
        held -= stale
        counts.append((added, len(stale), len(held)))
        keys.append({key(*row) for row in held})
    return counts, keys


def held_keys(model):
    layer, = model.embedding_layers
    return {int(k) for k in layer.table_states()[0].keys}


@pytest.mark.parametrize("storage", ["device", "host_cached"])
def test_rows_unseen_for_k_windows_age_out_with_exact_counts(storage):
    model = build(storage)
    windows = [window_table(w) for w in range(4)]
    history = model.fit_windows(windows, batch_size=BATCH, verbose=0, shuffle=False)
    counts, keys = reference(4)
    got = list(zip(*(history.history[name]
                     for name in ("rows_added", "rows_evicted", "rows_kept"))))
    assert got == counts
    assert counts == HAND_COUNTS
    assert held_keys(model) == keys[-1]
    assert key("a", 100) not in held_keys(model) and key("a", 0) in held_keys(model)
    assert key("b", 10) in held_keys(model)     # "b" does not age


def test_no_row_counts_without_aging():
    keras.utils.set_random_seed(0)
    columns = rk.layers.FeatureColumns([rk.features.Numeric("n"),
                                        rk.features.Categorical("a", dim=4)])
    model = rk.models.dlrm(columns, bottom_units=(8, 4), top_units=(8, 1),
                           dropout=0.0, embedding_l2=0.0)
    model.compile(optimizer="adam", loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.SGD(0.1))
    history = model.fit_windows([window_table(0)], batch_size=BATCH, verbose=0)
    assert "rows_kept" not in history.history


def tables_by_key(model):
    layer, = model.embedding_layers
    table = layer.table_states()[0]
    order = np.argsort(table.keys)
    return {name: values[order] for name, values in table.arrays().items()}


@pytest.mark.parametrize("storage", ["device", "host_cached"])
def test_delta_after_aging_out_loads_as_the_full_checkpoint(tmp_path, storage):
    model = build(storage)
    windows = [window_table(w) for w in range(4)]
    model.fit_windows(windows[:1], batch_size=BATCH, verbose=0)
    model.save_checkpoint(tmp_path / "full0")
    model.fit_windows(windows[1:], batch_size=BATCH, verbose=0)
    assert key("a", 50) not in held_keys(model)          # aged out after the full save
    model.save_checkpoint(tmp_path / "delta", base=tmp_path / "full0")
    model.save_checkpoint(tmp_path / "full3")
    from_delta, from_full = build(storage), build(storage)
    from_delta.load_checkpoint(tmp_path / "delta")
    from_full.load_checkpoint(tmp_path / "full3")
    expected, loaded = tables_by_key(from_full), tables_by_key(from_delta)
    assert set(expected["keys"].tolist()) == held_keys(model)
    for name in expected:
        np.testing.assert_array_equal(loaded[name], expected[name], err_msg=name)
    for a, b in zip(from_delta.get_weights(), from_full.get_weights()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("storage", ["device", "host_cached"])
@pytest.mark.parametrize("saved", ["full", "delta"])
@pytest.mark.slow
def test_a_job_restarted_from_a_checkpoint_ages_out_as_one_that_never_stopped(
        tmp_path, storage, saved):
    windows = [window_table(w) for w in range(4)]
    straight = build(storage)
    expected = straight.fit_windows(windows, batch_size=BATCH, verbose=0, shuffle=False)
    first = build(storage)
    if saved == "full":
        first.fit_windows(windows[:3], batch_size=BATCH, verbose=0, shuffle=False)
        first.save_checkpoint(tmp_path / "day2")
    else:
        first.fit_windows(windows[:1], batch_size=BATCH, verbose=0, shuffle=False)
        first.save_checkpoint(tmp_path / "day0")
        first.fit_windows(windows[1:3], batch_size=BATCH, verbose=0, shuffle=False)
        first.save_checkpoint(tmp_path / "day2", base=tmp_path / "day0")
    index = json.loads((tmp_path / "day2" / "index.json").read_text())
    assert index["windows"] == [[3]]                  # three windows ended
    restarted = build(storage)                         # a new day's process
    restarted.load_checkpoint(tmp_path / "day2")
    got = restarted.fit_windows(windows[3:], batch_size=BATCH, verbose=0, shuffle=False)
    # Window 3 frees a=101 and a=50-53, last trained in window 1.
    for name in ("rows_added", "rows_evicted", "rows_kept"):
        assert got.history[name] == expected.history[name][3:], name
    assert expected.history["rows_evicted"][3] == HAND_COUNTS[3][1] == 5
    assert held_keys(restarted) == held_keys(straight) == reference(4)[1][-1]
    resumed, uninterrupted = tables_by_key(restarted), tables_by_key(straight)
    for name in uninterrupted:
        np.testing.assert_array_equal(resumed[name], uninterrupted[name], err_msg=name)


def test_rows_of_a_format_3_checkpoint_count_as_trained_in_the_window_of_the_load(
        tmp_path):
    windows = [window_table(w) for w in range(4)]
    first = build()
    first.fit_windows(windows[:3], batch_size=BATCH, verbose=0, shuffle=False)
    first.save_checkpoint(tmp_path / "day2")
    as_format_3(tmp_path / "day2")                   # saved before windows were saved
    restarted = build()
    restarted.load_checkpoint(tmp_path / "day2")
    got = restarted.fit_windows(windows[3:], batch_size=BATCH, verbose=0, shuffle=False)
    # Every row counts as trained in the restarted process's window 0: none
    # is K = 2 windows old at its end.
    assert got.history["rows_evicted"] == [0]
    assert got.history["rows_kept"] == [HAND_COUNTS[2][2] + 2]
