"""The three synthetic throughput workloads of DESIGN.md, generated in memory.

* `dlrm`: 13 dense features + 26 one-hot categorical fields (vocabularies
  100k x8, 10k x10, 100 x8), dim 16, bottom MLP 512-256-16, dot interaction,
  top MLP 512-256-1.
* `wide`: 13 dense features + 300 one-hot fields (50k x50, 5k x100,
  100 x150), dim 8, bottom MLP 64-8, concat of the bottom output and all
  embeddings, top MLP 64-1.
* `huge`: as `wide` with 1000 one-hot fields (50k x150, 5k x350,
  100 x500), PICASSO's "up to a thousand feature fields".

Ids follow a Zipf law (exponent 1.1) over each field's vocabulary; the Zipf
ranks go through a fixed random permutation per field so that hot ids are
scattered over the table rather than packed at its start. Labels are drawn
from a hidden teacher (a linear term of the dense features plus one random
effect per id), so the training loss of every system means the same thing.

Every system of the benchmark trains on the same pre-generated batches:

    batches = make_batches(WORKLOADS["wide"], batch_size=2048, num_batches=23)
    table = to_arrow(batches, WORKLOADS["wide"])   # for reckeras's reader

or on the same rows written to parquet files with nulls in the proportions
of real Criteo logs (`null_rates`, `write_parquet`):

    write_parquet(batches, WORKLOADS["wide"], "/tmp/wide", warmup=3)
    # /tmp/wide/warmup/part-00000.parquet, /tmp/wide/timed/part-0000*.parquet
"""

import dataclasses
import os
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

NUM_DENSE = 13
ZIPF_EXPONENT = 1.1
_TEACHER_SEED = 20_261_201
_NULL_SEED = 20_261_205

# Share of nulls in each column of Criteo's day 0 (Criteo 1TB click logs),
# rounded: I1..I13, then C1..C26. Workloads with more fields than Criteo's 26
# cycle the categorical rates (field f takes the rate of C{f % 26 + 1}).
CRITEO_NUMERIC_NULL_RATES = (0.45, 0.0, 0.21, 0.22, 0.03, 0.22, 0.04, 0.0005, 0.04,
                             0.45, 0.04, 0.77, 0.22)
CRITEO_CATEGORICAL_NULL_RATES = (0.0, 0.0, 0.03, 0.03, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
                                 0.0, 0.03, 0.0, 0.0, 0.0, 0.03, 0.0, 0.0, 0.44, 0.44,
                                 0.03, 0.76, 0.0, 0.03, 0.44, 0.44)
# Rows of one parquet file of `write_parquet`, in batches: one row group each
# (pyarrow's writer puts up to 1M rows in a group), several files a run, as
# a day of logs is cut into parts.
BATCHES_PER_FILE = 8


@dataclasses.dataclass(frozen=True)
class Workload:
    """One benchmark model and the shape of its data.

    Args:
        name: `"dlrm"`, `"wide"` or `"huge"`.
        vocabs: vocabulary size of each one-hot categorical field, in field
            order (field `f` is column `C{f+1}`).
        dim: embedding dimension of every field.
        bottom: widths of the bottom MLP on the dense features (ReLU between
            layers and after the last one).
        top: widths of the top MLP; the last is 1, followed by a sigmoid.
        interaction: `"dot"` (pairwise dot products of the bottom output
            and the field embeddings, strictly lower triangle, concatenated
            with the bottom output, as in DLRM) or `"concat"` (the bottom
            output and all field embeddings flattened side by side).
    """

    name: str
    vocabs: tuple
    dim: int
    bottom: tuple
    top: tuple
    interaction: str

    @property
    def num_fields(self):
        return len(self.vocabs)

    @property
    def top_input_width(self):
        """Width of the interaction output that feeds the top MLP."""
        if self.interaction == "dot":
            vectors = self.num_fields + 1
            return self.bottom[-1] + vectors * (vectors - 1) // 2
        return self.bottom[-1] + self.num_fields * self.dim


