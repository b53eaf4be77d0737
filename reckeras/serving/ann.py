"""Approximate nearest-neighbour indexes of a retrieval artifact's corpus (faiss).

faiss (`faiss-cpu`) is an optional extra: `pip install "reckeras[ann]"`. An
index scores by inner product, on the corpus's L2-normalized embeddings: the
cosine the two-tower model trains and evaluates with. Two kinds:

* `"hnsw"`: a graph (`IndexHNSWFlat`), no training. Options `m` (links per
  node, default 32), `ef_construction` (default 200) and `ef_search` (the
  candidates a search keeps, default 128; raised to the depth a call asks
  for when that is more).
* `"ivf"`: inverted lists over k-means cells (`IndexIVFFlat`), trained on
  the corpus at load. Options `nlist` (cells, default `sqrt(N)`, at most
  `N / 39`: faiss's k-means wants 39 points a cell) and `nprobe` (cells
  searched, default 32: recall@20 0.96 on 20,000 random 16-dim vectors,
  0.85 at 16).

A query's `exclude` positions are searched past (the index is asked for
`k + E` neighbours, E the longest exclude list) and left out; the result is
ordered as `exact_top_k` orders (score descending, ties to the lower
position), empty slots `(-inf, -1)`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from reckeras.backend_kernels.topk import merge_top_k

KINDS = ("hnsw", "ivf")
DEFAULTS: dict[str, dict[str, int | None]] = {
    "hnsw": {"m": 32, "ef_construction": 200, "ef_search": 128},
    "ivf": {"nlist": None, "nprobe": 32}}


def _faiss() -> Any:
    try:
        import faiss
    except ImportError as error:
        raise ImportError(f"an ANN index needs faiss: pip install 'reckeras[ann]' "
                          f"(faiss-cpu), or serve the exact index ({error})") from error
    return faiss


def resolved_options(kind: str, options: dict[str, Any] | None,
                     num_items: int) -> dict[str, int]:
    """An index's options: the given ones over the defaults, checked.

    Args:
        kind: one of `KINDS`.
        options: `{name: positive int}`, or None for the defaults.
        num_items: the corpus size (IVF's default `nlist` depends on it).

    Returns:
        Every option of the kind with its value.

    Raises:
        ValueError: an unknown kind or option, or a value that is not a
            positive int (named).

    Example:

    ```python
    resolved_options("hnsw", {"ef_search": 256}, 10_000)
    # {"m": 32, "ef_construction": 200, "ef_search": 256}
    ```
    """
    if kind not in KINDS:
        raise ValueError(f"index must be 'exact' or one of {KINDS}, got {kind!r}")
    given = dict(options or {})
    unknown = sorted(set(given) - set(DEFAULTS[kind]))
    if unknown:
        raise ValueError(f"index_options {unknown} are not options of a {kind!r} index "
                         f"(it takes {sorted(DEFAULTS[kind])})")
    merged = {**DEFAULTS[kind], **given}
    if kind == "ivf" and merged["nlist"] is None:
        merged["nlist"] = max(1, min(int(math.sqrt(num_items)), num_items // 39))
    for name, value in merged.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"index_options[{name!r}] must be a positive int, got {value!r}")
    if kind == "ivf" and merged["nlist"] > num_items:
        raise ValueError(f"index_options['nlist'] = {merged['nlist']} exceeds the "
                         f"{num_items} items of the corpus")
    return merged


class AnnIndex:
    """A faiss index of a corpus, searched by inner product.

    `search` is safe to call from several threads at once (faiss searches
    read the index; the per-call depth goes in search parameters).

    Args:
        kind: `"hnsw"` or `"ivf"`.
        embeddings: float32 `[N, D]`, the corpus (L2-normalized).
        options: the kind's options (see the module), or None for defaults.

    Raises:
        ImportError: faiss is not installed (naming the `ann` extra).
        ValueError: a bad kind or option.

    Example:

    ```python
    index = AnnIndex("hnsw", item_vectors, {"ef_search": 256})
    scores, positions = index.search(torch.from_numpy(user_vectors), 20)
    ```
    """

    def __init__(self, kind: str, embeddings: np.ndarray, options: dict[str, Any] | None):
        self.kind = kind
        self.options = resolved_options(kind, options, len(embeddings))
        faiss = _faiss()
        self._faiss = faiss
        self.num_items, dim = embeddings.shape
        vectors = np.ascontiguousarray(embeddings, dtype=np.float32)
        if kind == "hnsw":
            self._index = faiss.IndexHNSWFlat(dim, self.options["m"],
                                              faiss.METRIC_INNER_PRODUCT)
            self._index.hnsw.efConstruction = self.options["ef_construction"]
        else:
            # The quantizer is kept: the IVF index holds no reference of its own.
            self._quantizer = faiss.IndexFlatIP(dim)
            self._index = faiss.IndexIVFFlat(self._quantizer, dim, self.options["nlist"],
                                             faiss.METRIC_INNER_PRODUCT)
            self._index.train(vectors)
        self._index.add(vectors)

    def _parameters(self, depth: int) -> Any:
        if self.kind == "hnsw":
            return self._faiss.SearchParametersHNSW(
                efSearch=max(self.options["ef_search"], depth))
        return self._faiss.SearchParametersIVF(nprobe=self.options["nprobe"])

    def search(self, queries: torch.Tensor, k: int, exclude: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """The approximate top `k` corpus positions of each query.

        Args:
            queries: float32 `[B, D]`.
            k: neighbours per query.
            exclude: int64 `[B, E]` positions to leave out, -1 padded; None
                for none.

        Returns:
            `(scores, positions)`: float32 and int64 `[B, k]`, best first,
            empty slots `(-inf, -1)`.

        Example:

        ```python
        scores, positions = index.search(queries, 10, exclude=seen_positions)
        ```
        """
        extra = 0 if exclude is None else exclude.shape[1]
        depth = min(k + extra, self.num_items)
        found, positions = self._index.search(
            np.ascontiguousarray(queries.numpy(), dtype=np.float32), depth,
            params=self._parameters(depth))
        scores, positions = torch.from_numpy(found), torch.from_numpy(positions)
        if exclude is not None and extra:
            left_out = ((positions[:, :, None] == exclude[:, None, :])
                        & (exclude[:, None, :] >= 0)).any(dim=2)
            positions = torch.where(left_out, -1, positions)
        return merge_top_k([(scores, positions)], k)
