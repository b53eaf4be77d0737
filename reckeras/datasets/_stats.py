"""Exact ROC AUC, kept private: the metrics package has the training-time one."""

from __future__ import annotations

from typing import Any

import numpy as np


def roc_auc(labels: Any, scores: Any) -> float:
    """Exact ROC AUC via the Mann-Whitney rank sum; ties get average ranks.

    Args:
        labels: 1-D array of 0/1 labels.
        scores: 1-D array of scores, same length; higher means more positive.

    Returns:
        The probability that a random positive outscores a random negative,
        counting ties as one half.

    Raises:
        ValueError: on mismatched shapes, labels other than 0/1, NaN scores,
            or when one of the classes is absent.

    Example:

    ```python
    from reckeras.datasets._stats import roc_auc

    roc_auc([0, 1, 1, 0], [0.1, 0.8, 0.4, 0.4])   # 0.875
    ```
    """
    labels = np.asarray(labels)
    scores = np.asarray(scores, dtype=np.float64)
    if labels.ndim != 1 or labels.shape != scores.shape:
        raise ValueError(
            f"labels and scores must be 1-D arrays of one length, got shapes "
            f"{labels.shape} and {scores.shape}")
    positive = labels == 1
    if not np.all(positive | (labels == 0)):
        raise ValueError("labels must all be 0 or 1")
    if np.isnan(scores).any():
        raise ValueError("scores contain NaN")
    num_pos = int(positive.sum())
    num_neg = labels.size - num_pos
    if num_pos == 0 or num_neg == 0:
        raise ValueError(
            f"AUC needs both classes, got {num_pos} positives and {num_neg} "
            f"negatives")
    order = np.argsort(scores, kind="stable")
    sorted_scores = scores[order]
    tie_starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    tie_ends = np.r_[tie_starts[1:], scores.size]
    # 1-based ranks start+1..end share their mean (start + 1 + end) / 2.
    ranks = np.repeat((tie_starts + tie_ends + 1) / 2.0, tie_ends - tie_starts)
    positive_rank_sum = ranks[positive[order]].sum()
    return float((positive_rank_sum - num_pos * (num_pos + 1) / 2.0)
                 / (num_pos * num_neg))
