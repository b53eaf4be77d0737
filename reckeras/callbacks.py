"""Keras callbacks that know about reckeras's tables and ranks."""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import warnings

import keras
import numpy as np
import torch

from reckeras import distributed


class ModelCheckpoint(keras.callbacks.Callback):
    """Writes a reckeras checkpoint (tables included) at the end of epochs.

    Unlike `keras.callbacks.ModelCheckpoint`, it writes with
    `rk.Model.save_checkpoint`: every rank saves the rows it owns, the save
    is atomic, and the result loads on any number of ranks. With
    `full_every=k`, every k-th save (the first, the (k+1)-th, ...) is a full
    checkpoint and the others are deltas against the save before them
    (only the rows written since; see `docs/continuous.md`): loading the
    latest loads its chain back to the last full one.

    Args:
        filepath: checkpoint directory; may contain `{epoch}` and log names,
            e.g. `"ckpt/epoch{epoch:02d}-{val_auc:.4f}"`.
        monitor: log watched by `save_best_only`.
        mode: `"min"`, `"max"` or `"auto"` (max for names containing
            "auc" or "acc", else min).
        save_best_only: only save when `monitor` improves.
        full_every: write a full checkpoint every this many saves and
            deltas between them; None (default): every save is full.

    Raises:
        ValueError: an unknown `mode`, a `full_every` below 1, or
            `full_every` with a `filepath` without `{epoch}` (each delta
            needs a directory of its own, its base stays beside it).

    Example:

    ```python
    model.fit(train, epochs=3, validation_data=test, callbacks=[
        rk.callbacks.ModelCheckpoint("ckpt/epoch{epoch}", monitor="val_auc",
                                     save_best_only=True)])
    # A full checkpoint every 5 epochs, deltas in between.
    model.fit(train, epochs=20, callbacks=[
        rk.callbacks.ModelCheckpoint("ckpt/epoch{epoch}", full_every=5)])
    ```
    """

    def __init__(self, filepath: str | os.PathLike, monitor: str = "val_loss",
                 mode: str = "auto", save_best_only: bool = False,
                 full_every: int | None = None):
        super().__init__()
        if mode not in ("auto", "min", "max"):
            raise ValueError(f"mode must be 'auto', 'min' or 'max', got {mode!r}")
        if full_every is not None:
            if not (isinstance(full_every, int) and full_every >= 1):
                raise ValueError(f"full_every must be a positive int or None, "
                                 f"got {full_every!r}")
            if "{epoch" not in os.fspath(filepath):
                raise ValueError(f"full_every needs a filepath with {{epoch}} (each delta "
                                 f"is a directory of its own), got {os.fspath(filepath)!r}")
        if mode == "auto":
            mode = "max" if ("auc" in monitor or "acc" in monitor) else "min"
        self.filepath = os.fspath(filepath)
        self.monitor = monitor
        self.mode = mode
        self.save_best_only = save_best_only
        self.full_every = full_every
        self.best = -math.inf if mode == "max" else math.inf
        self.saved: list[str] = []             # the checkpoints written, in order

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        logs = logs or {}
        if self.save_best_only:
            if self.monitor not in logs:
                raise KeyError(f"ModelCheckpoint monitors {self.monitor!r}, which is "
                               f"not in the logs {sorted(logs)}")
            value = logs[self.monitor]
            better = value > self.best if self.mode == "max" else value < self.best
            if not better:
                return
            self.best = value
        path = self.filepath.format(epoch=epoch + 1, **logs)
        delta = self.full_every is not None and len(self.saved) % self.full_every != 0
        self.model.save_checkpoint(path, base=self.saved[-1] if delta else None)
        self.saved.append(path)


BACKUP_RECORD = "backup.json"
_BACKUP_FORMAT = 1
_CHECKPOINT_PREFIX = "ckpt-"


