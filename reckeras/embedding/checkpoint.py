"""Checked checkpoints of a whole model: full and delta, re-sharding from N
ranks to M, and loadable into a changed model (warm start).

Layout of a checkpoint directory::

    index.json                         kind (full or delta), id, base (a delta's),
                                       world size, tables, windows (each
                                       table's window count, where it ages
                                       out by windows), dense variable paths,
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
                                       packs several) and, in a delta, .deleted
                                       (keys freed since the base)

Rows are saved in their table's dtype (float32, float16 or bfloat16; the
index records it per physical table, `"dtype"`, float32 when absent), and
optimizer state in float32. A checkpoint loads into a table of another row
dtype, rows converted to the table's (rounded to the nearest, ties to even),
and so do the links of a chain saved with different row dtypes.

A *full* checkpoint holds every row. A *delta* (`save_checkpoint(...,
base=...)`) holds the dense weights whole and only the rows written since
its base, with their optimizer state, plus the keys deleted since (rows the
lifecycle evicted). Its index names the base by the base's id (a random
128-bit id every save draws) and by its path relative to the delta, so
`load_checkpoint(delta)` follows the links back to a full checkpoint and
refuses a chain whose link is missing or is another save, naming the file.
Tables track changes cheaply (`table.PhysicalTable`): a training lookup
marks its rows with the current save generation, one indexed write; a save
ends the generation. A base must be a checkpoint this model saved, or
loaded exactly, since its last full save or load.

Loading on M ranks: each rank keeps the keys it owns under M ranks
(`sharding.owner_of`), so any N -> M works, link by link (the links of a
chain may come from different world sizes). It streams the table files in
chunks and keeps only its own rows, so its memory grows with its share of
the tables, not with the whole checkpoint. It reads only the files that can
hold rows it owns: file r of N when r = rank (mod gcd(N, M)), so all of them
when N and M are coprime, one when N = M. Of a chain, a row comes from the
last link that holds it, unless a later link deleted it.

Loading verifies before it changes anything: every file a rank needs, of
every link, is read whole, its size and CRC-32 compared with the index, its
safetensors header parsed and its tensors' names, dtypes and shapes
compared with the model, and the ranks agree that all of them passed,
before the first dense variable or table row is written. A damaged,
missing or foreign file raises `CheckpointError` naming it, and the model
stays as it was, on every rank.

`load_checkpoint(..., warm_start=True)` loads into a changed model: tables
matched by name (`rename_tables` maps old names to new ones; a renamed
table's keys are re-salted, `key ^ salt(old) ^ salt(new)`), tables the
checkpoint lacks start fresh, tables the model lacks are reported and
skipped, a table whose dim changed is an error naming it; dense variables
matched by path, with shape checks (`skip_mismatch`).

Writes are atomic: all ranks write into `<path>.tmp`; then rank 0 moves the
previous checkpoint to `<path>.old`, renames `<path>.tmp` to `<path>` and
deletes `<path>.old`. A crash at any point leaves a complete checkpoint at
`<path>` or, in the instant between the two renames, at `<path>.old`,
which `load_checkpoint` falls back to.

Example:

```python
from reckeras.embedding.checkpoint import CheckpointError

model.save_checkpoint("ckpt/full")
model.fit(train, epochs=1)
model.save_checkpoint("ckpt/delta1", base="ckpt/full")
try:
    model.load_checkpoint("ckpt/delta1")    # loads ckpt/full, then the delta
except CheckpointError as error:            # names the damaged file; nothing changed
    print(error)
```
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import struct
import uuid
import warnings
import weakref
import zlib
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import save_file

from reckeras import distributed
from reckeras.embedding.lifecycle import RowLifecycle
from reckeras.embedding.packing import table_salt
from reckeras.embedding.row_dtypes import ROW_DTYPES, dtype_name, numpy_dtype, to_torch
from reckeras.embedding.sharding import owner_of

FORMAT_VERSION = 4
# Version 1 (no sizes, no checksums) and 2 (no ids, table names or tags)
# still load, with every check but those, into the model they were saved from;
# version 3 (no row counts, no windows) loads with every row's count at 0 and
# its rows counted as trained in the model's current window.
_READABLE_VERSIONS = (1, 2, 3, 4)
INDEX = "index.json"
DENSE = "dense.safetensors"
# Bytes read per step when a file is streamed: what a rank holds beyond its
# own rows while it loads.
CHUNK_BYTES = 8 * 2**20
_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
           "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
           "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}
_NUMPY = {"F32": np.float32, "I64": np.int64, "I32": np.int32, "F16": np.float16,
          "BF16": numpy_dtype(torch.bfloat16)}
# The safetensors dtype of the rows of each `TableOptions.dtype`.
_ROWS = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
# The per-row arrays of a table file that loading streams into place (keys,
# tags and deleted keys are read whole when a file is scanned).
_STREAMED = ("weights", "state", "seen_steps", "last_window")


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
    except rk.embedding.CheckpointError:
        model.load_checkpoint("ckpt/epoch2")     # the one before
    ```
    """


