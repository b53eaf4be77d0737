"""The serving artifact on disk: its layout, manifest, checksums and rows.

An artifact is a directory:

    manifest.json                     format, kind ("full"), version, versions,
                                      features, layers (with each table's rows
                                      exported, `num_rows`), `min_count`,
                                      `rows_written_at`, `dense_weights`, files
    dense.pt2                         the dense network (`torch.export`)
    tables/L{l}.T{t}.r{rank}.safetensors
                                      keys and rows of physical table t of
                                      embedding layer l, as rank `rank` of
                                      the exporting job held them

A two-tower model's export (`TwoTower.export_serving(path, item_ids=...)`)
is a *retrieval* artifact: the same files for its query tower (the program
maps the query features to the L2-normalized query vector), plus

    candidates.safetensors            `ids` int64 [N], the corpus, and
                                      `embeddings` float32 [N, D], their
                                      candidate-tower vectors (L2-normalized)

named in the manifest's `files` and described by its `retrieval` entry
(`num_items`, `dim`, the query and candidate features). It has no deltas.

A *delta* (`export_serving(..., base=...)`) is a directory of the same
layout whose manifest has kind "delta" and names its `base` version: its
table files hold the rows written since the base and, as `deleted`, the
keys removed since (aged out or evicted); `dense.safetensors` holds the
dense network's weights, by the program's parameter names
(`dense_weights`). A version is `"{number}-{hash}"`: the number counts the
exports of a chain (a full export is 1, a delta its base's + 1), the hash
is the first 16 hex digits of the SHA-256 of the files' checksums and the
base's version.

With `min_count=k` only the rows seen in at least `k` training steps are
written; the others read zeros at serving, as ids never seen do.

The manifest names every file with its size and CRC-32, so a truncated or
altered file is found when the artifact loads. Rows are stored as float32,
float16 or int8; int8 rows are quantized row by row, with a float32 scale and
bias per row (`row = scale * q + bias`, `q` in [-128, 127]).
"""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from typing import Any

import numpy as np
import torch

FORMAT = "reckeras-serving"
FORMAT_VERSION = 2
# Version 1 (full exports before deltas: no kind, version, base, rows'
# time or dense weights) still loads and serves; no delta applies to it.
READABLE_VERSIONS = (1, 2)
MANIFEST = "manifest.json"
PROGRAM = "dense.pt2"
DENSE_WEIGHTS = "dense.safetensors"
CANDIDATES = "candidates.safetensors"
KINDS = ("full", "delta")
ROW_PRECISIONS = ("float32", "float16", "int8")
_CHUNK = 8 << 20


class ArtifactError(ValueError):
    """A serving artifact that is missing, damaged or of another format.

    The message names the file at fault.

    Example:

    ```python
    try:
        rk.serving.load("exported/model")
    except rk.serving.ArtifactError as error:
        print(error)   # exported/model/tables/L0.T0.r0.safetensors: ...
    ```
    """


class DeltaError(ArtifactError):
    """A serving delta that cannot be applied: damaged (a size or CRC-32
    that differs from its manifest), partial (a file or the manifest
    missing), of another format, or out of order (its base is not the
    version being served). The served version is left as it was.

    The message names the file or the versions at fault.

    Example:

    ```python
    try:
        predictor.apply_delta("exported/delta-0007")
    except rk.serving.DeltaError as error:
        print(error)   # ...: its base is 5-..., the served version is 6-...
    ```
    """


def version_of(number: int, files: dict[str, dict[str, int]], base: str | None) -> str:
    """The version of an export: its number in the chain and a content hash.

    Args:
        number: 1 for a full export, the base's number + 1 for a delta.
        files: the manifest's `files` (each file's size and CRC-32).
        base: the base's version for a delta, None for a full export.

    Returns:
        `"{number}-{16 hex digits}"`.

    Example:

    ```python
    version_of(1, {"dense.pt2": {"bytes": 10, "crc32": 7}}, None)   # '1-...'
    ```
    """
    content = json.dumps({"files": files, "base": base}, sort_keys=True).encode()
    return f"{number}-{hashlib.sha256(content).hexdigest()[:16]}"


def version_number(version: str) -> int:
    """The chain number of a version (`version_of`).

    Args:
        version: `"{number}-{hash}"`.

    Returns:
        The number.

    Example:

    ```python
    version_number("3-0123456789abcdef")   # 3
    ```
    """
    return int(version.split("-", 1)[0])


def table_file(layer: int, table: int, rank: int) -> str:
    """The artifact-relative path of one rank's rows of one table.

    Args:
        layer: the embedding layer's index.
        table: the physical table's index in the layer.
        rank: the rank that wrote the rows.

    Returns:
        `"tables/L{layer}.T{table}.r{rank}.safetensors"`.

    Example:

    ```python
    table_file(0, 1, 3)   # 'tables/L0.T1.r3.safetensors'
    ```
    """
    return f"tables/L{layer}.T{table}.r{rank}.safetensors"


def crc32_of(path: str) -> int:
    """The CRC-32 of a file, read in chunks.

    Args:
        path: the file.

    Returns:
        The checksum, an int.

    Example:

    ```python
    crc32_of("exported/model/dense.pt2")
    ```
    """
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def file_entry(root: str, name: str) -> dict[str, int]:
    """`{"bytes", "crc32"}` of a file of the artifact.

    Args:
        root: the artifact directory.
        name: the file's path inside it.

    Returns:
        Its size and CRC-32.

    Example:

    ```python
    file_entry("exported/model", "dense.pt2")   # {"bytes": 81234, "crc32": ...}
    ```
    """
    path = os.path.join(root, name)
    return {"bytes": os.path.getsize(path), "crc32": crc32_of(path)}


