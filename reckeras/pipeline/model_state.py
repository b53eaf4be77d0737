"""`rk.Model`'s state beyond Keras's variables: the embedding tables with
the dense weights (`get_weights`/`set_weights`), their statistics,
checkpoints, the serving artifact, and where a resumed `fit` starts.

The tables are not Keras variables: they live in the embedding engines,
sharded over the ranks. These methods carry them along with the dense weights
(`WeightsWithTables`), or hand the model to the packages that write and read
them (`reckeras.checkpoint`, `reckeras.serving.export`).
"""

from __future__ import annotations

import os

import torch

from reckeras import _keras_compat, checkpoint, distributed
from reckeras.pipeline.functional import FunctionalGraph, fed_layers
from reckeras.pipeline.resume import ResumePosition


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


class ModelStateMethods(_keras_compat.ModelMixin):
    """Mixin of `rk.Model`: the methods that read or write its state with
    the embedding tables, and `resume_at`.
    """

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
        takes it (it is kept in `model.loop_state.resume_position`).

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

    def export_serving(self, path: str | os.PathLike, rows: str | None = None,
                       min_count: int | None = None,
                       base: str | os.PathLike | None = None) -> str:
        """Writes the model's serving artifact, which `rk.serving.load` reads
        without Keras.

        The artifact holds the feature specs with their adapted statistics
        (the predictor runs the same transforms), every table's keys and
        rows (no optimizer state), the dense network as a `torch.export`
        program, and a manifest with versions and checksums. Under torchrun
        every rank calls it and writes its own rows; the artifact loads in
        one process. With `base`, it writes a *delta* against the model's
        latest export instead: the rows changed or created since, the ids
        removed since (aged out, evicted) and the dense weights, which a
        running predictor or server applies atomically
        (`Predictor.apply_delta`). See `docs/serving.md`.

        Args:
            path: the artifact directory (replaced if it exists).
            rows: `"float32"`, `"float16"` or `"int8"` (row-wise quantized:
                a scale and bias per row); None: `"float32"`, or the base's
                for a delta.
            min_count: export only the rows seen in at least this many
                training steps (the others read zeros at serving, as ids
                never seen do); None exports every row (a delta keeps its
                base's). At most 2047: a row's count saturates there. The
                manifest records it and the rows kept per table.
            base: the directory of this model's latest export (full or
                delta) to write a delta against; None for a full artifact.

        Returns:
            The artifact's path.

        Raises:
            ValueError: an unknown `rows`, a `min_count` that is not an int
                in [1, 2047] or None, an embedding layer that does not read the
                FeatureColumns' output, or a `base` that is not the model's
                latest export (or whose `rows`/`min_count` differ).
            NotImplementedError: a subclassed model (it has no graph).

        Example:

        ```python
        model.export_serving("exported/ctr", rows="int8", min_count=2)
        predictor = rk.serving.load("exported/ctr")
        model.fit(next_window)
        model.export_serving("exported/ctr-2", base="exported/ctr")
        predictor.apply_delta("exported/ctr-2")
        ```
        """
        from reckeras.serving.export import export_serving

        if not isinstance(self, FunctionalGraph):
            raise NotImplementedError("export_serving() traces a functional model's graph; a "
                                      "subclassed rk.Model has none: build the model with "
                                      "rk.Model(inputs, outputs) to export it")
        return export_serving(self, fed_layers(self), path, rows, min_count, base)
