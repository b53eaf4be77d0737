"""Metrics for recommender training."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import keras
import numpy as np
import torch

from reckeras._keras_compat import in_stateless_scope


@dataclass(frozen=True)
class _SortedRun:
    """Examples compacted to their distinct scores, in ascending order.

    `cum_positive[k]` and `cum_negative[k]` are the total positive and
    negative weight of the scores below `scores[k]`; both hold one more entry
    than `scores`, so the last one is the run's total.
    """

    scores: torch.Tensor
    cum_positive: torch.Tensor
    cum_negative: torch.Tensor

    @classmethod
    def from_weights(cls, scores: torch.Tensor, positive: torch.Tensor,
                     negative: torch.Tensor) -> _SortedRun:
        distinct, group = torch.unique(scores, sorted=True, return_inverse=True)
        zeros = torch.zeros(distinct.numel() + 1, dtype=torch.float64)
        cum_positive = zeros.index_add(0, group + 1, positive).cumsum_(0)
        cum_negative = zeros.index_add(0, group + 1, negative).cumsum_(0)
        return cls(distinct, cum_positive, cum_negative)

    @property
    def positive(self) -> torch.Tensor:
        return self.cum_positive.diff()

    @property
    def negative(self) -> torch.Tensor:
        return self.cum_negative.diff()

    def __len__(self) -> int:
        return self.scores.numel()

    def ordered_pairs_within(self) -> float:
        """Weight of (positive, negative) pairs ranked right, ties as 1/2."""
        return float(
            self.positive @ (self.cum_negative[:-1] + 0.5 * self.negative))

    def ordered_pairs_across(self, other: _SortedRun) -> float:
        """Weight of pairs with one example here and one in `other`."""
        low = torch.searchsorted(other.scores, self.scores, side="left")
        high = torch.searchsorted(other.scores, self.scores, side="right")
        negative_below = other.cum_negative[low]
        negative_tied = other.cum_negative[high] - negative_below
        positive_above = other.cum_positive[-1] - other.cum_positive[high]
        positive_tied = other.cum_positive[high] - other.cum_positive[low]
        return float(
            self.positive @ (negative_below + 0.5 * negative_tied)
            + self.negative @ (positive_above + 0.5 * positive_tied))

    def merged(self, other: _SortedRun) -> _SortedRun:
        return _SortedRun.from_weights(
            torch.cat([self.scores, other.scores]),
            torch.cat([self.positive, other.positive]),
            torch.cat([self.negative, other.negative]))


def _gather(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order (just `[obj]` in one process)."""
    from reckeras import distributed
    world = distributed.world()
    if world.size == 1:
        return [obj]
    parts = [None] * world.size
    with distributed.collective("reducing metrics across ranks"):
        torch.distributed.all_gather_object(parts, obj)
    return parts


def _as_cpu_float64(values: Any) -> torch.Tensor:
    if isinstance(values, torch.Tensor):
        return values.detach().to(device="cpu", dtype=torch.float64)
    array = np.asarray(values, dtype=np.float64)
    # A read-only array (e.g. arrow's memory) is copied: torch wants writable memory.
    return torch.from_numpy(array if array.flags.writeable else array.copy())


