"""The on-disk layout of a checkpoint: its files, their names, the index
and the versions this reckeras reads.

Layout of a checkpoint directory::

    index.json                         kind (full or delta), id, base (a delta's),
                                       world size, tables, windows (each
                                       table's window count, where it ages
                                       out by windows), the epochs fitted
                                       (`fit`'s shuffle goes on from them),
                                       dense variable paths,
                                       every file's size and CRC-32, format
                                       version, the index's own CRC-32
    dense.safetensors                  dense weights and the Keras optimizer's state (rank 0)
    tables-00001-of-00004.safetensors  the rows rank 1 of 4 owns: for every
                                       embedding layer L and physical table T,
                                       L{L}.T{T}.keys / .weights / .state,
                                       .seen_steps (the training steps each row
                                       was seen in), .last_window (the window
                                       it was last trained in, where its table
                                       ages out by windows), .tags (each row's
                                       logical table, where the physical table
                                       packs several: int8, int16 or int32,
                                       the narrowest that holds its tables)
                                       and, in a delta, .deleted
                                       (keys freed since the base)

The arrays of a table file are those of a `rk.embedding.TableState`, by
field name. Rows are saved in their table's dtype (float32, float16 or
bfloat16; the index records it per physical table, `"dtype"`, float32 when
absent), and optimizer state in float32. Dense variables are named
`model/<i>` (the i-th of `model.variables`) and `optimizer/<i>`.
"""

from __future__ import annotations

import json
import os
import zlib
from typing import Any

import numpy as np
import torch

from reckeras.embedding.row_dtypes import ROW_DTYPES, numpy_dtype
from reckeras.embedding.table_state import TableLayout

FORMAT_VERSION = 5
# Version 1 (no sizes, no checksums) and 2 (no ids, table names or tags)
# still load, with every check but those, into the model they were saved from;
# version 3 (no row counts, no windows) loads with every row's count at 0 and
# its rows counted as trained in the model's current window.
# version 4 wrote tags as int32; 5 in the narrowest of int8, int16 and int32
# that holds the table's logical tables (`tag_code`).
READABLE_VERSIONS = (1, 2, 3, 4, 5)
# The dtypes a file's tags may have.
TAG_CODES = ("I8", "I16", "I32")
INDEX = "index.json"
DENSE = "dense.safetensors"
# The safetensors dtype codes a checkpoint holds, as torch and numpy dtypes.
TORCH_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
                "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
                "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}
NUMPY_DTYPES: dict[str, np.dtype] = {"F32": np.dtype(np.float32), "I64": np.dtype(np.int64),
                                      "I32": np.dtype(np.int32), "I16": np.dtype(np.int16),
                                      "I8": np.dtype(np.int8), "F16": np.dtype(np.float16),
                                      "BF16": numpy_dtype(torch.bfloat16)}
