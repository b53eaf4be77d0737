"""Retrieval losses over a score matrix of queries against candidates.

Every loss here reads `scores[i, j]`, the affinity of query `i` with
candidate `j` (a `[B, N]` matrix, `N >= B`: the batch's own candidates,
maybe gathered from every rank, then sampled negatives), and
`positive_index[i]`, the column of row `i`'s positive. The other columns
are its negatives, but for accidental hits (`accidental_hits`): a
candidate with the positive's id, which would push the positive against
itself. Each loss returns one value per row; a model averages them.
"""

from __future__ import annotations

import numbers
from typing import Any

import torch
import torch.nn.functional as functional


def accidental_hits(positive_ids: torch.Tensor, candidate_ids: torch.Tensor,
                    positive_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Where a candidate is row `i`'s positive item but not its positive column.

    The pairs are found through the sorted candidate ids (no `[B, N]`
    comparison): a batch holds few of them, and the losses mask only those.

    Args:
        positive_ids: int64 `[B]`, the id of each row's positive.
        candidate_ids: int64 `[N]`, the id of each candidate column.
        positive_index: int64 `[B]`, the column of each row's positive.

    Returns:
        `(rows, columns)`, int64 `[H]` each: the pairs with
        `candidate_ids[columns[k]] == positive_ids[rows[k]]` and
        `columns[k] != positive_index[rows[k]]` (the cells the losses leave
        out), rows ascending, columns ascending within a row.

    Example:

    ```python
    rows, columns = accidental_hits(torch.tensor([7, 8]), torch.tensor([7, 8, 7]),
                                    torch.tensor([0, 1]))
    # rows [0], columns [2]
    ```
    """
    order = torch.argsort(candidate_ids, stable=True)
    ordered = candidate_ids[order]
    first = torch.searchsorted(ordered, positive_ids)
    counts = torch.searchsorted(ordered, positive_ids, right=True) - first
    device = positive_ids.device
    rows = torch.repeat_interleave(torch.arange(positive_ids.shape[0], device=device),
                                   counts)
    # Pair k is the (k - run start)-th of its row's run of equal ids.
    run_starts = torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
    within = torch.arange(rows.shape[0], device=device) - run_starts
    columns = order[first[rows] + within]
    keep = columns != positive_index[rows]
    return rows[keep], columns[keep]


def _hit_pairs(hits):
    """Checks `hits` is `accidental_hits`'s `(rows, columns)` pair."""
    if not (isinstance(hits, tuple) and len(hits) == 2
            and all(isinstance(h, torch.Tensor) and h.ndim == 1 and not h.is_floating_point()
                    and h.dtype != torch.bool for h in hits)):
        raise ValueError(f"hits must be the (rows, columns) int tensors accidental_hits "
                         f"returns, got {type(hits).__name__}")
    return hits


def _negatives(scores, positive_index, hits):
    """bool `[B, N]`: the columns that count as row `i`'s negatives."""
    negatives = torch.ones_like(scores, dtype=torch.bool)
    negatives[torch.arange(scores.shape[0], device=scores.device), positive_index] = False
    if hits is not None:
        negatives[_hit_pairs(hits)] = False
    return negatives


def _positive_scores(scores, positive_index):
    return scores.gather(1, positive_index[:, None])[:, 0]


class _SoftmaxCrossEntropy(torch.autograd.Function):
    """`-log softmax(scores / t - log_q, hits left out)[positive]` per row,
    its gradient from the saved softmax: one `[B, N]` pass for the logits,
    the softmax, one pass back (the plain composition scales, shifts, masks
    and takes a log-softmax, then differentiates each step, with an `exp`
    of the log-probabilities that costs more than the softmax itself)."""

    @staticmethod
    def forward(ctx, scores, positive_index, temperature, log_q, hit_rows, hit_columns):
        if log_q is None:
            logits = scores * (1.0 / temperature)
        else:
            per_column = log_q[None, :] if log_q.ndim == 1 else log_q
            logits = torch.add(per_column.to(scores.dtype).neg(), scores,
                               alpha=1.0 / temperature)
        logits[hit_rows, hit_columns] = torch.finfo(logits.dtype).min
        positive = logits.gather(1, positive_index[:, None])
        probabilities = torch.softmax(logits, dim=1)
        # log sum exp = top - log p(top): the top's probability is >= 1 / N,
        # so this is exact where -log p(positive) could underflow. (amax:
        # `max` with its indices is several times slower on CPU.)
        log_sum_exp = logits.amax(dim=1, keepdim=True) \
            - probabilities.amax(dim=1, keepdim=True).log()
        ctx.save_for_backward(probabilities, positive_index)
        ctx.temperature = temperature
        ctx.log_q_per_column = log_q is not None and log_q.ndim == 1
        return (log_sum_exp - positive)[:, 0]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_rows):
        probabilities, positive_index = ctx.saved_tensors
        # d row_i / d logit_ij = p_ij - [j is i's positive]; a hit's p is
        # exactly 0, so its gradient is too.
        scale = (grad_rows / ctx.temperature)[:, None]
        grad_scores = probabilities * scale
        grad_scores.scatter_add_(1, positive_index[:, None], scale.neg())
        grad_log_q = None
        if ctx.needs_input_grad[3]:
            grad_log_q = grad_scores.mul(-ctx.temperature)
            if ctx.log_q_per_column:
                grad_log_q = grad_log_q.sum(0)
        return grad_scores, None, None, grad_log_q, None, None


