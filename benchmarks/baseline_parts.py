"""What every baseline of `baselines.py` and `torchrec_baselines.py` shares:
the dense network of a workload's model, its dense-only floor, and the
timed training loop over a feed (`feeds`)."""

import dataclasses
import time

import torch
import torch.nn.functional as F
from torch import nn

from workloads import NUM_DENSE

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


def timed_steps(feed, train_step, device="cpu"):
    """Runs `train_step(batch) -> loss tensor` on the feed's warmup batches, then
    times it on its timed ones, reading included (on a GPU, up to the end of
    their kernels).

    Returns:
        A `Measurement`.
    """
    for batch in feed.warmup():
        train_step(batch)
    loss_sum = torch.zeros((), device=device)
    steps = examples = 0
    _synchronize(device)
    start = time.perf_counter()
    for batch in feed.timed():
        loss_sum += train_step(batch)
        steps += 1
        examples += len(batch[2])
    _synchronize(device)
    seconds = time.perf_counter() - start
    return Measurement(examples / seconds, loss_sum.item() / steps)


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


class DenseArch(nn.Module):
    """`sign(x) * log1p(|x|)` of the numeric features, bottom MLP, interaction
    and top MLP of a workload; returns logits [B]."""

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
        bottom = self.bottom(torch.sign(dense) * torch.log1p(dense.abs()))
        if self.interaction == "dot":
            vectors = torch.cat([bottom.unsqueeze(1), embeddings], dim=1)
            gram = torch.bmm(vectors, vectors.transpose(1, 2))
            features = torch.cat([bottom, gram[:, self.pair_rows, self.pair_cols]], dim=1)
        else:
            features = torch.cat([bottom, embeddings.flatten(1)], dim=1)
        return self.top(features).squeeze(1)


class FloorModel(nn.Module):
    """The dense part of a workload's model on constant embeddings."""

    def __init__(self, workload):
        super().__init__()
        self.register_buffer("embeddings", torch.empty(workload.num_fields, workload.dim)
                             .uniform_(-EMBEDDING_INIT_RANGE, EMBEDDING_INIT_RANGE))
        self.dense_arch = DenseArch(workload)

    def forward(self, dense):
        return self.dense_arch(dense, self.embeddings.expand(len(dense), -1, -1))


def dense_floor_step(model, optimizer, device="cpu"):
    """A train step of a `FloorModel` (or its DMP wrapper): no ids, one optimizer."""
    def train_step(batch):
        dense, _, labels = batch
        loss = F.binary_cross_entropy_with_logits(
            model(torch.from_numpy(dense).to(device)), torch.from_numpy(labels).to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.detach()
    return train_step


