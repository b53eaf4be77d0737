"""rk.Model: a keras.Model whose fit/evaluate/predict read reckeras data."""

import itertools
import os
import time

import keras
import numpy as np
import torch
from keras.src.backend.common import global_state
from keras.src.backend.torch.core import get_device, to_torch_dtype
from keras.src.models.functional import operation_fn as functional_operation
from keras.src.models.functional import unpack_singleton
from keras.src.saving import serialization_lib
from keras.src.trainers.data_adapters import data_adapter_utils
from tqdm.auto import tqdm

from reckeras import distributed
from reckeras import optimizers as sparse_optimizers
from reckeras.embedding import checkpoint
from reckeras.layers.feature_columns import FeatureColumns
from reckeras.layers.sharded_embedding import ShardedEmbedding
from reckeras.metrics import GAUC
from reckeras.pipeline.batches import as_data, to_tensors
from reckeras.pipeline import device_copy
from reckeras.pipeline.device_copy import DeviceCopy
from reckeras.pipeline.prefetch import Pipeline
from reckeras.pipeline.sparse_dist import SparseDist


@keras.saving.register_keras_serializable(package="reckeras")
class Model(keras.Model):
    """A Keras functional model over ``rk.layers.FeatureColumns`` inputs.

    Built like ``keras.Model(inputs, outputs)``. Its ``fit``, ``evaluate`` and
    ``predict`` take reckeras datasets (``rk.datasets.load(...)``), pyarrow
    tables or dicts of arrays; every batch is validated and encoded by the
    model's FeatureColumns (a bad batch raises, naming the feature, before any
    weight or table row changes). Embedding tables are trained by the
    ``embedding_optimizer`` given to ``compile``, inside the backward pass;
    the dense weights by Keras's ``optimizer``.

    Example:
        >>> model = rk.Model(inputs, out)
        >>> model.compile(optimizer="adam", loss="binary_crossentropy",
        ...               embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.05),
        ...               metrics=[rk.metrics.AUC()])
        >>> model.fit(rk.datasets.load("criteo_synth"), batch_size=4096)
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Keras rebuilds the functional model's input spec (one InputSpec per
        # input) on every call; with hundreds of feature inputs that showed in
        # the step time. The graph is fixed, so the spec is built once.
        self.input_spec = self.input_spec
        self._declared_inputs = _declared_inputs(self._inputs_struct)

    def _inputs_as_declared(self, inputs):
        """The flat input list when ``inputs`` is a dict of exactly the input
        names holding torch tensors of the declared dtypes and shapes on the
        Keras device (what fit, evaluate and predict feed), else None.

        Keras converts, re-ranks and checks every input through pytree walks;
        with hundreds of feature inputs that was a fifth of a training step.
        Inputs that need any of it take Keras's own path.
        """
        declared = self._declared_inputs
        if declared is None or not isinstance(inputs, dict) \
                or inputs.keys() != self._inputs_struct.keys():
            return None
        flat = [inputs[key] for key in declared.keys]
        device = torch.device(get_device()).type
        try:
            signature = [(x.dtype, x.dim(), x.device.type) for x in flat]
        except AttributeError:               # not torch tensors
            return None
        if signature != declared.signature(device) \
                or any(flat[i].shape[axis] != size for i, axis, size in declared.fixed_sizes):
            return None
        return flat

    def _standardize_inputs(self, inputs):
        flat = self._inputs_as_declared(inputs)
        return flat if flat is not None else super()._standardize_inputs(inputs)

    def _assert_input_compatibility(self, *args):
        if args and self._inputs_as_declared(args[0]) is not None:
            return
        super()._assert_input_compatibility(*args)

    def _maybe_warn_inputs_struct_mismatch(self, inputs, raise_exception=False):
        # The common case, a dict with exactly the model's input names, is
        # told apart in one set comparison instead of a pytree walk over every
        # input; anything else gets Keras's own check and message.
        if isinstance(inputs, dict) and isinstance(self._inputs_struct, dict) \
                and inputs.keys() == self._inputs_struct.keys() \
                and not any(isinstance(v, (dict, list, tuple)) for v in inputs.values()):
            return
        super()._maybe_warn_inputs_struct_mismatch(inputs, raise_exception)

    def _forward(self, inputs, training):
        """``self(inputs, training=training)``, without Keras's per-call work
        on inputs that are already as declared (what the loops feed).

        ``Layer.__call__`` walks the whole input structure several times
        (conversion, masks, symbolic checks); with hundreds of feature inputs
        that cost ~4 ms of a ~45 ms step, twice: once for the model and once
        for its FeatureColumns layer, which receive the same dict. Here the
        model opens the call context itself (clearing the last call's losses
        and passing ``training`` on, as ``__call__`` does) and runs its graph,
        calling the built FeatureColumns layer's ``call`` directly; every
        other layer is called as usual.
        """
        flat = self._inputs_as_declared(inputs)
        columns = self.feature_columns
        if flat is None or not columns.built or \
                global_state.get_global_attribute("current_call_ctx") is not None:
            return self(inputs, training=training)
        context = self._get_call_context()     # the model is the entry layer
        context.set_value("training", training)

        def operation(op):
            return op.call if op is columns else \
                functional_operation(op, training=training)

        try:
            outputs = self._run_through_graph(flat, operation_fn=operation)
        finally:
            self._maybe_reset_call_context()
        return unpack_singleton(outputs)

    # ---- structure -------------------------------------------------------------

    def _layers_of(self, kind):
        # A functional model's layers are fixed once it is built: walk them once.
        if not hasattr(self, "_layers_by_kind"):
            self._layers_by_kind = {}
        if kind not in self._layers_by_kind:
            self._layers_by_kind[kind] = [
                layer for layer in self._flatten_layers(include_self=False)
                if isinstance(layer, kind)]
        return self._layers_by_kind[kind]

    @property
    def feature_columns(self):
        """The model's FeatureColumns layer."""
        found = self._layers_of(FeatureColumns)
        if len(found) != 1:
            raise ValueError(f"rk.Model needs exactly one FeatureColumns layer, "
                             f"found {len(found)}")
        return found[0]

    @property
    def embedding_layers(self):
        return list(self._layers_of(ShardedEmbedding))

    # ---- compile -----------------------------------------------------------------

    def compile(self, optimizer="rmsprop", loss=None, embedding_optimizer=None,
                metrics=None, **kwargs):
        """Configures training.

        Args:
            optimizer: Keras optimizer of the dense weights.
            loss: Keras loss.
            embedding_optimizer: a ``rk.optimizers`` sparse optimizer (or its
                name) for the embedding tables. Required when the model has a
                ShardedEmbedding layer.
            metrics: Keras metrics; ``rk.metrics.GAUC`` also receives the
                group ids of every example from the model's inputs.
            **kwargs: other ``keras.Model.compile`` arguments.
        """
        metrics = list(metrics or [])
        group_metrics = [m for m in metrics if isinstance(m, GAUC)]
        super().compile(optimizer=optimizer, loss=loss,
                        metrics=[m for m in metrics if not isinstance(m, GAUC)] or None,
                        **kwargs)
        self._group_metrics = group_metrics
        if embedding_optimizer is None and self.embedding_layers:
            raise ValueError("the model has ShardedEmbedding tables: pass "
                             "embedding_optimizer=rk.optimizers.RowWiseAdagrad(...) "
                             "(or another rk.optimizers optimizer) to compile()")
        self.embedding_optimizer = None if embedding_optimizer is None else \
            sparse_optimizers.get(embedding_optimizer)
        for layer in self.embedding_layers:
            layer.engine.set_optimizer(self.embedding_optimizer)

    def get_compile_config(self):
        config = super().get_compile_config()
        if config and self.embedding_optimizer is not None:
            config["embedding_optimizer"] = sparse_optimizers.serialize(
                self.embedding_optimizer)
        if config and self._group_metrics:
            config["group_metrics"] = [m.get_config() for m in self._group_metrics]
        return config

    def compile_from_config(self, config):
        embedding_optimizer = config.pop("embedding_optimizer", None)
        group_metrics = [GAUC(**c) for c in config.pop("group_metrics", [])]
        config = serialization_lib.deserialize_keras_object(config)
        config["metrics"] = list(config.get("metrics") or []) + group_metrics
        self.compile(embedding_optimizer=embedding_optimizer, **config)
        if self.built:
            self.optimizer.build(self.trainable_variables)

    def embedding_stats(self):
        """Rows, memory and requests of every embedding table on every rank.

        Under torchrun every rank must call it (it gathers across ranks).

        Returns:
            ``{layer name: {"per_rank": [stats of rank 0, ...],
            "rows_imbalance": max/mean, "requests_imbalance": max/mean}}``
            where each rank's stats hold ``requests`` and, per physical table,
            ``dim``, ``rows`` and ``bytes`` (plus ``cache``, the device
            cache's hit rates and traffic, for ``host_cached`` tables; see
            ``docs/caching.md``).
        """
        from reckeras.embedding.sharding import imbalance
        world = distributed.world()
        result = {}
        for layer in self.embedding_layers:
            per_rank = [layer.engine.stats()]
            if world.size > 1:
                per_rank = [None] * world.size
                with distributed.collective("gathering embedding stats"):
                    torch.distributed.all_gather_object(per_rank, layer.engine.stats())
            rows = [sum(t["rows"] for t in s["tables"]) for s in per_rank]
            result[layer.name] = {
                "per_rank": per_rank, "rows_imbalance": imbalance(rows),
                "requests_imbalance": imbalance([s["requests"] for s in per_rank])}
        return result

    # ---- checkpoints -------------------------------------------------------------

    def save_checkpoint(self, path):
        """Saves dense weights, tables and optimizer state, from every rank.

        Atomic (a crash leaves the previous checkpoint loadable) and
        re-shardable: ``load_checkpoint`` works on any number of ranks. See
        ``reckeras.embedding.checkpoint``. Every rank must call it.

        Args:
            path: checkpoint directory on a filesystem all ranks share.

        Example:
            >>> model.save_checkpoint("ckpt/epoch3")
        """
        checkpoint.save_checkpoint(self, path)

    def load_checkpoint(self, path):
        """Restores a checkpoint saved by ``save_checkpoint`` on any world size.

        Args:
            path: checkpoint directory.

        Example:
            >>> model.load_checkpoint("ckpt/epoch3")      # on any number of ranks
            >>> model.fit(train, epochs=5, initial_epoch=3)
        """
        checkpoint.load_checkpoint(self, path)

    # ---- steps ---------------------------------------------------------------------

    def train_step(self, data):
        # Keras's torch train_step skips backward when there is no trainable
        # Keras weight; here backward also trains the tables, so it always runs.
        x, y, sample_weight = data_adapter_utils.unpack_x_y_sample_weight(data)
        for layer in self.embedding_layers:
            layer.engine.release_pins()       # left by a step that failed mid-way
        y_pred = self._forward(x, training=True)
        self.zero_grad()
        loss = self._compute_loss(x=x, y=y, y_pred=y_pred,
                                  sample_weight=sample_weight, training=True)
        self._loss_tracker.update_state(loss, sample_weight=y.shape[0])
        loss = self.optimizer.scale_loss(loss)
        if loss.requires_grad:
            loss.backward()
        trainable = self.trainable_weights[:]
        if trainable:
            gradients = [v.value.grad for v in trainable]
            with torch.no_grad():
                # Each rank's loss is a mean over its own examples: averaging
                # the gradients gives the gradient of the global mean.
                distributed.all_reduce_mean_([g for g in gradients if g is not None])
                self.optimizer.apply(gradients, trainable)
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def test_step(self, data):
        x, y, sample_weight = data_adapter_utils.unpack_x_y_sample_weight(data)
        y_pred = self._forward(x, training=False)
        loss = self._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,
                                  training=False)
        self._loss_tracker.update_state(loss, sample_weight=y.shape[0])
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        for metric in self._group_metrics:
            metric.update_state(y, y_pred, sample_weight, groups=x[metric.group])
        return super().compute_metrics(x, y, y_pred, sample_weight)

    def _synced_metrics_result(self, logs):
        """Metrics over all ranks' examples (exact AUC/GAUC; summed means)."""
        if distributed.world().size > 1:
            leaves = []
            for metric in self.metrics:
                leaves.extend(getattr(metric, "metrics", None) or [metric])
            for metric in leaves:
                if hasattr(metric, "sync_across_ranks"):
                    metric.sync_across_ranks()
                elif metric.variables:
                    # Mean-style metrics keep (total, count): sums reduce them.
                    with distributed.collective("reducing metrics across ranks"):
                        for variable in metric.variables:
                            torch.distributed.all_reduce(variable.value.data)
        return _python_logs(self._get_metrics_result_or_logs(logs))

    # ---- loops -----------------------------------------------------------------------

    def _batches(self, data, batch_size, with_label, steps, shuffle=False, seed=0,
                 sample_weight=None, pipeline="auto", prefetch_depth=2, training=False):
        """The ``_Batches`` stream of ``(rows, (inputs, labels, weights))``.

        Stages (see ``prefetch.Pipeline``): read this rank's shard, then
        encode (validate, hash strings, numpy -> torch), then, when training
        a model with ``host_cached`` tables, load the batch's rows into the
        device caches, then on a GPU copy the batch to it (``h2d``, see
        ``device_copy``). With ``pipeline`` (see ``_pipeline_threads``) they run
        in background threads, ``prefetch_depth`` batches ahead, and with
        several ranks the sparse-dist stage exchanges the next batch's ids
        while a step runs (``sparse_dist.SparseDist``).
        """
        columns = self.feature_columns
        world = distributed.world()
        source = data.batches(batch_size, shuffle=shuffle, seed=seed,
                              shard_index=world.rank, num_shards=world.size)
        device = torch.device(get_device())
        on_gpu = device.type == "cuda"

        def encode(batch):
            # On a GPU the tensors stay on the host until the h2d stage.
            return batch.num_rows, to_tensors(columns, batch, data.label, with_label,
                                              sample_weight, "cpu" if on_gpu else device)

        stages = [("encode", encode)]
        fed = self._engines_fed_by_columns()
        cached = [engine for engine in fed if any(engine.caches)] if training else []
        if cached:
            def cache_rows(item):
                # The same ids the step will look up: the transforms of the
                # sparse features depend on no trained weight.
                sparse = columns.plan.packed_sparse(item[1][0])
                for engine in cached:
                    engine.prefetch(sparse["ids"], sparse["offsets"])
                return item

            stages.append(("cache_prefetch", cache_rows))
        if on_gpu:
            stages.append((DeviceCopy.name, DeviceCopy(device)))
        threads = _pipeline_threads(pipeline)
        sparse_dist = SparseDist(fed, columns.plan.packed_sparse, training) \
            if threads and fed and world.size > 1 else None
        return _Batches(Pipeline(source, stages, depth=prefetch_depth, threads=threads),
                        steps, sparse_dist)

    def _engines_fed_by_columns(self):
        """Engines of the layers that look up the FeatureColumns' packed
        batch itself, once per step: the stages can work on their ids ahead."""
        slots = [s.name for s in self.feature_columns.plan.slots]
        return [layer.engine for layer in self.embedding_layers
                if [s.name for s in layer.packing.slots] == slots
                and len(layer._inbound_nodes) == 1]

    def _num_steps(self, data, batch_size, limit=None):
        """Steps every rank can take (collectives need the same count)."""
        world = distributed.world()
        steps = data.num_batches(batch_size, shard_index=world.rank,
                                 num_shards=world.size)
        if limit is not None:
            steps = min(steps, limit)
        if world.size > 1:
            count = torch.tensor(steps)
            with distributed.collective("agreeing on the number of steps"):
                torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.MIN)
            steps = int(count)
        return steps

    def _sync_dense_weights(self):
        """Gives every rank rank 0's dense weights (once, before training)."""
        if distributed.world().size > 1 and not getattr(self, "_weights_synced", False):
            with torch.no_grad(), distributed.collective("broadcasting dense weights"):
                for variable in self.variables:
                    torch.distributed.broadcast(variable.value.data, src=0)
            self._weights_synced = True

    def _adapt_if_needed(self, data, batch_size):
        columns = self.feature_columns
        if columns.needs_adapt:
            columns.adapt(b for _, b in zip(range(64), data.batches(batch_size)))

    def fit(self, x=None, y=None, batch_size=4096, epochs=1, verbose=1, callbacks=None,
            validation_data=None, shuffle=True, seed=0, steps_per_epoch=None,
            initial_epoch=0, sample_weight=None, pipeline="auto", prefetch_depth=2):
        """Trains the model.

        Args:
            x: a reckeras dataset, a pyarrow Table or a dict of arrays.
            y: labels when ``x`` is a dict/Table without a ``label`` column.
            batch_size: examples per step.
            epochs: passes over the data.
            verbose: 0 silent, 1 a tqdm progress bar per epoch.
            callbacks: Keras callbacks (History is always added).
            validation_data: data evaluated after every epoch (``val_`` logs).
            shuffle: reshuffle the batch order every epoch.
            seed: seed of the shuffle (epoch ``e`` uses ``seed + e``).
            steps_per_epoch: stop an epoch after this many steps.
            initial_epoch: epoch to start at (to resume from a checkpoint:
                epoch ``e`` always uses shuffle seed ``seed + e``).
            sample_weight: name of a column of per-example loss weights.
            pipeline: ``True`` prepares batches in background threads,
                ``False`` inline before each step; the result is the same
                either way. ``"auto"`` uses threads when they have a core of
                their own: on a GPU, or when the process may use more cores
                than torch's intra-op threads of all ranks on this machine
                (on a CPU whose every core runs the step's math, a stage
                thread only slows the step; see ``docs/pipeline.md``).
            prefetch_depth: batches each pipeline stage may run ahead.

        Returns:
            The ``keras.callbacks.History``.
        """
        if not self.compiled:
            raise RuntimeError("compile() the model before fit()")
        data = as_data(x, y)
        self._adapt_if_needed(data, batch_size)
        for layer in self.embedding_layers:
            layer.engine.connect()            # checks configs agree across ranks
        self._sync_dense_weights()
        verbose = verbose if distributed.world().is_main else 0
        steps = self._num_steps(data, batch_size, steps_per_epoch)
        callback_list = keras.callbacks.CallbackList(
            callbacks, add_history=True, add_progbar=False, model=self,
            verbose=verbose, epochs=epochs, steps=steps)
        self.stop_training = False
        self.make_train_function()
        callback_list.on_train_begin()
        logs = {}
        epoch_logs = {}
        self.pipeline_stats = {}
        for epoch in range(initial_epoch, epochs):
            self.reset_metrics()
            callback_list.on_epoch_begin(epoch)
            bar = tqdm(total=steps, desc=f"Epoch {epoch + 1}/{epochs}", unit="step",
                       disable=not verbose, leave=True)
            examples, taken, started, step_s = 0, 0, time.perf_counter(), 0.0
            batches = self._batches(data, batch_size, True, steps, shuffle, seed + epoch,
                                    sample_weight, pipeline, prefetch_depth,
                                    training=True)
            with batches as items:
                for step, (rows, batch) in enumerate(items):
                    callback_list.on_train_batch_begin(step)
                    step_started = time.perf_counter()
                    logs = self.train_step(batch)
                    step_s += time.perf_counter() - step_started
                    callback_list.on_train_batch_end(step, logs)
                    examples += rows
                    taken += 1
                    bar.update(1)
                    if step % 10 == 0 or step == steps - 1:
                        rate = examples / (time.perf_counter() - started)
                        bar.set_postfix(loss=f"{float(logs['loss']):.4f}",
                                        ex_s=f"{rate:,.0f}")
                    if self.stop_training:
                        break
            bar.close()
            self._record_pipeline_stats(batches, taken, step_s, examples,
                                        time.perf_counter() - started)
            epoch_logs = self._synced_metrics_result(logs)
            if validation_data is not None:
                val_logs = self.evaluate(validation_data, batch_size=batch_size,
                                         verbose=0, return_dict=True)
                epoch_logs.update({f"val_{k}": v for k, v in val_logs.items()})
            callback_list.on_epoch_end(epoch, epoch_logs)
            if verbose:
                tqdm.write(f"Epoch {epoch + 1}/{epochs}: " + "  ".join(
                    f"{k}={v:.4f}" for k, v in epoch_logs.items()))
            if self.stop_training:
                break
        callback_list.on_train_end(epoch_logs)
        return self.history

    def _record_pipeline_stats(self, batches, steps, step_s, examples, seconds):
        """Adds one epoch's figures to ``self.pipeline_stats``."""
        epoch = batches.stats()
        epoch["step"] = {"items": steps, "busy_s": round(step_s, 4)}
        epoch["examples"] = examples
        epoch["wall_s"] = round(seconds, 4)
        totals = self.pipeline_stats
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
        totals["threads"] = batches.threads
        totals["examples_per_s"] = round(totals["examples"] / max(totals["wall_s"], 1e-9), 1)
        caches = {layer.name: [t["cache"] for t in layer.engine.stats()["tables"]
                               if "cache" in t] for layer in self.embedding_layers}
        caches = {name: tables for name, tables in caches.items() if tables}
        if caches:                  # cumulative since the caches were configured
            totals["embedding_cache"] = caches

    def evaluate(self, x=None, y=None, batch_size=4096, verbose=1, return_dict=False,
                 steps=None, callbacks=None, sample_weight=None, pipeline="auto",
                 prefetch_depth=2):
        """Loss and metrics on data, like ``keras.Model.evaluate``.

        Args:
            x, y: as in ``fit``.
            batch_size: examples per step.
            verbose: 0 silent, 1 a progress bar.
            return_dict: return ``{name: value}`` instead of a list.
            steps: stop after this many steps.
            callbacks: Keras callbacks (test hooks are called).
            sample_weight: name of a column of per-example loss weights.
            pipeline, prefetch_depth: as in ``fit``.
        """
        data = as_data(x, y)
        total = self._num_steps(data, batch_size, steps)
        verbose = verbose if distributed.world().is_main else 0
        callback_list = keras.callbacks.CallbackList(
            callbacks, model=self, verbose=verbose, epochs=1, steps=total)
        self.reset_metrics()
        callback_list.on_test_begin()
        logs = {}
        with torch.no_grad(), self._batches(data, batch_size, True, total,
                                            sample_weight=sample_weight, pipeline=pipeline,
                                            prefetch_depth=prefetch_depth) as items:
            for step, (_, batch) in enumerate(tqdm(
                    items, total=total, desc="Evaluate",
                    unit="step", disable=not verbose)):
                callback_list.on_test_batch_begin(step)
                logs = self.test_step(batch)
                callback_list.on_test_batch_end(step, logs)
        logs = self._synced_metrics_result(logs)
        callback_list.on_test_end(logs)
        if return_dict:
            return logs
        values = list(logs.values())
        return values[0] if len(values) == 1 else values

    def predict(self, x, batch_size=4096, verbose=0, steps=None, callbacks=None,
                pipeline="auto", prefetch_depth=2):
        """Model outputs for every example of ``x``, as numpy.

        Args:
            x: a reckeras dataset, a pyarrow Table or a dict of arrays.
            batch_size: examples per step.
            verbose: 0 silent, 1 a progress bar.
            steps: stop after this many steps.
            callbacks: unused by reckeras; accepted for Keras compatibility.
            pipeline, prefetch_depth: as in ``fit``.
        """
        data = as_data(x)
        total = self._num_steps(data, batch_size, steps)
        outputs = []
        with torch.no_grad(), self._batches(data, batch_size, False, total,
                                            pipeline=pipeline,
                                            prefetch_depth=prefetch_depth) as items:
            for inputs, _, _ in tqdm((batch for _, batch in items),
                                     total=total, desc="Predict", unit="step",
                                     disable=not verbose):
                outputs.append(keras.ops.convert_to_numpy(self._forward(inputs, False)))
        if not outputs:
            raise ValueError("predict() received no data")
        return np.concatenate(outputs)


