"""What the baselines' training loops read: the same batches, from memory or
from parquet files with nulls.

A feed yields each batch as numpy arrays `(dense, ids, labels)`:

* `dense`: float32 `[B, 13]`, the numeric columns `I1..I13`, a null as 0
  (the models then apply `sign(x) * log1p(|x|)`, as reckeras's
  `Numeric(transform="log1p")` does after filling a missing value with 0);
* `ids`: int64 `[F, B]`, field-major (one row per field `C1..CF`, as
  columnar data holds them and as TorchRec's `KeyedJaggedTensor` lays out its
  values), a null as the field's reserved id `vocab` (one past its last id:
  the baselines' tables have `vocab + 1` rows; reckeras gives a null an
  empty bag instead);
* `labels`: float32 `[B]`.

`MemoryFeed` holds `workloads.make_batches` output (null-free, turned
field-major once, untimed). `ParquetFeed` reads `workloads.write_parquet`'s
files with `pyarrow.parquet` as a baseline's user does: each file opened in
turn, `iter_batches` of the batch size, nulls filled column by column; the
reading happens while the loop consumes the batches, so a baseline's timed
steps include it.

    feed = ParquetFeed("/tmp/wide", WORKLOADS["wide"], batch_size=2048)
    for dense, ids, labels in feed.timed():
        ...
"""

import glob
import os

import numpy as np
import pyarrow.parquet as pq

from workloads import NUM_DENSE


class MemoryFeed:
    """In-memory batches, the first `warmup` of them untimed.

    Args:
        batches: `workloads.make_batches` output (`ids` batch-major `[B, F]`).
        warmup: leading batches `warmup()` yields (at least 1, fewer than all).

    Attributes:
        batch_size: rows of a batch.
        warmup_steps: batches `warmup()` yields.
    """

    source = "memory"

    def __init__(self, batches, warmup):
        if not 0 < warmup < len(batches):
            raise ValueError(f"warmup must be in [1, {len(batches) - 1}], got {warmup}")
        self._batches = [(dense, np.ascontiguousarray(ids.T), labels)
                         for dense, ids, labels in batches]
        self._warmup = warmup
        self.batch_size = len(batches[0][2])
        self.warmup_steps = warmup

    def warmup(self):
        """The untimed leading batches."""
        return iter(self._batches[:self._warmup])

    def timed(self):
        """The batches after the warmup."""
        return iter(self._batches[self._warmup:])


class ParquetFeed:
    """Batches read from `workloads.write_parquet`'s directory.

    Args:
        directory: the directory `write_parquet` wrote (its `warmup/` and
            `timed/` parts).
        workload: the `workloads.Workload` of the files.
        batch_size: rows per batch (the files hold whole batches).

    Attributes:
        batch_size: rows of a batch.
        warmup_steps: batches `warmup()` yields (from the files' footers).
    """

    source = "parquet"

    def __init__(self, directory, workload, batch_size):
        self.directory = directory
        self.batch_size = batch_size
        self.reserved_ids = list(workload.vocabs)
        self._dense_names = [f"I{i + 1}" for i in range(NUM_DENSE)]
        self._id_names = [f"C{f + 1}" for f in range(workload.num_fields)]
        warmup_rows = sum(pq.read_metadata(path).num_rows for path in self._paths("warmup"))
        self.warmup_steps = -(-warmup_rows // batch_size)

    def _paths(self, part):
        paths = sorted(glob.glob(os.path.join(self.directory, part, "*.parquet")))
        if not paths:
            raise FileNotFoundError(f"no parquet files in {os.path.join(self.directory, part)}")
        return paths

    def warmup(self):
        """Batches of the `warmup/` files."""
        return self._read("warmup")

    def timed(self):
        """Batches of the `timed/` files, read and converted as they are consumed."""
        return self._read("timed")

    def _read(self, part):
        for path in self._paths(part):
            for record_batch in pq.ParquetFile(path).iter_batches(batch_size=self.batch_size):
                yield self._convert(record_batch)

    def _convert(self, record_batch):
        rows = record_batch.num_rows
        dense = np.empty((rows, NUM_DENSE), dtype=np.float32)
        for index, name in enumerate(self._dense_names):
            dense[:, index] = record_batch.column(name).fill_null(0.0).to_numpy()
        ids = np.empty((len(self._id_names), rows), dtype=np.int64)
        for field, (name, reserved) in enumerate(zip(self._id_names, self.reserved_ids)):
            ids[field] = record_batch.column(name).fill_null(reserved).to_numpy()
        return dense, ids, record_batch.column("label").to_numpy(zero_copy_only=False, writable=True)
