"""The systems reckeras is measured against, on the workloads of `workloads.py`.

Each baseline trains one workload's model on the same pre-generated batches
(`workloads.make_batches`), one step per batch in order, and returns a
`Measurement`: examples/s over the steps after `warmup` (total examples
of the timed steps / their total `time.perf_counter` seconds) and the mean
training loss of those steps.

What makes them fair baselines:

* Same model everywhere: one `dim`-wide sum-pooled embedding per field
  initialised uniform in [-0.05, 0.05], the workload's bottom MLP (ReLU after
  every layer), its interaction, its top MLP ending in a sigmoid,
  binary cross-entropy; dense layers Glorot-uniform with zero biases (Keras's
  defaults, applied to the torch models too).
* Same optimizer family: Adagrad (learning rate 0.01) for the dense and the
  embedding weights, each system using its own idiomatic Adagrad (sparse
  gradients in plain PyTorch, fused into the backward pass in TorchRec,
  Keras's optimizer in plain Keras).
* Same inputs and the same per-step work a user of each system pays: the
  timed loop starts from the numpy batches, so turning them into tensors
  (and, for TorchRec, into a `KeyedJaggedTensor`) is timed too.
* Same threads: every baseline runs with `torch.set_num_threads(THREADS)`.

Each baseline also runs its dense-only floor (`floor=True`): the same model and
training loop with the embeddings replaced by a constant tensor of their
shape (`[B, F, dim]`, fixed values from the embedding initializer): no
lookup, no sparse optimizer, no id input, the same dense forward and
backward. A system's step time minus its floor's is what its sparse path
costs. `ConstantEmbeddings` is that tensor as a Keras layer, for the
Keras models (plain Keras's and reckeras's floors).

Run `python benchmarks/baselines.py [dlrm] [wide] [huge]` to print
`<workload> <system> examples_per_s=<n>` lines at batch 2048, and the same
for each floor (`<system>_floor`). Every system runs in this one process
here; `throughput.py` gives each its own.
"""

import argparse
import dataclasses
import os
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from workloads import NUM_DENSE, WORKLOADS, make_batches

os.environ["KERAS_BACKEND"] = "torch"   # before keras is imported anywhere

import keras  # noqa: E402

THREADS = 2
LEARNING_RATE = 0.01
EMBEDDING_INIT_RANGE = 0.05
BATCH_SIZE = 2048
# (warmup steps, timed steps) per workload for the command-line run.
STEPS = {"dlrm": (5, 30), "wide": (3, 20), "huge": (3, 10)}


@dataclasses.dataclass(frozen=True)
class Measurement:
    """Throughput of one baseline on one workload.

    Attributes:
        examples_per_s: examples of the timed steps / their wall-clock seconds.
        loss: mean training loss over the timed steps.
    """

    examples_per_s: float
    loss: float


