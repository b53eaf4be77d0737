"""`Dataset`: a re-iterable, shardable stream of fixed-size record batches.

A dataset reads through a *source* that splits its files into *units*: a
parquet row group, or a whole ORC, CSV or TSV file. A unit is the smallest piece that can
be read without reading the ones before it, so shuffling permutes units and
sharding cuts the unit sequence into balanced row ranges; only a unit that
straddles a cut is read (partly) by two shards.

A source has `files` (list of paths), `schema` (pyarrow.Schema),
`unit_rows()` (rows per unit, in storage order; the first call may drop
files found bad), `read_unit(unit, start, stop, columns)` (an iterator of
tables holding rows [start, stop) of that unit, or fewer when the unit fails
while read and is skipped) and `bad_files` (its `_files.BadFiles`: the
`on_bad_file` policy and the files skipped).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from reckeras.datasets._files import SkippedFile
from reckeras.datasets._stats import roc_auc
from reckeras.datasets._windows import WindowSource, window_units

# Rows mixed by one in-memory permutation when shuffling: large enough to
# mix many row groups, small enough (about 100 MB for Criteo-like rows) to
# stay in memory.
_SHUFFLE_WINDOW_ROWS = 262_144

LABEL = "label"
TEACHER_PROB = "teacher_prob"


class Dataset:
    """Labelled rows in files, streamed as fixed-size pyarrow record batches.

    Make one with `load`, `generate`, `from_parquet`, `from_orc`, `from_csv`
    or `criteo_tsv` rather than directly. Iterating is cheap to restart:
    every `batches` call opens the files afresh, so one `Dataset` serves
    every epoch and every reader.

    Args:
        source: the reader of the underlying files (see the module docstring).
        name: a short name used in messages, e.g. "criteo_synth:train".
        metadata: a dict describing the data.
        label: the name of the label column; `label` is None (no labels, as
            for data to predict on) when the schema has no such column.
        partition: for a window (`windows`), its partition values
            `{key: value}`; None for a whole dataset.

    Example:

    ```python
    train = rk.datasets.load("criteo_synth", split="train")
    batch = next(train.batches(4096, shuffle=True, seed=1))
    batch.num_rows   # 4096
    ```
    """

    def __init__(self, source: Any, name: str, metadata: dict[str, Any],
                 label: str = LABEL, partition: dict[str, Any] | None = None):
        self._source = source
        self.name = name
        self.metadata = metadata
        self._label_column = label
        self.label = label if label in source.schema.names else None
        self.partition = partition

    def __repr__(self) -> str:
        # The source's list as it stands: a repr must not count text rows.
        return (f"Dataset({self.name!r}, files={len(self._source.files)}, "
                f"columns={len(self.schema)})")

    @property
    def files(self) -> list[str]:
        """The paths read, in storage order, without those skipped when opened.

        For CSV and Criteo TSV data this counts the rows first (one pass over
        the text, done once), since that pass finds bad files.
        """
        self._source.unit_rows()
        return list(self._source.files)

    @property
    def skipped_files(self) -> list[SkippedFile]:
        """The files a reader with `on_bad_file="skip"` skipped, and why.

        Each is a `SkippedFile` with `path`, `reason` (the error, naming the
        file and the row group, stripe or line where known) and `when`:
        "open" (left out of `files` before sharding) or "read" (failed while
        read, in any pass so far; listed once per file and reason). Always
        empty under `on_bad_file="raise"`. Like `files`, it counts the rows
        of text files first.
        """
        self._source.unit_rows()
        return list(self._source.bad_files.skipped)

    @property
    def schema(self) -> pa.Schema:
        """The `pyarrow.Schema` of every batch (before column selection)."""
        return self._source.schema

    @property
    def num_rows(self) -> int:
        """Total number of rows (may need one pass over text files)."""
        return int(sum(self._source.unit_rows()))

    def _shard_range(self, shard_index: int, num_shards: int) -> tuple[int, int]:
        if not isinstance(num_shards, int) or num_shards < 1:
            raise ValueError(f"num_shards must be a positive int, got {num_shards!r}")
        if not isinstance(shard_index, int) or not 0 <= shard_index < num_shards:
            raise ValueError(
                f"shard_index must be an int in [0, {num_shards}), got "
                f"{shard_index!r}")
        total = self.num_rows
        return (total * shard_index // num_shards,
                total * (shard_index + 1) // num_shards)

    def num_batches(self, batch_size: int, drop_remainder: bool = False,
                    shard_index: int = 0, num_shards: int = 1) -> int:
        """Number of batches that `batches` yields with the same arguments.

        Args:
            batch_size: rows per batch.
            drop_remainder: whether the last, smaller batch is dropped.
            shard_index: which shard, in [0, num_shards).
            num_shards: number of disjoint shards the rows are split into.

        Returns:
            The batch count of that shard (shuffling does not change it).

        Example:

        ```python
        train = rk.datasets.load("criteo_synth", split="train")
        train.num_batches(4096, drop_remainder=True)   # 48
        ```
        """
        _check_batch_size(batch_size)
        start, stop = self._shard_range(shard_index, num_shards)
        rows = stop - start
        return rows // batch_size if drop_remainder else -(-rows // batch_size)

    def batches(self, batch_size: int, *, shuffle: bool = False, seed: int = 0,
                drop_remainder: bool = False,
                columns: str | Sequence[str] | None = None, shard_index: int = 0,
                num_shards: int = 1) -> Iterator[pa.RecordBatch]:
        """Streams the rows as `pyarrow.RecordBatch`es of `batch_size` rows.

        Shards are balanced contiguous row ranges of the (possibly shuffled)
        unit order: every shard gets `num_rows // num_shards` or one more row,
        shards are disjoint, and together they hold every row once. With the
        same `seed` all shards agree on the unit order, so they stay disjoint
        when shuffled; change `seed` every epoch for a fresh order.

        A shard that loses rows to a file skipped while read
        (`on_bad_file="skip"`) makes them up with the rows after its range
        (wrapping around to the first shard's, never its own), so that it
        still yields `num_batches` batches and ranks stay in step; those
        rows are read twice in the pass.

        Args:
            batch_size: rows per batch; only the last batch may be smaller.
            shuffle: whether to permute the order of row groups (and files),
                then the rows within windows of about 262k rows.
            seed: seed of the shuffle; the same seed gives the same order.
            drop_remainder: whether to drop a last batch smaller than
                `batch_size`.
            columns: names of the columns to read (or one name); all when
                `None`.
            shard_index: which shard to read, in [0, num_shards).
            num_shards: number of disjoint shards the rows are split into.

        Returns:
            An iterator of `pyarrow.RecordBatch`.

        Raises:
            ValueError: for a bad batch size or shard, or an unknown column.

        Example:

        ```python
        train = rk.datasets.load("criteo_synth", split="train")
        world = rk.distributed.world()
        for epoch in range(2):
            for batch in train.batches(4096, shuffle=True, seed=epoch,
                                       shard_index=world.rank,
                                       num_shards=world.size):
                labels = batch.column("label")
        ```
        """
        _check_batch_size(batch_size)
        if columns is not None:
            columns = [columns] if isinstance(columns, str) else list(columns)
            unknown = [c for c in columns if c not in self.schema.names]
            if unknown:
                raise ValueError(
                    f"{self.name}: unknown columns {unknown}; the columns are "
                    f"{self.schema.names}")
        start, stop = self._shard_range(shard_index, num_shards)
        pieces = self._read_shard(start, stop, self._unit_order(shuffle, seed),
                                  columns)
        if shuffle:
            window_rng = np.random.default_rng([seed, shard_index])
            pieces = _window_shuffle(pieces, window_rng)
        return _rebatch(pieces, batch_size, drop_remainder)

    def _unit_order(self, shuffle: bool, seed: int) -> np.ndarray:
        units = len(self._source.unit_rows())
        if shuffle:
            return np.random.default_rng(seed).permutation(units)
        return np.arange(units)

    def _read_shard(self, start: int, stop: int, order: np.ndarray,
                    columns: list[str] | None) -> Iterator[pa.Table]:
        """Rows [start, stop) of `order`, rows lost to skipped files made up."""
        failures = self._source.bad_files.read_failures
        missing = stop - start
        for table in self._read_range(start, stop, order, columns):
            missing -= table.num_rows
            yield table
        if self._source.bad_files.read_failures == failures:
            return
        # Rows after the shard, then (wrapping around) before it: only other
        # shards' rows, so a single shard never repeats a row.
        for position, end in ((stop, self.num_rows), (0, start)):
            while missing > 0 and position < end:
                chunk_stop = min(end, position + missing)
                for table in self._read_range(position, chunk_stop, order,
                                              columns):
                    missing -= table.num_rows
                    yield table
                position = chunk_stop

    def _read_range(self, start: int, stop: int, order: np.ndarray,
                    columns: list[str] | None) -> Iterator[pa.Table]:
        unit_rows = self._source.unit_rows()
        offset = 0
        for unit in order:
            rows = unit_rows[unit]
            lo, hi = max(start - offset, 0), min(stop - offset, rows)
            offset += rows
            if lo < hi:
                yield from self._source.read_unit(int(unit), lo, hi, columns)
            if offset >= stop:
                return

    def to_table(self) -> pa.Table:
        """Reads every row into one `pyarrow.Table`.

        Returns:
            A table with `schema`, rows in storage order.

        Example:

        ```python
        test = rk.datasets.load("criteo_synth", split="test")
        labels = test.to_table()["label"].to_numpy()
        ```
        """
        pieces = list(self._read_range(0, self.num_rows,
                                       self._unit_order(False, 0), None))
        if not pieces:
            return self.schema.empty_table()
        return pa.concat_tables(pieces)

    def windows(self, by: str | Sequence[str]) -> list[Dataset]:
        """One dataset per value of partition keys, ordered by that value.

        For data in time partitions, e.g. `logs/dt=2026-12-01/hour=03/
        part-0.parquet` read with `partitioning="hive"` (the readers'
        default): `windows("dt")` gives one dataset per day,
        `windows(["dt", "hour"])` one per hour. Windows are ordered by the
        partition values as typed by the partitioning: strings (ISO dates)
        lexicographically, integers (pyarrow reads `hour=03` as the int 3)
        numerically, the first key most significant. Within a window the
        rows keep their storage order. The list depends only on the paths,
        so every rank that lists the same files gets the same windows.

        Each window is a `Dataset` like any other (batches, shuffling,
        sharding, `num_rows`, `bayes_auc`) with its partition values in
        `partition` and a name such as `"logs[dt=2026-12-01]"`; its
        `metadata` is this dataset's, updated with the description in its
        first file's footer (for `criteo_stream`, that day's).

        Args:
            by: a partition key, or keys from most to least significant.

        Returns:
            The windows, in order; a partition value without rows has none.

        Raises:
            ValueError: when the data has no partition columns, a key is
                not one of them, or a file has no (or a null) value of a key
                (naming the file).

        Example:

        ```python
        logs = rk.datasets.from_parquet("/data/logs")   # logs/dt=*/hour=*
        for window in logs.windows(["dt", "hour"]):
            window.partition   # {"dt": "2026-12-01", "hour": 0}, ...
        days = logs.windows("dt")
        recent = [day for day in days if day.partition["dt"] >= "2026-12-05"]
        ```
        """
        keys = [by] if isinstance(by, str) else list(by)
        result = []
        for partition, units in window_units(self._source, keys, self.name):
            source = WindowSource(self._source, units)
            where = "/".join(f"{key}={value}" for key, value in partition.items())
            metadata = {**self.metadata, **source.unit_description(0)}
            result.append(Dataset(source, f"{self.name}[{where}]", metadata,
                                  self._label_column, partition))
        return result

    def bayes_auc(self) -> float:
        """Exact ROC AUC of the hidden teacher's probability on these rows.

        This is the best AUC any model can reach on these rows in
        expectation, since labels were drawn from `teacher_prob`.

        Returns:
            The AUC of column `teacher_prob` against `label`, ties counted
            as one half.

        Raises:
            ValueError: when the dataset has no `teacher_prob` column.

        Example:

        ```python
        test = rk.datasets.load("criteo_synth", split="test")
        round(test.bayes_auc(), 3)   # 0.847
        ```
        """
        if TEACHER_PROB not in self.schema.names:
            raise ValueError(
                f"dataset {self.name!r} has no {TEACHER_PROB!r} column, so its "
                f"Bayes-optimal AUC is unknown; only synthetic datasets carry it")
        pieces = self._read_range(0, self.num_rows, self._unit_order(False, 0),
                                  [LABEL, TEACHER_PROB])
        table = pa.concat_tables(pieces)
        return roc_auc(table[LABEL].to_numpy(), table[TEACHER_PROB].to_numpy())

    def teacher_recall(self, k: int) -> float:
        """The hidden teacher's Recall@k on these held-out interactions.

        For a retrieval dataset made by a known teacher (`retrieval_synth`'s
        `valid` and `test` splits): the teacher ranks every candidate by its
        own score, each user's train items left out, and its top `k` is
        scored against the user's items in this split with
        `rk.metrics.RecallAtK`'s definition. This is the retrieval analogue
        of `bayes_auc`: the Recall@k a perfect model reaches in expectation.

        Args:
            k: the cut-off; the values stored are listed in the error for
                any other.

        Returns:
            The mean over users of (held-out items in the teacher's top k) /
            (the user's held-out items).

        Raises:
            ValueError: when the dataset carries no teacher recall, or not
                for this `k`.

        Example:

        ```python
        test = rk.datasets.load("retrieval_synth", split="test")
        test.teacher_recall(20)
        ```
        """
        stored = self.metadata.get("teacher_recall")
        if not stored:
            raise ValueError(
                f"dataset {self.name!r} carries no teacher recall; only the held-out "
                f"splits of synthetic retrieval data (retrieval_synth's 'valid' and "
                f"'test') do")
        if str(k) not in stored:
            raise ValueError(f"dataset {self.name!r} stores the teacher's recall for "
                             f"k in {sorted(map(int, stored))}, not {k!r}")
        return float(stored[str(k)])


def _check_batch_size(batch_size: Any) -> None:
    if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")


def rows_of(batches: Iterable[pa.RecordBatch], start: int,
            stop: int) -> Iterator[pa.Table]:
    """Rows [start, stop) of a stream of record batches, read no further.

    Args:
        batches: the batches of one unit, in order.
        start: the first row wanted.
        stop: one past the last row wanted.

    Returns:
        An iterator of tables holding those rows, in order.

    Example:

    ```python
    from reckeras.datasets._dataset import rows_of

    batches = pa.table({"x": range(10)}).to_batches(max_chunksize=4)
    [t.num_rows for t in rows_of(batches, 3, 9)]   # [1, 4, 1]
    ```
    """
    offset = 0
    for batch in batches:
        lo, hi = max(start - offset, 0), min(stop - offset, batch.num_rows)
        offset += batch.num_rows
        if lo < hi:
            yield pa.Table.from_batches([batch.slice(lo, hi - lo)])
        if offset >= stop:
            return


def _window_shuffle(pieces: Iterable[pa.Table],
                    rng: np.random.Generator) -> Iterator[pa.Table]:
    """Permutes rows within consecutive windows of `_SHUFFLE_WINDOW_ROWS` rows."""
    window, window_rows = [], 0
    for piece in pieces:
        window.append(piece)
        window_rows += piece.num_rows
        if window_rows >= _SHUFFLE_WINDOW_ROWS:
            yield _permuted(window, rng)
            window, window_rows = [], 0
    if window_rows:
        yield _permuted(window, rng)


def _permuted(tables: list[pa.Table], rng: np.random.Generator) -> pa.Table:
    table = pa.concat_tables(tables)
    return table.take(rng.permutation(table.num_rows))


def _rebatch(pieces: Iterable[pa.Table], batch_size: int,
             drop_remainder: bool) -> Iterator[pa.RecordBatch]:
    """Regroups a stream of tables into record batches of `batch_size` rows."""
    pending, pending_rows = [], 0
    for piece in pieces:
        if piece.num_rows == 0:
            continue
        pending.append(piece)
        pending_rows += piece.num_rows
        if pending_rows < batch_size:
            continue
        # One contiguous copy per piece; every batch is then a zero-copy slice.
        merged = _single_batch(pending)
        full = pending_rows - pending_rows % batch_size
        for start in range(0, full, batch_size):
            yield merged.slice(start, batch_size)
        rest = merged.slice(full)
        pending = [pa.Table.from_batches([rest])] if rest.num_rows else []
        pending_rows = rest.num_rows
    if pending_rows and not drop_remainder:
        yield _single_batch(pending)


def _single_batch(tables: list[pa.Table]) -> pa.RecordBatch:
    # combine_chunks leaves one chunk per column, hence exactly one batch.
    return pa.concat_tables(tables).combine_chunks().to_batches()[0]