def sampled_softmax_loss(scores: torch.Tensor, positive_index: torch.Tensor,
                         temperature: float = 1.0, log_q: torch.Tensor | None = None,
                         hits: tuple[torch.Tensor, torch.Tensor] | None = None
                         ) -> torch.Tensor:
    """Softmax cross-entropy of each row's positive among its candidates.

    The logits are `scores / temperature - log_q[j]` (the logQ correction
    of Yi et al. 2019: a candidate sampled often is a negative often, and
    its logit is lowered by its log sampling probability, the positive's
    as well), with accidental hits left out of the softmax.

    Args:
        scores: float `[B, N]`.
        positive_index: int64 `[B]`, the column of each row's positive.
        temperature: divides the scores (`> 0`).
        log_q: float `[N]`, each candidate's log sampling probability
            (or `[B, N]`, one per cell, where a column's candidate differs
            by row), or None for no correction.
        hits: `(rows, columns)` from `accidental_hits`, or None.

    Returns:
        float `[B]`: `-log softmax(logits)[i, positive_index[i]]`.

    Example:

    ```python
    scores = query @ candidates.T                       # [B, B]
    loss = sampled_softmax_loss(scores, torch.arange(B), temperature=0.05).mean()
    ```
    """
    empty = torch.zeros(0, dtype=torch.int64, device=scores.device)
    hit_rows, hit_columns = (empty, empty) if hits is None else _hit_pairs(hits)
    return _SoftmaxCrossEntropy.apply(scores, positive_index, float(temperature), log_q,
                                      hit_rows, hit_columns)


def bpr_loss(scores: torch.Tensor, positive_index: torch.Tensor,
             hits: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Bayesian personalized ranking (Rendle et al. 2009) over each row's negatives.

    Args:
        scores: float `[B, N]`.
        positive_index: int64 `[B]`, the column of each row's positive.
        hits: `(rows, columns)` from `accidental_hits`, or None.

    Returns:
        float `[B]`: the mean over row `i`'s negatives `j` of
        `-log sigmoid(scores[i, pos] - scores[i, j])` (0 for a row
        without negatives).

    Example:

    ```python
    loss = bpr_loss(query @ candidates.T, torch.arange(B)).mean()
    ```
    """
    negatives = _negatives(scores, positive_index, hits)
    margins = _positive_scores(scores, positive_index)[:, None] - scores
    pairs = functional.softplus(-margins) * negatives
    return pairs.sum(dim=1) / negatives.sum(dim=1).clamp(min=1)


def cosine_contrastive_loss(scores: torch.Tensor, positive_index: torch.Tensor,
                            margin: float = 0.0, negative_weight: float = 1.0,
                            hits: tuple[torch.Tensor, torch.Tensor] | None = None
                            ) -> torch.Tensor:
    """SimpleX's cosine contrastive loss (Mao et al., CIKM 2021).

    `scores` are cosine similarities (dot products of L2-normalized
    embeddings): the positive is pulled to 1, and each negative above
    `margin` is pushed down, the negatives' mean weighted by
    `negative_weight`.

    Args:
        scores: float `[B, N]` cosines.
        positive_index: int64 `[B]`, the column of each row's positive.
        margin: negatives with a cosine at or below it cost nothing.
        negative_weight: weight of the negatives' mean term.
        hits: `(rows, columns)` from `accidental_hits`, or None.

    Returns:
        float `[B]`: `(1 - cos_pos) + negative_weight * mean_j relu(cos_j -
        margin)` over row `i`'s negatives `j`.

    Example:

    ```python
    loss = cosine_contrastive_loss(query @ candidates.T, torch.arange(B),
                                   margin=0.8, negative_weight=150.0).mean()
    ```
    """
    negatives = _negatives(scores, positive_index, hits)
    pushed = torch.relu(scores - margin) * negatives
    mean_negative = pushed.sum(dim=1) / negatives.sum(dim=1).clamp(min=1)
    return 1.0 - _positive_scores(scores, positive_index) + negative_weight * mean_negative


LOSSES = ("softmax", "bpr", "cosine_contrastive")


def check_loss_options(owner: str, loss: Any, temperature: Any, margin: Any,
                       negative_weight: Any) -> None:
    """Checks a retrieval loss's name and options, naming `owner`.

    Args:
        owner: who is checking, for the messages (`"two_tower"`).
        loss: one of `LOSSES`.
        temperature: a number `> 0`.
        margin: a number in `[-1, 1)`.
        negative_weight: a number `>= 0`.

    Raises:
        ValueError: for an unknown loss or an option out of its range.

    Example:

    ```python
    check_loss_options("two_tower", "softmax", 0.05, 0.0, 1.0)
    ```
    """
    if loss not in LOSSES:
        raise ValueError(f"{owner}: loss must be one of {LOSSES}, got {loss!r}")

    def number(value):
        return isinstance(value, numbers.Real) and not isinstance(value, bool)

    if not number(temperature) or not float(temperature) > 0:
        raise ValueError(f"{owner}: temperature must be a number > 0, got {temperature!r}")
    if not number(margin) or not -1.0 <= float(margin) < 1.0:
        raise ValueError(f"{owner}: margin must be a cosine in [-1, 1), got {margin!r}")
    if not number(negative_weight) or not float(negative_weight) >= 0:
        raise ValueError(f"{owner}: negative_weight must be a number >= 0, got "
                         f"{negative_weight!r}")