@keras.saving.register_keras_serializable(package="reckeras")
class AUC(keras.metrics.Metric):
    """Exact area under the ROC curve, accumulated over batches.

    Unlike `keras.metrics.AUC`, which buckets scores into a fixed number of
    thresholds, this metric ranks every score it has seen: the result is the
    weighted Mann-Whitney statistic, the probability that a random positive
    scores above a random negative, with tied scores counting 1/2 and each
    pair weighted by the product of its two sample weights.

    Each batch is compacted to its distinct scores and ranked against the
    batches seen before it when it arrives, so `result()`, which Keras calls
    after every step, costs nothing. Memory grows with the number of distinct
    scores seen (24 bytes each, on the host) until `reset_state()`.

    Labels must be 0 or 1, scores must not be NaN, and sample weights must be
    finite and non-negative; anything else raises `ValueError`. Until both a
    positive and a negative have been seen (with non-zero weight), the result
    is 0.0, as for `keras.metrics.AUC`.

    Under torchrun, `rk.Model` calls `sync_across_ranks` at the end of
    every epoch and of `evaluate`, so the logged AUC is that of every rank's
    examples.

    Args:
        name: name of the metric.
        dtype: dtype of the result.

    Example:

    ```python
    auc = rk.metrics.AUC()
    auc.update_state([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8])
    float(auc.result())  # 0.75

    model.compile(optimizer="adam", loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.05),
                  metrics=[rk.metrics.AUC()])
    ```
    """

    def __init__(self, name: str = "auc", dtype: str | None = None):
        super().__init__(name=name, dtype=dtype)
        self.reset_state()

    def reset_state(self) -> None:
        # Each run is more than twice as long as the next, so there are at
        # most log2(distinct scores) of them.
        self._runs: list[_SortedRun] = []
        self._ordered_pairs = 0.0

    def update_state(self, y_true: Any, y_pred: Any,
                     sample_weight: Any = None) -> None:
        # Keras traces metrics on placeholder tensors inside a stateless scope
        # to build them; that pass must not count as data.
        if in_stateless_scope():
            return
        scores = _as_cpu_float64(y_pred)
        labels = _as_cpu_float64(y_true)
        if labels.numel() != scores.numel():
            raise ValueError(
                f"AUC needs one label per score; got y_true of shape "
                f"{tuple(labels.shape)} and y_pred of shape "
                f"{tuple(scores.shape)}.")
        if sample_weight is None:
            weights = torch.ones_like(scores)
        else:
            weights = self._broadcast_weights(
                _as_cpu_float64(sample_weight), scores.shape)
        scores, labels, weights = (
            scores.reshape(-1), labels.reshape(-1), weights.reshape(-1))
        if scores.numel() == 0:
            return
        self._check_values(labels, scores, weights)

        run = _SortedRun.from_weights(
            scores, weights * labels, weights * (1.0 - labels))
        self._ordered_pairs += run.ordered_pairs_within() + sum(
            run.ordered_pairs_across(earlier) for earlier in self._runs)
        self._runs.append(run)
        while (len(self._runs) > 1
               and len(self._runs[-2]) <= 2 * len(self._runs[-1])):
            last = self._runs.pop()
            self._runs.append(self._runs.pop().merged(last))

    @staticmethod
    def _broadcast_weights(weights: torch.Tensor,
                           score_shape: torch.Size) -> torch.Tensor:
        if weights.numel() == score_shape.numel():
            return weights
        # Per-example weights of shape [B] apply to every score of a [B, k]
        # prediction, as in Keras's own metrics.
        trailing = (1,) * max(len(score_shape) - weights.dim(), 0)
        try:
            return torch.broadcast_to(
                weights.reshape(weights.shape + trailing), score_shape)
        except RuntimeError:
            raise ValueError(
                f"AUC cannot apply sample_weight of shape "
                f"{tuple(weights.shape)} to y_pred of shape "
                f"{tuple(score_shape)}.") from None

    @staticmethod
    def _check_values(labels: torch.Tensor, scores: torch.Tensor,
                      weights: torch.Tensor) -> None:
        if not torch.all((labels == 0) | (labels == 1)):
            bad = labels[(labels != 0) & (labels != 1)][0].item()
            raise ValueError(f"AUC labels must be 0 or 1; got {bad}.")
        if torch.isnan(scores).any():
            raise ValueError("AUC got a NaN score.")
        if not torch.all(torch.isfinite(weights) & (weights >= 0)):
            bad_weight = weights[~(torch.isfinite(weights) & (weights >= 0))][0]
            raise ValueError(
                f"AUC sample weights must be finite and non-negative; got "
                f"{bad_weight.item()}.")

    def result(self) -> Any:
        positive = sum(float(run.cum_positive[-1]) for run in self._runs)
        negative = sum(float(run.cum_negative[-1]) for run in self._runs)
        both = positive > 0 and negative > 0
        auc = self._ordered_pairs / (positive * negative) if both else 0.0
        return keras.ops.convert_to_tensor(auc, dtype=self.dtype)

    def sync_across_ranks(self) -> None:
        """Merges every rank's examples, so `result()` is the exact global AUC.

        Every rank must call it (it is a collective); in one process it
        changes nothing. `rk.Model` calls it at the end of every epoch
        and of `evaluate`.
        """
        local = [(r.scores, r.positive, r.negative) for r in self._runs]
        runs = [run for part in _gather(local) for run in part]
        self.reset_state()
        if runs:
            scores, positive, negative = (torch.cat(parts) for parts in zip(*runs, strict=True))
            merged = _SortedRun.from_weights(scores, positive, negative)
            self._runs = [merged]
            self._ordered_pairs = merged.ordered_pairs_within()