class BackupAndRestore(keras.callbacks.Callback):
    """Backs training up into sharded checkpoints and resumes from the last one.

    Keras's `BackupAndRestore` semantics, with reckeras checkpoints
    (`rk.Model.save_checkpoint`: atomic, every rank writes the rows it owns)
    and mid-epoch positions. When `fit` begins and `backup_dir` holds a
    backup, the model is restored from it (`load_checkpoint`, on any number
    of ranks) and `fit` resumes where the backup was written: at that epoch,
    the batches already trained on left out (`rk.Model.resume_at`), the data
    in the same order. When `fit` ends without an error, the backup is
    deleted (unless `delete_checkpoint=False`). Under
    `torchrun --max-restarts=K` a restarted job thus continues by itself
    after a rank dies, and ends with the weights and tables of a run never
    interrupted (see `docs/distributed.md`, "Elastic resume").

    A backup holds the dense weights, every table's rows with their sparse
    optimizer state, the Keras optimizer's state (its step count included),
    the layers' seed generators, every rank's torch, numpy and python random
    generators (Keras's dropout without a seed draws from torch's; they are
    restored when resuming on the same number of ranks), the position (epoch,
    step), and the epoch's metric state held in Keras variables (the loss,
    Keras metrics), summed over the ranks. Not restored: the state of
    `rk.metrics.AUC` and `GAUC` (they keep their examples outside Keras
    variables), so after a mid-epoch resume they cover the batches from the
    resume on (a warning names them); the row lifecycle's counters (tables
    with `admit_after` / eviction start counting again); anything a custom
    callback keeps. The shuffle order needs no state: epoch `e` is shuffled
    with `fit`'s `seed + e`.

    Files: `backup_dir/ckpt-<epoch>-<step>/` (a reckeras checkpoint) and
    `backup_dir/backup.json` (the position, the run's global batch size and
    number of ranks, the metric and random state, the checkpoint's name and id),
    replaced atomically after the checkpoint is complete; the checkpoint
    before is deleted only then, so a crash at any moment leaves a backup
    whose record and checkpoint agree.

    Args:
        backup_dir: directory of the backup, on a filesystem all ranks share.
        save_freq: `"epoch"`: back up at the end of every epoch (after its
            validation); an int N: after every N-th training step, counted
            from the first step of epoch 0 (a step due at the last batch of an
            epoch is backed up at that epoch's end instead).
        delete_checkpoint: delete the backup when `fit` ends without error.

    Raises:
        ValueError: `save_freq` neither `"epoch"` nor a positive int.

    Example:

    ```python
    # torchrun --nproc_per_node=8 --max-restarts=3 train.py
    model.fit(train, batch_size=4096, epochs=5, callbacks=[
        rk.callbacks.BackupAndRestore("/shared/backup", save_freq=500)])
    ```
    """

    def __init__(self, backup_dir: str | os.PathLike, save_freq: str | int = "epoch",
                 delete_checkpoint: bool = True):
        super().__init__()
        if save_freq != "epoch" and not (isinstance(save_freq, int)
                                         and not isinstance(save_freq, bool)
                                         and save_freq >= 1):
            raise ValueError(f"save_freq must be 'epoch' or a positive int (steps), "
                             f"got {save_freq!r}")
        self.backup_dir = os.fspath(backup_dir)
        self.save_freq = save_freq
        self.delete_checkpoint = delete_checkpoint
        # The restored metric state, added to the metrics once the resumed
        # epoch's first step has built them (Keras builds compiled metrics
        # on their first update): `(summed metric state, step)`.
        self._pending_metrics: tuple[dict, int] | None = None

    @property
    def _record_path(self):
        return os.path.join(self.backup_dir, BACKUP_RECORD)

    def on_train_begin(self, logs: dict | None = None) -> None:
        if "batch_size" not in self.params:
            raise ValueError("rk.callbacks.BackupAndRestore works with rk.Model.fit (its "
                             "fit gives callbacks the batch size); fit_windows resumes by "
                             "being given the windows not trained on yet")
        world = distributed.world()
        self._steps = self.params["steps"]
        self._global_batch = self.params["batch_size"] * world.size
        record = self._read_record()
        if record is None:
            return
        if record["steps"] != self._steps:
            raise ValueError(f"{self._record_path}: the backup was written by a fit whose "
                             f"epochs had {record['steps']} steps; this one's have "
                             f"{self._steps}: resume with the same data and global batch "
                             f"size ({record['global_batch_size']} examples per step over "
                             f"all ranks)")
        self.model.load_checkpoint(os.path.join(self.backup_dir, record["checkpoint"]))
        self.model.resume_at(record["epoch"], record["step"],
                             global_batch_size=record["global_batch_size"],
                             world_size=record["world_size"])
        if record["world_size"] == world.size:
            _set_rng_state(record["rng"][world.rank])
        elif world.is_main:
            warnings.warn(f"{self._record_path} was written on {record['world_size']} "
                          f"rank(s), this fit runs on {world.size}: the random generators "
                          f"(torch, numpy, python) are not restored, so dropout without a "
                          f"seed draws other masks than the run that wrote the backup",
                          stacklevel=2)
        if record["step"]:
            self._pending_metrics = record["metrics"], record["step"]

    def _read_record(self):
        """Rank 0's reading of the backup record, given to every rank (None:
        no backup). A damaged record raises on every rank, naming it."""
        world = distributed.world()
        found = None
        if world.is_main:
            try:
                found = self._parsed_record()
            except ValueError as error:
                found = error
        if world.size > 1:
            box = [found]
            with distributed.collective("sharing the backup record"):
                torch.distributed.broadcast_object_list(box, src=0)
            found = box[0]
        if isinstance(found, Exception):
            raise ValueError(str(found))
        return found

    def _parsed_record(self):
        try:
            with open(self._record_path) as f:
                record = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, json.JSONDecodeError) as error:
            raise ValueError(f"{self._record_path} is not a readable backup record "
                             f"({error}); delete {self.backup_dir} to start afresh") from None
        fields = ("format", "checkpoint", "checkpoint_id", "epoch", "step", "steps",
                  "global_batch_size", "world_size", "metrics", "rng")
        missing = [name for name in fields if name not in record]
        if missing or record["format"] != _BACKUP_FORMAT:
            raise ValueError(f"{self._record_path} is not a backup record of format "
                             f"{_BACKUP_FORMAT} (missing {missing}, format "
                             f"{record.get('format')!r})")
        index = os.path.join(self.backup_dir, record["checkpoint"], "index.json")
        try:
            with open(index) as f:
                saved_id = json.load(f).get("id")
        except (OSError, json.JSONDecodeError) as error:
            raise ValueError(f"{self._record_path} names checkpoint {record['checkpoint']!r}, "
                             f"whose {index} cannot be read ({error})") from None
        if saved_id != record["checkpoint_id"]:
            raise ValueError(f"{index} is checkpoint {saved_id}, not {record['checkpoint_id']} "
                             f"that {self._record_path} was written after: the backup "
                             f"directory was changed by something else")
        return record

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self._pending_metrics is not None:
            self._restore_metrics(*self._pending_metrics)
            self._pending_metrics = None
        if self.save_freq == "epoch" or batch + 1 == self._steps:
            return
        epoch = self._epoch
        if (epoch * self._steps + batch + 1) % self.save_freq == 0:
            self._back_up(epoch, batch + 1)

    def _restore_metrics(self, state, step):
        """Adds the backup's summed metric state on rank 0 (the other ranks'
        own sums join it when the epoch's metrics are reduced)."""
        variables = _metric_variables(self.model)
        paths = [v.path for v in variables]
        if paths != state["paths"]:
            raise ValueError(f"{self._record_path} holds the state of metric variables "
                             f"{state['paths']}, the model has {paths}: compile the "
                             f"metrics the backup was written with")
        if not distributed.world().is_main:
            return
        for variable, value in zip(variables, state["values"], strict=True):
            variable.assign(variable.numpy() + np.asarray(value, dtype=variable.dtype))
        lost = [m.name for m in _metric_leaves(self.model) if not m.variables]
        if lost:
            warnings.warn(f"resumed mid-epoch from {self._record_path}: the state of "
                          f"metrics {lost} is not in Keras variables and was not backed "
                          f"up; this epoch's {lost} cover its steps from {step + 1} on",
                          stacklevel=2)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._epoch = epoch

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        due = self.save_freq == "epoch" or (
            bool(self._steps) and ((epoch + 1) * self._steps) % self.save_freq == 0)
        if due:
            self._back_up(epoch + 1, 0)

    def _back_up(self, epoch, step):
        world = distributed.world()
        metrics = _summed_metric_state(self.model) if step else None
        rng = [_rng_state()]
        if world.size > 1:
            rng = [None] * world.size
            with distributed.collective("gathering the random generators for a backup"):
                torch.distributed.all_gather_object(rng, _rng_state())
        name = f"{_CHECKPOINT_PREFIX}{epoch:05d}-{step:07d}"
        self.model.save_checkpoint(os.path.join(self.backup_dir, name))
        if world.is_main:
            with open(os.path.join(self.backup_dir, name, "index.json")) as f:
                identity = json.load(f)["id"]
            record = {"format": _BACKUP_FORMAT, "checkpoint": name, "checkpoint_id": identity,
                      "epoch": epoch, "step": step, "steps": self._steps,
                      "global_batch_size": self._global_batch, "world_size": world.size,
                      "metrics": metrics, "rng": rng}
            _write_atomically(self._record_path, json.dumps(record))
            # Only now is the older checkpoint no longer the record's.
            for entry in os.listdir(self.backup_dir):
                if entry.startswith(_CHECKPOINT_PREFIX) and entry != name:
                    shutil.rmtree(os.path.join(self.backup_dir, entry), ignore_errors=True)

    def on_train_end(self, logs: dict | None = None) -> None:
        if not self.delete_checkpoint:
            return
        distributed.barrier("waiting for every rank before deleting the backup")
        if distributed.world().is_main and os.path.isdir(self.backup_dir):
            # The record first: a crash mid-deletion leaves no record
            # naming a half-deleted checkpoint.
            if os.path.exists(self._record_path):
                os.remove(self._record_path)
            for entry in os.listdir(self.backup_dir):
                if entry.startswith(_CHECKPOINT_PREFIX):
                    shutil.rmtree(os.path.join(self.backup_dir, entry), ignore_errors=True)
            if not os.listdir(self.backup_dir):
                os.rmdir(self.backup_dir)