def read_manifest(root: str, kind: str | None = "full", check_files: bool = True
                  ) -> dict[str, Any]:
    """The manifest of an artifact or a delta, with every file it names checked.

    Args:
        root: the artifact (or delta) directory.
        kind: `"full"` or `"delta"`, what the directory must hold; None
            for either.
        check_files: whether to check every file's size and CRC-32 (an
            exporter reading its base's manifest needs none of its files).

    Returns:
        The parsed manifest.

    Raises:
        ArtifactError: (`DeltaError` for a delta) no manifest, another
            format, version or kind, or a file that is missing or whose
            size or CRC-32 differs (named).

    Example:

    ```python
    manifest = read_manifest("exported/model")
    manifest["features"][0]["class_name"]   # 'Numeric'
    ```
    """
    error = DeltaError if kind == "delta" else ArtifactError
    path = os.path.join(root, MANIFEST)
    try:
        with open(path) as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise error(f"{root}: no serving {'delta' if kind == 'delta' else 'artifact'} "
                    f"here (no {MANIFEST}; a writer that died leaves none)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as reason:
        raise error(f"{path}: not a readable manifest ({reason})") from None
    if manifest.get("format") != FORMAT or \
            manifest.get("format_version") not in READABLE_VERSIONS:
        raise error(f"{path}: format {manifest.get('format')!r} version "
                    f"{manifest.get('format_version')!r}; this reckeras reads "
                    f"{FORMAT!r} versions {READABLE_VERSIONS}")
    if manifest["format_version"] == 1:
        manifest = _from_version_1(manifest)
    if kind is not None and manifest.get("kind") != kind:
        raise error(f"{path}: a {manifest.get('kind')!r} export, expected a {kind!r} one"
                    + (" (load a full export with rk.serving.load, apply deltas to it)"
                       if kind == "delta" else " (apply a delta with "
                       "Predictor.apply_delta to the predictor of its base)"))
    for name, expected in manifest["files"].items() if check_files else ():
        file = os.path.join(root, name)
        if not os.path.exists(file):
            raise error(f"{file}: missing")
        if os.path.getsize(file) != expected["bytes"]:
            raise error(f"{file}: {os.path.getsize(file)} bytes, the manifest "
                        f"says {expected['bytes']} (truncated or replaced)")
        if crc32_of(file) != expected["crc32"]:
            raise error(f"{file}: its CRC-32 does not match the manifest "
                        f"(the file is damaged)")
    return manifest


def _from_version_1(manifest: dict[str, Any]) -> dict[str, Any]:
    """A version-1 manifest with the fields version 2 added: a full
    export, versioned by its files, whose rows' time is unknown and whose
    dense weights no delta can name (`dense_weights` None)."""
    return {**manifest, "kind": "full", "base": None, "rows_written_at": None,
            "dense_weights": None,
            "version": version_of(1, manifest["files"], None)}


def write_manifest(root: str, manifest: dict[str, Any]) -> None:
    """Writes the manifest (the last file of an export).

    Args:
        root: the artifact directory.
        manifest: what `read_manifest` gives back.

    Example:

    ```python
    write_manifest(tmp, {"format": FORMAT, "format_version": FORMAT_VERSION, ...})
    ```
    """
    with open(os.path.join(root, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def encode_rows(weights: np.ndarray, precision: str) -> dict[str, np.ndarray]:
    """The stored form of float32 rows.

    Args:
        weights: float32 `[n, dim]`.
        precision: one of `ROW_PRECISIONS`.

    Returns:
        `{"rows": ...}` in that dtype; for `"int8"` also float32 `"scale"`
        and `"bias"` per row: the row's range in 255 steps of `scale`, its
        minimum at `q = -128` (`bias = minimum + 128 * scale`).

    Example:

    ```python
    stored = encode_rows(np.array([[0.0, 1.0, 2.0]], np.float32), "int8")
    decode_rows(stored)   # ~[[0.0, 1.0, 2.0]], error at most scale / 2
    ```
    """
    if precision == "float32":
        return {"rows": np.ascontiguousarray(weights, dtype=np.float32)}
    if precision == "float16":
        return {"rows": weights.astype(np.float16)}
    low = weights.min(axis=1, keepdims=True) if weights.size else \
        np.zeros((len(weights), 1), np.float32)
    high = weights.max(axis=1, keepdims=True) if weights.size else low
    # 256 levels from the row's minimum to its maximum: q + 128 steps of scale.
    scale = np.where(high > low, (high - low) / 255.0, 1.0).astype(np.float32)
    q = np.clip(np.rint((weights - low) / scale) - 128, -128, 127).astype(np.int8)
    return {"rows": q, "scale": scale[:, 0], "bias": (low + 128 * scale)[:, 0]
            .astype(np.float32)}


def decode_rows(stored: dict[str, torch.Tensor]) -> torch.Tensor:
    """float32 rows of what `encode_rows` stored.

    Args:
        stored: `{"rows"}` (and `"scale"`, `"bias"` for int8).

    Returns:
        float32 `[n, dim]`.

    Example:

    ```python
    decode_rows({"rows": torch.ones(2, 4, dtype=torch.float16)})   # float32 ones
    ```
    """
    rows = stored["rows"]
    if rows.dtype != torch.int8:
        return rows.float()
    return rows.float() * stored["scale"][:, None] + stored["bias"][:, None]