@keras.saving.register_keras_serializable(package="reckeras")
class GAUC(keras.metrics.Metric):
    """Group AUC: the AUC of every group (e.g. user), averaged by group size.

    `GAUC = sum_g n_g * AUC_g / sum_g n_g` over the groups that hold both
    a positive and a negative example (AUC is undefined for the others);
    `n_g` is the group's number of examples. Each `AUC_g` is exact, with
    tied scores counting 1/2. The group of each example is the model input
    named `group`: `rk.Model` passes it to the metric.

    Args:
        group: name of the model input (feature) that identifies the group.
        name: metric name.
        dtype: result dtype.

    Example:

    ```python
    gauc = rk.metrics.GAUC(group="user_id")
    gauc.update_state([0, 1, 1, 0], [0.2, 0.9, 0.3, 0.6], groups=[7, 7, 8, 8])
    float(gauc.result())  # 0.5: user 7 ranked right, user 8 wrong

    model.compile(optimizer="adam", loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.05),
                  metrics=[rk.metrics.AUC(), rk.metrics.GAUC(group="user_id")])
    ```
    """

    def __init__(self, group: str, name: str = "gauc", dtype: str | None = None):
        super().__init__(name=name, dtype=dtype)
        if not isinstance(group, str) or not group:
            raise ValueError(f"GAUC needs the name of the group input, got {group!r}")
        self.group = group
        self.reset_state()

    def reset_state(self) -> None:
        # (groups, labels, scores) of every batch seen, on the host.
        self._parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None,
                     groups: Any = None) -> None:
        """Adds a batch of examples.

        Args:
            y_true: 0/1 labels, one per score.
            y_pred: scores.
            sample_weight: ignored (every example of a group counts once).
            groups: the group id of every example; `rk.Model` passes the
                values of the `group` input.

        Raises:
            ValueError: when `groups` is missing or the sizes differ.
        """
        if in_stateless_scope():
            return
        if groups is None:
            raise ValueError(f"GAUC needs the group ids of every example (input "
                             f"{self.group!r}); use it with rk.Model, which passes them")
        scores = _as_cpu_float64(y_pred).reshape(-1).numpy()
        labels = _as_cpu_float64(y_true).reshape(-1).numpy()
        groups = np.asarray(keras.ops.convert_to_numpy(groups)).reshape(-1)
        if not len(scores) == len(labels) == len(groups):
            raise ValueError(f"GAUC needs one label and one group per score; got "
                             f"{len(labels)} labels, {len(groups)} groups and "
                             f"{len(scores)} scores")
        self._parts.append((groups.astype(np.int64), labels, scores))

    def sync_across_ranks(self) -> None:
        """Gathers every rank's examples, so `result()` is global.

        Every rank must call it (it is a collective); in one process it
        changes nothing. `rk.Model` calls it at the end of every epoch
        and of `evaluate`.
        """
        self._parts = [part for parts in _gather(list(self._parts)) for part in parts]

    def result(self) -> Any:
        if not self._parts:
            return keras.ops.convert_to_tensor(0.0, dtype=self.dtype)
        groups, labels, scores = (np.concatenate(c) for c in zip(*self._parts, strict=True))
        order = np.lexsort((scores, groups))
        groups, labels, scores = groups[order], labels[order], scores[order]
        n = len(groups)
        # Average 1-based ranks inside each (group, tied score) run.
        new_group = np.r_[True, groups[1:] != groups[:-1]]
        new_tie = new_group | np.r_[True, scores[1:] != scores[:-1]]
        group_id = np.cumsum(new_group) - 1
        group_start = np.flatnonzero(new_group)
        tie_id = np.cumsum(new_tie) - 1
        tie_start = np.flatnonzero(new_tie)
        tie_end = np.r_[tie_start[1:], n]
        tie_first = tie_start[tie_id] - group_start[group_id]
        tie_last = tie_end[tie_id] - 1 - group_start[group_id]
        rank = (tie_first + tie_last) / 2.0 + 1.0
        positives = np.bincount(group_id, weights=labels)
        sizes = np.bincount(group_id)
        negatives = sizes - positives
        rank_sum = np.bincount(group_id, weights=rank * labels)
        valid = (positives > 0) & (negatives > 0)
        if not valid.any():
            return keras.ops.convert_to_tensor(0.0, dtype=self.dtype)
        auc = (rank_sum[valid] - positives[valid] * (positives[valid] + 1) / 2.0) / (
            positives[valid] * negatives[valid])
        value = float((auc * sizes[valid]).sum() / sizes[valid].sum())
        return keras.ops.convert_to_tensor(value, dtype=self.dtype)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "group": self.group}


