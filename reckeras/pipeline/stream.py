"""The epoch stream: a loop's batches, prepared ahead of its steps.

`fit`, `evaluate` and `predict` take their batches from an `EpochStream`.
Per batch, in order (see `prefetch.Pipeline` for how stages overlap):

1. read this rank's shard of the data (`data.batches`);
2. encode: validate, hash strings, numpy -> torch, read labels and weights
   (`batches.to_tensors`), then, on a CPU, pack the features once
   (`FeatureColumns.pack`: dense block and packed sparse batch);
3. on a GPU, `h2d` (`device_copy.DeviceCopy`): copy the encoded tensors
   and pack them there, on the copy stream;
4. when training a model with `host_cached` tables, `cache_prefetch`: load
   the batch's rows into the device caches;
5. with several ranks and stage threads, `sparse_dist`
   (`sparse_dist.SparseDist`): exchange the next batch's ids while a step
   runs.

Every stage works on the one packed batch, and what a stage plans for a layer
(its routes) travels with the batch (`PreparedBatch.routes`); the loops hand
the step `PreparedBatch.data`, a `StepData` that carries the batch, so the
step finds it there (`steps.forward`), with nothing stashed on the model. The
stream is capped at the steps every rank takes: the sparse-dist stage's
exchanges are collectives, so every rank must submit exactly the same batches.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Collection, Iterator
from typing import Any

import torch

from reckeras import _keras_compat, distributed
from reckeras.pipeline import device_copy
from reckeras.pipeline.batches import Targets, to_tensors
from reckeras.pipeline.prefetch import Pipeline
from reckeras.pipeline.sparse_dist import SparseDist


@dataclasses.dataclass
class PreparedBatch:
    """One batch as the stages leave it for the step.

    Args:
        rows: examples in the batch.
        inputs: `{input name: tensor}`, the model's encoded inputs.
        labels: float32 labels, or None.
        weights: float32 per-example loss weights, or None.
        packed: the FeatureColumns' output for `inputs` (`pack`), or None
            before the pack stage ran.
        routes: `{embedding layer: future of its RoutedBatch}` planned by the
            sparse-dist stage for this batch.
    """

    rows: int
    inputs: dict
    labels: torch.Tensor | None
    weights: torch.Tensor | None
    packed: tuple | None = None
    routes: dict = dataclasses.field(default_factory=dict)

    @property
    def data(self) -> StepData:
        """`(inputs, labels, weights)`, what Keras's steps take, carrying
        this batch (`StepData`)."""
        return StepData(self)

    def tensors(self) -> Iterator[torch.Tensor]:
        """Every tensor the batch holds (inputs, labels, weights, packed)."""
        yield from self.inputs.values()
        for tensor in (self.labels, self.weights):
            if tensor is not None:
                yield tensor
        if self.packed is not None:
            dense, sparse = self.packed
            yield dense
            if sparse is not None:
                yield from sparse.values()


class StepData(tuple):
    """`(inputs, labels, weights)`, what Keras's `train_step(data)` takes,
    carrying the `PreparedBatch` they come from in `prepared`.

    It is a plain tuple to Keras (`keras.utils.unpack_x_y_sample_weight`
    unpacks it), so a step a user overrides works unchanged; `rk.Model`'s
    own steps find the batch's packed FeatureColumns output and planned
    routes in `prepared` (`steps.forward`).

    Args:
        batch: the `PreparedBatch`.

    Example:

    ```python
    data = StepData(batch)
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    data.prepared is batch                 # True
    ```
    """

    prepared: PreparedBatch

    def __new__(cls, batch: PreparedBatch) -> StepData:
        data = super().__new__(cls, (batch.inputs, batch.labels, batch.weights))
        data.prepared = batch
        return data


class EpochStream:
    """The batches of one pass of a loop over its data.

    Args:
        columns: the model's `rk.layers.FeatureColumns`.
        fed_layers: the ShardedEmbedding layers that look up the columns'
            packed sparse batch itself, once per step (the stages may work on
            their ids ahead of the step).
        data: the data (`batches.as_data`).
        batch_size: examples per step on this rank.
        steps: the steps every rank takes (`agreed_steps`).
        targets: labels and weights to read.
        training: whether the steps train (the cache prefetch runs only then).
        shuffle: permute the rows (the same permutation on every rank).
        seed: seed of the permutation.
        pipeline: `True`, `False` or `"auto"` (see `pipeline_threads`).
        prefetch_depth: batches each stage may run ahead.
        skip: leave out the first `skip` of the `steps` batches (a resumed
            epoch's batches trained before its backup, `rk.Model.resume_at`):
            they are read and dropped before the first stage.
        unread: features the model ignores, whose columns the data may
            lack (`rk.Model.unread_features`).

    Example:

    ```python
    stream = EpochStream(columns, layers, data, 4096, steps, Targets("label"), True)
    with stream as batches:
        for batch in batches:
            model.train_step(batch.data)        # a StepData
    print(stream.stats())
    ```
    """

    def __init__(self, columns: Any, fed_layers: list, data: Any, batch_size: int, steps: int,
                 targets: Targets, training: bool, shuffle: bool = False, seed: int = 0,
                 pipeline: bool | str = "auto", prefetch_depth: int = 2, skip: int = 0,
                 unread: Collection[str] = ()):
        world = distributed.world()
        device = _keras_compat.keras_device()
        on_gpu = device.type == "cuda"

        def pack(batch):
            batch.packed = columns.pack(batch.inputs)
            return batch

        def encode(table):
            inputs, labels, weights = to_tensors(columns, table, targets, unread=unread)
            batch = PreparedBatch(table.num_rows, inputs, labels, weights)
            # On a GPU the features are packed by the h2d stage, on the device.
            return batch if on_gpu else pack(batch)

        stages = [("encode", encode)]
        if on_gpu:
            stages.append((device_copy.DeviceCopy.name, device_copy.DeviceCopy(device, pack)))
        cached = [layer.engine for layer in fed_layers
                  if layer.engine.has_host_cached] if training else []
        if cached:
            def cache_rows(item):
                # The same ids the step will look up: the transforms of the
                # sparse features depend on no trained weight.
                sparse = device_copy.wait_for_copy(item).packed[1]
                for engine in cached:
                    engine.prefetch(sparse["ids"], sparse["offsets"])
                return item

            stages.append(("cache_prefetch", cache_rows))
        self.threads = pipeline_threads(pipeline)
        source = itertools.islice(
            data.batches(batch_size, shuffle=shuffle, seed=seed, shard_index=world.rank,
                         num_shards=world.size), skip, None)
        self.pipeline = Pipeline(source, stages, depth=prefetch_depth, threads=self.threads)
        self.steps = steps - skip
        self.sparse_dist = SparseDist(fed_layers, training) \
            if self.threads and fed_layers and world.size > 1 else None

    def __enter__(self) -> Iterator[PreparedBatch]:
        # On a GPU, `ready` orders this thread's stream after each batch's copy.
        items = map(device_copy.ready,
                    itertools.islice(self.pipeline.__enter__(), self.steps))
        return self.sparse_dist.ahead(items) if self.sparse_dist else items

    def __exit__(self, kind, error, traceback):
        try:
            if self.sparse_dist:
                self.sparse_dist.__exit__(kind, error, traceback)
        finally:
            self.pipeline.close()
        return False

    def stats(self) -> dict:
        """Per stage: items, busy seconds, queue occupancy; the consumer's wait."""
        stats = self.pipeline.stats()
        if self.sparse_dist:
            stats[self.sparse_dist.name] = self.sparse_dist.stats()
        return stats


def pipeline_threads(pipeline: bool | str) -> bool:
    """Whether the stages of `fit(pipeline=...)` run in threads.

    `"auto"` uses threads when they have a core of their own: on a GPU, or
    when the process may use more cores than torch's intra-op threads of all
    ranks on this machine (on a CPU whose every core runs the step's math, a
    stage thread only slows the step; see `docs/pipeline.md`).

    Args:
        pipeline: `True`, `False` or `"auto"`.

    Returns:
        True for threads.
    """
    if isinstance(pipeline, bool):
        return pipeline
    if pipeline != "auto":
        raise ValueError(f"pipeline must be True, False or 'auto', got {pipeline!r}")
    if _keras_compat.keras_device().type == "cuda":
        return True                      # the step's math runs on the GPU
    # Under torchrun the ranks of this machine share its cores (torchrun
    # usually gives each rank one torch thread), so count all of their threads.
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return len(os.sched_getaffinity(0)) > torch.get_num_threads() * ranks_here


def agreed_steps(data: Any, batch_size: int, limit: int | None = None) -> int:
    """Steps every rank can take over `data` (collectives need one count).

    Args:
        data: the data (`batches.as_data`).
        batch_size: examples per step on each rank.
        limit: at most this many steps (None: no limit).

    Returns:
        The smallest count over the ranks.

    Raises:
        ValueError: data without a batch (on some rank), or without a length
            and no `limit`.
    """
    world = distributed.world()
    steps = data.num_batches(batch_size, shard_index=world.rank, num_shards=world.size)
    if steps is None:                 # a source of batches without an end or a length
        if limit is None:
            raise ValueError(f"the {getattr(data, 'kind', 'data')} has no length: pass "
                             f"steps_per_epoch to fit (validation_steps for its "
                             f"validation_data), or steps to evaluate and predict")
        steps = limit
    elif limit is not None:
        steps = min(steps, limit)
    if world.size > 1:
        count = torch.tensor(steps)
        with distributed.collective("agreeing on the number of steps"):
            torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.MIN)
        steps = int(count)
    if steps == 0 and limit != 0:
        name = getattr(data, "name", None) or getattr(data, "kind", None) or "the data"
        where = "on at least one rank" if world.size > 1 else "in this process"
        raise ValueError(f"{name} gives no batch {where}: it holds no rows (an empty "
                         f"file, table or filter?)")
    return steps


