"""The Keras-free retrieval predictor: top K of a corpus for raw query rows.

A two-tower model's artifact (`TwoTower.export_serving(path, item_ids=...)`)
holds the query tower and the corpus (`artifact.CANDIDATES`). A
`RetrievalPredictor` runs the query tower as `Predictor` runs any model
(the same transforms, lookup and program), then ranks the corpus by inner
product of the L2-normalized vectors, the cosine the model trains and
evaluates with (its temperature scales it, the ranking is the same):

* exact (the default): `exact_top_k`, the chunked brute force
  `rk.retrieval.evaluate` runs, ties to the lower corpus position;
* or through a faiss index (`ann.AnnIndex`, `index="hnsw"` or `"ivf"`).

The candidate side's columns (the item id) are not needed in a request: a
missing one is filled with nulls.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from reckeras.backend_kernels.topk import DEFAULT_CHUNK_SIZE, check_k, exact_top_k
from reckeras.features.encode import RawBatch, raw_columns
from reckeras.features.specs import Categorical
from reckeras.serving import ann, artifact
from reckeras.serving.predictor import Predictor

INDEXES = ("exact", *ann.KINDS)


class RetrievalPredictor(Predictor):
    """Answers the top K items of a corpus for raw query rows, without Keras.

    `predict` gives the `[B, D]` query vectors; `retrieve` the items. Both
    are safe to call from several threads at once.

    Args:
        path: the artifact directory a two-tower's `export_serving` wrote.
        index: `"exact"` (chunked brute force), `"hnsw"` or `"ivf"` (faiss,
            the `ann` extra; see `reckeras.serving.ann` for the options).
        index_options: the ANN index's options, None for its defaults.
        chunk_size: corpus rows the exact search scores at once.

    Raises:
        reckeras.serving.ArtifactError: a missing, damaged or foreign file,
            or an artifact without a corpus (named).
        ValueError: an unknown index or option.
        ImportError: an ANN index without faiss (naming the extra).

    Example:

    ```python
    predictor = rk.serving.load("exported/retrieval", index="hnsw")
    item_ids, scores = predictor.retrieve({"user_id": [7, 8]}, k=20,
                                          exclude=[[3, 5], []])
    ```
    """

    def __init__(self, path: str | os.PathLike, index: str = "exact",
                 index_options: dict[str, Any] | None = None,
                 chunk_size: int = DEFAULT_CHUNK_SIZE):
        if index not in INDEXES:
            raise ValueError(f"index must be one of {INDEXES}, got {index!r}")
        if index == "exact" and index_options:
            raise ValueError(f"index_options {sorted(index_options)} are for an ANN "
                             f"index; the exact one takes none")
        super().__init__(path)
        section = self.manifest.get("retrieval")
        file = os.path.join(self.path, artifact.CANDIDATES)
        if section is None:
            raise artifact.ArtifactError(f"{self.path}: not a retrieval artifact (its "
                                         f"manifest has no corpus); load it with "
                                         f"rk.serving.load and predict")
        try:
            stored = load_file(file)
            ids, embeddings = stored["ids"], stored["embeddings"]
        except (SafetensorError, OSError, KeyError) as error:
            raise artifact.ArtifactError(f"{file}: {error}") from error
        if ids.shape != (section["num_items"],) or \
                embeddings.shape != (section["num_items"], section["dim"]):
            raise artifact.ArtifactError(
                f"{file}: ids {tuple(ids.shape)} and embeddings {tuple(embeddings.shape)}, "
                f"the manifest says {section['num_items']} items of dim {section['dim']}")
        self.item_ids, self.candidates = ids, embeddings
        self.chunk_size = chunk_size
        self._sorted_ids, self._order = torch.sort(ids)
        self.index = None if index == "exact" else \
            ann.AnnIndex(index, embeddings.numpy(), index_options)
        candidate_side = [s for s in self.specs if s.name in section["candidate_features"]]
        self._fillers = {name: pa.string() if getattr(spec, "dtype", None) == "string"
                         else pa.int64()
                         for spec in candidate_side if isinstance(spec, Categorical)
                         for name in raw_columns([spec])}

    @property
    def index_kind(self) -> str:
        """`"exact"`, `"hnsw"` or `"ivf"`."""
        return "exact" if self.index is None else self.index.kind

    def apply_delta(self, path: str | os.PathLike) -> str:
        """Refused: a retrieval artifact has no deltas.

        Args:
            path: the delta's directory.

        Raises:
            reckeras.serving.DeltaError: always.
        """
        raise artifact.DeltaError(f"{os.fspath(path)}: a retrieval artifact takes no "
                                  f"deltas; load the new full export")

    def predict_with_version(self, batch: RawBatch
                             ) -> tuple[np.ndarray | dict[str, np.ndarray], str]:
        """The query vectors `[B, D]` of a batch and the served version.

        Args:
            batch: raw query columns (the candidate id column may be left
                out), as `Predictor.predict` takes them.

        Returns:
            `(float32 [B, D], version)`.

        Example:

        ```python
        vectors, version = predictor.predict_with_version({"user_id": [7]})
        ```
        """
        return super().predict_with_version(self._with_candidate_columns(batch))

    def _with_candidate_columns(self, batch):
        if isinstance(batch, pa.RecordBatch):
            batch = pa.Table.from_batches([batch])
        if isinstance(batch, pa.Table):
            for name, type_ in self._fillers.items():
                if name not in batch.column_names:
                    batch = batch.append_column(name, pa.nulls(batch.num_rows, type_))
            return batch
        if not batch:
            return batch
        rows = len(next(iter(batch.values())))
        return {**{name: pa.nulls(rows, type_) for name, type_ in self._fillers.items()},
                **batch}

    def retrieve(self, batch: RawBatch, k: int = 10,
                 exclude: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """The top `k` items of the corpus for each query row.

        Args:
            batch: raw query columns, as `predict` takes them.
            k: items per query (more than the corpus: the extra slots are
                empty).
            exclude: per query row, the item ids to leave out (e.g. the
                user's history): a list of B lists (of any lengths) or an
                int array `[B, E]`; ids not in the corpus are ignored (so -1
                pads). None for none.

        Returns:
            `(item_ids, scores)`: int64 and float32 `[B, k]`, best first;
            a score is the cosine of the query and item vectors; an empty
            slot is `(-1, -inf)`.

        Raises:
            reckeras.features.FeatureInputError: a bad query column (named).
            ValueError: a bad `k` or `exclude`.

        Example:

        ```python
        item_ids, scores = predictor.retrieve({"user_id": [7]}, k=20, exclude=[[3, 5]])
        ```
        """
        item_ids, scores, _ = self.retrieve_with_version(batch, k, exclude)
        return item_ids, scores

    def retrieve_with_version(self, batch: RawBatch,
                              k: int = 10, exclude: Any = None
                              ) -> tuple[np.ndarray, np.ndarray, str]:
        """`retrieve`'s answer and the served version.

        Args:
            batch: as for `retrieve`.
            k: as for `retrieve`.
            exclude: as for `retrieve`.

        Returns:
            `(item_ids, scores, version)`.

        Example:

        ```python
        item_ids, scores, version = predictor.retrieve_with_version(rows, k=5)
        ```
        """
        k = check_k(k)
        vectors, version = self.predict_with_version(batch)
        queries = torch.from_numpy(np.asarray(vectors))
        left_out = None if exclude is None else self.exclude_positions(exclude,
                                                                       len(queries))
        if self.index is None:
            scores, positions = exact_top_k(queries, self.candidates, k, exclude=left_out,
                                            chunk_size=self.chunk_size)
        else:
            scores, positions = self.index.search(queries, k, left_out)
        ids = torch.where(positions >= 0, self.item_ids[positions.clamp(min=0)], -1)
        return ids.numpy(), scores.numpy(), version

    def exclude_positions(self, exclude: Any, rows: int) -> torch.Tensor:
        """Per-query item ids to leave out, as corpus positions.

        Args:
            exclude: B lists of item ids, or an int array `[B, E]`.
            rows: B, the queries of the batch.

        Returns:
            int64 `[B, E]` positions, -1 for padding and ids not in the corpus.

        Raises:
            ValueError: not B lists of ints.

        Example:

        ```python
        predictor.exclude_positions([[10, 12], []], 2)   # [[0, 2], [-1, -1]]
        ```
        """
        lists = [np.asarray(row) for row in exclude]
        if len(lists) != rows:
            raise ValueError(f"exclude holds {len(lists)} lists, the batch {rows} rows")
        if any(row.ndim != 1 or (row.size and not np.issubdtype(row.dtype, np.integer))
               for row in lists):
            raise ValueError("exclude must hold one list of int item ids per query row")
        lengths = torch.tensor([len(row) for row in lists], dtype=torch.int64)
        width = int(lengths.max()) if rows else 0
        flat = torch.from_numpy(np.concatenate(lists).astype(np.int64)) if width else \
            torch.zeros(0, dtype=torch.int64)
        slot = torch.searchsorted(self._sorted_ids, flat).clamp_(max=len(self.item_ids) - 1)
        positions = torch.where(self._sorted_ids[slot] == flat, self._order[slot], -1)
        padded = torch.full((rows, width), -1, dtype=torch.int64)
        columns = torch.arange(width)[None, :]
        padded[columns < lengths[:, None]] = positions
        return padded