def _metric_leaves(model):
    """The model's metrics, those compiled together listed one by one."""
    leaves = []
    for metric in model.metrics:
        leaves.extend(getattr(metric, "metrics", None) or [metric])
    return leaves


def _metric_variables(model):
    return [v for metric in model.metrics for v in metric.variables]


def _summed_metric_state(model):
    """`{"paths", "values"}` of the metric variables summed over the ranks
    (how `rk.Model` reduces them at the end of an epoch), as JSON lists;
    the model's own variables are left as they are."""
    variables = _metric_variables(model)
    values = [torch.as_tensor(np.array(v.numpy(), dtype=np.float64)) for v in variables]
    if distributed.world().size > 1 and values:
        with distributed.collective("summing the metric state for a backup"):
            for value in values:
                torch.distributed.all_reduce(value)
    return {"paths": [v.path for v in variables], "values": [v.tolist() for v in values]}


def _rng_state():
    """This process's random generators as JSON lists: torch's (dropout
    without a seed draws from it; CUDA's too on a GPU), numpy's and python's."""
    # numpy's global generator is what is backed up: legacy `np.random.*` draws from it.
    kind, keys, position, has_gauss, gauss = np.random.get_state()  # noqa: NPY002
    version, internal, python_gauss = random.getstate()
    state = {"torch": torch.get_rng_state().tolist(),
             "numpy": [kind, keys.tolist(), position, has_gauss, gauss],
             "python": [version, list(internal), python_gauss]}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state().tolist()
    return state


