"""rk.callbacks.BackupAndRestore in one process: a fit interrupted mid-epoch
and resumed from its backup ends as the fit that was never interrupted."""

import json
import os

import keras
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import reckeras as rk
from reckeras.checkpoint import CheckpointError

STEPS = 16          # 1024 rows at batch 64


def rows(n=1024, seed=0):
    rng = np.random.default_rng(seed)
    a, b = rng.integers(0, 300, n), rng.integers(0, 40, n)
    x = rng.normal(size=n).astype(np.float32)
    logit = np.sin(a) + np.cos(b) * x
    return pa.table({"n": x, "a": a, "b": b,
                     "label": (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)})


def build(seed=0, tables=("a", "b")):
    # Dropout draws from its layer's seed generator, Adam keeps moments and a
    # step count, the tables keep Adagrad accumulators: all must come back.
    keras.utils.set_random_seed(seed)
    columns = rk.layers.FeatureColumns(
        [rk.features.Numeric("n")] + [rk.features.Categorical(t, dim=4) for t in tables])
    inputs = columns.inputs()
    dense, sparse = columns(inputs)
    emb = keras.layers.Flatten()(rk.layers.ShardedEmbedding(columns)(sparse))
    hidden = keras.layers.Dense(8, activation="relu")(keras.layers.Concatenate()([dense, emb]))
    out = keras.layers.Dense(1, activation="sigmoid")(keras.layers.Dropout(0.3)(hidden))
    model = rk.Model(inputs, out)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.Adagrad(0.1),
                  metrics=[keras.metrics.BinaryAccuracy(name="acc"), rk.metrics.AUC()])
    return model


def fit(model, callbacks=(), batch_size=64, epochs=3):
    return model.fit(rows(), batch_size=batch_size, epochs=epochs, seed=5, verbose=0,
                     callbacks=list(callbacks))


def by_key(model):
    """Dense weights, and every table's (keys, rows, state) sorted by key: a
    loaded table may hold its rows in another order."""
    dense = [w.numpy().copy() for w in model.weights]
    tables = []
    for layer in model.embedding_layers:
        for table in layer.tables:
            arrays = table.export()
            order = np.argsort(arrays["keys"])
            tables.append({k: arrays[k][order] for k in ("keys", "weights", "state")})
    return dense, tables


def assert_same_model(a, b):
    # Resuming replays the same float operations on the same values: the
    # weights come out equal to the last bit.
    for x, y in zip(a[0], b[0], strict=True):
        np.testing.assert_array_equal(x, y)
    for x, y in zip(a[1], b[1], strict=True):
        for name in x:
            np.testing.assert_array_equal(x[name], y[name], err_msg=name)


class Interrupt(keras.callbacks.Callback):
    """Raises when training reaches batch `step` of epoch `epoch`."""

    def __init__(self, epoch, step):
        super().__init__()
        self.at = (epoch, step)

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            raise RuntimeError("interrupted")


