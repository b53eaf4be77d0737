"""`reckeras.serving.load`: the predictor of an artifact, by what it holds."""

from __future__ import annotations

import os
from typing import Any

from reckeras.serving import artifact
from reckeras.serving.predictor import Predictor
from reckeras.serving.retrieval import RetrievalPredictor


def load(path: str | os.PathLike, index: str = "exact",
         index_options: dict[str, Any] | None = None) -> Predictor:
    """Loads an exported model for prediction, without Keras.

    Args:
        path: the directory `export_serving` wrote.
        index: for a retrieval artifact (a two-tower's), how `retrieve`
            searches the corpus: `"exact"` (chunked brute force), `"hnsw"`
            or `"ivf"` (faiss, `pip install "reckeras[ann]"`); a ranking
            artifact takes only `"exact"`.
        index_options: the ANN index's options (`reckeras.serving.ann`),
            None for its defaults.

    Returns:
        A `Predictor`, or a `RetrievalPredictor` for a retrieval artifact.

    Raises:
        reckeras.serving.ArtifactError: a missing, damaged or foreign file
            (named), found before anything is served.
        ValueError: an ANN index asked of a ranking artifact, or a bad
            index or option.
        ImportError: an ANN index without faiss.

    Example:

    ```python
    import reckeras.serving

    predictor = reckeras.serving.load("exported/ctr")
    predictor.predict({"I1": [1.0, 2.0], "C1": [7, -3]})
    items = reckeras.serving.load("exported/retrieval", index="hnsw")
    items.retrieve({"user_id": [7]}, k=20)
    ```
    """
    manifest = artifact.read_manifest(os.fspath(path), kind=None, check_files=False)
    if "retrieval" in manifest:
        return RetrievalPredictor(path, index, index_options)
    if index != "exact" or index_options:
        raise ValueError(f"{os.fspath(path)}: a ranking artifact; index={index!r} and "
                         f"index_options apply to a retrieval (two-tower) artifact")
    return Predictor(path)