def _synchronize(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _timed_steps(batches, warmup, train_step, device="cpu"):
    """Runs `train_step(batch) -> loss tensor` on every batch, timing the last ones
    (on a GPU, up to the end of their kernels)."""
    if not 0 < warmup < len(batches):
        raise ValueError(f"warmup must be in [1, {len(batches) - 1}], got {warmup}")
    for batch in batches[:warmup]:
        train_step(batch)
    loss_sum = torch.zeros((), device=device)
    _synchronize(device)
    start = time.perf_counter()
    for batch in batches[warmup:]:
        loss_sum += train_step(batch)
    _synchronize(device)
    seconds = time.perf_counter() - start
    timed = batches[warmup:]
    examples = sum(len(labels) for _, _, labels in timed)
    return Measurement(examples / seconds, loss_sum.item() / len(timed))


def _mlp(in_width, widths, relu_after_last):
    layers = []
    for index, width in enumerate(widths):
        linear = nn.Linear(in_width, width)
        nn.init.xavier_uniform_(linear.weight)
        nn.init.zeros_(linear.bias)
        layers.append(linear)
        if relu_after_last or index < len(widths) - 1:
            layers.append(nn.ReLU())
        in_width = width
    return nn.Sequential(*layers)


class _DenseArch(nn.Module):
    """Bottom MLP, interaction and top MLP of a workload; returns logits [B]."""

    def __init__(self, workload):
        super().__init__()
        self.interaction = workload.interaction
        self.bottom = _mlp(NUM_DENSE, workload.bottom, relu_after_last=True)
        self.top = _mlp(workload.top_input_width, workload.top, relu_after_last=False)
        rows, cols = torch.tril_indices(workload.num_fields + 1, workload.num_fields + 1,
                                        offset=-1)
        self.register_buffer("pair_rows", rows, persistent=False)
        self.register_buffer("pair_cols", cols, persistent=False)

    def forward(self, dense, embeddings):
        """`dense` [B, 13], `embeddings` [B, F, dim] -> logits [B]."""
        bottom = self.bottom(dense)
        if self.interaction == "dot":
            vectors = torch.cat([bottom.unsqueeze(1), embeddings], dim=1)
            gram = torch.bmm(vectors, vectors.transpose(1, 2))
            features = torch.cat([bottom, gram[:, self.pair_rows, self.pair_cols]], dim=1)
        else:
            features = torch.cat([bottom, embeddings.flatten(1)], dim=1)
        return self.top(features).squeeze(1)


class _PerFieldModel(nn.Module):
    def __init__(self, workload):
        super().__init__()
        self.tables = nn.ModuleList(
            nn.EmbeddingBag(vocab, workload.dim, mode="sum", sparse=True)
            for vocab in workload.vocabs)
        for table in self.tables:
            nn.init.uniform_(table.weight, -EMBEDDING_INIT_RANGE, EMBEDDING_INIT_RANGE)
        self.dense_arch = _DenseArch(workload)

    def forward(self, dense, ids):
        embeddings = torch.stack(
            [table(ids[:, field:field + 1]) for field, table in enumerate(self.tables)], dim=1)
        return self.dense_arch(dense, embeddings)


class _FloorModel(nn.Module):
    """The dense part of a workload's model on constant embeddings."""

    def __init__(self, workload):
        super().__init__()
        self.register_buffer("embeddings", torch.empty(workload.num_fields, workload.dim)
                             .uniform_(-EMBEDDING_INIT_RANGE, EMBEDDING_INIT_RANGE))
        self.dense_arch = _DenseArch(workload)

    def forward(self, dense):
        return self.dense_arch(dense, self.embeddings.expand(len(dense), -1, -1))


def _dense_floor_step(model, optimizer, device="cpu"):
    """A train step of a `_FloorModel` (or its DMP wrapper): no ids, one optimizer."""
    def train_step(batch):
        dense, _, labels = batch
        loss = F.binary_cross_entropy_with_logits(
            model(torch.from_numpy(dense).to(device)), torch.from_numpy(labels).to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.detach()
    return train_step


def plain_pytorch(workload, batches, warmup, floor=False, device="cpu"):
    """Plain PyTorch: one `nn.EmbeddingBag(sparse=True)` per field.

    What a PyTorch user writes without a recommender library: a Python loop
    over the fields' own tables, `torch.optim.Adagrad` on the sparse
    embedding gradients (only the rows of the batch are updated) and a second
    `Adagrad` on the dense weights.

    Args:
        workload: a `workloads.Workload`.
        batches: `workloads.make_batches` output for it.
        warmup: untimed leading steps (at least 1).
        floor: train the dense-only floor instead: the same dense network
            and dense `Adagrad` on constant embeddings (no tables, no ids).
        device: where the model and its steps run; each batch is copied
            there from the host, as a user's loop does.

    Returns:
        A `Measurement`.
    """
    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    if floor:
        model = _FloorModel(workload).to(device)
        optimizer = torch.optim.Adagrad(model.parameters(), lr=LEARNING_RATE)
        return _timed_steps(batches, warmup, _dense_floor_step(model, optimizer, device),
                            device)
    model = _PerFieldModel(workload).to(device)
    dense_optimizer = torch.optim.Adagrad(model.dense_arch.parameters(), lr=LEARNING_RATE)
    sparse_optimizer = torch.optim.Adagrad(model.tables.parameters(), lr=LEARNING_RATE)

    def train_step(batch):
        dense, ids, labels = (torch.from_numpy(array).to(device) for array in batch)
        loss = F.binary_cross_entropy_with_logits(model(dense, ids), labels)
        dense_optimizer.zero_grad(set_to_none=True)
        sparse_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        dense_optimizer.step()
        sparse_optimizer.step()
        return loss.detach()

    return _timed_steps(batches, warmup, train_step, device)


def plain_keras(workload, batches, warmup, floor=False):
    """Plain Keras 3 on the torch backend: one `keras.layers.Embedding` per field.

    What a Keras user writes without a recommender library: a functional
    model with a dense input and an ids input whose columns feed one
    `Embedding` layer each, `Dense` layers, the interaction in
    `keras.ops`, `keras.optimizers.Adagrad` for every weight (Keras
    updates whole embedding tables: it has no sparse gradients) and
    `model.fit` on numpy arrays. One `fit` call runs all batches in
    order (`shuffle=False`); a callback times the steps after `warmup`,
    from the end of step `warmup - 1` to the end of the last one, so the
    input slicing Keras does for those steps is timed and the one-off
    tracing of the first steps is not.

    Args:
        workload: a `workloads.Workload`.
        batches: `workloads.make_batches` output for it, all of one size.
        warmup: untimed leading steps (at least 1).
        floor: train the dense-only floor instead: the ids input and the
            `Embedding` layers replaced by `ConstantEmbeddings`.

    Returns:
        A `Measurement`.
    """
    if keras.backend.backend() != "torch":
        raise RuntimeError(f"plain_keras needs Keras's torch backend, got "
                           f"{keras.backend.backend()!r}: import keras after this module")
    if not 0 < warmup < len(batches):
        raise ValueError(f"warmup must be in [1, {len(batches) - 1}], got {warmup}")
    torch.set_num_threads(THREADS)
    keras.utils.set_random_seed(0)
    model = _keras_model(workload, floor)
    model.compile(optimizer=keras.optimizers.Adagrad(LEARNING_RATE),
                  loss="binary_crossentropy")

    class StepTimer(keras.callbacks.Callback):
        # Keras logs the running mean of the loss over the epoch's steps.
        def on_train_batch_end(self, batch, logs=None):
            if batch == warmup - 1:
                self.start, self.mean_loss_at_start = time.perf_counter(), float(logs["loss"])
            self.end, self.mean_loss_at_end = time.perf_counter(), float(logs["loss"])

    timer = StepTimer()
    batch_size = len(batches[0][2])
    inputs = {"dense_features": np.concatenate([batch[0] for batch in batches])}
    if not floor:
        inputs["ids"] = np.concatenate([batch[1] for batch in batches])
    model.fit(inputs, np.concatenate([batch[2] for batch in batches])[:, None],
              batch_size=batch_size, epochs=1, shuffle=False, verbose=0,
              callbacks=[timer])
    timed_steps = len(batches) - warmup
    timed_loss = (timer.mean_loss_at_end * len(batches)
                  - timer.mean_loss_at_start * warmup) / timed_steps
    return Measurement(timed_steps * batch_size / (timer.end - timer.start), timed_loss)


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
    bottom = dense_input
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
            [layers.Embedding(vocab, workload.dim, embeddings_initializer=initializer)(
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


class _TorchRecModel(nn.Module):
    def __init__(self, workload, embedding_bags):
        super().__init__()
        self.embedding_bags = embedding_bags
        self.embedding_shape = (workload.num_fields, workload.dim)
        self.dense_arch = _DenseArch(workload)

    def forward(self, dense, features):
        # One pooled vector per field, concatenated in the collection's key order.
        pooled = self.embedding_bags(features).values()
        return self.dense_arch(dense, pooled.view(-1, *self.embedding_shape))


def torchrec(workload, batches, warmup, floor=False):
    """TorchRec: a sharded `EmbeddingBagCollection` with Adagrad fused into backward.

    How TorchRec is used for training on CPU: one `EmbeddingBagConfig` per
    field in an `EmbeddingBagCollection` built on the meta device,
    `apply_optimizer_in_backward(torch.optim.Adagrad)` on it, and
    `DistributedModelParallel` on a one-rank gloo group (created here, and
    destroyed afterwards, unless one exists), whose planner shards the tables
    into fbgemm's batched embedding kernels (tables of one dim share one
    kernel) that apply exact Adagrad during the backward pass. Inputs are
    `KeyedJaggedTensor` s of length-1 bags; the dense weights (in DDP) use
    `torch.optim.Adagrad`. `TrainPipelineSparseDist` needs CUDA streams,
    so the steps run one after another.

    Args:
        workload: a `workloads.Workload`.
        batches: `workloads.make_batches` output for it, all of one size.
        warmup: untimed leading steps (at least 1).
        floor: train the dense-only floor instead: the same dense network on
            constant embeddings, in `DistributedModelParallel` (so in DDP,
            as TorchRec runs the dense part) with the same `Adagrad`.

    Returns:
        A `Measurement`, or None (after printing why) when TorchRec (the
        `bench` extra) is not importable.
    """
    try:
        from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
        from torchrec.distributed import DistributedModelParallel
        from torchrec.distributed.embedding_types import EmbeddingComputeKernel
        from torchrec.distributed.planner import (EmbeddingShardingPlanner,
                                                  ParameterConstraints, Topology)
        from torchrec.distributed.sharding_plan import get_default_sharders
        from torchrec.distributed.types import ShardingType
        from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
        from torchrec.optim.keyed import KeyedOptimizerWrapper
        from torchrec.optim.optimizers import in_backward_optimizer_filter
    except ImportError as error:
        print(f"{workload.name} torchrec skipped: cannot import torchrec ({error}); "
              f"install it: bash scripts/install_bench.sh")
        return None
    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    owns_group = not dist.is_initialized()
    if owns_group:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        if floor:
            model = DistributedModelParallel(_FloorModel(workload), device=torch.device("cpu"))
            optimizer = KeyedOptimizerWrapper(
                dict(model.named_parameters()),
                lambda params: torch.optim.Adagrad(params, lr=LEARNING_RATE))
            return _timed_steps(batches, warmup, _dense_floor_step(model, optimizer))
        keys = [f"C{field + 1}" for field in range(workload.num_fields)]
        embedding_bags = EmbeddingBagCollection(
            tables=[EmbeddingBagConfig(name=f"table_{key}", num_embeddings=vocab,
                                       embedding_dim=workload.dim, feature_names=[key],
                                       weight_init_min=-EMBEDDING_INIT_RANGE,
                                       weight_init_max=EMBEDDING_INIT_RANGE)
                    for key, vocab in zip(keys, workload.vocabs)],
            device=torch.device("meta"))
        apply_optimizer_in_backward(torch.optim.Adagrad, embedding_bags.parameters(),
                                    {"lr": LEARNING_RATE})
        model = _TorchRecModel(workload, embedding_bags)
        # Left to itself the one-rank planner replicates tables (data parallel:
        # dense gradients through DDP); table-wise sharding keeps fbgemm's
        # fused kernels and their in-backward optimizer.
        fused_table_wise = ParameterConstraints(
            sharding_types=[ShardingType.TABLE_WISE.value],
            compute_kernels=[EmbeddingComputeKernel.FUSED.value])
        planner = EmbeddingShardingPlanner(
            topology=Topology(world_size=dist.get_world_size(), compute_device="cpu"),
            batch_size=len(batches[0][2]), debug=False,
            constraints={f"table_{key}": fused_table_wise for key in keys})
        sharders = get_default_sharders()
        model = DistributedModelParallel(
            model, device=torch.device("cpu"), sharders=sharders,
            plan=planner.collective_plan(model, sharders, dist.GroupMember.WORLD))
        dense_optimizer = KeyedOptimizerWrapper(
            dict(in_backward_optimizer_filter(model.named_parameters())),
            lambda params: torch.optim.Adagrad(params, lr=LEARNING_RATE))
        lengths = torch.ones(workload.num_fields * len(batches[0][2]), dtype=torch.int32)

        def train_step(batch):
            dense, ids, labels = (torch.from_numpy(array) for array in batch)
            features = KeyedJaggedTensor.from_lengths_sync(
                keys=keys, values=ids.t().contiguous().view(-1), lengths=lengths)
            loss = F.binary_cross_entropy_with_logits(model(dense, features), labels)
            dense_optimizer.zero_grad(set_to_none=True)
            loss.backward()      # also applies the fused Adagrad to the embedding rows
            dense_optimizer.step()
            return loss.detach()

        return _timed_steps(batches, warmup, train_step)
    finally:
        if owns_group:
            dist.destroy_process_group()


# Each takes (workload, batches, warmup, floor=False) and returns a Measurement.
BASELINES = {"pytorch": plain_pytorch, "keras": plain_keras, "torchrec": torchrec}


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
        batches = make_batches(workload, BATCH_SIZE, warmup + timed)
        for system, baseline in BASELINES.items():
            for floor in (False, True):
                measurement = baseline(workload, batches, warmup, floor=floor)
                if measurement is not None:
                    print(f"{name} {system}{'_floor' if floor else ''} "
                          f"examples_per_s={measurement.examples_per_s:.0f}", flush=True)


if __name__ == "__main__":
    main()
