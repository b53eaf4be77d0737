"""Serving deltas read back: checked against the served version, their rows decoded.

`export_serving(..., base=...)` writes a delta (see `artifact`); a predictor
applies it (`Predictor.apply_delta`): it checks the delta and reads its rows
with the functions here, then writes them into the table copy no request
reads (`table_copies`) and swaps one reference. Like the rest of
`reckeras.serving`, nothing here imports Keras.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from reckeras.serving import artifact


def read_delta(path: str, served: dict[str, Any], served_version: str) -> dict[str, Any]:
    """The manifest of a delta, checked against the version it would update.

    Args:
        path: the delta's directory.
        served: the manifest of the full artifact being served.
        served_version: the version being served.

    Returns:
        The delta's manifest, every file it names checked.

    Raises:
        reckeras.serving.DeltaError: no manifest (a writer that died), a
            missing, truncated or damaged file, another format, a full
            artifact, a base that is not `served_version` (out of order),
            or layers, tables or dense weights that are not the served
            model's (each naming the file or the versions).

    Example:

    ```python
    manifest = read_delta("exported/ctr-2", predictor.manifest, predictor.version)
    manifest["base"] == predictor.version     # True
    ```
    """
    manifest = artifact.read_manifest(path, kind="delta")
    filename = os.path.join(path, artifact.MANIFEST)
    if manifest["base"] != served_version:
        raise artifact.DeltaError(
            f"{filename}: delta {manifest['version']} is based on version "
            f"{manifest['base']}, but version {served_version} is served (a delta "
            f"applies to its base only: apply the ones before it first)")
    layouts = [[table["dim"] for table in layer["tables"]]
               for layer in manifest["embedding_layers"]]
    expected = [[table["dim"] for table in layer["tables"]]
                for layer in served["embedding_layers"]]
    if served["dense_weights"] is None:
        raise artifact.DeltaError(
            f"{filename}: the served artifact (format version "
            f"{served['format_version']}) names no dense weights for a delta to "
            f"replace: serve a full export of format version {artifact.FORMAT_VERSION}")
    if layouts != expected or \
            sorted(manifest["dense_weights"]) != sorted(served["dense_weights"]):
        raise artifact.DeltaError(
            f"{filename}: its tables (dims {layouts}) or dense weights are not those of "
            f"the served model (dims {expected}): a changed model needs a full export")
    return manifest


def table_rows(path: str, files: list[str], error: type[artifact.ArtifactError]
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The keys, float32 rows and removed keys of one table, over the files
    every rank wrote.

    Args:
        path: the artifact or delta directory.
        files: the table's files (the manifest's `files` of the table).
        error: what a file safetensors cannot read raises.

    Returns:
        `(keys [n], rows [n, dim], removed [m])`; `removed` is empty for a
        full artifact.

    Raises:
        ArtifactError: (`error`) a file safetensors cannot read, named.

    Example:

    ```python
    keys, rows, removed = table_rows("exported/ctr", ["tables/L0.T0.r0.safetensors"],
                                     artifact.ArtifactError)
    ```
    """
    keys, rows, removed = [], [], []
    for name in files:
        file = os.path.join(path, name)
        try:
            stored = load_file(file)
        except (SafetensorError, OSError) as reason:
            raise error(f"{file}: {reason}") from reason
        keys.append(stored["keys"])
        rows.append(artifact.decode_rows(stored))
        removed.append(stored.get("deleted", torch.zeros(0, dtype=torch.int64)))
    return torch.cat(keys), torch.cat(rows), torch.cat(removed)
