"""Keras callbacks that know about reckeras's tables and ranks."""

from __future__ import annotations

import math
import os

import keras
import numpy as np

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
        self.saved = []

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
        if update_freq != "epoch" and not (isinstance(update_freq, int) and update_freq > 0):
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
        if self.update_freq != "epoch" and self._batches % self.update_freq == 0:
            self._write(logs, self._batches, "batch_")

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self._write(logs, epoch, "epoch_")

    def on_train_end(self, logs: dict | None = None) -> None:
        if self._writer is not None:
            self._writer.close()
