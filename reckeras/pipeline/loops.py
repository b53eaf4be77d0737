"""`rk.Model`'s loops: `fit`, `evaluate` and `predict`, with their argument
checks, callbacks, progress bars and stats.

As in Keras's torch trainer, a loop checks its arguments, makes its callback
list, and calls the model's step on every batch of an epoch stream
(`stream.EpochStream`, Keras's `EpochIterator`): `model.train_step(data)`,
`test_step` or `predict_step`, where `data` is the batch's `StepData` (the
prepared batch travels with it to `steps.forward`). Before training,
`prepare_to_train` adapts the FeatureColumns, connects the engines, builds a
subclassed model and gives every rank rank 0's dense weights.

The small public functions here (`epoch_stream`, `prepare_to_train`,
`synced_metrics_result`, `returned_logs`) are also the seams of the
`*_on_batch` methods (`on_batch.py`).
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Any

import keras
import numpy as np
import torch
from tqdm.auto import tqdm

from reckeras import _allocator, _keras_compat, distributed
from reckeras.pipeline import guard, steps
from reckeras.pipeline import stream as streams
from reckeras.pipeline.batch_sources import end_epoch
from reckeras.pipeline.batches import Targets, as_data, check_class_weight
from reckeras.pipeline.functional import fed_layers
from reckeras.pipeline.resume import ResumePosition
from reckeras.pipeline.targets import model_targets


@dataclasses.dataclass
class LoopState:
    """What an `rk.Model`'s loops keep between calls (`model.loop_state`).

    Args:
        resume_position: where the next `fit` starts (`resume_at`), or None.
        weights_synced: whether every rank got rank 0's dense weights.
        epochs_fitted: epochs the model's `fit` calls completed (saved in
            and restored from checkpoints): an epoch without a `seed`
            shuffles with the next (see `fit`'s `seed`).
    """

    resume_position: ResumePosition | None = None
    weights_synced: bool = False
    epochs_fitted: int = 0


def check_batch_size(batch_size: int | None) -> int:
    """A loop's `batch_size`, checked (None: 4096).

    Args:
        batch_size: examples per step on each rank, or None.

    Returns:
        The batch size.

    Raises:
        ValueError: not a positive int.
    """
    if batch_size is None:
        return 4096
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    return batch_size


def check_verbose(verbose: int | str) -> int:
    """A loop's `verbose`, checked (`"auto"`: 1).

    Args:
        verbose: `"auto"`, 0, 1 or 2.

    Returns:
        0, 1 or 2.

    Raises:
        ValueError: any other value.
    """
    if verbose == "auto":
        return 1
    if verbose not in (0, 1, 2):
        raise ValueError(f"verbose must be 'auto', 0, 1 or 2, got {verbose!r}")
    return verbose


def epoch_stream(model: keras.Model, data: Any, batch_size: int, steps: int,
                 targets: Targets, training: bool, shuffle: bool = False, seed: int = 0,
                 pipeline: bool | str = "auto", prefetch_depth: int = 2,
                 skip: int = 0) -> streams.EpochStream:
    """The `EpochStream` of one pass of a loop of `model` over `data`.

    Args:
        model: the `rk.Model`.
        data: the data (`batches.as_data`).
        batch_size: examples per step on this rank.
        steps: the steps every rank takes (`stream.agreed_steps`).
        targets: labels and weights to read.
        training: whether the steps train.
        shuffle: permute the rows.
        seed: seed of the permutation.
        pipeline: `True`, `False` or `"auto"`.
        prefetch_depth: batches each stage may run ahead.
        skip: leave out the first `skip` batches (`resume_at`).

    Returns:
        The stream; each of its batches' `data` is what a step takes.

    Example:

    ```python
    with epoch_stream(model, data, 4096, steps, Targets(), False) as batches:
        for batch in batches:
            outputs = model.predict_step(batch.data)
    ```
    """
    return streams.EpochStream(model.feature_columns, fed_layers(model), data, batch_size,
                               steps, targets, training, shuffle=shuffle, seed=seed,
                               pipeline=pipeline, prefetch_depth=prefetch_depth, skip=skip,
                               unread=model.unread_features)


def prepare_to_train(model: keras.Model, data: Any, batch_size: int) -> None:
    """Readies `model` for training on `data`.

    Tunes the allocator for training (`rk.config`'s `malloc_tuning`), adapts
    the columns on `data` if they need it, checks the engines' configs
    across ranks, builds a subclassed model, and gives every rank rank 0's
    dense weights (once per model).

    Args:
        model: a compiled `rk.Model`.
        data: the data to train on (`batches.as_data`).
        batch_size: examples per step on each rank.
    """
    _allocator.tune_malloc()
    columns = model.feature_columns
    if columns.needs_adapt:
        columns.adapt(itertools.islice(data.batches(batch_size), 64))
    for layer in model.embedding_layers:
        layer.engine.connect()            # checks configs agree across ranks
    if not model.built:
        _build_on(model, data, batch_size)
    if distributed.world().size > 1 and not model.loop_state.weights_synced:
        with torch.no_grad(), distributed.collective("broadcasting dense weights"):
            for variable in model.variables:
                torch.distributed.broadcast(variable.value.data, src=0)
        model.loop_state.weights_synced = True


def _build_on(model, data, batch_size):
    """Builds a subclassed model (its weights exist once it has run): one
    forward pass, not training (no table row is created), on this rank's
    first batch of `data`."""
    count = streams.agreed_steps(data, batch_size, 1)
    with torch.no_grad(), epoch_stream(model, data, batch_size, count, Targets(), False,
                                       pipeline=False) as batches:
        for batch in batches:
            steps.forward(model, batch.inputs, False, batch)


def synced_metrics_result(model: keras.Model) -> dict[str, float]:
    """The model's metrics over all ranks' examples (exact AUC/GAUC; sums
    of the mean-style metrics' totals and counts).

    Under torchrun every rank must call it (it reduces across ranks).

    Args:
        model: the `rk.Model`.

    Returns:
        `{name: value}` as Python floats.
    """
    if distributed.world().size > 1:
        leaves: list[keras.metrics.Metric] = []
        for metric in model.metrics:
            leaves.extend(getattr(metric, "metrics", None) or [metric])
        for metric in leaves:
            if hasattr(metric, "sync_across_ranks"):
                metric.sync_across_ranks()
            elif metric.variables:
                # Mean-style metrics keep (total, count): sums reduce them.
                with distributed.collective("reducing metrics across ranks"):
                    for variable in metric.variables:
                        torch.distributed.all_reduce(variable.value.data)
    return {name: float(keras.ops.convert_to_numpy(value))
            for name, value in model.get_metrics_result().items()}


def metrics_or_step_logs(model: keras.Model, step_logs: Any) -> dict:
    """An epoch's logs by Keras's rule: the metrics' results over every
    rank's examples, unless the last step returned logs of other names (an
    overridden `train_step` or `test_step`), which are then the epoch's.

    Under torchrun every rank must call it (it reduces the metrics).

    Args:
        model: the `rk.Model`.
        step_logs: what the epoch's last step returned (None: no step).

    Returns:
        `{name: value}`, scalars as Python floats.
    """
    metrics = synced_metrics_result(model)
    if not isinstance(step_logs, dict) or set(step_logs) == set(metrics):
        return metrics
    return {name: _plain(value) for name, value in step_logs.items()}


def _plain(value: Any) -> Any:
    """A logged value as Keras's callbacks see it: a float for a scalar."""
    array = keras.ops.convert_to_numpy(value)
    return float(array) if np.ndim(array) == 0 else array


def returned_logs(model: keras.Model, logs: dict, return_dict: bool) -> Any:
    """What `evaluate` and the `*_on_batch` methods return, as Keras does.

    Args:
        model: the compiled model (its metrics give the list's order).
        logs: `{name: value}`.
        return_dict: return the dict itself.

    Returns:
        `logs`, or its values in Keras's order: a list, or a scalar when
        there is one.
    """
    if return_dict:
        return logs
    return _keras_compat.metrics_in_order(model, logs)


def _callback_list(model, callbacks, verbose, epochs, steps, add_history=False, **params):
    """The loop's `CallbackList` (fit hands its own to its validation);
    `params` join Keras's `verbose`, `epochs` and `steps`."""
    if isinstance(callbacks, keras.callbacks.CallbackList):
        return callbacks
    return keras.callbacks.CallbackList(callbacks, add_history=add_history,
                                        add_progbar=False, model=model, verbose=verbose,
                                        epochs=epochs, steps=steps, **params)


def _overrides(callback: keras.callbacks.Callback, method: str) -> bool:
    """Whether `callback` has its own `method` (a subclass's or, as
    `LambdaCallback` sets them, an instance's)."""
    bound = getattr(callback, method)
    return getattr(bound, "__func__", None) is not getattr(keras.callbacks.Callback, method)


def _batch_end_hook(callback_list: keras.callbacks.CallbackList, kind: str) -> Any:
    """`callback_list.on_<kind>_batch_end`, or a no-op when no callback has
    one of its own (for `"train"`, nor an `on_batch_end`, which Keras's
    default calls): Keras would still hand the no-op to a worker thread
    every step, a thread wake-up and a GIL hand-off each."""
    methods = [f"on_{kind}_batch_end"] + (["on_batch_end"] if kind == "train" else [])
    if any(_overrides(c, m) for c in callback_list.callbacks for m in methods):
        return getattr(callback_list, methods[0])
    return lambda step, logs: None


def fit(model: keras.Model, x: Any, y: Any, batch_size: int | None, epochs: int,
        verbose: int | str, callbacks: list | None, validation_split: float,
        validation_data: Any, shuffle: bool, class_weight: dict | None,
        sample_weight: Any, initial_epoch: int, steps_per_epoch: int | None,
        validation_steps: int | None, validation_batch_size: int | None,
        validation_freq: int, labels: str | dict | None, seed: int | None,
        pipeline: bool | str, prefetch_depth: int) -> keras.callbacks.History:
    """The loop of `rk.Model.fit` (see its arguments there).

    Args:
        model: the `rk.Model`.
        x: as in `fit`.
        y: as in `fit`.
        batch_size: as in `fit`.
        epochs: as in `fit`.
        verbose: as in `fit`.
        callbacks: as in `fit`.
        validation_split: as in `fit`.
        validation_data: as in `fit`.
        shuffle: as in `fit`.
        class_weight: as in `fit`.
        sample_weight: as in `fit`.
        initial_epoch: as in `fit`.
        steps_per_epoch: as in `fit`.
        validation_steps: as in `fit`.
        validation_batch_size: as in `fit`.
        validation_freq: as in `fit`.
        labels: as in `fit`.
        seed: as in `fit`.
        pipeline: as in `fit`.
        prefetch_depth: as in `fit`.

    Returns:
        The `keras.callbacks.History`.
    """
    if not model.compiled:
        raise RuntimeError("compile() the model before fit()")
    if distributed.world().size > 1 and any(
            isinstance(c, keras.callbacks.BackupAndRestore) for c in callbacks or []):
        raise ValueError("keras.callbacks.BackupAndRestore writes one weights file from "
                         "every rank, each holding only its own table rows: under "
                         "torchrun use rk.callbacks.BackupAndRestore(backup_dir), "
                         "which writes sharded reckeras checkpoints and resumes "
                         "mid-epoch on any number of ranks")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError(f"seed must be an int or None, got {seed!r}")
    batch_size = check_batch_size(batch_size)
    verbose = check_verbose(verbose)
    if not (isinstance(validation_freq, int) and validation_freq >= 1):
        raise ValueError(f"validation_freq must be an int >= 1, got {validation_freq!r}")
    class_weight = check_class_weight(class_weight)
    if class_weight is not None and sample_weight is not None:
        raise ValueError("You cannot use class_weight and sample_weight at the same "
                         "time (Keras's rule): fold the class weights into "
                         "sample_weight instead")
    data, weight = as_data(x, y, sample_weight)
    if class_weight is not None and weight is not None:
        raise ValueError("You cannot use class_weight and sample_weight at the same "
                         "time (Keras's rule): the batches carry sample weights")
    if validation_split:
        if not 0 < validation_split < 1:
            raise ValueError(f"validation_split must be in (0, 1), "
                             f"got {validation_split!r}")
        if validation_data is None:
            if not hasattr(data, "split"):
                raise ValueError("validation_split needs in-memory data (a dict of "
                                 "arrays or a pyarrow Table); for a dataset, pass "
                                 "validation_data")
            data, validation_data = data.split(validation_split)
            validation_data = (validation_data, None, weight)
    targets = model_targets(model, data, labels, weight, class_weight, "fit")
    prepare_to_train(model, data, batch_size)
    verbose = verbose if distributed.world().is_main else 0
    steps = streams.agreed_steps(data, batch_size, steps_per_epoch)
    callback_list = _callback_list(model, callbacks, verbose, epochs, steps,
                                   add_history=True, batch_size=batch_size)
    model.stop_training = False
    model.make_train_function()
    callback_list.on_train_begin()
    initial_epoch = _keras_compat.initial_epoch(model, initial_epoch)
    skip = 0
    position, model.loop_state.resume_position = model.loop_state.resume_position, None
    if position is not None:
        initial_epoch, skip = position.start(data, batch_size, steps)
    epoch_logs = {}
    model.pipeline_stats = {}
    for epoch in range(initial_epoch, epochs):
        model.reset_metrics()
        callback_list.on_epoch_begin(epoch)
        model.train()
        # Without a seed, as Keras reshuffles on every call, each epoch the
        # model trains takes the next seed: fit(epochs=1) called n times
        # shuffles as fit(epochs=n), and so does a fit resumed from a
        # checkpoint (which keeps the count) or from its epoch.
        epoch_seed = seed + epoch if seed is not None else \
            max(model.loop_state.epochs_fitted, epoch)
        step_logs = _fit_epoch(model, epoch, epochs, data, batch_size, steps, targets,
                               shuffle, epoch_seed, pipeline, prefetch_depth, callback_list,
                               verbose, skip=skip if epoch == initial_epoch else 0)
        end_epoch(data)
        model.loop_state.epochs_fitted += 1
        epoch_logs = metrics_or_step_logs(model, step_logs)
        model.eval()
        if validation_data is not None and (epoch + 1) % validation_freq == 0:
            val_x, val_y, val_weight = keras.utils.unpack_x_y_sample_weight(
                validation_data)
            val_logs = model.evaluate(
                val_x, val_y, batch_size=validation_batch_size or batch_size,
                verbose=0, sample_weight=val_weight, steps=validation_steps,
                callbacks=callback_list, return_dict=True,
                labels=labels if val_y is None else None, pipeline=pipeline,
                prefetch_depth=prefetch_depth)
            epoch_logs.update({f"val_{k}": v for k, v in val_logs.items()})
        callback_list.on_epoch_end(epoch, epoch_logs)
        if model.table_rate is not None:
            model.table_rate.follow()   # as the epoch's callbacks set the dense rate
        if verbose:
            tqdm.write(f"Epoch {epoch + 1}/{epochs}: " + "  ".join(
                f"{k}={v:.4f}" for k, v in epoch_logs.items()))
        if model.stop_training:
            break
    callback_list.on_train_end(epoch_logs)
    return model.history


def _fit_epoch(model, epoch, epochs, data, batch_size, steps, targets, shuffle, seed,
               pipeline, prefetch_depth, callback_list, verbose, skip=0):
    """One epoch of `fit`, shuffled with `seed`; its first `skip` batches are
    left out (`resume_at`). Returns the last step's logs (None when no step
    ran)."""
    batch_end = _batch_end_hook(callback_list, "train")
    bar = tqdm(total=steps, initial=skip, desc=f"Epoch {epoch + 1}/{epochs}",
               unit="step", disable=verbose != 1, leave=True)
    examples, taken, started, step_s = 0, 0, time.perf_counter(), 0.0
    logs = None
    stream = epoch_stream(model, data, batch_size, steps, targets, True, shuffle,
                          seed, pipeline, prefetch_depth, skip=skip)
    with stream as batches:
        for step, batch in enumerate(batches, start=skip):
            callback_list.on_train_batch_begin(step)
            step_started = time.perf_counter()
            try:
                logs = model.train_step(batch.data)
            except guard.NonFiniteStepError as error:
                raise guard.NonFiniteStepError(
                    f"training step {step + 1} of epoch {epoch + 1}: {error}") from None
            step_s += time.perf_counter() - step_started
            batch_end(step, logs)
            examples += batch.rows
            taken += 1
            bar.update(1)
            if step % 10 == 0 or step == steps - 1:
                rate = examples / (time.perf_counter() - started)
                bar.set_postfix(loss=f"{float(logs['loss']):.4f}", ex_s=f"{rate:,.0f}")
            if model.stop_training:
                break
    bar.close()
    streams.add_epoch_stats(model.pipeline_stats, stream, taken, step_s, examples,
                            time.perf_counter() - started)
    caches = {layer.name: [t["cache"] for t in layer.engine.stats()["tables"]
                           if "cache" in t] for layer in model.embedding_layers}
    caches = {name: tables for name, tables in caches.items() if tables}
    if caches:                  # cumulative since the caches were configured
        model.pipeline_stats["embedding_cache"] = caches
    return logs


def evaluate(model: keras.Model, x: Any, y: Any, batch_size: int | None,
             verbose: int | str, sample_weight: Any, steps: int | None, callbacks: Any,
             return_dict: bool, labels: str | dict | None, pipeline: bool | str,
             prefetch_depth: int) -> Any:
    """The loop of `rk.Model.evaluate` (see its arguments there).

    Args:
        model: the `rk.Model`.
        x: as in `evaluate`.
        y: as in `evaluate`.
        batch_size: as in `evaluate`.
        verbose: as in `evaluate`.
        sample_weight: as in `evaluate`.
        steps: as in `evaluate`.
        callbacks: as in `evaluate`.
        return_dict: as in `evaluate`.
        labels: as in `evaluate`.
        pipeline: as in `evaluate`.
        prefetch_depth: as in `evaluate`.

    Returns:
        The loss and metric values (`returned_logs`).
    """
    if isinstance(x, tuple) and y is None and sample_weight is None:
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(x)
    batch_size = check_batch_size(batch_size)
    verbose = check_verbose(verbose) if distributed.world().is_main else 0
    data, weight = as_data(x, y, sample_weight)
    targets = model_targets(model, data, labels, weight, None, "evaluate")
    total = streams.agreed_steps(data, batch_size, steps)
    callback_list = _callback_list(model, callbacks, verbose, 1, total)
    model.reset_metrics()
    batch_end = _batch_end_hook(callback_list, "test")
    callback_list.on_test_begin()
    stream = epoch_stream(model, data, batch_size, total, targets, False,
                          pipeline=pipeline, prefetch_depth=prefetch_depth)
    logs = None
    with torch.no_grad(), stream as batches:
        for step, batch in enumerate(tqdm(batches, total=total, desc="Evaluate",
                                          unit="step", disable=verbose != 1)):
            callback_list.on_test_batch_begin(step)
            logs = model.test_step(batch.data)
            batch_end(step, logs)
    logs = metrics_or_step_logs(model, logs)
    end_epoch(data)
    callback_list.on_test_end(logs)
    return returned_logs(model, logs, return_dict)


def predict(model: keras.Model, x: Any, batch_size: int | None, verbose: int | str,
            steps: int | None, callbacks: Any, pipeline: bool | str,
            prefetch_depth: int) -> Any:
    """The loop of `rk.Model.predict` (see its arguments there).

    Args:
        model: the `rk.Model`.
        x: as in `predict`.
        batch_size: as in `predict`.
        verbose: as in `predict`.
        steps: as in `predict`.
        callbacks: as in `predict`.
        pipeline: as in `predict`.
        prefetch_depth: as in `predict`.

    Returns:
        The outputs of every example, concatenated.
    """
    batch_size = check_batch_size(batch_size)
    verbose = check_verbose(verbose) if distributed.world().is_main else 0
    data, _ = as_data(x)
    total = streams.agreed_steps(data, batch_size, steps)
    callback_list = _callback_list(model, callbacks, verbose, 1, total)
    batch_end = _batch_end_hook(callback_list, "predict")
    callback_list.on_predict_begin()
    outputs = []
    stream = epoch_stream(model, data, batch_size, total, Targets(), False,
                          pipeline=pipeline, prefetch_depth=prefetch_depth)
    with torch.no_grad(), stream as batches:
        for step, batch in enumerate(tqdm(batches, total=total, desc="Predict",
                                          unit="step", disable=verbose != 1)):
            callback_list.on_predict_batch_begin(step)
            batch_outputs = keras.tree.map_structure(
                keras.ops.convert_to_numpy, model.predict_step(batch.data))
            outputs.append(batch_outputs)
            batch_end(step, {"outputs": batch_outputs})
    end_epoch(data)
    callback_list.on_predict_end()
    if not outputs:
        raise ValueError("predict() received no data")
    return keras.tree.map_structure_up_to(
        outputs[0], lambda *parts: np.concatenate(parts), *outputs)

