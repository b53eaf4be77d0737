"""rk.Model: a keras.Model whose fit/evaluate/predict read reckeras data."""

from __future__ import annotations

import os
from typing import Any

import keras
import torch

from reckeras import _keras_compat, checkpoint, distributed
from reckeras import optimizers as sparse_optimizers
from reckeras.layers.feature_columns import FeatureColumns
from reckeras.layers.sharded_embedding import ShardedEmbedding
from reckeras.pipeline import group_metrics, loops, steps
from reckeras.pipeline import windows as windowed
from reckeras.pipeline.functional import FunctionalGraph, fed_layers
from reckeras.pipeline.on_batch import OnBatchMethods
from reckeras.pipeline.refused import RefusedKerasMethods
from reckeras.pipeline.resume import ResumePosition

NONFINITE_POLICIES = ("raise", "skip")


class WeightsWithTables(list):
    """`rk.Model.get_weights()`: the Keras weights (a list of numpy arrays,
    as Keras's `get_weights` returns), carrying this rank's embedding tables
    in `tables` so that `set_weights` restores both from the same moment.

    Args:
        weights: the Keras weights' values.
        tables: `{layer name: ShardedEmbedding.table_states()}`.
    """

    def __init__(self, weights: list, tables: dict):
        super().__init__(weights)
        self.tables = tables


