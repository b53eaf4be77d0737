"""A trained two-tower model evaluated over the whole corpus, in one call.

`evaluate` embeds the queries with the model's query tower and every
candidate with its candidate tower, ranks all candidates exactly
(`exact_top_k`, a user's training items left out) and feeds the top K to the
retrieval metrics (`rk.metrics.RecallAtK`, `NDCGAtK`, `HitRateAtK`, `MRR`).
`RetrievalEvaluation` is the Keras callback that runs it at the end of
epochs of `fit`.

Keras's own `evaluate` would need a loss and would carry the labels as
float32 through the model; here the relevant and excluded positions stay
int64 and the model needs no second output.

Under torchrun every rank passes the same queries: each embeds all of them
(the embedding lookups are collectives, so every rank makes the same calls),
ranks them against its own slice of the candidates, and `all_gather_top_k`
merges the slices, so every rank gets the top K one rank would, and the same
metric values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
import pyarrow as pa
import torch

from reckeras import _keras_compat, distributed
from reckeras.features.encode import as_table, as_tensors
from reckeras.metrics import RecallAtK
from reckeras.retrieval.topk import DEFAULT_CHUNK_SIZE, all_gather_top_k, exact_top_k


def _query_table(queries: Any) -> pa.Table:
    """The queries as a Table (a dataset read whole)."""
    return queries.to_table() if hasattr(queries, "to_table") else as_table(queries)


def _positions(values: Any, rows: int, what: str) -> torch.Tensor:
    """An int64 `[rows, n]` tensor of candidate positions, -1 padded."""
    tensor = torch.as_tensor(np.asarray(values))
    if tensor.dim() != 2 or tensor.shape[0] != rows or tensor.is_floating_point():
        raise ValueError(f"rk.retrieval.evaluate: {what} must be an int [queries, n] "
                         f"matrix of candidate positions, -1 padded, with one row per "
                         f"query ({rows}), got {tensor.dtype} {tuple(tensor.shape)}")
    return tensor.to(torch.int64)


def _ranked_length(metrics: Sequence[Any], k: int | None) -> int:
    """How many positions to rank: `k`, else the largest cut-off of the metrics."""
    cutoffs = [m.k for m in metrics if getattr(m, "k", None) is not None]
    if k is None:
        if not cutoffs:
            raise ValueError("rk.retrieval.evaluate: none of the metrics has a cut-off "
                             "k (MRR alone): give k, the number of positions to rank")
        return max(cutoffs)
    if isinstance(k, bool) or not isinstance(k, int) or k < max(cutoffs, default=1):
        raise ValueError(f"rk.retrieval.evaluate: k must be an int of at least every "
                         f"metric's cut-off ({max(cutoffs, default=1)}), got {k!r}")
    return k


def evaluate(model: Any, queries: Any, candidate_ids: Any, relevant: Any,
             exclude: Any = None, metrics: Sequence[Any] | None = None,
             k: int | None = None, batch_size: int = 4096,
             chunk_size: int = DEFAULT_CHUNK_SIZE) -> dict[str, float]:
    """Retrieval metrics of a two-tower model over the whole corpus.

    The query tower embeds `queries` (`batch_size` rows at a time), the
    candidate tower every id of `candidate_ids`; every candidate is scored
    exactly (`exact_top_k`, chunked), each query's `exclude` positions left
    out, and the top `k` positions go to the metrics with `relevant`. A
    candidate's position is its index in `candidate_ids`.

    Under torchrun, call it on every rank with the same arguments: each rank
    ranks its slice of the candidates and the slices are merged, so every
    rank returns what one rank returns.

    Args:
        model: a `rk.models.two_tower` model (anything with
            `candidate_embeddings(ids)`, `query_model()` and
            `candidate_features`).
        queries: the queries' features, one row per query: a reckeras
            `Dataset`, a pyarrow Table or a dict of arrays. Candidate-side
            columns may be left out.
        candidate_ids: int `[N]` ids of the corpus (the candidate id
            feature's values).
        relevant: int `[Q, R]` relevant candidate positions per query, -1
            padded (`rk.datasets.user_items` of a held-out split).
        exclude: int `[Q, E]` positions to leave out per query (the
            training items), -1 padded; None for none.
        metrics: retrieval metrics (`rk.metrics.RecallAtK`, `NDCGAtK`,
            `HitRateAtK`, `MRR`); they are reset first. Default:
            `[RecallAtK(20)]`.
        k: positions ranked per query (default: the largest cut-off of the
            metrics; `MRR` reads all of them).
        batch_size: queries embedded and ranked at once.
        chunk_size: candidates scored at once (`exact_top_k`'s memory bound).

    Returns:
        `{metric name: value}`.

    Raises:
        ValueError: for `relevant` or `exclude` not of one int row per
            query, a `k` below a metric's cut-off, or no `k` for `MRR`
            alone.

    Example:

    ```python
    users = np.arange(6_000)
    rk.retrieval.evaluate(
        model, {"user_id": users, "user_segment": segments},
        candidate_ids=np.arange(2_000),
        relevant=rk.datasets.user_items(test, users),
        exclude=rk.datasets.user_items(train, users),
        metrics=[rk.metrics.RecallAtK(20), rk.metrics.NDCGAtK(20)])
    # {"recall_at_20": 0.29..., "ndcg_at_20": 0.2...}
    ```
    """
    metrics = [RecallAtK(20)] if metrics is None else list(metrics)
    ranked = _ranked_length(metrics, k)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"rk.retrieval.evaluate: batch_size must be a positive int, "
                         f"got {batch_size!r}")
    table = _query_table(queries)
    relevant = _positions(relevant, table.num_rows, "relevant")
    exclude = None if exclude is None else _positions(exclude, table.num_rows, "exclude")
    device = _keras_compat.keras_device()
    world = distributed.world()
    count = len(np.asarray(candidate_ids))
    corpus = torch.from_numpy(model.candidate_embeddings(candidate_ids)).to(device)
    # One rank ranks every row; several rank one slice each and merge.
    mine = None if world.size == 1 else \
        torch.arange(world.rank, count, world.size, device=device)
    if mine is not None:
        corpus = corpus[mine]
    query_model = model.query_model()
    columns = query_model.columns
    for metric in metrics:
        metric.reset_state()
    with torch.no_grad():
        for start in range(0, table.num_rows, batch_size):
            rows = slice(start, start + batch_size)
            inputs = {name: tensor.to(device) for name, tensor in
                      as_tensors(columns.encode(table.slice(start, batch_size),
                                                 absent=query_model.unread_features)).items()}
            vectors = query_model(inputs, training=False)
            local = exact_top_k(vectors, corpus, ranked,
                                exclude=None if exclude is None else exclude[rows],
                                chunk_size=chunk_size, positions=mine)
            _, top = all_gather_top_k(*local, ranked)
            for metric in metrics:
                metric.update_state(relevant[rows], top)
    return {metric.name: float(metric.result()) for metric in metrics}


class RetrievalEvaluation(keras.callbacks.Callback):
    """Adds `rk.retrieval.evaluate`'s metrics to the logs at the end of epochs.

    The values join `fit`'s history under `<prefix><metric name>`
    (`val_recall_at_20`), so `EarlyStopping` and `ModelCheckpoint` can
    monitor them. Under torchrun every rank must run it (it is collective).

    Args:
        queries: as in `rk.retrieval.evaluate`.
        candidate_ids: as in `rk.retrieval.evaluate`.
        relevant: as in `rk.retrieval.evaluate`.
        exclude: as in `rk.retrieval.evaluate`.
        metrics: as in `rk.retrieval.evaluate`.
        k: as in `rk.retrieval.evaluate`.
        batch_size: as in `rk.retrieval.evaluate`.
        every: evaluate after every `every`-th epoch (and the last).
        prefix: prepended to the metric names in the logs.

    Example:

    ```python
    evaluation = rk.retrieval.RetrievalEvaluation(
        users, np.arange(num_items), relevant=valid_items, exclude=train_items,
        metrics=[rk.metrics.RecallAtK(20)])
    history = model.fit(train, epochs=5, callbacks=[evaluation])
    history.history["val_recall_at_20"]
    ```
    """

    def __init__(self, queries: Any, candidate_ids: Any, relevant: Any, exclude: Any = None,
                 metrics: Sequence[Any] | None = None, k: int | None = None,
                 batch_size: int = 4096, every: int = 1, prefix: str = "val_"):
        super().__init__()
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"RetrievalEvaluation: every must be a positive int, "
                             f"got {every!r}")
        self.arguments = {"queries": queries, "candidate_ids": candidate_ids,
                          "relevant": relevant, "exclude": exclude, "metrics": metrics,
                          "k": k, "batch_size": batch_size}
        self.every, self.prefix = every, prefix

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        last = self.params.get("epochs") == epoch + 1
        if logs is None or ((epoch + 1) % self.every and not last):
            return
        results = evaluate(self.model, **self.arguments)
        logs.update({self.prefix + name: value for name, value in results.items()})