@dataclasses.dataclass
class LoadReport:
    """What `load_checkpoint` loaded, and for a warm start what it did not.

    Args:
        chain: the checkpoint directories read, the full one first (one
            entry for a full checkpoint).
        warm_start: whether tables and variables were matched by name.
        added_tables: tables of the model the checkpoint has none of
            (they start with fresh rows).
        removed_tables: tables of the checkpoint the model lacks (skipped).
        renamed_tables: `{checkpoint table: model table}` whose rows were
            re-keyed.
        added_variables: dense variable paths the checkpoint lacks (they
            keep the model's values).
        removed_variables: dense variable paths of the checkpoint the model
            lacks (skipped).
        skipped_variables: dense variables whose shape differs, kept at the
            model's values (`skip_mismatch=True`).

    Example:

    ```python
    report = model.load_checkpoint("ckpt/full", warm_start=True)
    print(report.added_tables, report.removed_tables)
    ```
    """

    chain: list[str]
    warm_start: bool = False
    added_tables: list[str] = dataclasses.field(default_factory=list)
    removed_tables: list[str] = dataclasses.field(default_factory=list)
    renamed_tables: dict[str, str] = dataclasses.field(default_factory=dict)
    added_variables: list[str] = dataclasses.field(default_factory=list)
    removed_variables: list[str] = dataclasses.field(default_factory=list)
    skipped_variables: list[str] = dataclasses.field(default_factory=list)


class _History:
    """The save generations of one model: the current one, and the
    checkpoints a delta may use as its base (id -> the generation it
    captured): those saved, or loaded exactly, since the last full save or
    load."""

    def __init__(self):
        self.generation = 1
        self.bases = {}


_HISTORIES = weakref.WeakKeyDictionary()


def _history(model):
    if model not in _HISTORIES:
        _HISTORIES[model] = _History()
    return _HISTORIES[model]


def _indexes(model):
    return [store.index for layer in model.embedding_layers for store in layer.engine.tables]


def _end_generation(model, history):
    """Ends the current generation in the model and every table: what is
    written from now on is newer than the checkpoint being made."""
    ended = history.generation
    for index in _indexes(model):
        index.generation = ended
        index.next_generation()
    history.generation = ended + 1
    return ended