def _as_positions(values: Any, what: str) -> torch.Tensor:
    """A `[B, n]` int64 CPU tensor of candidate positions (floats rounded:
    labels reach metrics as float32, exact below 2**24)."""
    if isinstance(values, torch.Tensor):
        tensor = values.detach().cpu()
    else:
        tensor = torch.as_tensor(np.array(values))
    if tensor.is_floating_point():
        tensor = torch.round(tensor)
    tensor = tensor.to(torch.int64)
    if tensor.dim() == 1:
        tensor = tensor[:, None]
    if tensor.dim() != 2:
        raise ValueError(f"{what} must be [batch, positions], got shape "
                         f"{tuple(tensor.shape)}")
    return tensor


class _RankingMetric(keras.metrics.Metric):
    """The mean over users of a per-user ranking score (the users with at
    least one relevant item), from top-K positions and relevant positions.

    Subclasses give `_per_user(hits, relevant_count)`: `hits` is bool
    `[B, K]` (is the i-th ranked position relevant), `relevant_count` int64
    `[B]` (distinct relevant positions, > 0).
    """

    def __init__(self, k: int | None, name: str, dtype: str | None):
        super().__init__(name=name, dtype=dtype)
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ValueError(f"{type(self).__name__}: k must be a positive int, got {k!r}")
        self.k = k
        self.reset_state()

    def reset_state(self) -> None:
        self._total = 0.0
        self._users = 0.0

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        """Adds a batch of users.

        Args:
            y_true: `[B, R]` relevant candidate positions per user, -1
                padded (repeats count once).
            y_pred: `[B, K]` ranked candidate positions, best first (as
                `rk.retrieval.exact_top_k` returns them; -1 is an empty slot).
            sample_weight: optional `[B]` weight per user.
        """
        if in_stateless_scope():
            return
        relevant = _as_positions(y_true, f"{self.name}: y_true")
        ranked = _as_positions(y_pred, f"{self.name}: y_pred")
        if relevant.shape[0] != ranked.shape[0]:
            raise ValueError(f"{self.name}: y_true has {relevant.shape[0]} rows and y_pred "
                             f"{ranked.shape[0]}; both hold one row per user")
        if self.k is not None:
            if ranked.shape[1] < self.k:
                raise ValueError(f"{self.name} needs at least {self.k} ranked positions "
                                 f"per user, got {ranked.shape[1]}")
            ranked = ranked[:, :self.k]
        # Repeated relevant positions count once: blank all but the first.
        relevant = torch.sort(relevant, dim=1).values
        repeated = torch.zeros_like(relevant, dtype=torch.bool)
        repeated[:, 1:] = relevant[:, 1:] == relevant[:, :-1]
        relevant = torch.where(repeated, -1, relevant)
        relevant_count = (relevant >= 0).sum(dim=1)
        hits = ((ranked[:, :, None] == relevant[:, None, :])
                & (relevant[:, None, :] >= 0)).any(dim=2)
        weights = torch.ones(ranked.shape[0], dtype=torch.float64) if sample_weight is None \
            else _as_cpu_float64(sample_weight).reshape(-1)
        if weights.shape[0] != ranked.shape[0]:
            raise ValueError(f"{self.name}: sample_weight needs one weight per user "
                             f"({ranked.shape[0]}), got {weights.shape[0]}")
        users = relevant_count > 0
        if not users.any():
            return
        values = self._per_user(hits[users], relevant_count[users])
        self._total += float(values.to(torch.float64) @ weights[users])
        self._users += float(weights[users].sum())

    def _per_user(self, hits: torch.Tensor, relevant_count: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def result(self) -> Any:
        value = self._total / self._users if self._users else 0.0
        return keras.ops.convert_to_tensor(value, dtype=self.dtype)

    def sync_across_ranks(self) -> None:
        """Sums every rank's users, so `result()` is the mean over all of them.

        Every rank must call it (it is a collective); in one process it
        changes nothing. `rk.Model` calls it at the end of every epoch and
        of `evaluate`.
        """
        parts = _gather((self._total, self._users))
        self._total = sum(total for total, _ in parts)
        self._users = sum(users for _, users in parts)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "k": self.k}


