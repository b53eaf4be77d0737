"""rk.Model: a keras.Model whose fit/evaluate/predict read reckeras data."""

from __future__ import annotations

from typing import Any

import keras
import pyarrow as pa

from reckeras import _keras_compat
from reckeras.features.encode import is_dataframe
from reckeras.features.specs import LENGTHS
from reckeras.layers.feature_columns import FeatureColumns
from reckeras.layers.sharded_embedding import ShardedEmbedding
from reckeras.pipeline import compile_arguments, group_metrics, loops, steps
from reckeras.pipeline import windows as windowed
from reckeras.pipeline.functional import FunctionalGraph, rebase_on_functional
from reckeras.pipeline.model_state import ModelStateMethods
from reckeras.pipeline.on_batch import OnBatchMethods
from reckeras.pipeline.refused import RefusedKerasMethods
from reckeras.pipeline.table_rate import TableRate


class Model(ModelStateMethods, OnBatchMethods, RefusedKerasMethods, keras.Model):
    """A Keras model over `rk.layers.FeatureColumns` inputs.

    Built like `keras.Model(inputs, outputs)` (functional), or subclassed:
    layers made in `__init__` and used in `call`, which receives the dict of
    encoded inputs (`FeatureColumns.inputs()` names its keys). `fit`,
    `evaluate` and `predict` take reckeras datasets, pyarrow tables or dicts
    of arrays, with Keras's arguments; the FeatureColumns validate and encode
    every batch (a bad one raises, naming the feature, before anything
    changes). The tables are trained by `compile`'s `embedding_optimizer`,
    the dense weights by Keras's `optimizer`; a non-finite step changes
    nothing (`compile(nonfinite=...)`). `get_weights`/`set_weights` carry the
    tables along, so Keras callbacks that restore weights restore them too;
    `rk.callbacks.BackupAndRestore` also resumes mid-epoch (`resume_at`).
    Keras methods that cannot see the tables are refused with a message
    naming what to use (see `docs/keras_api.md`).

    Called directly, `model(x)` takes the encoded inputs its `call`
    receives, or a raw batch (a dict of columns or a pyarrow Table), which
    the FeatureColumns encode first, as `predict` does.

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
        # `rk.Model(inputs, outputs)` makes a FunctionalModel (Keras: a Functional).
        if cls is Model and _keras_compat.functional_init_arguments(args, kwargs):
            cls = FunctionalModel
        return super().__new__(cls, *args, **kwargs)

    def __init__(self, *args: Any, **kwargs: Any):
        if _keras_compat.functional_init_arguments(args, kwargs):
            if not isinstance(self, FunctionalModel):
                # A subclass given (inputs, outputs), as Keras allows, is rebased on
                # FunctionalModel (Keras would rebase rk.Model itself on Functional).
                rebase_on_functional(type(self), Model, FunctionalModel)
                FunctionalModel.__init__(self, *args, **kwargs)
                return
            _keras_compat.init_functional_model(self, args, kwargs)
        else:
            super().__init__(*args, **kwargs)
        self.nonfinite = "raise"
        # Set by compile; an uncompiled model saves without them.
        self.embedding_optimizer = None
        self.table_rate: TableRate | None = None
        self._group_metrics: list = []
        self._group_outputs: list = []
        self.pipeline_stats: dict[str, Any] = {}
        self.loop_state = loops.LoopState()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # A raw batch (a Table, or a dict of columns, which lacks the encoded
        # inputs' LENGTHS) is encoded first, as `predict` encodes it; encoded
        # and symbolic inputs go to Keras as they are.
        if args and self._is_raw_batch(args[0]):
            args = (self.feature_columns.encode(args[0], absent=self.unread_features),
                    *args[1:])
        return super().__call__(*args, **kwargs)

    def _is_raw_batch(self, x: Any) -> bool:
        if isinstance(x, (pa.Table, pa.RecordBatch)) or is_dataframe(x):
            return True
        if not isinstance(x, dict) or LENGTHS in x or not self._layers_of(FeatureColumns):
            return False
        return LENGTHS in self.feature_columns.input_names

    def _layers_of(self, kind):
        # Walked once (a built model's layers are fixed). Keyed by name: Keras
        # tracks the dict, and pytrees of it (torch.export's) sort its keys.
        if not hasattr(self, "_layers_by_kind"):
            self._layers_by_kind = {}
        if kind.__qualname__ not in self._layers_by_kind:
            self._layers_by_kind[kind.__qualname__] = [
                layer for layer in _keras_compat.walk_layers(self)
                if isinstance(layer, kind)]
        return self._layers_by_kind[kind.__qualname__]

    @property
    def unread_features(self) -> tuple[str, ...]:
        """Features of the FeatureColumns that this model's outputs do not
        read; data given to `predict`, `evaluate`, `fit` or a call may lack
        their columns (read as missing). None here; a two-tower's
        `query_model()` names the candidate side's.

        Example:

        ```python
        two_tower_model.query_model().unread_features    # ("item_id",)
        ```
        """
        return ()

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
                ShardedEmbedding layer. Its learning rate follows the dense
                optimizer's: when a callback (`ReduceLROnPlateau`,
                `LearningRateScheduler`) sets that, the tables' rate is
                scaled by the same factor (docs/keras_api.md).
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
                the step keeps data-dependent sizes and the sparse
                optimizer's hook in backward, and `torch.compile` of the
                dense part alone was measured slower (docs/kernels.md).
            **kwargs: other `keras.Model.compile` arguments (`loss_weights`,
                `weighted_metrics`, `run_eagerly`, `auto_scale_loss`).

        Example:

        ```python
        model.compile(optimizer="adam", loss="binary_crossentropy",
                      embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.05),
                      metrics=[rk.metrics.AUC()], nonfinite="skip")
        ```
        """
        compile_arguments.check(nonfinite, jit_compile, steps_per_execution)
        metrics, gaucs, gauc_outputs = group_metrics.split_group_metrics(metrics)
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics,
                        jit_compile=False, **kwargs)
        compile_arguments.check_optimizer(self.optimizer)
        self._group_metrics = gaucs
        self._group_outputs = gauc_outputs     # the output each GAUC reads (None: the only one)
        self.nonfinite = nonfinite
        self.embedding_optimizer = compile_arguments.embedding_optimizer(
            embedding_optimizer, self.embedding_layers)
        for layer in self.embedding_layers:
            layer.engine.set_optimizer(self.embedding_optimizer)
        self.table_rate = None if self.embedding_optimizer is None else \
            TableRate(self.optimizer, self.embedding_optimizer)

    def get_compile_config(self) -> dict | None:
        """The compile arguments, with the embedding optimizer and GAUC metrics.

        Returns:
            A serializable dict (None when not compiled).
        """
        return compile_arguments.with_own_config(
            super().get_compile_config(), self.nonfinite, self.embedding_optimizer,
            self._group_metrics, self._group_outputs)

    def compile_from_config(self, config: dict) -> None:
        """Compiles from `get_compile_config()` (used by `load_model`).

        Args:
            config: the compile config.
        """
        self.compile(**compile_arguments.from_config(config))
        if self.built:
            self.optimizer.build(self.trainable_variables)

    def train_step(self, data: tuple) -> dict:
        """One training step, guarded: a non-finite step changes nothing.

        Keras's torch `train_step`, but backward always runs (it also trains
        the tables), the tables' updates wait until the step is known to be
        finite (one scalar read, `pipeline.guard`), and the dense gradients
        are averaged over the ranks (`pipeline.steps`).

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

    def fit(self, x: Any = None, y: Any = None, batch_size: int | None = None,
            epochs: int = 1, verbose: int | str = "auto", callbacks: list | None = None,
            validation_split: float = 0.0, validation_data: Any = None,
            shuffle: bool = True, class_weight: dict | None = None,
            sample_weight: Any = None, initial_epoch: int = 0,
            steps_per_epoch: int | None = None, validation_steps: int | None = None,
            validation_batch_size: int | None = None, validation_freq: int = 1,
            labels: str | dict | None = None, seed: int | None = None,
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
            initial_epoch: epoch to start at (to resume from a checkpoint,
                with the uninterrupted run's shuffle: see `seed`).
            steps_per_epoch: stop an epoch after this many steps.
            validation_steps: evaluate at most this many steps.
            validation_batch_size: batch size of the validation (default
                `batch_size`).
            validation_freq: validate after every `validation_freq`-th epoch.
            labels: the label column(s) of `x` (a dataset or Table): a name,
                or `{output name: column}` for a model with dict outputs
                (default: `y`, else the data's `label` column). The
                validation data is read with the same labels.
            seed: seed of the shuffle: epoch `e` uses `seed + e`. By
                default (None) each epoch the model trains takes the next
                seed, counting the epochs of earlier `fit` calls (and of
                the checkpoint it loaded), at least `e`: calling
                `fit(epochs=1)` n times shuffles as `fit(epochs=n)` does
                (Keras reshuffles on every call). Give a seed to repeat an
                order.
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
            callbacks: Keras callbacks: epoch hooks per window (`on_epoch_begin(i,
                {"window": name})`), the evaluation's test hooks, the
                training's batch hooks. `EarlyStopping(monitor="progressive_auc",
                mode="max")` (give `mode`) stops after a window;
                `rk.callbacks.ModelCheckpoint` saves after each.
            shuffle: shuffle each window's rows for training.
            class_weight: as in `fit`, for the training.
            sample_weight: the name of a weight column, as in `fit`, for the
                training (the progressive evaluation is unweighted).
            labels: the label column(s), as in `fit`.
            seed: window i is shuffled with seed `seed + i`.
            evaluate_batch_size: the progressive evaluations' (default `batch_size`).
            pipeline: as in `fit`.
            prefetch_depth: as in `fit`.

        Returns:
            A `keras.callbacks.History` with one entry per window: `window`
            (its name, e.g. "dt=2026-12-01"), the training logs (`loss`,
            the metrics) and the progressive ones (`progressive_loss`,
            `progressive_<metric>`).

        Raises:
            ValueError: no windows, or a `BackupAndRestore` callback (resume
                by passing the windows not yet trained on).
            RuntimeError: not compiled, or the ranks see other windows.

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
            callbacks: Keras callbacks, or a `CallbackList` (its test hooks run).
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