def _barrier():
    if distributed.world().size > 1:
        with distributed.collective("the checkpoint barrier"):
            dist.barrier()


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _crc32_file(filename):
    """`(bytes, crc32)` of a file, read in chunks."""
    crc, size = 0, 0
    buffer = bytearray(CHUNK_BYTES)
    with open(filename, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            crc = zlib.crc32(memoryview(buffer)[:n], crc)
            size += n
    return size, crc


def _write(tensors, filename, metadata=None):
    save_file({k: v.contiguous() for k, v in tensors.items()}, filename, metadata)
    with open(filename, "rb") as f:
        os.fsync(f.fileno())
    size, crc = _crc32_file(filename)
    return {"bytes": size, "crc32": crc}


def _table_file(rank, world):
    return f"tables-{rank:05d}-of-{world:05d}.safetensors"


def _dense_variables(model):
    variables = {f"model/{i}": v for i, v in enumerate(model.variables)}
    if model.optimizer is not None and model.optimizer.built:
        variables.update({f"optimizer/{i}": v
                          for i, v in enumerate(model.optimizer.variables)})
    return variables


def _index_crc(index):
    fields = {k: v for k, v in index.items() if k != "index_crc32"}
    return zlib.crc32(json.dumps(fields, sort_keys=True).encode())


def _same_path(a, b):
    return os.path.normpath(os.path.abspath(a)) == os.path.normpath(os.path.abspath(b))


def save_checkpoint(model: Any, path: str | os.PathLike,
                    base: str | os.PathLike | None = None) -> None:
    """Saves dense weights, tables and both optimizers' state (all ranks call it).

    Without `base`, a full checkpoint: every row. With `base`, a delta: the
    dense weights and the Keras optimizer's state whole, and of the tables
    only the rows written since `base` (with their optimizer state) and the
    keys deleted since. The index records every file's size and CRC-32,
    which `load_checkpoint` checks, and for a delta the base's id and path.

    Args:
        model: an `rk.Model`.
        path: checkpoint directory (on a filesystem all ranks share).
        base: a checkpoint this model saved, or loaded exactly
            (`warm_start=False`), since its last full save or load; None
            for a full checkpoint.

    Raises:
        ValueError: `base` is `path` itself, or is not a checkpoint this
            model saved or loaded since its last full one (it names the
            base's index file).
        FileNotFoundError: no checkpoint at `base`.

    Example:

    ```python
    save_checkpoint(model, "ckpt/epoch3")                      # full
    save_checkpoint(model, "ckpt/epoch4", base="ckpt/epoch3")  # delta
    ```
    """
    world = distributed.world()
    path = os.fspath(path)
    history = _history(model)
    since, link = (None, None) if base is None else _base_link(history, path, os.fspath(base))
    tmp = path + ".tmp"
    if world.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    _barrier()
    tables = {}
    for l, layer in enumerate(model.embedding_layers):
        for t, store in enumerate(layer.engine.tables):
            arrays = store.export() if since is None else store.export_changes(since)
            if _ages_by_windows(store):
                arrays["last_window"] = store.last_windows(arrays["keys"])
            for name, array in arrays.items():
                tables[f"L{l}.T{t}.{name}"] = to_torch(array)
    # Exported: rows written from here on belong to the next checkpoint.
    generation = _end_generation(model, history)
    name = _table_file(world.rank, world.size)
    checked = [(name, _write(tables, os.path.join(tmp, name)))]
    del tables
    identity = uuid.uuid4().hex
    if world.size > 1:
        # Rank 0 writes every file's checksum into the index (and its id is
        # the checkpoint's); the gather also waits for every rank's table file.
        everyone = [None] * world.size
        with distributed.collective("gathering the checkpoint's table checksums"):
            dist.all_gather_object(everyone, (checked[0], identity))
        checked = [entry for entry, _ in everyone]
        identity = everyone[0][1]
    if world.is_main:
        dense = {name: torch.as_tensor(np.asarray(v.numpy())).clone()
                 for name, v in _dense_variables(model).items()}
        checked.append((DENSE, _write(dense, os.path.join(tmp, DENSE))))
        index = {"format_version": FORMAT_VERSION, "kind": "full" if link is None else "delta",
                 "id": identity, "world_size": world.size,
                 "table_files": [_table_file(r, world.size) for r in range(world.size)],
                 "layers": [[{"dim": store.dim, "state_width": store.state.shape[1],
                              "tables": names, "tags": store.index.tags is not None,
                              "dtype": dtype_name(store.index.weights.dtype)}
                             for store, names in zip(layer.engine.tables,
                                                     layer.engine.packing.group_tables)]
                            for layer in model.embedding_layers],
                 "windows": [[_window(store) for store in layer.engine.tables]
                             for layer in model.embedding_layers],
                 "dense_paths": [v.path for v in model.variables],
                 "files": dict(checked)}
        if link is not None:
            index["base"] = link
        index["index_crc32"] = _index_crc(index)
        with open(os.path.join(tmp, INDEX), "w") as f:
            json.dump(index, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
    _barrier()
    if world.is_main:
        old = path + ".old"
        if os.path.exists(path):
            shutil.rmtree(old, ignore_errors=True)
            os.rename(path, old)
        os.rename(tmp, path)
        _fsync_dir(os.path.dirname(os.path.abspath(path)))
        shutil.rmtree(old, ignore_errors=True)
    _barrier()
    if link is None:
        # No delta will reach back past a full checkpoint: older bases and
        # the tombstones they needed are dropped.
        history.bases = {}
        for index in _indexes(model):
            index.forget_deleted(generation)
    history.bases[identity] = generation


def _ages_by_windows(store):
    return isinstance(store, RowLifecycle) and store.ages_by_windows


def _window(store):
    """The window count of a table that ages out by windows (its rows'
    `last_window` count from it), else None."""
    return store.window if _ages_by_windows(store) else None


def _base_link(history, path, base):
    """`(generation of base, the link the delta's index records)`."""
    if _same_path(path, base):
        raise ValueError(f"a delta checkpoint cannot be saved over its own base {base!r}: "
                         f"give it another path")
    directory = _resolve(base)
    index = _read_index(directory)
    filename = os.path.join(directory, INDEX)
    if index["format_version"] < 3:
        raise ValueError(f"{filename} is of format {index['format_version']}, which has no "
                         f"checkpoint id: a delta needs a base saved by this reckeras")
    generation = history.bases.get(index["id"])
    if generation is None:
        raise ValueError(
            f"{filename}: checkpoint {index['id']} is not one this model saved, or loaded "
            f"exactly, since its last full checkpoint, so the model does not know what "
            f"changed since it; save a full checkpoint (base=None) first")
    relative = os.path.relpath(os.path.abspath(base), os.path.dirname(os.path.abspath(path)))
    return generation, {"id": index["id"], "path": relative}


def load_checkpoint(model: Any, path: str | os.PathLike, warm_start: bool = False,
                    rename_tables: dict[str, str | None] | None = None,
                    skip_mismatch: bool = False) -> LoadReport:
    """Loads a checkpoint (or a chain: a delta and its bases) saved on any
    number of ranks into `model`.

    Exact by default: the model must have the tables and dense variables it
    was saved from, and compiled (its Keras optimizer's state is restored
    too; an optimizer not built yet is built first). With `warm_start=True`
    the model may have changed (see the module docstring); its Keras
    optimizer's state is not restored then (it follows the dense variables,
    which changed), each row's sparse optimizer state is. Every rank calls
    it. Every file this rank needs is read and checked before anything
    changes, and only this rank's rows are kept.

    Args:
        model: an `rk.Model`.
        path: checkpoint directory (a full checkpoint or a delta).
        warm_start: match tables and dense variables by name.
        rename_tables: `{checkpoint table: model table}`, or `None` as the
            value to skip a table of the checkpoint (warm start only).
        skip_mismatch: keep the model's value of a dense variable whose
            shape differs instead of raising (warm start only).

    Returns:
        A `LoadReport`; a warm start also warns (rank 0) about what it
        skipped.

    Raises:
        FileNotFoundError: no checkpoint (no `index.json`) at `path`.
        CheckpointError: a file of the checkpoint or of a base it names is
            missing, damaged, of another save, or does not match the model
            (on any rank); the model is unchanged.
        ValueError: `rename_tables` or `skip_mismatch` without `warm_start`,
            or `rename_tables` naming a table neither side has.

    Example:

    ```python
    load_checkpoint(model, "ckpt/epoch3")    # what model.load_checkpoint runs
    ```
    """
    if not warm_start and (rename_tables or skip_mismatch):
        raise ValueError("rename_tables and skip_mismatch apply to a warm start: pass "
                         "warm_start=True")
    path = _resolve(os.fspath(path))
    world = distributed.world()
    history = _history(model)
    try:
        chain = _chain(path)
        report = LoadReport([directory for directory, _ in chain], warm_start)
        routes = _routes(model, chain, warm_start, dict(rename_tables or {}), report)
        dense = _read_dense(chain[-1][0], chain[-1][1].get("files"))
        assignments = _match_dense(model, dense, chain[-1], report, skip_mismatch) \
            if warm_start else _check_dense(model, dense, os.path.join(chain[-1][0], DENSE))
        del dense
        tables = _read_tables(model, chain, routes, world)
        failure = None
    except Exception as error:  # noqa: BLE001 -- the other ranks must hear of any failure
        failure = error
    _agree(failure, path, world)
    # Everything is read and checked on every rank: from here on, only writes.
    for variable, value in assignments:
        variable.assign(value)
    del assignments
    for index in _indexes(model):
        index.generation = history.generation
    for layer in model.embedding_layers:
        layer.engine.load_tables(tables.pop(0))
    generation = _end_generation(model, history)
    for index in _indexes(model):
        index.forget_deleted(generation)
    last = chain[-1][1]
    # A warm-started model is not the checkpoint's state: no delta can be
    # based on it. An exact load of this format can.
    history.bases = {last["id"]: generation} \
        if not warm_start and last["format_version"] >= 3 else {}
    if warm_start and world.is_main and (report.removed_tables or report.removed_variables
                                         or report.skipped_variables):
        warnings.warn(f"warm start from {path!r} skipped tables {report.removed_tables}, "
                      f"dense variables {report.removed_variables} the model lacks and "
                      f"{report.skipped_variables} of another shape", stacklevel=3)
    _barrier()
    return report


def _resolve(path):
    if not os.path.exists(os.path.join(path, INDEX)):
        if os.path.exists(os.path.join(path + ".old", INDEX)):
            return path + ".old"       # a crash between the two renames of a save
        raise FileNotFoundError(f"no checkpoint at {path!r} (no {INDEX})")
    return path


def _agree(failure, path, world):
    """Raises on every rank when any rank's checks failed (so that no rank
    loads while another keeps its old weights)."""
    if world.size > 1:
        verdicts = [None] * world.size
        mine = None if failure is None else f"{type(failure).__name__}: {failure}"
        with distributed.collective("agreeing that every rank checked the checkpoint"):
            dist.all_gather_object(verdicts, mine)
        if failure is None and any(verdicts):
            rank = next(r for r, v in enumerate(verdicts) if v)
            raise CheckpointError(f"checkpoint {path!r}: rank {rank} of {world.size} could "
                                  f"not load it, so no rank does: {verdicts[rank]}")
    if failure is not None:
        raise failure


def _chain(path):
    """`[(directory, index)]` from the full checkpoint to `path`, every
    link's base checked to be the save its delta names."""
    links = [(path, _read_index(path))]
    seen = {links[0][1].get("id")}
    while links[-1][1].get("kind", "full") == "delta":
        directory, index = links[-1]
        link = index["base"]
        base = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(directory)),
                                             link["path"]))
        filename = os.path.join(directory, INDEX)
        try:
            base_directory = _resolve(base)
        except FileNotFoundError as error:
            raise CheckpointError(f"{filename}: its base {base} is missing (no {INDEX}): "
                                  f"the chain of deltas is broken") from error
        base_index = _read_index(base_directory)
        base_filename = os.path.join(base_directory, INDEX)
        if base_index.get("id") != link["id"]:
            raise CheckpointError(
                f"{base_filename} is checkpoint {base_index.get('id')}, but the delta "
                f"{directory} was saved against checkpoint {link['id']}: the base was "
                f"replaced by another save")
        if base_index["id"] in seen:
            raise CheckpointError(f"{base_filename}: the chain of deltas loops back to it")
        seen.add(base_index["id"])
        if _without_dtypes(base_index["layers"]) != _without_dtypes(index["layers"]):
            raise CheckpointError(f"{base_filename} holds other tables than its delta "
                                  f"{directory}: {base_index['layers']} against "
                                  f"{index['layers']}")
        links.append((base_directory, base_index))
    return links[::-1]