def add_epoch_stats(totals: dict, stream: EpochStream, steps: int, step_s: float,
                    examples: int, seconds: float) -> None:
    """Adds one epoch's figures to a model's `pipeline_stats`.

    Args:
        totals: the stats so far (updated in place).
        stream: the epoch's stream.
        steps: steps taken.
        step_s: seconds spent in the steps.
        examples: examples trained on.
        seconds: the epoch's wall time.
    """
    epoch = stream.stats()
    epoch["step"] = {"items": steps, "busy_s": round(step_s, 4)}
    epoch["examples"] = examples
    epoch["wall_s"] = round(seconds, 4)
    for name, value in epoch.items():
        if isinstance(value, dict):
            merged = totals.setdefault(name, {})
            for key, number in value.items():
                if key == "mean_queue_occupancy":   # average over epochs
                    count = totals.get("epochs", 0)
                    merged[key] = round((merged.get(key, 0) * count + number)
                                        / (count + 1), 3)
                else:
                    merged[key] = round(merged.get(key, 0) + number, 4)
        else:
            totals[name] = round(totals.get(name, 0) + value, 4)
    totals["epochs"] = totals.get("epochs", 0) + 1
    totals["threads"] = stream.threads
    totals["examples_per_s"] = round(totals["examples"] / max(totals["wall_s"], 1e-9), 1)