class Batches(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seen = []

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        self.seen.append((self.epoch, batch))


@pytest.fixture(scope="module")
def straight():
    model = build()
    history = fit(model).history
    return by_key(model), history


def interrupted(backup_dir, epoch, step, save_freq):
    with pytest.raises(RuntimeError, match="interrupted"):
        fit(build(), [rk.callbacks.BackupAndRestore(backup_dir, save_freq=save_freq),
                      Interrupt(epoch, step)])


@pytest.mark.slow
def test_resume_mid_epoch_equals_the_uninterrupted_fit(tmp_path, straight):
    backup_dir = tmp_path / "backup"
    # Backups after global steps 5, 10, ..., 25 (epoch 1, step 9); the fit
    # dies at step 12 of epoch 1, three steps after its last backup.
    interrupted(backup_dir, 1, 12, save_freq=5)
    record = json.loads((backup_dir / "backup.json").read_text())
    assert (record["epoch"], record["step"]) == (1, 9)
    assert sorted(os.listdir(backup_dir)) == ["backup.json", "ckpt-00001-0000009"]

    resumed = build(seed=7)            # a new process: other initial weights
    seen = Batches()
    with pytest.warns(UserWarning, match=r"metrics \['auc'\].*from 10 on"):
        history = fit(resumed, [rk.callbacks.BackupAndRestore(backup_dir, save_freq=5),
                                seen]).history
    # Epoch 1 resumes at batch 9; no batch before it is trained again.
    assert seen.seen == [(1, b) for b in range(9, STEPS)] + [(2, b) for b in range(STEPS)]
    expected, expected_history = straight
    assert_same_model(expected, by_key(resumed))
    # The epoch's loss and accuracy count the steps before the backup too
    # (their sums are restored, then added to in another order: 1e-6).
    for name in ("loss", "acc"):
        np.testing.assert_allclose(history[name], expected_history[name][1:], rtol=1e-6)
    assert history["auc"][1] == pytest.approx(expected_history["auc"][2], rel=1e-6)
    assert not backup_dir.exists()                 # deleted at the end of the fit


@pytest.mark.slow
def test_resume_at_an_epoch_end_and_keep_the_backup(tmp_path, straight):
    backup_dir = tmp_path / "backup"
    interrupted(backup_dir, 2, 3, save_freq="epoch")
    seen = Batches()
    resumed = build(seed=7)
    history = fit(resumed, [rk.callbacks.BackupAndRestore(backup_dir,
                                                          delete_checkpoint=False),
                            seen]).history
    assert seen.seen == [(2, b) for b in range(STEPS)]
    assert_same_model(straight[0], by_key(resumed))
    for name in ("loss", "acc", "auc"):       # a whole epoch: every metric
        assert history[name] == pytest.approx(straight[1][name][2:], rel=1e-6)
    record = json.loads((backup_dir / "backup.json").read_text())
    assert (record["epoch"], record["step"]) == (3, 0)


def test_a_save_due_at_an_epochs_last_step_is_written_at_its_end(tmp_path):
    backup_dir = tmp_path / "backup"
    # Global step 16 is the last of epoch 0: backed up as (epoch 1, step 0).
    interrupted(backup_dir, 1, 2, save_freq=16)
    record = json.loads((backup_dir / "backup.json").read_text())
    assert (record["epoch"], record["step"], record["metrics"]) == (1, 0, None)


def test_wrong_uses_are_refused_with_what_differs(tmp_path):
    for bad in (0, -3, 2.5, True, "batch"):
        with pytest.raises(ValueError, match="save_freq must be 'epoch' or a positive int"):
            rk.callbacks.BackupAndRestore(tmp_path, save_freq=bad)
    backup_dir = tmp_path / "backup"
    interrupted(backup_dir, 1, 12, save_freq=5)
    # A backup of another model: its tables are named.
    with pytest.raises(CheckpointError, match=r"holds tables \[\[\['a', 'b'\]\]\].*"
                                              r"\[\[\['a', 'c'\]\]\]"):
        fit(build(tables=("a", "c")), [rk.callbacks.BackupAndRestore(backup_dir)])
    # Another batch size: the epoch has other steps.
    with pytest.raises(ValueError, match="epochs had 16 steps; this one's have 8"):
        fit(build(), [rk.callbacks.BackupAndRestore(backup_dir)], batch_size=128)
    # A damaged record names its file, on every rank.
    record = backup_dir / "backup.json"
    record.write_text(record.read_text()[:40])
    with pytest.raises(ValueError, match=r"backup\.json is not a readable backup record"):
        fit(build(), [rk.callbacks.BackupAndRestore(backup_dir)])


def test_the_position_of_resume_at_is_checked_against_the_fit(tmp_path):
    model = build()
    with pytest.raises(ValueError, match="step must be an int >= 0"):
        model.resume_at(1, -1)
    model.resume_at(0, 3, global_batch_size=32, world_size=1)
    with pytest.raises(ValueError, match=r"32 examples per step .* pass batch_size=32"):
        fit(model, epochs=1)
    model.resume_at(0, STEPS + 1)
    with pytest.raises(ValueError, match="beyond this fit's epochs of 16 steps"):
        fit(model, epochs=1)
    # A dataset shards rows by contiguous ranges: a mid-epoch position of 2
    # ranks is not one of 1 rank.
    pq.write_table(rows(), tmp_path / "part-0.parquet")
    model.resume_at(0, 3, world_size=2)
    with pytest.raises(ValueError, match="reached on 2 rank.*contiguous range of rows"):
        model.fit(rk.datasets.from_parquet(tmp_path), batch_size=64, verbose=0)
    # At an epoch's start it is the same position on any number of ranks.
    model.resume_at(1, 0, world_size=2)
    seen = Batches()
    model.fit(rk.datasets.from_parquet(tmp_path), batch_size=64, epochs=2, verbose=0,
              callbacks=[seen])
    assert seen.seen == [(1, b) for b in range(STEPS)]


def test_keras_backup_and_restore_under_torchrun_points_to_reckeras(monkeypatch, tmp_path):
    import dataclasses
    from reckeras import distributed
    two_ranks = dataclasses.replace(distributed.world(), size=2)
    monkeypatch.setattr(distributed, "world", lambda: two_ranks)
    with pytest.raises(ValueError, match=r"use rk\.callbacks\.BackupAndRestore\(backup_dir\)"):
        build().fit(rows(64), verbose=0,
                    callbacks=[keras.callbacks.BackupAndRestore(str(tmp_path))])


@pytest.mark.slow
def test_a_crash_between_checkpoint_and_record_resumes_from_the_backup_before(
        tmp_path, straight, monkeypatch):
    # The fit dies after the checkpoint of global step 10 is complete but
    # before backup.json names it: the record still names step 5's, which
    # is still there, and the resume starts from it.
    from reckeras import callbacks
    backup_dir = tmp_path / "backup"
    write, records = callbacks._write_atomically, []

    def crash_on_the_second_record(path, text):
        if records:
            raise RuntimeError("interrupted")
        records.append(text)
        write(path, text)

    monkeypatch.setattr(callbacks, "_write_atomically", crash_on_the_second_record)
    with pytest.raises(RuntimeError, match="interrupted"):
        fit(build(), [rk.callbacks.BackupAndRestore(backup_dir, save_freq=5)])
    monkeypatch.setattr(callbacks, "_write_atomically", write)
    assert sorted(os.listdir(backup_dir)) == ["backup.json", "ckpt-00000-0000005",
                                              "ckpt-00000-0000010"]
    seen = Batches()
    resumed = build(seed=7)
    with pytest.warns(UserWarning, match="metrics"):
        fit(resumed, [rk.callbacks.BackupAndRestore(backup_dir, save_freq=5), seen])
    assert seen.seen[0] == (0, 5)
    assert_same_model(straight[0], by_key(resumed))