def _without_dtypes(layers):
    """An index's tables less their row dtypes: the links of a chain may
    differ in those (a model loads a checkpoint of another dtype, then saves
    a delta against it)."""
    return [[{k: v for k, v in t.items() if k != "dtype"} for t in layer]
            for layer in layers]


def _read_index(path):
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
    if recorded is not None and recorded != _index_crc(index):
        raise bad(f"its CRC-32 is {_index_crc(index)}, the index records {recorded!r}")
    version = index.get("format_version")
    if type(version) is not int or version not in _READABLE_VERSIONS:
        raise CheckpointError(f"{filename} has format_version {version!r}; this reckeras "
                              f"reads {', '.join(map(str, _READABLE_VERSIONS))}")
    if version >= 2 and recorded is None:
        raise bad("it has no index_crc32")
    size = index.get("world_size")
    if not isinstance(size, int) or size < 1:
        raise bad(f"world_size {size!r}")
    if index.get("table_files") != [_table_file(r, size) for r in range(size)]:
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
                for w, layer in zip(windows, layers))):
            raise bad(f"windows {windows!r} do not give a window count or null per table")
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


@dataclasses.dataclass
class _Route:
    """Where the rows of one saved physical table go, per saved tag (each
    array has one entry per table of `tables`, then one for rows whose
    table is unknown, tag -1).

    `target` is the model's physical table (same layer and dim) or None;
    a row of tag i is kept if `kept[i]`, its key becomes `key ^ xor[i]` and
    its tag `tag[i]`. Rows a file has no tags for have tag `untagged`.
    """

    tables: list
    width: int
    target: int | None
    xor: np.ndarray
    kept: np.ndarray
    tag: np.ndarray
    untagged: int

    @classmethod
    def empty(cls, tables, width):
        count = len(tables)
        return cls(list(tables), width, None, np.zeros(count + 1, np.int64),
                   np.zeros(count + 1, bool), np.full(count + 1, -1, np.int32),
                   0 if count == 1 else -1)


