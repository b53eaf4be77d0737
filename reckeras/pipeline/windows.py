"""Training over time windows with progressive validation.

`rk.Model.fit_windows(windows)` runs the daily loop of a team that trains
on logs as they land: for each window in order, it first evaluates the model
on that window (the model has not seen it: progressive validation), then
trains one pass over it. The loop is small on purpose: each window is one
`Model.evaluate` and one one-epoch `Model.fit`, so everything those do
(pipeline, ranks, non-finite guard, labels and weights) holds per window.

Callbacks see one epoch per window: `on_epoch_begin(i, {"window": name})`,
then the progressive evaluation's test hooks, the training's batch hooks,
and `on_epoch_end(i, logs)` with the training logs (`loss`, the metrics)
and the progressive ones (`progressive_loss`, `progressive_<metric>`). The
`History` holds one entry per window under those keys, and the windows'
names under `window`.

Aging out: when an embedding table sets
`rk.embedding.TableOptions(evict_idle_windows=k)`, every window ends, after
its training, with `ShardedEmbedding.end_window` on every embedding layer:
rows not trained in the last `k` windows are freed, and the logs and the
`History` add the window's `rows_added`, `rows_evicted` and `rows_kept`,
summed over the layers and the ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import torch
from tqdm.auto import tqdm

from reckeras import distributed
from reckeras.pipeline.batches import as_data
from reckeras.pipeline.loops import check_batch_size, check_verbose, prepare_to_train

PROGRESSIVE_PREFIX = "progressive_"
ROW_COUNTS = ("rows_added", "rows_evicted", "rows_kept")


class _TrainBatchHooks(keras.callbacks.Callback):
    """Passes a window's training batch hooks to the windows loop's callbacks.

    The window's `fit` calls its own train and epoch hooks; only the batch
    hooks reach the user's callbacks, whose epochs are the windows.
    """

    def __init__(self, callbacks: keras.callbacks.CallbackList):
        super().__init__()
        self._callbacks = callbacks

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self._callbacks.on_train_batch_begin(batch, logs)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self._callbacks.on_train_batch_end(batch, logs)


def window_name(window: Any, index: int) -> str:
    """The name a window goes by in the History and the logs.

    Args:
        window: a window: a `Dataset` from `Dataset.windows`, or any data
            `fit` takes.
        index: its position in the sequence.

    Returns:
        Its partition as a path, e.g. "dt=2026-12-01/hour=3", for a window
        of `Dataset.windows`; else the index as a string.

    Example:

    ```python
    from reckeras.pipeline.windows import window_name

    window_name(logs.windows("dt")[0], 0)   # "dt=2026-12-01"
    window_name(table, 4)                    # "4"
    ```
    """
    partition = getattr(window, "partition", None)
    if partition:
        return "/".join(f"{key}={value}" for key, value in partition.items())
    return str(index)


def _end_window(layers: list) -> dict[str, int]:
    """Ends the window on every embedding layer (aging rows out) and sums
    their row counts over the layers and the ranks."""
    counts = torch.zeros(len(ROW_COUNTS), dtype=torch.int64)
    for layer in layers:
        ended = layer.end_window()
        counts += torch.tensor([ended[key] for key in ROW_COUNTS])
    if distributed.world().size > 1:
        with distributed.collective("summing the window's embedding row counts"):
            torch.distributed.all_reduce(counts)
    return dict(zip(ROW_COUNTS, counts.tolist(), strict=True))


def fit_windows(model: keras.Model, windows: Sequence[Any], *, batch_size: int | None,
                verbose: int | str, callbacks: list | None, shuffle: bool,
                class_weight: dict | None, sample_weight: str | None,
                labels: str | dict | None, seed: int, evaluate_batch_size: int | None,
                pipeline: bool | str, prefetch_depth: int) -> keras.callbacks.History:
    """The loop of `rk.Model.fit_windows` (see its arguments there).

    Args:
        model: a compiled `rk.Model`.
        windows: the windows, in order, at least one.
        batch_size: examples per step on each rank (None: 4096).
        verbose: `"auto"` or 1 (progress bars and a line per window), 2 (a
            line per window) or 0.
        callbacks: Keras callbacks.
        shuffle: shuffle every window's batches.
        class_weight: as in `fit`, for the training.
        sample_weight: a column name, as in `fit`, for the training.
        labels: as in `fit`.
        seed: window i is shuffled with seed `seed + i`.
        evaluate_batch_size: batch size of the progressive evaluation.
        pipeline: as in `fit`.
        prefetch_depth: as in `fit`.

    Returns:
        The `History`: one entry per window (with `rows_added`,
        `rows_evicted` and `rows_kept` when a table ages out by windows).

    Raises:
        RuntimeError: the model is not compiled, or the ranks do not see the
            same windows.
        ValueError: no windows, or a `BackupAndRestore` callback.

    Example:

    ```python
    from reckeras.pipeline.windows import fit_windows

    history = fit_windows(model, days, batch_size=4096, verbose=0, callbacks=None,
                          shuffle=True, class_weight=None, sample_weight=None,
                          labels=None, seed=0, evaluate_batch_size=None,
                          pipeline="auto", prefetch_depth=2)
    ```
    """
    if not model.compiled:
        raise RuntimeError("compile() the model before fit_windows()")
    windows = list(windows)
    if not windows:
        raise ValueError("fit_windows() needs at least one window")
    if any(isinstance(c, keras.callbacks.BackupAndRestore) for c in callbacks or []):
        raise ValueError("fit_windows() does not resume with BackupAndRestore: save "
                         "with rk.callbacks.ModelCheckpoint, load_checkpoint, and "
                         "pass the windows not yet trained on")
    batch_size = check_batch_size(batch_size)
    verbose = check_verbose(verbose) if distributed.world().is_main else 0
    # The first window is evaluated before any fit: adapt and sync first.
    prepare_to_train(model, as_data(windows[0])[0], batch_size)
    names = [window_name(window, index) for index, window in enumerate(windows)]
    distributed.check_same_on_all_ranks("the windows of fit_windows", repr(names))
    history = keras.callbacks.History()
    callback_list = keras.callbacks.CallbackList(
        [*(callbacks or []), history], model=model, verbose=verbose,
        epochs=len(windows), steps=None)
    inner_verbose = 1 if verbose == 1 else 0
    layers = model.embedding_layers
    ages = any(layer.ages_by_windows for layer in layers)
    callback_list.on_train_begin()
    logs = {}
    for index, (window, name) in enumerate(zip(windows, names, strict=True)):
        callback_list.on_epoch_begin(index, {"window": name})
        progressive = model.evaluate(
            window, batch_size=evaluate_batch_size or batch_size, verbose=inner_verbose,
            callbacks=callback_list, return_dict=True, labels=labels,
            pipeline=pipeline, prefetch_depth=prefetch_depth)
        if ages:
            for layer in layers:
                layer.begin_window()
        trained = model.fit(
            window, batch_size=batch_size, epochs=1, verbose=inner_verbose,
            callbacks=[_TrainBatchHooks(callback_list)], shuffle=shuffle,
            class_weight=class_weight, sample_weight=sample_weight, labels=labels,
            seed=seed + index, pipeline=pipeline, prefetch_depth=prefetch_depth)
        logs = {key: values[-1] for key, values in trained.history.items()}
        logs.update({PROGRESSIVE_PREFIX + key: value
                     for key, value in progressive.items()})
        if ages:
            logs.update(_end_window(layers))
        callback_list.on_epoch_end(index, logs)
        if model.table_rate is not None:
            model.table_rate.follow()   # as the epoch's callbacks set the dense rate
        history.history.setdefault("window", []).append(name)
        if verbose:
            tqdm.write(f"Window {index + 1}/{len(windows)} {name}: " + "  ".join(
                f"{key}={value}" if isinstance(value, int) else f"{key}={value:.4f}"
                for key, value in logs.items()))
        if model.stop_training:
            break
    callback_list.on_train_end(logs)
    return history
