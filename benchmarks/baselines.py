"""The systems reckeras is measured against, on the workloads of `workloads.py`.

Each baseline trains one workload's model on the batches of a feed
(`feeds.MemoryFeed`: pre-generated batches in memory; `feeds.ParquetFeed`:
the same rows read from parquet files with nulls), one step per batch in
order, and returns a `Measurement`: examples/s over the timed steps (total
examples of the timed steps / their total `time.perf_counter` seconds) and
the mean training loss of those steps.

What makes them fair baselines:

* Same model everywhere: `sign(x) * log1p(|x|)` of the numeric features (as
  reckeras's `Numeric(transform="log1p")`), one `dim`-wide sum-pooled
  embedding per field initialised uniform in [-0.05, 0.05], the workload's
  bottom MLP (ReLU after every layer), its interaction, its top MLP ending in
  a sigmoid, binary cross-entropy; dense layers Glorot-uniform with zero
  biases (Keras's defaults, applied to the torch models too). The baselines'
  tables have one row more than the field's vocabulary: the id a null
  becomes (`feeds`).
* Same optimizer family: Adagrad (learning rate 0.01) for the dense and the
  embedding weights, each system using its own idiomatic Adagrad (sparse
  gradients in plain PyTorch, fused into the backward pass in TorchRec,
  Keras's optimizer in plain Keras).
* Same inputs and the same per-step work a user of each system pays: the
  timed loop starts from the feed's numpy batches (and from the files with
  `ParquetFeed`: reading and filling nulls are timed), so turning them into
  tensors (and, for TorchRec, into a `KeyedJaggedTensor`) is timed too.
* Same threads: every baseline runs with `torch.set_num_threads(THREADS)`.

Two plain PyTorch configurations are measured (`plain_pytorch`: one
`nn.EmbeddingBag` per field; `plain_pytorch_concat`: every field's rows in
one table at per-field row offsets), and the TorchRec ones of
`torchrec_baselines.py`.

Each baseline also runs its dense-only floor (`floor=True`): the same model and
training loop with the embeddings replaced by a constant tensor of their
shape (`[B, F, dim]`, fixed values from the embedding initializer): no
lookup, no sparse optimizer, no id input, the same dense forward and
backward. A system's step time minus its floor's is what its sparse path
costs. `ConstantEmbeddings` is that tensor as a Keras layer, for the
Keras models (plain Keras's and reckeras's floors).

Run `python benchmarks/baselines.py [dlrm] [wide] [huge]` to print
`<workload> <system> examples_per_s=<n>` lines at batch 2048 on in-memory
batches, and the same for each floor (`<system>_floor`). Every system runs
in this one process here; `throughput.py` gives each its own.
"""

import argparse
import functools
import itertools
import os
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import torchrec_baselines
from baseline_parts import (BATCH_SIZE, EMBEDDING_INIT_RANGE, LEARNING_RATE, STEPS, THREADS,
                            DenseArch, FloorModel, Measurement, dense_floor_step,
                            timed_steps)
from feeds import MemoryFeed
from workloads import NUM_DENSE, WORKLOADS, make_batches

os.environ["KERAS_BACKEND"] = "torch"   # before keras is imported anywhere

import keras  # noqa: E402

class _PerFieldModel(nn.Module):
    def __init__(self, workload):
        super().__init__()
        self.tables = nn.ModuleList(
            nn.EmbeddingBag(vocab + 1, workload.dim, mode="sum", sparse=True)
            for vocab in workload.vocabs)
        for table in self.tables:
            nn.init.uniform_(table.weight, -EMBEDDING_INIT_RANGE, EMBEDDING_INIT_RANGE)
        self.dense_arch = DenseArch(workload)

    def forward(self, dense, ids):
        """`ids`: int64 [F, B], field-major."""
        embeddings = torch.stack(
            [table(ids[field].view(-1, 1)) for field, table in enumerate(self.tables)], dim=1)
        return self.dense_arch(dense, embeddings)