def _routes(model, chain, warm_start, rename, report):
    """Per saved layer, the `_Route` of each saved physical table."""
    path, index = chain[-1]
    saved = index["layers"]
    layers = model.embedding_layers
    expected = [[store.dim for store in layer.engine.tables] for layer in layers]
    found = [[t["dim"] for t in layer] for layer in saved]
    version = index["format_version"]
    if not warm_start:
        if expected != found:
            raise CheckpointError(f"checkpoint {path!r} holds tables of dims {found}, the "
                                  f"model has {expected}")
        names = [[t["tables"] for t in layer] for layer in saved] if version >= 3 else None
        model_names = [layer.engine.packing.group_tables for layer in layers]
        if names is not None and names != model_names:
            raise CheckpointError(f"checkpoint {path!r} holds tables {names}, the model has "
                                  f"{model_names}: load it with warm_start=True to match "
                                  f"them by name")
        routes = []
        for layer, groups in zip(saved, model_names):
            routes.append([])
            for target, (entry, group) in enumerate(zip(layer, groups)):
                route = _Route.empty(group, entry["state_width"])
                route.target = target
                route.kept[:] = True
                route.tag[:-1] = np.arange(len(group))
                routes[-1].append(route)
    else:
        if version < 3:
            raise CheckpointError(
                f"{os.path.join(path, INDEX)} is of format {version}, which does not name "
                f"its tables: a warm start needs format {FORMAT_VERSION} (load it into the "
                f"model it was saved from and save it again)")
        if len(saved) != len(layers):
            raise CheckpointError(f"checkpoint {path!r} has {len(saved)} embedding layers, "
                                  f"the model has {len(layers)}: a warm start matches "
                                  f"tables layer by layer")
        routes = _warm_routes(model, path, saved, rename, report)
    for layer, layer_routes in zip(layers, routes):
        for route in layer_routes:
            store = None if route.target is None else layer.engine.tables[route.target]
            if store is not None and store.state.shape[1] not in (0, route.width):
                raise CheckpointError(
                    f"checkpoint {path!r}: table {store.name} was saved with "
                    f"{route.width} optimizer state values per row, the model's sparse "
                    f"optimizer keeps {store.state.shape[1]}")
    return routes


def _warm_routes(model, path, saved, rename, report):
    """`_routes` of a warm start: tables matched by name, renamed by `rename`."""
    groups = [layer.engine.packing.group_tables for layer in model.embedding_layers]
    saved_names = sorted({n for layer in saved for t in layer for n in t["tables"]})
    model_names = sorted({n for layer in groups for group in layer for n in group})
    unknown = sorted(set(rename) - set(saved_names))
    if unknown:
        raise ValueError(f"rename_tables names {unknown}, which checkpoint {path!r} does "
                         f"not have; its tables are {saved_names}")
    missing = sorted({n for n in rename.values() if n is not None} - set(model_names))
    if missing:
        raise ValueError(f"rename_tables maps to {missing}, which the model does not have; "
                         f"its tables are {model_names}")
    routes = []
    for layer, saved_layer, layer_groups in zip(model.embedding_layers, saved, groups):
        place = {name: (target, tag) for target, group in enumerate(layer_groups)
                 for tag, name in enumerate(group)}
        sources = {}              # the model's table -> the checkpoint's that loads into it
        routes.append([])
        for entry in saved_layer:
            route = _Route.empty(entry["tables"], entry["state_width"])
            for i, name in enumerate(entry["tables"]):
                new = rename.get(name, name)
                if new not in place:
                    report.removed_tables.append(name)
                    continue
                if new in sources:
                    raise CheckpointError(
                        f"checkpoint {path!r}: tables {sources[new]!r} and {name!r} would "
                        f"both load into table {new!r}; map one of them elsewhere in "
                        f"rename_tables (or to None)")
                sources[new] = name
                target, tag = place[new]
                dim = layer.engine.tables[target].dim
                if dim != entry["dim"]:
                    raise CheckpointError(
                        f"checkpoint {path!r}: table {name!r} has dim {entry['dim']}, the "
                        f"model's table {new!r} has dim {dim}; a table whose dim changed "
                        f"cannot be warm-started (rename_tables={{{name!r}: None}} starts "
                        f"it fresh)")
                route.target = target
                route.xor[i] = table_salt(name) ^ table_salt(new)
                route.kept[i], route.tag[i] = True, tag
                if new != name:
                    report.renamed_tables[name] = new
            # Rows of an unknown table load only where nothing changes for them.
            route.kept[-1] = route.target is not None \
                and layer_groups[route.target] == entry["tables"] \
                and not route.xor.any() \
                and route.tag[:-1].tolist() == list(range(len(entry["tables"])))
            routes[-1].append(route)
        report.added_tables += [n for group in layer_groups for n in group
                                if n not in sources]
    return routes


