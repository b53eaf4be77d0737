"""Exact top-K retrieval by dot product, in bounded memory, on one rank or many.

`exact_top_k` and `merge_top_k` live in `reckeras.backend_kernels.topk`
(pure torch, shared with the Keras-free serving predictor): every candidate
is scored `chunk_size` rows at a time, a running top K kept per query, ties
to the lower position.

When the candidates are sharded over ranks, each rank ranks its own rows
(with their global positions, `positions=`) and `all_gather_top_k` merges
the ranks' lists into the top K of the whole corpus, the same as one rank
holding every candidate.
"""

from __future__ import annotations

from typing import Any

import keras
import torch

from reckeras import distributed
from reckeras.backend_kernels.topk import (
    DEFAULT_CHUNK_SIZE,
    check_k,
    exact_top_k,
    merge_top_k,
)

__all__ = ["DEFAULT_CHUNK_SIZE", "BruteForceTopK", "all_gather_top_k", "exact_top_k",
           "merge_top_k"]


def all_gather_top_k(scores: torch.Tensor, positions: torch.Tensor,
                     k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Merges every rank's top K of the same queries into the global top K.

    For candidates sharded over ranks: every rank scores the *same* queries
    against its own candidate rows (`exact_top_k(..., positions=its global
    positions)`) and calls this collective with the result; every rank gets
    the top `k` of the whole corpus, equal to `exact_top_k` on one rank
    holding every candidate. In one process it is `merge_top_k` of one list.

    Args:
        scores: float32 `[B, k_local]`, this rank's top scores (the same
            shape on every rank).
        positions: int64 `[B, k_local]`, their global positions.
        k: the length of the merged lists.

    Returns:
        `(scores, positions)`, `[B, k]`, on every rank.

    Example:

    ```python
    world = rk.distributed.world()
    mine = torch.arange(world.rank, num_items, world.size)   # this rank's rows
    local = rk.retrieval.exact_top_k(queries, item_vectors[mine], 20,
                                     positions=mine)
    scores, top = rk.retrieval.all_gather_top_k(*local, 20)
    ```
    """
    world = distributed.world()
    if world.size == 1:
        return merge_top_k([(scores, positions)], k)
    gathered = [torch.empty_like(t) for t in (scores, positions) for _ in range(world.size)]
    with distributed.collective("merging top-K lists across ranks"):
        torch.distributed.all_gather(gathered[:world.size], scores.contiguous())
        torch.distributed.all_gather(gathered[world.size:], positions.contiguous())
    return merge_top_k(list(zip(gathered[:world.size], gathered[world.size:],
                                strict=True)), k)


@keras.saving.register_keras_serializable(package="reckeras")
class BruteForceTopK(keras.layers.Layer):
    """The top `k` candidate positions of each query, by exact dot product.

    Holds the candidate matrix `[num_candidates, D]` as a non-trainable
    weight (saved with the model; set it with `set_candidates`) and returns
    `exact_top_k`'s positions: the output of a model evaluated with
    `rk.metrics.RecallAtK` and its siblings. An optional `exclude` input
    gives the positions to leave out per query (the user's training items),
    -1 padded; float values, as a `rk.features.Numeric` vector feature
    delivers them, are rounded (exact below 2**24).

    Args:
        k: positions returned per query.
        num_candidates: rows of the candidate matrix.
        chunk_size: candidate rows scored at once (the memory bound).
        **kwargs: `keras.layers.Layer` arguments (`name`, ...).

    Call arguments:
        queries: float `[B, D]`.
        exclude: optional `[B, E]` positions, -1 padded.

    Returns:
        int64 `[B, k]` positions, best first (-1 for an empty slot).

    Example:

    ```python
    top_k = rk.retrieval.BruteForceTopK(20, num_candidates=items.shape[0])
    outputs = top_k(query_vector, exclude=seen_items)
    model = rk.Model(inputs, outputs)
    top_k.set_candidates(items)          # [num_candidates, D]
    model.compile(metrics=[rk.metrics.RecallAtK(20)])
    ```
    """

    def __init__(self, k: int, num_candidates: int,
                 chunk_size: int = DEFAULT_CHUNK_SIZE, **kwargs: Any):
        super().__init__(**kwargs)
        self.k = check_k(k)
        if isinstance(num_candidates, bool) or not isinstance(num_candidates, int) \
                or num_candidates < 1:
            raise ValueError(f"BruteForceTopK {self.name!r}: num_candidates must be a "
                             f"positive int, got {num_candidates!r}")
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"BruteForceTopK {self.name!r}: chunk_size must be a "
                             f"positive int, got {chunk_size!r}")
        self.num_candidates = num_candidates
        self.chunk_size = chunk_size

    def build(self, queries_shape: tuple, exclude_shape: tuple | None = None) -> None:
        self.candidates = self.add_weight(
            name="candidates", shape=(self.num_candidates, queries_shape[-1]),
            initializer="zeros", trainable=False)

    def set_candidates(self, candidates: Any) -> None:
        """Sets the candidate matrix (the layer must be built).

        Args:
            candidates: `[num_candidates, D]` array or tensor.

        Raises:
            ValueError: when the layer is not built or the shape differs.
        """
        if not self.built:
            raise ValueError(f"BruteForceTopK {self.name!r} is not built: call it on "
                             f"the queries (build the model) before set_candidates")
        shape = tuple(keras.ops.shape(candidates))
        if shape != tuple(self.candidates.shape):
            raise ValueError(f"BruteForceTopK {self.name!r} holds candidates of shape "
                             f"{tuple(self.candidates.shape)}, got {shape}")
        self.candidates.assign(candidates)

    def call(self, queries: Any, exclude: Any = None) -> Any:
        if exclude is not None:
            exclude = torch.round(exclude).to(torch.int64) if exclude.is_floating_point() \
                else exclude
        _, positions = exact_top_k(queries, self.candidates.value.to(queries.dtype),
                                   self.k, exclude=exclude, chunk_size=self.chunk_size)
        return positions

    def compute_output_spec(self, queries: Any, exclude: Any = None) -> keras.KerasTensor:
        return keras.KerasTensor((queries.shape[0], self.k), dtype="int64")

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "k": self.k, "num_candidates": self.num_candidates,
                "chunk_size": self.chunk_size}
