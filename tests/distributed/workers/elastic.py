"""Trains the common model 3 epochs with rk.callbacks.BackupAndRestore (a
backup every 3 steps); one rank may SIGKILL itself mid-epoch.

Usage: elastic.py <backup_dir> <out.npz> <events.log> <kill_rank> <kill_step>

Rank <kill_rank> kills itself before step <kill_step> of epoch 1, on the
first attempt only (TORCHELASTIC_RESTART_COUNT 0 or unset); -1: nobody
does. Every rank appends `<event> <rank> <attempt> <epoch> <step> <time>`
lines to events.log: `start` when the process starts, `kill` just before
the kill, `trained` after the first step it trains. Rank 0 writes the final
weights and tables (gathered by key) to out.npz.
"""

import os
import signal
import sys
import time

import common

import keras
import reckeras as rk
from reckeras import distributed

backup_dir, out_path, events = sys.argv[1:4]
kill_rank, kill_step = int(sys.argv[4]), int(sys.argv[5])
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
world = distributed.init(timeout_s=30)


def log(event, epoch, step):
    with open(events, "a") as f:
        f.write(f"{event} {world.rank} {attempt} {epoch} {step} {time.time():.3f}\n")


log("start", -1, -1)


class Events(keras.callbacks.Callback):
    """Logs the first trained step and kills this rank where it was told to."""

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if (world.rank, attempt, self.epoch, batch) == (kill_rank, 0, 1, kill_step):
            log("kill", self.epoch, batch)
            os.kill(os.getpid(), signal.SIGKILL)

    def on_train_batch_end(self, batch, logs=None):
        if not getattr(self, "logged", False):
            log("trained", self.epoch, batch)
            self.logged = True


model = common.model()
model.fit(common.data(), batch_size=common.GLOBAL_BATCH // world.size, epochs=3, seed=3,
          verbose=0, callbacks=[rk.callbacks.BackupAndRestore(backup_dir, save_freq=3),
                                Events()])
common.save_all(model, out_path)