class _File:
    """One safetensors file of the checkpoint, open, its header parsed and
    its size checked against the index.

    `tensors` maps a name to `(dtype, shape, begin, end)`, byte offsets from
    the file's start, in file order.
    """

    def __init__(self, path, name, files):
        self.filename = os.path.join(path, name)
        self.expected = None if files is None else files[name]
        try:
            self.file = open(self.filename, "rb", buffering=0)
        except FileNotFoundError as error:
            raise CheckpointError(f"{self.filename} is missing: the checkpoint is "
                                  f"incomplete") from error
        try:
            self._parse()
        except BaseException:
            self.file.close()
            raise

    def error(self, what):
        return CheckpointError(f"{self.filename}: {what}")

    def _parse(self):
        self.size = os.fstat(self.file.fileno()).st_size
        if self.expected is not None and self.size != self.expected["bytes"]:
            raise self.error(f"has {self.size} bytes, the index records "
                             f"{self.expected['bytes']}: the file is truncated or was "
                             f"overwritten")
        head = self.file.read(8)
        if len(head) < 8:
            raise self.error(f"has {self.size} bytes: too short for a safetensors header")
        (length,) = struct.unpack("<Q", head)
        if length > self.size - 8:
            raise self.error(f"its safetensors header says it is {length} bytes long, the "
                             f"file has {self.size - 8} after the length: truncated or "
                             f"damaged")
        self.header = head + self.file.read(length)
        try:
            header = json.loads(self.header[8:])
            if not isinstance(header, dict):
                raise ValueError("not a JSON object")
        except ValueError as error:
            raise self.error(f"its safetensors header is not valid JSON ({error})") from error
        header.pop("__metadata__", None)
        start, tensors = 8 + length, []
        for name, entry in header.items():
            try:
                dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
                ok = (dtype in _DTYPES and all(isinstance(d, int) and d >= 0 for d in shape)
                      and isinstance(begin, int) and isinstance(end, int) and begin <= end)
            except (KeyError, TypeError, ValueError):
                ok = False
            if not ok:
                raise self.error(f"its safetensors header has a malformed entry for "
                                 f"{name!r}: {entry!r}")
            nbytes = math.prod(shape) * _DTYPES[dtype].itemsize
            if end - begin != nbytes:
                raise self.error(f"tensor {name!r} of dtype {dtype} and shape {shape} "
                                 f"needs {nbytes} bytes, its header gives {end - begin}")
            tensors.append((start + begin, start + end, name, dtype, tuple(shape)))
        tensors.sort()
        position = start
        for begin, end, name, _, _ in tensors:
            if begin != position:
                raise self.error(f"tensor {name!r} starts at byte {begin}, the data before "
                                 f"it ends at {position}: the header is damaged")
            position = end
        if position != self.size:
            raise self.error(f"its tensors end at byte {position}, the file has "
                             f"{self.size} bytes: truncated or damaged")
        self.tensors = {name: (dtype, shape, begin, end)
                        for begin, end, name, dtype, shape in tensors}

    def expect(self, name, dtype, shape):
        """Checks that tensor `name` exists with this dtype and shape (None in
        `shape`: any size)."""
        if name not in self.tensors:
            raise self.error(f"has no tensor {name!r}")
        found, found_shape = self.tensors[name][:2]
        if found != dtype or len(found_shape) != len(shape) or any(
                s is not None and s != f for s, f in zip(shape, found_shape)):
            raise self.error(f"tensor {name!r} is {found} {list(found_shape)}, the model "
                             f"needs {dtype} {[s if s is not None else 'n' for s in shape]}")

    def read(self, name):
        """Tensor `name` as a numpy array (read now, not checked against the
        file's checksum yet)."""
        dtype, shape, begin, end = self.tensors[name]
        array = np.empty(shape, _NUMPY[dtype])
        self.file.seek(begin)
        self.read_exactly(array.reshape(-1).view(np.uint8))
        return array

    def read_exactly(self, target):
        """Fills the uint8 array `target` from the current position (a read
        may return less than asked)."""
        view, got = memoryview(target), 0
        while got < target.size:
            n = self.file.readinto(view[got:])
            if not n:
                raise self.error("ended while it was read: it was truncated meanwhile")
            got += n

    def verify(self, crc):
        if self.expected is not None and crc != self.expected["crc32"]:
            raise self.error(f"its CRC-32 is {crc:#010x}, the index records "
                             f"{self.expected['crc32']:#010x}: the file was altered "
                             f"after the save, or the index is another save's")

    def close(self):
        self.file.close()


def _read_dense(path, files):
    """The dense file's tensors, the whole file read and checked."""
    source = _File(path, DENSE, files)
    try:
        data = bytearray(source.size)
        source.file.seek(0)
        source.read_exactly(np.frombuffer(data, np.uint8))
        source.verify(zlib.crc32(data))
        tensors = {}
        for name, (dtype, shape, begin, end) in source.tensors.items():
            flat = torch.frombuffer(data, dtype=_DTYPES[dtype], count=math.prod(shape),
                                    offset=begin) if end > begin else \
                torch.empty(0, dtype=_DTYPES[dtype])
            tensors[name] = flat.reshape(shape)
        return tensors
    finally:
        source.close()


def _check_dense(model, tensors, filename):
    """The `(variable, value)` pairs of an exact load, by position, every
    variable of the model required."""
    if model.optimizer is not None and not model.optimizer.built and any(
            name.startswith("optimizer/") for name in tensors):
        # Every file passed its checks: building now (its state as a first
        # step would make it) is what lets the saved state be compared.
        model.optimizer.build(model.trainable_variables)
    variables = _dense_variables(model)
    extra = sorted(set(tensors) - set(variables))
    if extra:
        raise CheckpointError(f"{filename} has dense variables the model lacks: "
                              f"{extra[:5]} (the model has {len(variables)})")
    # A checkpoint saved before the Keras optimizer was built has no
    # optimizer state; the model's is kept then.
    needed = [n for n in variables if n.startswith("model/")
              or any(t.startswith("optimizer/") for t in tensors)]
    missing = [n for n in needed if n not in tensors]
    if missing:
        raise CheckpointError(f"{filename} lacks dense variables of the model: "
                              f"{[f'{n} ({variables[n].path})' for n in missing[:5]]}")
    for name, value in tensors.items():
        _check_variable(variables[name], value, filename, f"{name} ({variables[name].path})")
    return [(variables[name], value) for name, value in tensors.items()]


def _check_variable(variable, value, filename, name):
    if tuple(variable.shape) != tuple(value.shape):
        raise CheckpointError(f"{filename}: variable {name} has shape "
                              f"{tuple(value.shape)}, the model's is {tuple(variable.shape)}")
    dtype = str(value.dtype).removeprefix("torch.")
    if dtype != variable.dtype:
        raise CheckpointError(f"{filename}: variable {name} is {dtype}, the model's is "
                              f"{variable.dtype}")


