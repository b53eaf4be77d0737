"""Candidates gathered from every rank: each rank's loss sees the global batch.

Under torchrun each rank holds a slice of the batch. Gathering every rank's
candidate embeddings (with their ids and log q) gives each query the
negatives of the whole global batch, as on one rank. Autograd flows back
to each rank's own slice: the gradient a rank receives for its candidates
is the sum of what every rank's loss sends them. `rk.Model` averages the
dense gradients over the ranks, so the step equals one rank's over the
concatenated batch (the world-size invariance the tests check).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from reckeras import distributed


def _gather_rows(tensor: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """Every rank's `tensor` (rows `sizes[r]` on rank r), concatenated in rank order."""
    longest = max(sizes)
    padded = torch.zeros((longest, *tensor.shape[1:]), dtype=tensor.dtype,
                         device=tensor.device)
    padded[:tensor.shape[0]] = tensor
    parts = [torch.empty_like(padded) for _ in sizes]
    with distributed.collective("gathering retrieval candidates"):
        dist.all_gather(parts, padded)
    return torch.cat([part[:size] for part, size in zip(parts, sizes, strict=True)])


class _GatherWithGradient(torch.autograd.Function):
    """All-gather of rows whose backward sums the gradients to their owner."""

    @staticmethod
    def forward(context: Any, tensor: torch.Tensor, sizes: list[int],
                rank: int) -> torch.Tensor:
        context.sizes, context.rank = sizes, rank
        return _gather_rows(tensor, sizes)

    @staticmethod
    def backward(context: Any, gradient: torch.Tensor) -> tuple:
        gradient = gradient.contiguous()
        with distributed.collective("summing retrieval candidates' gradients"):
            dist.all_reduce(gradient)
        start = sum(context.sizes[:context.rank])
        return gradient[start:start + context.sizes[context.rank]], None, None


def gather_candidates(embeddings: torch.Tensor, ids: torch.Tensor,
                      log_q: torch.Tensor | None) -> tuple:
    """Every rank's candidates, in rank order; a no-op on one rank.

    Every rank must call it in the same step; the ranks' row counts may
    differ (a last, shorter batch).

    Args:
        embeddings: float `[n, D]`, this rank's candidate embeddings (the
            gradient of the gathered rows flows back to them, summed over
            the ranks' losses).
        ids: int64 `[n]`, their ids.
        log_q: float `[n]`, their log sampling probabilities, or None.

    Returns:
        `(embeddings [N, D], ids [N], log_q [N] or None, offset)`: the
        global candidates, and where this rank's rows start in them.

    Raises:
        PeerFailureError: a peer did not take part.

    Example:

    ```python
    candidates, ids, log_q, offset = gather_candidates(local, local_ids, local_log_q)
    scores = query @ candidates.T          # positives at offset + arange(n)
    ```
    """
    world = distributed.world()
    if world.size == 1:
        return embeddings, ids, log_q, 0
    count = torch.tensor([embeddings.shape[0]], device=embeddings.device)
    counts = [torch.empty_like(count) for _ in range(world.size)]
    with distributed.collective("gathering retrieval candidate counts"):
        dist.all_gather(counts, count)
    sizes = [int(c.item()) for c in counts]
    gathered = _GatherWithGradient.apply(embeddings, sizes, world.rank)
    gathered_ids = _gather_rows(ids, sizes)
    gathered_log_q = None if log_q is None else _gather_rows(log_q.detach(), sizes)
    return gathered, gathered_ids, gathered_log_q, sum(sizes[:world.rank])