WORKLOADS = {
    "dlrm": Workload(
        name="dlrm",
        vocabs=(100_000,) * 8 + (10_000,) * 10 + (100,) * 8,
        dim=16,
        bottom=(512, 256, 16),
        top=(512, 256, 1),
        interaction="dot",
    ),
    "wide": Workload(
        name="wide",
        vocabs=(50_000,) * 50 + (5_000,) * 100 + (100,) * 150,
        dim=8,
        bottom=(64, 8),
        top=(64, 1),
        interaction="concat",
    ),
    "huge": Workload(
        name="huge",
        vocabs=(50_000,) * 150 + (5_000,) * 350 + (100,) * 500,
        dim=8,
        bottom=(64, 8),
        top=(64, 1),
        interaction="concat",
    ),
}


class _Teacher:
    """The fixed hidden parts of a workload: id permutations and label model."""

    def __init__(self, workload):
        rng = np.random.default_rng([_TEACHER_SEED, zlib.crc32(workload.name.encode())])
        self.permutations = [rng.permutation(vocab) for vocab in workload.vocabs]
        self.zipf_cdfs = {
            vocab: np.cumsum(np.arange(1, vocab + 1, dtype=np.float64) ** -ZIPF_EXPONENT)
            for vocab in set(workload.vocabs)}
        dense_weights = rng.standard_normal(NUM_DENSE)
        self.dense_weights = dense_weights / np.linalg.norm(dense_weights)
        # Unit-variance total of the id effects whatever the number of fields.
        scale = 1.0 / np.sqrt(workload.num_fields)
        self.id_effects = [scale * rng.standard_normal(vocab) for vocab in workload.vocabs]
        self.bias = -1.0

    def logit(self, dense, ids):
        total = self.bias + 0.5 * dense @ self.dense_weights
        for field, effects in enumerate(self.id_effects):
            total = total + effects[ids[:, field]]
        return total


def _zipf_ids(workload, teacher, rng, rows):
    """[rows, F] int64 ids: Zipf ranks mapped through each field's permutation."""
    ids = np.empty((rows, workload.num_fields), dtype=np.int64)
    vocabs = np.asarray(workload.vocabs)
    # Fields sharing a vocabulary share one CDF: sample them together.
    for vocab in np.unique(vocabs):
        fields = np.flatnonzero(vocabs == vocab)
        cdf = teacher.zipf_cdfs[vocab]
        uniform = rng.random((rows, fields.size)) * cdf[-1]
        ranks = np.minimum(np.searchsorted(cdf, uniform, side="right"), vocab - 1)
        for column, field in enumerate(fields):
            ids[:, field] = teacher.permutations[field][ranks[:, column]]
    return ids


def make_batches(workload, batch_size, num_batches, seed=0):
    """Deterministic training batches of `workload`.

    Args:
        workload: a `Workload` (for example `WORKLOADS["dlrm"]`).
        batch_size: rows per batch.
        num_batches: number of batches.
        seed: row seed. Batch `i` depends only on `(workload, seed, i,
            batch_size)`, so a shorter list is a prefix of a longer one; the
            id permutations and the teacher are fixed per workload.

    Returns:
        A list of `(dense, ids, labels)`: float32 `[B, 13]` standard
        normal features, int64 `[B, F]` ids (`0 <= ids[:, f] <
        vocabs[f]`) and float32 `[B]` 0/1 labels, all C-contiguous.
    """
    teacher = _Teacher(workload)
    return [_batch(workload, teacher, np.random.default_rng([seed, index]), batch_size)
            for index in range(num_batches)]


def _batch(workload, teacher, rng, batch_size):
    dense = rng.standard_normal((batch_size, NUM_DENSE), dtype=np.float32)
    ids = _zipf_ids(workload, teacher, rng, batch_size)
    probability = 1.0 / (1.0 + np.exp(-teacher.logit(dense, ids)))
    labels = (rng.random(batch_size) < probability).astype(np.float32)
    return dense, ids, labels


def to_arrow(batches, workload):
    """All `batches` as one table: `I1..I13` float32, `C1..CF` int64, `label` float32."""
    dense = np.concatenate([batch[0] for batch in batches])
    ids = np.concatenate([batch[1] for batch in batches])
    labels = np.concatenate([batch[2] for batch in batches])
    columns = {f"I{i + 1}": pa.array(dense[:, i]) for i in range(NUM_DENSE)}
    columns.update({f"C{f + 1}": pa.array(ids[:, f]) for f in range(workload.num_fields)})
    columns["label"] = pa.array(labels)
    return pa.table(columns)