class _ConcatenatedModel(nn.Module):
    """Every field's rows in one table, field `f`'s at rows `row_offsets[f]`
    onwards; one lookup of `B * F` single-id bags a step."""

    def __init__(self, workload):
        super().__init__()
        rows = [vocab + 1 for vocab in workload.vocabs]
        self.table = nn.EmbeddingBag(sum(rows), workload.dim, mode="sum", sparse=True)
        nn.init.uniform_(self.table.weight, -EMBEDDING_INIT_RANGE, EMBEDDING_INIT_RANGE)
        starts = torch.tensor([0, *rows[:-1]], dtype=torch.int64).cumsum(0)
        self.register_buffer("row_offsets", starts.view(1, -1), persistent=False)
        self.embedding_shape = (workload.num_fields, workload.dim)
        self.dense_arch = DenseArch(workload)

    def forward(self, dense, ids):
        """`ids`: int64 [F, B], field-major; looked up batch-major, so the
        pooled rows are already `[B, F, dim]`."""
        rows = (ids.t() + self.row_offsets).reshape(-1, 1)
        return self.dense_arch(dense, self.table(rows).view(-1, *self.embedding_shape))


def _sparse_adagrad_baseline(model_class, workload, feed, floor, device):
    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    if floor:
        model = FloorModel(workload).to(device)
        optimizer = torch.optim.Adagrad(model.parameters(), lr=LEARNING_RATE)
        return timed_steps(feed, dense_floor_step(model, optimizer, device), device)
    model = model_class(workload).to(device)
    dense_optimizer = torch.optim.Adagrad(model.dense_arch.parameters(), lr=LEARNING_RATE)
    sparse_parameters = [parameter for name, parameter in model.named_parameters()
                         if not name.startswith("dense_arch.")]
    sparse_optimizer = torch.optim.Adagrad(sparse_parameters, lr=LEARNING_RATE)

    def train_step(batch):
        dense, ids, labels = (torch.from_numpy(array).to(device) for array in batch)
        loss = F.binary_cross_entropy_with_logits(model(dense, ids), labels)
        dense_optimizer.zero_grad(set_to_none=True)
        sparse_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        dense_optimizer.step()
        sparse_optimizer.step()
        return loss.detach()

    return timed_steps(feed, train_step, device)


def plain_pytorch(workload, feed, floor=False, device="cpu"):
    """Plain PyTorch: one `nn.EmbeddingBag(sparse=True)` per field.

    What a PyTorch user writes without a recommender library: a Python loop
    over the fields' own tables, `torch.optim.Adagrad` on the sparse
    embedding gradients (only the rows of the batch are updated) and a second
    `Adagrad` on the dense weights.

    Args:
        workload: a `workloads.Workload`.
        feed: a `feeds.MemoryFeed` or `feeds.ParquetFeed` of its batches.
        floor: train the dense-only floor instead: the same dense network
            and dense `Adagrad` on constant embeddings (no tables, no ids).
        device: where the model and its steps run; each batch is copied
            there from the host, as a user's loop does.

    Returns:
        A `Measurement`.
    """
    return _sparse_adagrad_baseline(_PerFieldModel, workload, feed, floor, device)


def plain_pytorch_concat(workload, feed, floor=False, device="cpu"):
    """Plain PyTorch with one concatenated table: every field's rows in one
    `nn.EmbeddingBag(sparse=True)`, field `f`'s ids shifted by its row offset,
    one lookup and one sparse `torch.optim.Adagrad` update a step (no Python
    loop over the fields), dense weights on a second `Adagrad`.

    Args:
        workload: a `workloads.Workload`.
        feed: a `feeds.MemoryFeed` or `feeds.ParquetFeed` of its batches.
        floor: train the dense-only floor instead (the same as `plain_pytorch`'s).
        device: where the model and its steps run.

    Returns:
        A `Measurement`.
    """
    return _sparse_adagrad_baseline(_ConcatenatedModel, workload, feed, floor, device)