def _match_dense(model, tensors, link, report, skip_mismatch):
    """The `(variable, value)` pairs of a warm start: the model's variables
    matched by path; the Keras optimizer's state is not loaded."""
    directory, index = link
    filename = os.path.join(directory, DENSE)
    paths = index["dense_paths"]
    if len(set(paths)) != len(paths) or any(f"model/{i}" not in tensors
                                            for i in range(len(paths))):
        raise CheckpointError(f"{filename} does not hold one tensor per dense variable path "
                              f"its index lists ({len(paths)} paths)")
    saved = {p: tensors[f"model/{i}"] for i, p in enumerate(paths)}
    variables = {}
    for variable in model.variables:
        if variable.path in variables:
            raise ValueError(f"the model has two dense variables at path {variable.path!r}: "
                             f"a warm start matches them by path (give the layers names)")
        variables[variable.path] = variable
    assignments = []
    for path, variable in variables.items():
        if path not in saved:
            report.added_variables.append(path)
        elif tuple(variable.shape) != tuple(saved[path].shape) and skip_mismatch:
            report.skipped_variables.append(path)
        else:
            _check_variable(variable, saved[path], filename,
                            f"{path!r} (skip_mismatch=True keeps the model's value)")
            assignments.append((variable, saved[path]))
    report.removed_variables += [p for p in saved if p not in variables]
    return assignments


def _read_tables(model, chain, routes, world):
    """This rank's rows of every table of the model, from every file of
    every link that can hold some: per embedding layer, one
    `{"keys", "weights", "state", "seen_steps"[, "tags"]}` dict per physical table.

    Three steps: open each file (size, header, tensor names and shapes) and
    read its keys, tags and deleted keys to find the rows this rank loads
    (its own, of kept tables, not replaced or deleted by a later link);
    allocate this rank's arrays once; stream each file whole, checking its
    CRC-32 on the way and copying the loaded rows of each chunk into place.
    """
    resalted = any(route.xor.any() for layer in routes for route in layer)
    links = []
    for directory, index in chain:
        # The owner of a key is h mod (world size) for one hash h (owner_of), so
        # file r of N holds h = r (mod N); this rank m of M owns h = m (mod M);
        # both hold for some h exactly when r = m (mod gcd(N, M)). A re-salted
        # key has another owner: every file is read then.
        common = 1 if resalted else math.gcd(index["world_size"], world.size)
        links.append((directory, index, [name for r, name in enumerate(index["table_files"])
                                         if r % common == world.rank % common]))
    chosen = {}                   # (link, file, layer, table) -> rows loaded
    found = {}                    # (link, layer, table) -> [(saved keys, keys, tags)] per file
    deleted = {}                  # (link, layer, table) -> [deleted keys] per file
    for i, (directory, index, names) in enumerate(links):
        for name in names:
            source = _File(directory, name, index.get("files"))
            try:
                _scan(source, (i, name), index, routes, world, chosen, found, deleted)
            finally:
                source.close()
    _drop_overridden(links, routes, chosen, found, deleted)
    tables = _allocate(model, routes, found, links)
    filled = {}
    buffer = np.empty(CHUNK_BYTES, np.uint8)
    for i, (directory, index, names) in enumerate(links):
        for name in names:
            source = _File(directory, name, index.get("files"))
            try:
                buffer = _stream(source, (i, name), routes, chosen, tables, filled, buffer)
            finally:
                source.close()
    return tables


def _scan(source, file, index, routes, world, chosen, found, deleted):
    """Checks one table file's tensors and reads its keys, tags and deleted
    keys: which of its rows this rank loads, and under which keys.

    `file` is `(link, name)`; `found` gets, per file, the chosen rows'
    saved keys, their keys in the model (the same array unless re-salted)
    and their tags in the model."""
    link = file[0]
    delta = index.get("kind") == "delta"
    expected = set()
    for l, layer in enumerate(index["layers"]):
        for t, entry in enumerate(layer):
            route = routes[l][t]
            prefix = f"L{l}.T{t}."
            counted = index["format_version"] >= 4
            aged = counted and index["windows"][l][t] is not None
            arrays = ["keys", "weights", "state"] + ["seen_steps"] * counted \
                + ["last_window"] * aged + ["tags"] * bool(entry.get("tags")) \
                + ["deleted"] * delta
            expected.update(prefix + a for a in arrays)
            source.expect(prefix + "keys", "I64", (None,))
            n = source.tensors[prefix + "keys"][1][0]
            source.expect(prefix + "weights", _ROWS[entry.get("dtype", "float32")],
                          (n, entry["dim"]))
            source.expect(prefix + "state", "F32", (n, route.width))
            if counted:
                source.expect(prefix + "seen_steps", "I32", (n,))
            if aged:
                source.expect(prefix + "last_window", "I32", (n,))
            if entry.get("tags"):
                source.expect(prefix + "tags", "I32", (n,))
            if delta:
                source.expect(prefix + "deleted", "I64", (None,))
            saved = source.read(prefix + "keys")
            tags = source.read(prefix + "tags") if entry.get("tags") else \
                np.full(n, route.untagged, np.int32)
            kept = route.kept[tags]
            if not route.kept[-1] and bool((tags == -1).any()):
                raise source.error(
                    f"{int((tags == -1).sum())} rows of tables {route.tables} carry no "
                    f"table tag (they were loaded from an export without tags): a warm "
                    f"start that changes these tables cannot tell which table they are of")
            keys = saved ^ route.xor[tags] if route.xor.any() else saved
            mask = kept & (owner_of(torch.from_numpy(keys), world.size) == world.rank).numpy()
            chosen[(*file, l, t)] = mask
            saved_chosen = saved[mask]
            found.setdefault((link, l, t), []).append(
                (saved_chosen, saved_chosen if keys is saved else keys[mask],
                 route.tag[tags[mask]]))
            if delta:
                deleted.setdefault((link, l, t), []).append(source.read(prefix + "deleted"))
    extra = sorted(set(source.tensors) - expected)
    if extra:
        raise source.error(f"has tensors the model has no table for: {extra[:5]}")


