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
"""

import dataclasses
import zlib

import numpy as np
import pyarrow as pa

NUM_DENSE = 13
ZIPF_EXPONENT = 1.1
_TEACHER_SEED = 20_261_201


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


def quickstart_model(table_options=None, metrics=()):
    """The README quickstart's DLRM on criteo_synth's columns, compiled as
    there (`examples/quickstart.py`), for the benchmarks that train it.

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