def _set_rng_state(state):
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    kind, keys, position, has_gauss, gauss = state["numpy"]
    state_of_numpy = (kind, np.array(keys, dtype=np.uint32), position, has_gauss, gauss)
    np.random.set_state(state_of_numpy)  # noqa: NPY002 - the global generator, as backed up
    version, internal, python_gauss = state["python"]
    random.setstate((version, tuple(internal), python_gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(torch.tensor(state["cuda"], dtype=torch.uint8))


def _write_atomically(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    directory = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


class TensorBoard(keras.callbacks.Callback):
    """Writes epoch (and optionally batch) logs as TensorBoard event files.

    Keras's own TensorBoard callback needs TensorFlow; this one writes with
    `torch.utils.tensorboard` (install the `tensorboard` package). Under
    torchrun only rank 0 writes, and the logs are already reduced over ranks.

    Args:
        log_dir: directory of the event files.
        update_freq: `"epoch"`, or an int N to also log every N batches.

    Example:

    ```python
    model.fit(train, epochs=3, callbacks=[rk.callbacks.TensorBoard("runs/dlrm")])
    ```
    """

    def __init__(self, log_dir: str | os.PathLike, update_freq: str | int = "epoch"):
        super().__init__()
        if update_freq != "epoch" and not (isinstance(update_freq, int)
                                           and not isinstance(update_freq, bool)
                                           and update_freq > 0):
            raise ValueError(f"update_freq must be 'epoch' or a positive int, "
                             f"got {update_freq!r}")
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as error:
            raise ImportError("rk.callbacks.TensorBoard needs the tensorboard package: "
                              "pip install tensorboard") from error
        self.log_dir = os.fspath(log_dir)
        self.update_freq = update_freq
        self._writer = SummaryWriter(self.log_dir) if distributed.world().is_main else None
        self._batches = 0

    def _write(self, logs, step, prefix):
        if self._writer is None:
            return
        for name, value in (logs or {}).items():
            self._writer.add_scalar(f"{prefix}{name}", float(np.asarray(value)), step)
        self._writer.flush()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self._batches += 1
        if isinstance(self.update_freq, int) and self._batches % self.update_freq == 0:
            self._write(logs, self._batches, "batch_")

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self._write(logs, epoch, "epoch_")

    def on_train_end(self, logs: dict | None = None) -> None:
        if self._writer is not None:
            self._writer.close()