@keras.saving.register_keras_serializable(package="reckeras")
class RecallAtK(_RankingMetric):
    """Recall@K: the share of each user's relevant items ranked in the top K.

    Per user, `|top K ∩ relevant| / |relevant|`, as LightGCN and the open
    matching benchmarks (Gowalla, Yelp2018, Amazon-book) define it: a user
    with more than K relevant items cannot reach 1.

    `y_true` holds each user's relevant candidate positions `[B, R]`, -1
    padded (`rk.datasets.user_items` of the held-out split); `y_pred` the
    ranked positions `[B, K]`, best first, as `rk.retrieval.exact_top_k` and
    `rk.retrieval.BruteForceTopK` give them (training items already left
    out). Users without a relevant position are skipped; the result is the
    (sample-weighted) mean over the other users, 0.0 before any. Under
    torchrun, `rk.Model` sums every rank's users at the end of each epoch
    and of `evaluate`.

    Args:
        k: the cut-off; `y_pred` must hold at least `k` positions per row.
        name: metric name, `recall_at_<k>` by default.
        dtype: result dtype.

    Example:

    ```python
    recall = rk.metrics.RecallAtK(2)
    recall.update_state([[4, 9, -1], [1, -1, -1]], [[9, 3, 4], [0, 2, 5]])
    float(recall.result())   # (1/2 + 0/1) / 2 = 0.25
    ```
    """

    def __init__(self, k: int, name: str | None = None, dtype: str | None = None):
        super().__init__(k, name or f"recall_at_{k}", dtype)

    def _per_user(self, hits, relevant_count):
        return hits.sum(dim=1) / relevant_count


@keras.saving.register_keras_serializable(package="reckeras")
class HitRateAtK(_RankingMetric):
    """HitRate@K: the share of users with at least one relevant item in the top K.

    `y_true` holds each user's relevant candidate positions `[B, R]`, -1
    padded (`rk.datasets.user_items` of the held-out split); `y_pred` the
    ranked positions `[B, K]`, best first, as `rk.retrieval.exact_top_k` and
    `rk.retrieval.BruteForceTopK` give them (training items already left
    out). Users without a relevant position are skipped; the result is the
    (sample-weighted) mean over the other users, 0.0 before any. Under
    torchrun, `rk.Model` sums every rank's users at the end of each epoch
    and of `evaluate`.

    Args:
        k: the cut-off; `y_pred` must hold at least `k` positions per row.
        name: metric name, `hit_rate_at_<k>` by default.
        dtype: result dtype.

    Example:

    ```python
    hit_rate = rk.metrics.HitRateAtK(2)
    hit_rate.update_state([[4, 9, -1], [1, -1, -1]], [[9, 3, 4], [0, 2, 5]])
    float(hit_rate.result())   # 0.5
    ```
    """

    def __init__(self, k: int, name: str | None = None, dtype: str | None = None):
        super().__init__(k, name or f"hit_rate_at_{k}", dtype)

    def _per_user(self, hits, relevant_count):
        return hits.any(dim=1).to(torch.float64)