def _drop_overridden(links, routes, chosen, found, deleted):
    """Of a chain, keeps each row from the last link that holds it, and none
    that a later link deleted (`chosen` and `found` are narrowed in place)."""
    if len(links) == 1:
        return
    for l, layer in enumerate(routes):
        for t in range(len(layer)):
            later = np.empty(0, np.int64)     # keys a later link holds or deleted
            for i in reversed(range(len(links))):
                parts = found.get((i, l, t), [])
                if later.size and parts:
                    survives = ~np.isin(np.concatenate([part[0] for part in parts]), later)
                    start = 0
                    for f, (name, (saved, keys, tags)) in enumerate(zip(links[i][2], parts)):
                        keep = survives[start:start + saved.size]
                        start += saved.size
                        mask = chosen[i, name, l, t]
                        mask[np.flatnonzero(mask)[~keep]] = False
                        kept = saved[keep]
                        parts[f] = (kept, kept if keys is saved else keys[keep], tags[keep])
                if i:
                    later = np.union1d(later, np.concatenate(
                        [part[0] for part in parts] + deleted.get((i, l, t), [])
                        + [np.empty(0, np.int64)]))


def _allocate(model, routes, found, links):
    """This rank's arrays, once: keys and tags from the scan, the per-row
    arrays to be streamed in (rows in the order the files are streamed),
    and for a table that ages out by windows the last link's window count."""
    num_links = len(links)
    windows = links[-1][1].get("windows")
    tables = []
    for l, layer in enumerate(model.embedding_layers):
        tables.append([])
        for target, store in enumerate(layer.engine.tables):
            # At most one saved table per target: both are the layer's table of one dim.
            sources = [(t, route) for t, route in enumerate(routes[l]) if route.target == target]
            parts = [part for t, _ in sources for i in range(num_links)
                     for part in found.get((i, l, t), [])]
            width = sources[0][1].width if sources else store.state.shape[1]
            keys = np.concatenate([k for _, k, _ in parts] + [np.empty(0, np.int64)])
            # Counts stay 0 for rows of a link saved before rows were counted.
            # Rows in the table's row dtype: a file of another converts as it streams.
            arrays = {"keys": keys,
                      "weights": np.empty((keys.size, store.dim),
                                          numpy_dtype(store.index.weights.dtype)),
                      "state": np.empty((keys.size, width), np.float32),
                      "seen_steps": np.zeros(keys.size, np.int32)}
            if _ages_by_windows(store):
                # -1 (unknown) for rows of a link that saved no windows.
                arrays["last_window"] = np.full(keys.size, -1, np.int32)
                saved = [windows[l][t] for t, _ in sources] if windows else []
                if saved and saved[0] is not None:
                    arrays["window"] = saved[0]
            if store.index.tags is not None:
                arrays["tags"] = np.concatenate([g for _, _, g in parts]
                                                + [np.empty(0, np.int32)])
            tables[l].append(arrays)
    return tables


def _stream(source, file, routes, chosen, tables, filled, buffer):
    """Reads one table file whole in chunks, checking its CRC-32 and copying
    the chosen rows' per-row arrays (`_STREAMED`) into `tables`; returns the
    (maybe grown) read buffer."""
    crc = zlib.crc32(source.header)
    for tensor, (dtype, shape, begin, end) in source.tensors.items():
        l, t, array = _parse_name(tensor)
        target = routes[l][t].target
        copied = array in _STREAMED and target is not None and array in tables[l][target]
        mask = chosen[(*file, l, t)] if copied else None
        out = tables[l][target][array] if copied else None
        width = math.prod(shape[1:])
        row_bytes = max(1, width) * _DTYPES[dtype].itemsize
        step = max(1, CHUNK_BYTES // row_bytes)
        position = filled.get((l, target, array), 0)
        source.file.seek(begin)
        for first in range(0, shape[0], step):
            count = min(step, shape[0] - first)
            owned = None if mask is None else mask[first:first + count]
            kept = 0 if owned is None else int(owned.sum())
            target_rows = None if out is None else out[position:position + kept]
            if owned is not None and kept == count and out.dtype == _NUMPY[dtype]:
                chunk = target_rows.reshape(-1).view(np.uint8)   # all loaded: read in place
            else:
                if row_bytes * count > buffer.size:
                    buffer = np.empty(row_bytes * count, np.uint8)
                chunk = buffer[:count * width * _DTYPES[dtype].itemsize]
            source.read_exactly(chunk)
            crc = zlib.crc32(chunk, crc)
            if owned is not None and 0 < kept and not (kept == count and
                                                        out.dtype == _NUMPY[dtype]):
                saved = chunk.view(_NUMPY[dtype]).reshape(count, *shape[1:])
                if out.dtype == saved.dtype:
                    np.compress(owned, saved, axis=0, out=target_rows)
                else:           # rows of another dtype than the table's: converted
                    target_rows[...] = saved[owned]
            position += kept
        if copied:
            filled[l, target, array] = position
    _skip_absent(source, file, routes, chosen, tables, filled)
    source.verify(crc)
    return buffer


def _skip_absent(source, file, routes, chosen, tables, filled):
    """Moves past this file's rows in the arrays it does not hold (a link of
    an older format): they keep the values `_allocate` gave them."""
    for l, t in {_parse_name(tensor)[:2] for tensor in source.tensors}:
        target = routes[l][t].target
        if target is None:
            continue
        rows = int(chosen[(*file, l, t)].sum())
        for array in _STREAMED:
            if array in tables[l][target] and f"L{l}.T{t}.{array}" not in source.tensors:
                filled[l, target, array] = filled.get((l, target, array), 0) + rows


def _parse_name(tensor):
    layer, table, array = tensor.split(".")
    return int(layer[1:]), int(table[1:]), array