# The safetensors dtype of the rows of each `TableOptions.dtype`.
ROW_CODES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
# The per-row arrays of a table file that loading streams into place (keys,
# tags and deleted keys are read whole when a file is scanned).
STREAMED = ("weights", "state", "seen_steps", "last_window")


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded into this model; nothing was changed.

    Raised by `load_checkpoint` (and `rk.Model.load_checkpoint`) for a file
    that is missing, truncated, altered (its size or CRC-32 differs from the
    index), not a well-formed safetensors file, or holds tensors whose names,
    dtypes or shapes are not the model's; for an unreadable or damaged
    `index.json`; for a delta whose base is missing or is another save; and
    for a warm start the model cannot take (a table whose dim changed, a
    dense variable of another shape). The message names the file or table.
    On several ranks every rank raises it when any rank found a fault.

    Example:

    ```python
    try:
        model.load_checkpoint("ckpt/epoch3")
    except rk.checkpoint.CheckpointError:
        model.load_checkpoint("ckpt/epoch2")     # the one before
    ```
    """


def table_file(rank: int, world: int) -> str:
    """The name of the table file rank `rank` of `world` writes.

    Args:
        rank: the writing rank.
        world: the number of ranks that saved.

    Returns:
        E.g. `"tables-00001-of-00004.safetensors"`.
    """
    return f"tables-{rank:05d}-of-{world:05d}.safetensors"


def narrow_tags(tags: np.ndarray, tables: int) -> np.ndarray:
    """A table's tags in the narrowest signed int dtype that holds its
    logical tables (and -1, unknown): a tag takes 1 byte of a row, not 4,
    where a physical table packs up to 127 tables.

    Args:
        tags: int32 `[n]` tags.
        tables: the number of logical tables the physical table packs.

    Returns:
        The tags as int8, int16 or int32.

    Example:

    ```python
    narrow_tags(np.array([0, 25, -1], np.int32), 26).dtype   # int8
    ```
    """
    for dtype in (np.int8, np.int16):
        if tables <= np.iinfo(dtype).max + 1:      # tags 0 .. tables - 1, and -1
            return tags.astype(dtype)
    return tags


def tensor_name(layer: int, table: int, array: str) -> str:
    """The name of one array of a table file.

    Args:
        layer: the embedding layer's position in `model.embedding_layers`.
        table: the physical table's position in its engine.
        array: a `TableState` array's field name.

    Returns:
        E.g. `"L0.T1.weights"`.
    """
    return f"L{layer}.T{table}.{array}"


def parse_tensor_name(name: str) -> tuple[int, int, str]:
    """The inverse of `tensor_name`.

    Args:
        name: a table file's tensor name.

    Returns:
        `(layer, table, array)`.
    """
    layer, table, array = name.split(".")
    return int(layer[1:]), int(table[1:]), array


def dense_variables(model: Any) -> dict:
    """The dense variables a checkpoint saves, by their names in
    `dense.safetensors`.

    Args:
        model: an `rk.Model`.

    Returns:
        `{"model/<i>": variable, "optimizer/<i>": variable}` (the Keras
        optimizer's once it is built).
    """
    variables = {f"model/{i}": v for i, v in enumerate(model.variables)}
    if model.optimizer is not None and model.optimizer.built:
        variables.update({f"optimizer/{i}": v
                          for i, v in enumerate(model.optimizer.variables)})
    return variables


def layout_entry(layout: TableLayout) -> dict:
    """A physical table's entry in the index's `"layers"`.

    Args:
        layout: the table's layout.

    Returns:
        `{"dim", "state_width", "tables", "tags", "dtype"}`.
    """
    return {"dim": layout.dim, "state_width": layout.state_width,
            "tables": list(layout.tables), "tags": layout.tracks_tags, "dtype": layout.dtype}


def new_index(kind: str, identity: str, world_size: int, layouts: list[list[TableLayout]],
              windows: list[list[int | None]], dense_paths: list[str], files: dict,
              base: dict | None, epochs_fitted: int = 0) -> dict:
    """The index of a checkpoint being written, its own CRC-32 included.

    Args:
        kind: `"full"` or `"delta"`.
        identity: the checkpoint's id.
        world_size: the ranks that saved it.
        layouts: per embedding layer, the layout of each physical table.
        windows: per embedding layer, each physical table's window count
            (`TableState.window`: None where it does not age by windows).
        dense_paths: the paths of `model.variables`, in order.
        files: `{file name: {"bytes", "crc32"}}` of every file.
        base: a delta's base, `{"id", "path"}`; None for a full checkpoint.
        epochs_fitted: the epochs the model's `fit` calls completed (the
            shuffle seed of its next epoch without a `seed`).

    Returns:
        The index, as `index.json` holds it.
    """
    index = {"format_version": FORMAT_VERSION, "kind": kind, "id": identity,
             "world_size": world_size,
             "table_files": [table_file(r, world_size) for r in range(world_size)],
             "layers": [[layout_entry(layout) for layout in layer] for layer in layouts],
             "windows": windows, "epochs_fitted": epochs_fitted,
             "dense_paths": dense_paths, "files": files}
    if base is not None:
        index["base"] = base
    index["index_crc32"] = index_crc(index)
    return index


def index_crc(index: dict) -> int:
    """The CRC-32 of an index's fields but its own CRC-32.

    Args:
        index: an index.

    Returns:
        The checksum `"index_crc32"` records.
    """
    fields = {k: v for k, v in index.items() if k != "index_crc32"}
    return zlib.crc32(json.dumps(fields, sort_keys=True).encode())


def resolve(path: str) -> str:
    """The directory that holds the checkpoint saved at `path`.

    Args:
        path: a checkpoint's path.

    Returns:
        `path`, or `path + ".old"` after a crash between the two renames
        of a save (see `write`).

    Raises:
        FileNotFoundError: neither holds an index.
    """
    if not os.path.exists(os.path.join(path, INDEX)):
        if os.path.exists(os.path.join(path + ".old", INDEX)):
            return path + ".old"
        raise FileNotFoundError(f"no checkpoint at {path!r} (no {INDEX})")
    return path


def without_dtypes(layers: list) -> list:
    """An index's tables less their row dtypes: the links of a chain may
    differ in those (a model loads a checkpoint of another dtype, then saves
    a delta against it).

    Args:
        layers: an index's `"layers"`.

    Returns:
        The same entries without `"dtype"`.
    """
    return [[{k: v for k, v in t.items() if k != "dtype"} for t in layer]
            for layer in layers]


def read_index(path: str) -> dict:
    """Reads and checks a checkpoint's index.

    Args:
        path: the checkpoint directory.

    Returns:
        The index.

    Raises:
        CheckpointError: it is not valid JSON, its CRC-32 or a field is
            wrong, or its format version is one this reckeras does not read.
    """
    filename = os.path.join(path, INDEX)
    try:
        with open(filename, "rb") as f:
            index = json.loads(f.read())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{filename} is not valid JSON ({error}): the index is "
                              f"damaged") from error

    def bad(what):
        return CheckpointError(f"{filename} is damaged or not a reckeras index: {what}")

    if not isinstance(index, dict):
        raise bad("not a JSON object")
    # The index's own CRC-32 first: a damaged format_version is damage.
    recorded = index.get("index_crc32")
    if recorded is not None and recorded != index_crc(index):
        raise bad(f"its CRC-32 is {index_crc(index)}, the index records {recorded!r}")
    version = index.get("format_version")
    if type(version) is not int or version not in READABLE_VERSIONS:
        raise CheckpointError(f"{filename} has format_version {version!r}; this reckeras "
                              f"reads {', '.join(map(str, READABLE_VERSIONS))}")
    if version >= 2 and recorded is None:
        raise bad("it has no index_crc32")
    size = index.get("world_size")
    if not isinstance(size, int) or size < 1:
        raise bad(f"world_size {size!r}")
    if index.get("table_files") != [table_file(r, size) for r in range(size)]:
        raise bad(f"table_files {index.get('table_files')!r} are not those of "
                  f"{size} ranks")
    layers = index.get("layers")
    if not (isinstance(layers, list) and all(
            isinstance(layer, list) and all(
                isinstance(t, dict) and isinstance(t.get("dim"), int)
                and isinstance(t.get("state_width"), int)
                and t.get("dtype", "float32") in ROW_DTYPES for t in layer)
            for layer in layers)):
        raise bad(f"layers {layers!r}")
    if version >= 2:
        files = index.get("files")
        names = [DENSE, *index["table_files"]]
        if not (isinstance(files, dict) and sorted(files) == sorted(names) and all(
                isinstance(files[n], dict) and isinstance(files[n].get("bytes"), int)
                and isinstance(files[n].get("crc32"), int) for n in names)):
            raise bad(f"files {files!r} do not give bytes and crc32 of {names}")
    if version >= 3:
        _check_version_3(index, bad)
    if version >= 4:
        windows = index.get("windows")
        if not (isinstance(windows, list) and len(windows) == len(layers) and all(
                isinstance(w, list) and len(w) == len(layer) and all(
                    n is None or (type(n) is int and n >= 0) for n in w)
                for w, layer in zip(windows, layers, strict=True))):
            raise bad(f"windows {windows!r} do not give a window count or null per table")
    # Added within format 4: an index without it loads as 0.
    epochs = index.get("epochs_fitted", 0)
    if type(epochs) is not int or epochs < 0:
        raise bad(f"epochs_fitted {epochs!r} is not a count")
    return index


def _check_version_3(index, bad):
    """The fields format 3 added: kind, id, base, table names and tags,
    dense variable paths."""
    if index.get("kind") not in ("full", "delta") or not isinstance(index.get("id"), str):
        raise bad(f"kind {index.get('kind')!r}, id {index.get('id')!r}")
    base = index.get("base")
    if index["kind"] == "delta" and not (isinstance(base, dict) and isinstance(
            base.get("id"), str) and isinstance(base.get("path"), str)):
        raise bad(f"a delta's base {base!r} gives no id and path")
    if not all(isinstance(t.get("tables"), list) and t["tables"]
               and all(isinstance(n, str) for n in t["tables"])
               and isinstance(t.get("tags"), bool) for layer in index["layers"] for t in layer):
        raise bad(f"layers {index['layers']!r} do not name their tables")
    paths = index.get("dense_paths")
    if not (isinstance(paths, list) and all(isinstance(p, str) for p in paths)):
        raise bad(f"dense_paths {paths!r}")