@keras.saving.register_keras_serializable(package="reckeras")
class NDCGAtK(_RankingMetric):
    """NDCG@K with binary relevance.

    Per user, `DCG / IDCG` with `DCG = sum_{i < K, i-th ranked relevant}
    1 / log2(i + 2)` and the ideal `IDCG = sum_{i < min(K, |relevant|)}
    1 / log2(i + 2)` (LightGCN's definition).

    `y_true` holds each user's relevant candidate positions `[B, R]`, -1
    padded (`rk.datasets.user_items` of the held-out split); `y_pred` the
    ranked positions `[B, K]`, best first, as `rk.retrieval.exact_top_k` and
    `rk.retrieval.BruteForceTopK` give them (training items already left
    out). Users without a relevant position are skipped; the result is the
    (sample-weighted) mean over the other users, 0.0 before any. Under
    torchrun, `rk.Model` sums every rank's users at the end of each epoch
    and of `evaluate`.

    Args:
        k: the cut-off; `y_pred` must hold at least `k` positions per row.
        name: metric name, `ndcg_at_<k>` by default.
        dtype: result dtype.

    Example:

    ```python
    ndcg = rk.metrics.NDCGAtK(2)
    ndcg.update_state([[3, -1]], [[9, 3]])
    float(ndcg.result())   # (1 / log2(3)) / 1 = 0.63...
    ```
    """

    def __init__(self, k: int, name: str | None = None, dtype: str | None = None):
        super().__init__(k, name or f"ndcg_at_{k}", dtype)

    def _per_user(self, hits, relevant_count):
        discount = 1.0 / torch.log2(torch.arange(hits.shape[1], dtype=torch.float64) + 2.0)
        ideal = torch.cumsum(discount, 0)[relevant_count.clamp(max=hits.shape[1]) - 1]
        return (hits.to(torch.float64) @ discount) / ideal


@keras.saving.register_keras_serializable(package="reckeras")
class MRR(_RankingMetric):
    """Mean reciprocal rank: `1 / rank` of each user's first relevant item.

    The rank counts from 1 over every position of `y_pred` (so MRR@K for a
    `[B, K]` prediction); a user with no relevant item in it scores 0.

    `y_true` holds each user's relevant candidate positions `[B, R]`, -1
    padded (`rk.datasets.user_items` of the held-out split); `y_pred` the
    ranked positions `[B, K]`, best first, as `rk.retrieval.exact_top_k` and
    `rk.retrieval.BruteForceTopK` give them (training items already left
    out). Users without a relevant position are skipped; the result is the
    (sample-weighted) mean over the other users, 0.0 before any. Under
    torchrun, `rk.Model` sums every rank's users at the end of each epoch
    and of `evaluate`.

    Args:
        name: metric name.
        dtype: result dtype.

    Example:

    ```python
    mrr = rk.metrics.MRR()
    mrr.update_state([[4, 9, -1], [1, -1, -1]], [[3, 9, 4], [0, 2, 5]])
    float(mrr.result())   # (1/2 + 0) / 2 = 0.25
    ```
    """

    def __init__(self, name: str = "mrr", dtype: str | None = None):
        super().__init__(None, name, dtype)

    def _per_user(self, hits, relevant_count):
        first = torch.where(hits.any(dim=1), hits.to(torch.int8).argmax(dim=1) + 1.0,
                            float("inf"))
        return (1.0 / first).to(torch.float64)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        del config["k"]
        return config