def plain_keras(workload, feed, floor=False):
    """Plain Keras 3 on the torch backend: one `keras.layers.Embedding` per field.

    What a Keras user writes without a recommender library: a functional
    model with a dense input and an ids input whose columns feed one
    `Embedding` layer each, `Dense` layers, the interaction in
    `keras.ops`, `keras.optimizers.Adagrad` for every weight (Keras
    updates whole embedding tables: it has no sparse gradients) and
    `model.fit` on a generator of the feed's batches (`ids` batch-major,
    as the model's input). One `fit` call runs all batches in order; a
    callback times the steps after the warmup ones, from the end of the
    last warmup step to the end of the last one, so the reading and input
    conversion of those steps are timed and the one-off tracing of the first
    steps is not.

    Args:
        workload: a `workloads.Workload`.
        feed: a `feeds.MemoryFeed` or `feeds.ParquetFeed` of its batches.
        floor: train the dense-only floor instead: the ids input and the
            `Embedding` layers replaced by `ConstantEmbeddings`.

    Returns:
        A `Measurement`.
    """
    if keras.backend.backend() != "torch":
        raise RuntimeError(f"plain_keras needs Keras's torch backend, got "
                           f"{keras.backend.backend()!r}: import keras after this module")
    torch.set_num_threads(THREADS)
    keras.utils.set_random_seed(0)
    model = _keras_model(workload, floor)
    model.compile(optimizer=keras.optimizers.Adagrad(LEARNING_RATE),
                  loss="binary_crossentropy")
    warmup = feed.warmup_steps

    class StepTimer(keras.callbacks.Callback):
        # Keras logs the running mean of the loss over the epoch's steps.
        def on_train_batch_end(self, batch, logs=None):
            if batch == warmup - 1:
                self.start, self.mean_loss_at_start = time.perf_counter(), float(logs["loss"])
            self.end, self.steps = time.perf_counter(), batch + 1
            self.mean_loss_at_end = float(logs["loss"])

    def inputs_and_labels():
        for dense, ids, labels in itertools.chain(feed.warmup(), feed.timed()):
            inputs = {"dense_features": dense}
            if not floor:
                inputs["ids"] = ids.T
            yield inputs, labels[:, None]

    timer = StepTimer()
    model.fit(inputs_and_labels(), epochs=1, shuffle=False, verbose=0, callbacks=[timer])
    timed_steps = timer.steps - warmup
    timed_loss = (timer.mean_loss_at_end * timer.steps
                  - timer.mean_loss_at_start * warmup) / timed_steps
    return Measurement(timed_steps * feed.batch_size / (timer.end - timer.start), timed_loss)