def null_rates(workload):
    """Per-column null shares of `write_parquet`'s files.

    Args:
        workload: a `Workload`.

    Returns:
        `(numeric, categorical)`: float tuples of length 13 (`I1..I13`) and
        `workload.num_fields` (`C1..CF`): Criteo's day-0 rates, the
        categorical ones cycled past `C26`.
    """
    rates = CRITEO_CATEGORICAL_NULL_RATES
    return (CRITEO_NUMERIC_NULL_RATES,
            tuple(rates[field % len(rates)] for field in range(workload.num_fields)))


def write_parquet(batches, workload, directory, warmup):
    """Writes `batches` as parquet files with Criteo's share of nulls.

    The rows are those of `to_arrow(batches, workload)`, with each value of
    column `I{i}` or `C{f}` replaced by a null with that column's
    `null_rates` probability (a fixed draw per workload and row count, so
    every system of a run reads the same nulls). The first `warmup` batches
    go to `directory/warmup/`, the others to `directory/timed/`, in files of
    `BATCHES_PER_FILE` batches (`part-00000.parquet`, ...) written with
    pyarrow's defaults, one row group per file.

    Args:
        batches: `make_batches` output, all of one size.
        workload: the `Workload` they belong to.
        directory: where to write (created if missing).
        warmup: how many leading batches go to `warmup/` (at least 1).

    Returns:
        `(warmup_dir, timed_dir)`: the two directories written.
    """
    if not 0 < warmup < len(batches):
        raise ValueError(f"warmup must be in [1, {len(batches) - 1}], got {warmup}")
    table = to_arrow(batches, workload)
    rng = np.random.default_rng([_NULL_SEED, zlib.crc32(workload.name.encode()),
                                 table.num_rows])
    numeric_rates, categorical_rates = null_rates(workload)
    names = [f"I{i + 1}" for i in range(NUM_DENSE)] + [f"C{f + 1}"
                                                        for f in range(workload.num_fields)]
    columns = []
    for name, rate in zip(names, numeric_rates + categorical_rates):
        column = table.column(name).combine_chunks()
        null = rng.random(table.num_rows) < rate
        columns.append(pa.array(column.to_numpy(), mask=null) if null.any() else column)
    columns.append(table.column("label"))
    table = pa.table(columns, names=[*names, "label"])
    batch_size = len(batches[0][2])
    directories = []
    for part, (start, stop) in (("warmup", (0, warmup)), ("timed", (warmup, len(batches)))):
        os.makedirs(os.path.join(directory, part), exist_ok=True)
        for index, first in enumerate(range(start, stop, BATCHES_PER_FILE)):
            rows = table.slice(first * batch_size,
                               (min(first + BATCHES_PER_FILE, stop) - first) * batch_size)
            pq.write_table(rows, os.path.join(directory, part, f"part-{index:05d}.parquet"))
        directories.append(os.path.join(directory, part))
    return tuple(directories)


def quickstart_model(table_options=None, metrics=()):
    """The README quickstart's DLRM on criteo_synth's columns, compiled as
    there (`examples/quickstart.py`), for the benchmarks that train it; as it
    was when their figures were measured: rows at the default scale and no
    embedding penalty (the quickstart now sets `init_scale=0.05` and
    `L2(1e-4)`, docs/quickstart.md).

    Args:
        table_options: `ShardedEmbedding`'s `table_options` (None: defaults).
        metrics: `compile`'s metrics.

    Returns:
        The compiled `rk.Model`.
    """
    import reckeras as rk  # first: selects Keras's torch backend

    import keras
    columns = rk.layers.FeatureColumns(
        [rk.features.Numeric(f"I{i}", transform="log1p") for i in range(1, 14)]
        + [rk.features.Categorical(f"C{i}", dim=16) for i in range(1, 27)])
    inputs = columns.inputs()
    dense, sparse = columns(inputs)
    emb = rk.layers.ShardedEmbedding(columns, table_options=table_options)(sparse)
    x = rk.layers.MLP([512, 256, 16])(dense)
    z = rk.layers.DotInteraction()([x, emb])
    out = rk.layers.MLP([512, 256, 1], output_activation="sigmoid")(z)
    model = rk.Model(inputs, out)
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.05),
                  loss="binary_crossentropy", metrics=list(metrics))
    return model
