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
                    positive_index: torch.Tensor) -> torch.Tensor:
    """Where a candidate is row `i`'s positive item but not its positive column.

    Args:
        positive_ids: int64 `[B]`, the id of each row's positive.
        candidate_ids: int64 `[N]`, the id of each candidate column.
        positive_index: int64 `[B]`, the column of each row's positive.

    Returns:
        bool `[B, N]`: True where `candidate_ids[j] == positive_ids[i]` and
        `j != positive_index[i]` (columns the losses leave out).

    Example:

    ```python
    hits = accidental_hits(torch.tensor([7, 8]), torch.tensor([7, 8, 7]),
                           torch.tensor([0, 1]))
    # [[False, False, True], [False, False, False]]
    ```
    """
    same = positive_ids[:, None] == candidate_ids[None, :]
    columns = torch.arange(candidate_ids.shape[0], device=candidate_ids.device)
    return same & (columns[None, :] != positive_index[:, None])


def _negatives(scores, positive_index, hits):
    """bool `[B, N]`: the columns that count as row `i`'s negatives."""
    columns = torch.arange(scores.shape[1], device=scores.device)
    negatives = columns[None, :] != positive_index[:, None]
    return negatives if hits is None else negatives & ~hits


def _positive_scores(scores, positive_index):
    return scores.gather(1, positive_index[:, None])[:, 0]


def sampled_softmax_loss(scores: torch.Tensor, positive_index: torch.Tensor,
                         temperature: float = 1.0, log_q: torch.Tensor | None = None,
                         hits: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax cross-entropy of each row's positive among its candidates.

    The logits are `scores / temperature - log_q[j]` (the logQ correction
    of Yi et al. 2019: a candidate sampled often is a negative often, and
    its logit is lowered by its log sampling probability, the positive's
    as well), with accidental hits left out of the softmax.

    Args:
        scores: float `[B, N]`.
        positive_index: int64 `[B]`, the column of each row's positive.
        temperature: divides the scores (`> 0`).
        log_q: float `[N]`, each candidate's log sampling probability, or
            None for no correction.
        hits: bool `[B, N]` from `accidental_hits`, or None.

    Returns:
        float `[B]`: `-log softmax(logits)[i, positive_index[i]]`.

    Example:

    ```python
    scores = query @ candidates.T                       # [B, B]
    loss = sampled_softmax_loss(scores, torch.arange(B), temperature=0.05).mean()
    ```
    """
    logits = scores / temperature
    if log_q is not None:
        logits = logits - log_q[None, :].to(logits.dtype)
    if hits is not None:
        logits = logits.masked_fill(hits, torch.finfo(logits.dtype).min)
    return functional.cross_entropy(logits, positive_index, reduction="none")


def bpr_loss(scores: torch.Tensor, positive_index: torch.Tensor,
             hits: torch.Tensor | None = None) -> torch.Tensor:
    """Bayesian personalized ranking (Rendle et al. 2009) over each row's negatives.

    Args:
        scores: float `[B, N]`.
        positive_index: int64 `[B]`, the column of each row's positive.
        hits: bool `[B, N]` from `accidental_hits`, or None.

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
                            hits: torch.Tensor | None = None) -> torch.Tensor:
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
        hits: bool `[B, N]` from `accidental_hits`, or None.

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