class ConstantEmbeddings(keras.layers.Layer):
    """Constant embeddings of a workload's shape, for the dense-only floors.

    Stands in for a model's embedding lookup: returns the same non-trainable
    `[fields, dim]` values (drawn once from the benchmark's embedding
    initializer) for every example, so the dense network after it does the
    work it does on looked-up embeddings, without ids, tables or a sparse
    optimizer.

    Args:
        fields: number of embedded fields.
        dim: embedding dimension.
        flatten: return `[B, fields * dim]` (a concatenated lookup) instead
            of `[B, fields, dim]` (a stacked one).
        **kwargs: `keras.layers.Layer` arguments.

    Call arguments:
        batch_source: any tensor whose first axis is the batch; only its
            length is used.

    Example:

    ```python
    dense = keras.Input((13,))
    embedded = ConstantEmbeddings(fields=26, dim=16)(dense)    # [B, 26, 16]
    ```
    """

    def __init__(self, fields: int, dim: int, flatten: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.fields, self.dim, self.flatten = fields, dim, flatten

    def build(self, input_shape):
        self.constant = self.add_weight(
            shape=(self.fields, self.dim), trainable=False, name="constant",
            initializer=keras.initializers.RandomUniform(
                -EMBEDDING_INIT_RANGE, EMBEDDING_INIT_RANGE, seed=0))

    def call(self, batch_source):
        batch = keras.ops.shape(batch_source)[0]
        values = keras.ops.broadcast_to(self.constant, (batch, self.fields, self.dim))
        return keras.ops.reshape(values, (batch, -1)) if self.flatten else values

    def compute_output_shape(self, input_shape):
        if self.flatten:
            return (input_shape[0], self.fields * self.dim)
        return (input_shape[0], self.fields, self.dim)


def _keras_model(workload, floor):
    ops, layers = keras.ops, keras.layers
    dense_input = keras.Input((NUM_DENSE,), name="dense_features")
    inputs = {"dense_features": dense_input}
    bottom = ops.sign(dense_input) * ops.log1p(ops.abs(dense_input))
    for width in workload.bottom:
        bottom = layers.Dense(width, activation="relu")(bottom)
    if floor:
        embeddings = ConstantEmbeddings(workload.num_fields, workload.dim)(dense_input)
    else:
        inputs["ids"] = ids_input = keras.Input((workload.num_fields,), dtype="int64",
                                                name="ids")
        initializer = keras.initializers.RandomUniform(-EMBEDDING_INIT_RANGE,
                                                       EMBEDDING_INIT_RANGE)
        embeddings = ops.stack(
            [layers.Embedding(vocab + 1, workload.dim, embeddings_initializer=initializer)(
                ids_input[:, field]) for field, vocab in enumerate(workload.vocabs)], axis=1)
    if workload.interaction == "dot":
        vectors = ops.concatenate([ops.expand_dims(bottom, 1), embeddings], axis=1)
        gram = ops.matmul(vectors, ops.transpose(vectors, (0, 2, 1)))
        count = workload.num_fields + 1
        rows, cols = np.tril_indices(count, k=-1)
        pairs = ops.take(ops.reshape(gram, (-1, count * count)), rows * count + cols, axis=1)
        features = ops.concatenate([bottom, pairs], axis=1)
    else:
        features = ops.concatenate(
            [bottom, ops.reshape(embeddings, (-1, workload.num_fields * workload.dim))], axis=1)
    for width in workload.top[:-1]:
        features = layers.Dense(width, activation="relu")(features)
    output = layers.Dense(workload.top[-1], activation="sigmoid")(features)
    return keras.Model(inputs, output)


# Every baseline configuration by its system name; each takes
# (workload, feed, floor=False) and returns a Measurement (None: not installed).
BASELINES = {
    "plain_pytorch_per_field": plain_pytorch,
    "plain_pytorch_concat": plain_pytorch_concat,
    "plain_keras": plain_keras,
    **{name: functools.partial(torchrec_baselines.torchrec, name)
       for name in torchrec_baselines.CONFIGURATIONS},
}
# The configurations of one baseline family: each workload's comparison is
# with the fastest of them.
FAMILIES = {"torchrec": list(torchrec_baselines.CONFIGURATIONS),
            "plain_pytorch": ["plain_pytorch_per_field", "plain_pytorch_concat"],
            "plain_keras": ["plain_keras"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workloads", nargs="*", metavar="WORKLOAD",
                        help=f"any of {', '.join(WORKLOADS)} (default: all)")
    names = parser.parse_args().workloads or list(WORKLOADS)
    unknown = sorted(set(names) - set(WORKLOADS))
    if unknown:
        parser.error(f"unknown workloads {unknown}; choose from {list(WORKLOADS)}")
    for name in names:
        warmup, timed = STEPS[name]
        workload = WORKLOADS[name]
        feed = MemoryFeed(make_batches(workload, BATCH_SIZE, warmup + timed), warmup)
        for system, baseline in BASELINES.items():
            for floor in (False, True):
                measurement = baseline(workload, feed, floor=floor)
                if measurement is not None:
                    print(f"{name} {system}{'_floor' if floor else ''} "
                          f"examples_per_s={measurement.examples_per_s:.0f}", flush=True)


if __name__ == "__main__":
    main()
