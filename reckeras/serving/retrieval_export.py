"""Export of a trained two-tower model into a retrieval artifact.

This side runs in the training process, with Keras. The query tower is
written as `export.write_artifact` writes any model (feature specs and
statistics, the tables' rows, the part after the lookup as a `torch.export`
program); the corpus goes beside it: every id of the user's `item_ids` with
its candidate-tower embedding (`TwoTower.candidate_embeddings`), in
`artifact.CANDIDATES`. `RetrievalPredictor` reads both without Keras.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from safetensors.numpy import save_file

from reckeras.serving import artifact
from reckeras.serving.export import ExportedNetwork, write_artifact


class _QueryNetwork(torch.nn.Module):
    """The query tower past the lookup: what the program holds."""

    def __init__(self, query_model: Any):
        super().__init__()
        self.query_model = query_model

    def forward(self, inputs: dict, dense: torch.Tensor, embedded: list) -> torch.Tensor:
        return self.query_model.tower_output(dense, embedded[0])


def corpus_ids(item_ids: Any) -> np.ndarray:
    """`item_ids` as int64 `[N]`, checked: present, 1-D, integer, distinct.

    Args:
        item_ids: the corpus's ids (a list, numpy or pyarrow array).

    Returns:
        int64 `[N]`, in the given order (an item's position is its index).

    Raises:
        ValueError: naming `item_ids` and what is wrong.

    Example:

    ```python
    corpus_ids([10, 11, 12])   # array([10, 11, 12])
    ```
    """
    if item_ids is None:
        raise ValueError("a two-tower model's export_serving needs item_ids: the ids of "
                         "the corpus retrieval picks from (e.g. every item of the "
                         "catalogue)")
    ids = np.asarray(item_ids)
    if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"export_serving: item_ids must be a non-empty 1-D array of int "
                         f"ids, got shape {ids.shape} dtype {ids.dtype}")
    ids = ids.astype(np.int64)
    unique, counts = np.unique(ids, return_counts=True)
    if len(unique) != len(ids):
        raise ValueError(f"export_serving: item_ids repeats ids, e.g. "
                         f"{unique[counts > 1][:5].tolist()}")
    return ids


def export_retrieval(model: Any, path: str | os.PathLike, item_ids: Any,
                     rows: str | None = None, min_count: int | None = None,
                     base: str | os.PathLike | None = None) -> str:
    """Writes the retrieval artifact of a trained two-tower model (every
    rank calls it, with the same `item_ids`).

    Args:
        model: a trained `TwoTower`.
        path: the artifact directory (replaced if it exists).
        item_ids: the corpus's ids (`corpus_ids`).
        rows: the tables' row precision (`export.export_serving`'s).
        min_count: `export.export_serving`'s.
        base: must be None (a retrieval artifact has no deltas).

    Returns:
        The artifact's path.

    Raises:
        NotImplementedError: a `base`.
        ValueError: bad `item_ids` (`corpus_ids`), `rows` or `min_count`.

    Example:

    ```python
    export_retrieval(two_tower_model, "exported/retrieval", item_ids)
    ```
    """
    if base is not None:
        raise NotImplementedError("export_serving: a two-tower model's retrieval artifact "
                                  "has no deltas (its corpus embeddings all change with "
                                  "the candidate tower); write a full export (base=None)")
    ids = corpus_ids(item_ids)
    embeddings = np.ascontiguousarray(model.candidate_embeddings(ids), dtype=np.float32)
    network = ExportedNetwork(model.columns, [model.embedding],
                              _QueryNetwork(model.query_model()), [], None)

    def write_candidates(staging: str) -> tuple[dict, list[str]]:
        save_file({"ids": ids, "embeddings": embeddings},
                  os.path.join(staging, artifact.CANDIDATES))
        return {"retrieval": {"num_items": len(ids), "dim": embeddings.shape[1],
                              "query_features": list(model.query_features),
                              "candidate_features": list(model.candidate_features)}}, \
            [artifact.CANDIDATES]

    return write_artifact(network, path, rows, min_count, None, write_candidates)