class _Batches:
    """A fit/evaluate/predict loop's batches: the host pipeline, capped at the
    steps every rank takes, then (with several ranks) the sparse-dist stage.

    The cap comes before the sparse-dist stage: that stage's key exchanges
    are collectives, so every rank must submit exactly the same batches.
    """

    def __init__(self, pipeline, steps, sparse_dist):
        self.pipeline, self.steps, self.sparse_dist = pipeline, steps, sparse_dist

    @property
    def threads(self):
        return self.pipeline.threads

    def __enter__(self):
        # On a GPU, ``ready`` orders this thread's stream after each batch's copy.
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

    def stats(self):
        """The pipeline's stats, plus the sparse-dist stage's when it ran."""
        stats = self.pipeline.stats()
        if self.sparse_dist:
            stats[self.sparse_dist.name] = self.sparse_dist.stats()
        return stats


def _pipeline_threads(pipeline):
    """Whether the pipeline stages of ``fit(pipeline=...)`` run in threads."""
    if isinstance(pipeline, bool):
        return pipeline
    if pipeline != "auto":
        raise ValueError(f"pipeline must be True, False or 'auto', got {pipeline!r}")
    if torch.device(get_device()).type == "cuda":
        return True                      # the step's math runs on the GPU
    # Under torchrun the ranks of this machine share its cores (torchrun
    # usually gives each rank one torch thread), so count all of their threads.
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return len(os.sched_getaffinity(0)) > torch.get_num_threads() * ranks_here