class Model(OnBatchMethods, RefusedKerasMethods, keras.Model):
    """A Keras model over `rk.layers.FeatureColumns` inputs.

    Built like `keras.Model(inputs, outputs)` (functional), or subclassed:
    layers made in `__init__` and used in `call`, which receives the dict of
    encoded inputs (`FeatureColumns.inputs()` names its keys). Its `fit`,
    `evaluate` and `predict` take reckeras datasets (`rk.datasets.load(...)`),
    pyarrow tables or dicts of arrays, with Keras's arguments (see each
    method); every batch is validated and encoded by the model's
    FeatureColumns (a bad batch raises, naming the feature, before any weight
    or table row changes). Embedding tables are trained by the
    `embedding_optimizer` given to `compile`; the dense weights by Keras's
    `optimizer`. A step whose loss or gradients are not finite changes
    nothing (`compile(nonfinite=...)`). `get_weights`/`set_weights` carry the
    tables along, so Keras's `EarlyStopping(restore_best_weights=True)` and
    `BackupAndRestore` restore tables and dense weights of the same epoch;
    `rk.callbacks.BackupAndRestore` also resumes mid-epoch, under torchrun
    too (`resume_at`). Keras methods that cannot see the tables are refused
    with a message naming what to use (see `docs/keras_api.md`).

    A subclassed model is built by its first batch (`fit` builds it on the
    data's first rows before training; or call `predict_on_batch`), and,
    as in Keras, implements `get_config`/`from_config` to be saved with
    `model.save`. Its `call` is code, not a graph: the pipeline cannot plan
    its lookups a batch ahead, so each embedding lookup routes its ids
    inside the step (same result, less overlap under torchrun).

    Example:

    ```python
    model = rk.Model(inputs, out)
    model.compile(optimizer="adam", loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.05),
                  metrics=[rk.metrics.AUC()])
    model.fit(rk.datasets.load("criteo_synth"), batch_size=4096)

    class Ranker(rk.Model):
        def __init__(self, columns, **kwargs):
            super().__init__(**kwargs)
            self.columns = columns
            self.embedding = rk.layers.ShardedEmbedding(columns, output="concat")
            self.head = rk.layers.MLP([64, 1], output_activation="sigmoid")

        def call(self, inputs):
            dense, sparse = self.columns(inputs)
            return self.head(keras.ops.concatenate([dense, self.embedding(sparse)], 1))
    ```
    """

    def __new__(cls, *args: Any, **kwargs: Any):
        # `rk.Model(inputs, outputs)` makes a FunctionalModel, as
        # `keras.Model(inputs, outputs)` makes a Functional.
        if cls is Model and _keras_compat.functional_init_arguments(args, kwargs):
            cls = FunctionalModel
        return super().__new__(cls, *args, **kwargs)

    def __init__(self, *args: Any, **kwargs: Any):
        if _keras_compat.functional_init_arguments(args, kwargs):
            if not isinstance(self, FunctionalModel):
                # A subclass given (inputs, outputs), as Keras allows: its class
                # is rebased on FunctionalModel (Keras rebases it on Functional,
                # which would rebase rk.Model itself).
                _rebase_on_functional(type(self))
                FunctionalModel.__init__(self, *args, **kwargs)
                return
            _keras_compat.init_functional_model(self, args, kwargs)
        else:
            super().__init__(*args, **kwargs)
        self.nonfinite = "raise"
        self.pipeline_stats = {}
        self.loop_state = loops.LoopState()

    # ---- structure -------------------------------------------------------------

    def _layers_of(self, kind):
        # A functional model's layers are fixed once it is built: walk them
        # once. Keyed by name: Keras tracks the dict, and pytrees of it (as
        # torch.export walks) sort its keys.
        if not hasattr(self, "_layers_by_kind"):
            self._layers_by_kind = {}
        if kind.__qualname__ not in self._layers_by_kind:
            self._layers_by_kind[kind.__qualname__] = [
                layer for layer in _keras_compat.walk_layers(self)
                if isinstance(layer, kind)]
        return self._layers_by_kind[kind.__qualname__]

    @property
    def feature_columns(self) -> FeatureColumns:
        """The model's FeatureColumns layer."""
        found = self._layers_of(FeatureColumns)
        if len(found) != 1:
            raise ValueError(f"rk.Model needs exactly one FeatureColumns layer, "
                             f"found {len(found)}")
        return found[0]

    @property
    def embedding_layers(self) -> list:
        """The model's ShardedEmbedding layers."""
        return list(self._layers_of(ShardedEmbedding))

    def export_serving(self, path: str | os.PathLike, rows: str = "float32",
                       min_count: int | None = None) -> str:
        """Writes the model's serving artifact, which `rk.serving.load` reads
        without Keras.

        The artifact holds the feature specs with their adapted statistics
        (the predictor runs the same transforms), every table's keys and
        rows (no optimizer state), the dense network as a `torch.export`
        program, and a manifest with versions and checksums. Under torchrun
        every rank calls it and writes its own rows; the artifact loads in
        one process. See `docs/serving.md`.

        Args:
            path: the artifact directory (replaced if it exists).
            rows: `"float32"`, `"float16"` or `"int8"` (row-wise quantized:
                a scale and bias per row).
            min_count: export only the rows seen in at least this many
                training steps (the others read zeros at serving, as ids
                never seen do); None exports every row. The manifest
                records it and the rows kept per table.

        Returns:
            The artifact's path.

        Raises:
            ValueError: an unknown `rows`, a `min_count` that is not an int
                >= 1 or None, or an embedding layer that does not read the
                FeatureColumns' output.
            NotImplementedError: a subclassed model (it has no graph).

        Example:

        ```python
        model.export_serving("exported/ctr", rows="int8", min_count=2)
        predictor = rk.serving.load("exported/ctr")
        ```
        """
        from reckeras.serving.export import export_serving

        if not isinstance(self, FunctionalGraph):
            raise NotImplementedError("export_serving() traces a functional model's graph; a "
                                      "subclassed rk.Model has none: build the model with "
                                      "rk.Model(inputs, outputs) to export it")
        return export_serving(self, fed_layers(self), path, rows, min_count)

    # ---- compile -----------------------------------------------------------------

    def compile(self, optimizer: Any = "rmsprop", loss: Any = None,
                embedding_optimizer: Any = None, metrics: list | None = None,
                nonfinite: str = "raise", steps_per_execution: int = 1,
                jit_compile: bool | str = "auto", **kwargs: Any) -> None:
        """Configures training.

        Args:
            optimizer: Keras optimizer of the dense weights.
            loss: Keras loss.
            embedding_optimizer: a `rk.optimizers` sparse optimizer (or its
                name) for the embedding tables. Required when the model has a
                ShardedEmbedding layer.
            metrics: Keras metrics; `rk.metrics.GAUC` also receives the
                group ids of every example from the model's inputs.
            nonfinite: what a training step whose loss, or any dense or
                embedding gradient, is NaN or inf does. Either way it changes
                no dense weight, no table row and no optimizer state.
                `"raise"` (default): `fit` raises `rk.NonFiniteStepError` naming
                the step; `"skip"`: training goes on, and the skipped steps
                are counted in `pipeline_stats["nonfinite_skipped"]`.
            steps_per_execution: must be 1: every step runs eagerly (the
                embedding lookup is not a traceable graph).
            jit_compile: `False` or `"auto"` (which means False here):
                `torch.compile` cannot trace the embedding engine's hash
                tables, nor its optimizer applied after backward.
            **kwargs: other `keras.Model.compile` arguments (`loss_weights`,
                `weighted_metrics`, `run_eagerly`, `auto_scale_loss`).

        Example:

        ```python
        model.compile(optimizer="adam", loss="binary_crossentropy",
                      embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.05),
                      metrics=[rk.metrics.AUC()], nonfinite="skip")
        ```
        """
        if nonfinite not in NONFINITE_POLICIES:
            raise ValueError(f"nonfinite must be one of {NONFINITE_POLICIES}, "
                             f"got {nonfinite!r}")
        if jit_compile not in (False, "auto"):
            raise ValueError("rk.Model does not support jit_compile=True: torch.compile "
                             "cannot trace the embedding engine's hash tables and its "
                             "sparse optimizer; use jit_compile=False (or 'auto')")
        if steps_per_execution != 1:
            raise ValueError(f"rk.Model runs one step per execution; got "
                             f"steps_per_execution={steps_per_execution!r}. Every step "
                             f"is eager already, so there is nothing to amortize")
        metrics, gaucs, gauc_outputs = group_metrics.split_group_metrics(metrics)
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics,
                        jit_compile=False, **kwargs)
        if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
            raise ValueError("rk.Model does not support loss scaling (a LossScaleOptimizer, "
                             "or auto_scale_loss under the mixed_float16 policy): the "
                             "embedding tables' optimizer would receive the scaled "
                             "gradients. Use the mixed_bfloat16 or float32 policy, or "
                             "compile(auto_scale_loss=False)")
        self._group_metrics = gaucs
        self._group_outputs = gauc_outputs     # the output each GAUC reads (None: the only one)
        self.nonfinite = nonfinite
        if embedding_optimizer is None and self.embedding_layers:
            raise ValueError("the model has ShardedEmbedding tables: pass "
                             "embedding_optimizer=rk.optimizers.RowWiseAdagrad(...) "
                             "(or another rk.optimizers optimizer) to compile()")
        self.embedding_optimizer = None if embedding_optimizer is None else \
            sparse_optimizers.get(embedding_optimizer)
        for layer in self.embedding_layers:
            layer.engine.set_optimizer(self.embedding_optimizer)

    def get_compile_config(self) -> dict | None:
        """The compile arguments, with the embedding optimizer and GAUC metrics.

        Returns:
            A serializable dict (None when not compiled).
        """
        config = super().get_compile_config()
        if config:
            config["nonfinite"] = self.nonfinite
            if self.embedding_optimizer is not None:
                config["embedding_optimizer"] = sparse_optimizers.serialize(
                    self.embedding_optimizer)
            if self._group_metrics:
                config["group_metrics"] = group_metrics.group_metrics_config(
                    self._group_metrics, self._group_outputs)
        return config

    def compile_from_config(self, config: dict) -> None:
        """Compiles from `get_compile_config()` (used by `load_model`).

        Args:
            config: the compile config.
        """
        embedding_optimizer = config.pop("embedding_optimizer", None)
        saved_gaucs = config.pop("group_metrics", [])
        config = keras.saving.deserialize_keras_object(config)
        config["metrics"] = group_metrics.with_group_metrics(config.get("metrics"), saved_gaucs)
        self.compile(embedding_optimizer=embedding_optimizer, **config)
        if self.built:
            self.optimizer.build(self.trainable_variables)

    # ---- state -------------------------------------------------------------------

    def get_weights(self) -> WeightsWithTables:
        """The values of `model.weights`, with this rank's embedding tables.

        A list of numpy arrays as Keras's `get_weights` returns (same length
        and order as `model.weights`), whose `tables` attribute holds a copy
        of every table's keys, rows and optimizer state, so that
        `set_weights` puts the model back as it was, tables included.

        Returns:
            A `WeightsWithTables`.
        """
        return WeightsWithTables(
            super().get_weights(),
            {layer.name: layer.table_states() for layer in self.embedding_layers})

    def set_weights(self, weights: list) -> None:
        """Sets `model.weights`, and the tables when `weights` carries them.

        Args:
            weights: a list of numpy arrays as `get_weights` returns; when it
                is `get_weights()`'s own result, the tables are restored too.
        """
        super().set_weights(weights)
        for layer in self.embedding_layers:
            tables = getattr(weights, "tables", {})
            if layer.name in tables:
                layer.load_table_states(tables[layer.name])

    def embedding_stats(self) -> dict:
        """Rows, memory and requests of every embedding table on every rank.

        Under torchrun every rank must call it (it gathers across ranks).

        Returns:
            `{layer name: {"per_rank": [stats of rank 0, ...],
            "rows_imbalance": max/mean, "requests_imbalance": max/mean}}`
            where each rank's stats hold `requests` and, per physical table,
            `dim`, `rows`, `bytes` and `bytes_by_part` (`rows`,
            `optimizer_state`, `keys`, `tracking`, `index`; see
            `PhysicalTable.memory_by_part`), plus `cache`, the device cache's
            hit rates and traffic, for `host_cached` tables (see
            `docs/caching.md`).
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

    def save_checkpoint(self, path: str, base: str | None = None) -> None:
        """Saves dense weights, tables and optimizer state, from every rank.

        Atomic (a crash leaves the previous checkpoint loadable) and
        re-shardable: `load_checkpoint` works on any number of ranks. With
        `base`, a delta: the dense weights whole, and only the table rows
        (with their optimizer state) written since `base` and the keys
        deleted since; loading it loads `base` first. See
        `reckeras.checkpoint` and `docs/continuous.md`. Every rank
        must call it.

        Args:
            path: checkpoint directory on a filesystem all ranks share.
            base: for a delta, a checkpoint this model saved, or loaded
                exactly, since its last full save or load; None (default)
                for a full checkpoint.

        Raises:
            ValueError: `base` is `path`, or not a checkpoint this model
                saved or loaded since its last full one.

        Example:

        ```python
        model.save_checkpoint("ckpt/epoch3")
        model.fit(train, epochs=4, initial_epoch=3)
        model.save_checkpoint("ckpt/epoch4", base="ckpt/epoch3")   # a delta
        ```
        """
        checkpoint.save_checkpoint(self, path, base=base)

    def load_checkpoint(self, path: str, warm_start: bool = False,
                        rename_tables: dict[str, str | None] | None = None,
                        skip_mismatch: bool = False) -> checkpoint.LoadReport:
        """Restores a checkpoint (full, or a delta and its bases) saved on any world size.

        Exact by default: the model must be the one saved. With
        `warm_start=True` it may have changed: tables are matched by name
        (tables it added start fresh, tables it dropped are skipped and
        reported, `rename_tables` maps old names to new ones, a table whose
        dim changed raises), dense variables by path with their shapes
        checked; the Keras optimizer's state is then not restored. Nothing
        changes if any check fails. See `docs/continuous.md`.

        Args:
            path: checkpoint directory.
            warm_start: load into a changed model (match by name).
            rename_tables: `{checkpoint table: model table}`; a value of
                None skips that table (warm start only).
            skip_mismatch: keep the model's value of a dense variable whose
                shape differs instead of raising (warm start only).

        Returns:
            A `reckeras.checkpoint.LoadReport`: the chain loaded,
            and what a warm start added, skipped and renamed.

        Raises:
            CheckpointError: a file is missing, damaged, of another save, or
                does not fit the model; the model is unchanged.

        Example:

        ```python
        model.load_checkpoint("ckpt/epoch3")      # on any number of ranks
        model.fit(train, epochs=5, initial_epoch=3)
        ```
        """
        return checkpoint.load_checkpoint(self, path, warm_start=warm_start,
                                          rename_tables=rename_tables,
                                          skip_mismatch=skip_mismatch)

    def resume_at(self, epoch: int, step: int = 0, *, global_batch_size: int | None = None,
                  world_size: int | None = None) -> None:
        """Makes the next `fit` start at step `step` of epoch `epoch`.

        The seam of `rk.callbacks.BackupAndRestore`, which calls it from
        `on_train_begin` after restoring a backup. `fit` then starts at
        `epoch` (instead of `initial_epoch`) and leaves out the first `step`
        batches of that epoch: they are read and dropped before any stage of
        the pipeline, not trained on, and no callback sees them; the batches
        after keep their indices in the batch hooks (the first is `step`).
        The data order is the uninterrupted run's: epoch `e` is shuffled
        with seed `seed + e` whatever epoch a fit starts at. Call it before
        `fit` or from a callback's `on_train_begin`; only the next `fit`
        takes it.

        Args:
            epoch: the epoch to start at (0-based).
            step: the batches of that epoch already trained on.
            global_batch_size: examples per step over all ranks in the run
                that reached this position; `fit` checks that it is its own
                (another global batch puts other examples in each step).
            world_size: the number of ranks of that run. A mid-epoch
                position resumes on another number of ranks only for data
                whose global batches do not depend on it (a pyarrow Table or
                a dict of arrays); a reckeras dataset gives each rank a
                contiguous range of rows, so `fit` raises for it.

        Raises:
            ValueError: `epoch` or `step` is not an int >= 0, or
                `global_batch_size` / `world_size` not a positive int.

        Example:

        ```python
        model.load_checkpoint("backup/ckpt")
        model.resume_at(2, 150)        # epoch 2, its first 150 batches trained
        model.fit(train, epochs=4)     # epoch 2 from batch 150, then epoch 3
        ```
        """
        self.loop_state.resume_position = ResumePosition(epoch, step, global_batch_size,
                                                         world_size)

    # ---- steps ---------------------------------------------------------------------

    def train_step(self, data: tuple) -> dict:
        """One training step, guarded: a non-finite step changes nothing.

        Keras's torch `train_step`, with three differences: backward always
        runs (it also trains the tables); the tables' updates wait until
        backward is done and the step is known to be finite; the dense
        gradients are averaged over the ranks.

        The check costs one scalar read per step (see `pipeline.guard`).

        Args:
            data: `(x, y, sample_weight)`.

        Returns:
            The metrics' values (unchanged by a skipped step).
        """
        return steps.train_step(self, data)

    def test_step(self, data: tuple) -> dict:
        """One evaluation step: loss and metrics, no update.

        Args:
            data: `(x, y, sample_weight)`.

        Returns:
            The metrics' values.
        """
        return steps.test_step(self, data)

    def predict_step(self, data: Any) -> Any:
        """The model's outputs for one batch (Keras's `predict_step`).

        Args:
            data: the batch's inputs, or `(x,)`, `(x, y)`, `(x, y, w)`.

        Returns:
            The outputs, as `model(x)` returns them.
        """
        return steps.predict_step(self, data)

    def compute_metrics(self, x: dict, y: Any, y_pred: Any,
                        sample_weight: Any = None) -> dict:
        """Updates the metrics; GAUC metrics also get their group column.

        Args:
            x: the batch's inputs.
            y: the labels.
            y_pred: the model's outputs.
            sample_weight: per-example weights, or None.

        Returns:
            The metrics' values.
        """
        group_metrics.update_group_metrics(self._group_metrics, self._group_outputs, x, y,
                                           y_pred, sample_weight)
        return super().compute_metrics(x, y, y_pred, sample_weight)

    # ---- loops -----------------------------------------------------------------------

    def fit(self, x: Any = None, y: Any = None, batch_size: int | None = None,
            epochs: int = 1, verbose: int | str = "auto", callbacks: list | None = None,
            validation_split: float = 0.0, validation_data: Any = None,
            shuffle: bool = True, class_weight: dict | None = None,
            sample_weight: Any = None, initial_epoch: int = 0,
            steps_per_epoch: int | None = None, validation_steps: int | None = None,
            validation_batch_size: int | None = None, validation_freq: int = 1,
            labels: str | dict | None = None, seed: int = 0,
            pipeline: bool | str = "auto",
            prefetch_depth: int = 2) -> keras.callbacks.History:
        """Trains the model, with the arguments of `keras.Model.fit`.

        Before training it tunes glibc's allocator for the whole process,
        so that a step's freed buffers are reused instead of faulted in
        again (see `docs/performance.md`); `rk.config.set(malloc_tuning=
        False)` or `RECKERAS_MALLOC_TUNING=0` leaves the allocator alone.

        Args:
            x: a reckeras dataset, a pyarrow Table or a dict of arrays.
            y: labels when `x` is a dict/Table without a `label` column.
            batch_size: examples per step on each rank (default 4096).
            epochs: the epoch to end at.
            verbose: `"auto"` or 1: a progress bar per epoch; 2: one line per
                epoch; 0: silent.
            callbacks: Keras callbacks (History is always added). Validation
                calls their test hooks, as Keras does. Their `params` hold
                `batch_size` (per rank) beside Keras's `verbose`, `epochs`
                and `steps`. `rk.callbacks.BackupAndRestore` backs up and
                resumes mid-epoch on any number of ranks (`resume_at`).
            validation_split: fraction of in-memory data (the last rows,
                before shuffling) held out and evaluated after every epoch.
            validation_data: data evaluated after every epoch (`val_` logs):
                a dataset, Table or dict, or `(x, y)` or `(x, y,
                sample_weight)`.
            shuffle: reshuffle the batch order every epoch.
            class_weight: `{class index: weight}` multiplying each example's
                loss weight by its class (the rounded label).
            sample_weight: per-example loss weights: an array for in-memory
                `x`, or the name of a column.
            initial_epoch: epoch to start at (to resume from a checkpoint:
                epoch `e` always uses shuffle seed `seed + e`).
            steps_per_epoch: stop an epoch after this many steps.
            validation_steps: evaluate at most this many steps.
            validation_batch_size: batch size of the validation (default
                `batch_size`).
            validation_freq: validate after every `validation_freq`-th epoch.
            labels: the label column(s) of `x` (a dataset or Table): a name,
                or `{output name: column}` for a model with dict outputs
                (default: `y`, else the data's `label` column). The
                validation data is read with the same labels.
            seed: seed of the shuffle (epoch `e` uses `seed + e`).
            pipeline: `True` prepares batches in background threads,
                `False` inline before each step; the result is the same
                either way. `"auto"` uses threads when they have a core of
                their own (see `docs/pipeline.md`).
            prefetch_depth: batches each pipeline stage may run ahead.

        Returns:
            The `keras.callbacks.History`.

        Example:

        ```python
        model.fit(x, y, batch_size=1024, epochs=3, validation_split=0.1,
                  class_weight={0: 1.0, 1: 3.0},
                  callbacks=[keras.callbacks.EarlyStopping(restore_best_weights=True)])
        ```
        """
        return loops.fit(self, x, y, batch_size, epochs, verbose, callbacks, validation_split,
                         validation_data, shuffle, class_weight, sample_weight,
                         initial_epoch, steps_per_epoch, validation_steps,
                         validation_batch_size, validation_freq, labels, seed, pipeline,
                         prefetch_depth)

    def fit_windows(self, windows: Any, batch_size: int | None = None,
                    verbose: int | str = "auto", callbacks: list | None = None,
                    shuffle: bool = True, class_weight: dict | None = None,
                    sample_weight: str | None = None, labels: str | dict | None = None,
                    seed: int = 0, evaluate_batch_size: int | None = None,
                    pipeline: bool | str = "auto",
                    prefetch_depth: int = 2) -> keras.callbacks.History:
        """Trains over time windows in order, evaluating each one first.

        Progressive validation: window i is evaluated with the weights
        trained on windows 0..i-1 (data the model has not seen, as
        tomorrow's traffic will be), then trained on for one pass. It is
        `evaluate(window)` then `fit(window, epochs=1, seed=seed + i)` for
        each window, with callbacks seeing one epoch per window (see
        `docs/continuous.md`).

        Args:
            windows: the windows in time order: `Dataset.windows(...)`, or a
                sequence of anything `fit` takes (Tables, dicts with a label
                column). Every rank must give the same windows.
            batch_size: examples per step on each rank (default 4096).
            verbose: `"auto"` or 1: progress bars and one line per window;
                2: one line per window; 0: silent.
            callbacks: Keras callbacks. `on_epoch_begin(i, {"window":
                name})` and `on_epoch_end(i, logs)` per window, the
                progressive evaluation's test hooks, the training's batch
                hooks. `EarlyStopping(monitor="progressive_auc",
                mode="max")` stops after a window (Keras infers no direction
                for these names: give `mode`); `rk.callbacks.ModelCheckpoint`
                saves after each.
            shuffle: shuffle each window's rows for training.
            class_weight: as in `fit`, for the training.
            sample_weight: the name of a weight column, as in `fit`, for the
                training (the progressive evaluation is unweighted).
            labels: the label column(s), as in `fit`.
            seed: window i is shuffled with seed `seed + i`.
            evaluate_batch_size: batch size of the progressive evaluations
                (default `batch_size`).
            pipeline: as in `fit`.
            prefetch_depth: as in `fit`.

        Returns:
            A `keras.callbacks.History` with one entry per window: `window`
            (its name, e.g. "dt=2026-12-01"), the training logs (`loss`,
            the metrics) and the progressive ones (`progressive_loss`,
            `progressive_<metric>`).

        Raises:
            ValueError: no windows, or a `BackupAndRestore` callback
                (resume by passing the windows not yet trained on).
            RuntimeError: the ranks do not see the same windows.

        Example:

        ```python
        days = rk.datasets.from_parquet("/data/logs").windows("dt")
        history = model.fit_windows(days, batch_size=4096)
        history.history["window"]            # ["dt=2026-12-01", ...]
        history.history["progressive_auc"]   # each day, before training on it
        ```
        """
        return windowed.fit_windows(
            self, windows, batch_size=batch_size, verbose=verbose, callbacks=callbacks,
            shuffle=shuffle, class_weight=class_weight, sample_weight=sample_weight,
            labels=labels, seed=seed, evaluate_batch_size=evaluate_batch_size,
            pipeline=pipeline, prefetch_depth=prefetch_depth)

    def evaluate(self, x: Any = None, y: Any = None, batch_size: int | None = None,
                 verbose: int | str = "auto", sample_weight: Any = None,
                 steps: int | None = None, callbacks: Any = None,
                 return_dict: bool = False, labels: str | dict | None = None,
                 pipeline: bool | str = "auto", prefetch_depth: int = 2) -> Any:
        """Loss and metrics on data, like `keras.Model.evaluate`.

        Args:
            x: as in `fit`; also `(x, y)` or `(x, y, sample_weight)`.
            y: as in `fit`.
            batch_size: examples per step (default 4096).
            verbose: `"auto"` or 1: a progress bar; 0 or 2: none.
            sample_weight: per-example loss weights (array or column name).
            steps: stop after this many steps.
            callbacks: Keras callbacks, or a `CallbackList` (test hooks are
                called).
            return_dict: return `{name: value}` instead of a list.
            labels: as in `fit`.
            pipeline: as in `fit`.
            prefetch_depth: as in `fit`.

        Returns:
            The loss and metric values (a scalar when there is only the loss).

        Example:

        ```python
        logs = model.evaluate(test, batch_size=8192, return_dict=True)
        ```
        """
        return loops.evaluate(self, x, y, batch_size, verbose, sample_weight, steps, callbacks,
                              return_dict, labels, pipeline, prefetch_depth)

    def predict(self, x: Any, batch_size: int | None = None, verbose: int | str = "auto",
                steps: int | None = None, callbacks: Any = None,
                pipeline: bool | str = "auto", prefetch_depth: int = 2) -> Any:
        """Model outputs for every example of `x`, as numpy.

        Args:
            x: a reckeras dataset, a pyarrow Table or a dict of arrays.
            batch_size: examples per step (default 4096).
            verbose: `"auto"` or 1: a progress bar; 0 or 2: none.
            steps: stop after this many steps.
            callbacks: Keras callbacks (predict hooks are called; each batch's
                `on_predict_batch_end` logs hold its `outputs`).
            pipeline: as in `fit`.
            prefetch_depth: as in `fit`.

        Returns:
            The outputs of every example, concatenated (numpy, or a dict or
            list of numpy arrays for a model with several outputs).

        Example:

        ```python
        scores = model.predict(test, batch_size=8192)[:, 0]
        ```
        """
        return loops.predict(self, x, batch_size, verbose, steps, callbacks, pipeline,
                             prefetch_depth)


@keras.saving.register_keras_serializable(package="reckeras", name="Model")
class FunctionalModel(FunctionalGraph, Model, _keras_compat.Functional):
    """What `rk.Model(inputs, outputs)` makes: an `rk.Model` whose steps run
    its graph (`functional.FunctionalGraph`). Saved under the name
    `"reckeras>Model"`.

    Args:
        *args: `inputs`, `outputs` (and `name`), as for `keras.Model`.
        **kwargs: the same, by keyword.
    """


def _rebase_on_functional(cls):
    """Puts FunctionalModel in place of Model in `cls`'s bases (and in those
    of its bases between it and Model)."""
    cls.__bases__ = tuple(
        FunctionalModel if base is Model else
        _rebase_on_functional(base) if issubclass(base, Model)
        and not issubclass(base, FunctionalModel) else base
        for base in cls.__bases__)
    return cls