class _DeclaredInputs:
    """A functional model's dict inputs in Keras's flat order, with the dtype,
    rank and fixed axis sizes each one is declared with."""

    def __init__(self, keys, tensors):
        self.keys = keys
        self._dtypes_and_ranks = [(to_torch_dtype(t.dtype), len(t.shape)) for t in tensors]
        self._signatures = {}
        self.fixed_sizes = [(index, axis, size) for index, t in enumerate(tensors)
                            for axis, size in enumerate(t.shape) if size is not None]


    def signature(self, device_type):
        """``(dtype, rank, device type)`` of every input, in flat order."""
        if device_type not in self._signatures:
            self._signatures[device_type] = [(dtype, rank, device_type)
                                             for dtype, rank in self._dtypes_and_ranks]
        return self._signatures[device_type]


def _declared_inputs(inputs_struct):
    """``_DeclaredInputs`` of a dict of ``keras.Input``; None for other structures."""
    if not isinstance(inputs_struct, dict) or any(
            not isinstance(t, keras.KerasTensor) or t.sparse or t.ragged
            for t in inputs_struct.values()):
        return None
    keys = keras.tree.flatten({key: key for key in inputs_struct})
    return _DeclaredInputs(keys, [inputs_struct[key] for key in keys])


def _python_logs(logs):
    return {name: float(keras.ops.convert_to_numpy(value)) for name, value in logs.items()}

