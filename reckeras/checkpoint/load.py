"""Loading a checkpoint, or a chain of deltas and their full base, saved
on any number of ranks, into a model, exactly or as a warm start.

`load_checkpoint(delta)` follows the links back to a full checkpoint and
refuses a chain whose link is missing or is another save, naming the file.
Which rows each rank reads and where they go is `plan`'s: this module
reads, checks and hands the rows to the engine as `TableState`s
(`EmbeddingEngine.load_table_states`), then records what the tables equal
(`mark_saved`).

Loading verifies before it changes anything: every file a rank needs, of
every link, is read whole, its size and CRC-32 compared with the index, its
safetensors header parsed and its tensors' names, dtypes and shapes
compared with the model, and the ranks agree that all of them passed,
before the first dense variable or table row is written. A damaged,
missing or foreign file raises `CheckpointError` naming it, and the model
stays as it was, on every rank. A rank streams the table files in chunks
and keeps only its own rows (`files.TableFile`), so its memory grows with
its share of the tables, not with the whole checkpoint.

Example:

```python
from reckeras.checkpoint import CheckpointError

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

import math
import os
import warnings
import zlib
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from reckeras import distributed
from reckeras.checkpoint import plan
from reckeras.checkpoint.files import CHUNK_BYTES, TableFile, read_dense
from reckeras.checkpoint.format import (
    DENSE,
    INDEX,
    NUMPY_DTYPES,
    ROW_CODES,
    STREAMED,
    TAG_CODES,
    TORCH_DTYPES,
    CheckpointError,
    dense_variables,
    parse_tensor_name,
    read_index,
    resolve,
    tensor_name,
    without_dtypes,
)
from reckeras.embedding.row_dtypes import ROW_DTYPES, numpy_dtype
from reckeras.embedding.sharding import owner_of
from reckeras.embedding.table_state import TableState


def load_checkpoint(model: Any, path: str | os.PathLike, warm_start: bool = False,
                    rename_tables: dict[str, str | None] | None = None,
                    skip_mismatch: bool = False) -> plan.LoadReport:
    """Loads a checkpoint (or a chain: a delta and its bases) saved on any
    number of ranks into `model`.

    Exact by default: the model must have the tables and dense variables it
    was saved from, and compiled (its Keras optimizer's state is restored
    too; an optimizer not built yet is built first). With `warm_start=True`
    the model may have changed (see `plan`); its Keras
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
    path = resolve(os.fspath(path))
    world = distributed.world()
    engines = [layer.engine for layer in model.embedding_layers]
    layouts = [engine.table_layouts() for engine in engines]
    try:
        chain = _chain(path)
        report = plan.LoadReport([directory for directory, _ in chain], warm_start)
        routes = plan.routes(layouts, chain, warm_start, dict(rename_tables or {}), report)
        dense = read_dense(chain[-1][0], chain[-1][1].get("files"))
        assignments = _match_dense(model, dense, chain[-1], report, skip_mismatch) \
            if warm_start else _check_dense(model, dense, os.path.join(chain[-1][0], DENSE))
        del dense
        tables = _read_tables(layouts, chain, routes, world)
        failure = None
    except Exception as error:  # noqa: BLE001 -- the other ranks must hear of any failure
        failure = error
    _agree(failure, path, world)
    # Everything is read and checked on every rank: from here on, only writes.
    for variable, value in assignments:
        variable.assign(value)
    del assignments
    last = chain[-1][1]
    # A warm-started model is not the checkpoint's state: no delta can be
    # based on it. An exact load of this format can.
    loaded = last["id"] if not warm_start and last["format_version"] >= 3 else None
    for engine in engines:
        engine.load_table_states(tables.pop(0))
        engine.mark_saved(loaded, full=True)
    if not warm_start:       # where the shuffle goes on (`fit`'s seed)
        model.loop_state.epochs_fitted = last.get("epochs_fitted", 0)
        if model.table_rate is not None:
            model.table_rate.follow()   # the restored dense rate sets the tables'
    if warm_start and world.is_main and (report.removed_tables or report.removed_variables
                                         or report.skipped_variables):
        warnings.warn(f"warm start from {path!r} skipped tables {report.removed_tables}, "
                      f"dense variables {report.removed_variables} the model lacks and "
                      f"{report.skipped_variables} of another shape", stacklevel=3)
    distributed.barrier("every rank loaded the checkpoint")
    return report


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
    links = [(path, read_index(path))]
    seen = {links[0][1].get("id")}
    while links[-1][1].get("kind", "full") == "delta":
        directory, index = links[-1]
        link = index["base"]
        base = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(directory)),
                                             link["path"]))
        filename = os.path.join(directory, INDEX)
        try:
            base_directory = resolve(base)
        except FileNotFoundError as error:
            raise CheckpointError(f"{filename}: its base {base} is missing (no {INDEX}): "
                                  f"the chain of deltas is broken") from error
        base_index = read_index(base_directory)
        base_filename = os.path.join(base_directory, INDEX)
        if base_index.get("id") != link["id"]:
            raise CheckpointError(
                f"{base_filename} is checkpoint {base_index.get('id')}, but the delta "
                f"{directory} was saved against checkpoint {link['id']}: the base was "
                f"replaced by another save")
        if base_index["id"] in seen:
            raise CheckpointError(f"{base_filename}: the chain of deltas loops back to it")
        seen.add(base_index["id"])
        if without_dtypes(base_index["layers"]) != without_dtypes(index["layers"]):
            raise CheckpointError(f"{base_filename} holds other tables than its delta "
                                  f"{directory}: {base_index['layers']} against "
                                  f"{index['layers']}")
        links.append((base_directory, base_index))
    return links[::-1]


def _check_dense(model, tensors, filename):
    """The `(variable, value)` pairs of an exact load, by position, every
    variable of the model required."""
    if model.optimizer is not None and not model.optimizer.built and any(
            name.startswith("optimizer/") for name in tensors):
        # Every file passed its checks: building now (its state as a first
        # step would make it) is what lets the saved state be compared.
        model.optimizer.build(model.trainable_variables)
    variables = dense_variables(model)
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


def _read_tables(layouts, chain, routes, world):
    """This rank's rows of every table of the model, from every file of
    every link that can hold some: per embedding layer, one `TableState`
    per physical table.

    Three steps: open each file (size, header, tensor names and shapes) and
    read its keys, tags and deleted keys to find the rows this rank loads
    (its own, of kept tables, not replaced or deleted by a later link);
    allocate this rank's arrays once; stream each file whole, checking its
    CRC-32 on the way and copying the loaded rows of each chunk into place.
    """
    resalted = any(route.xor.any() for layer in routes for route in layer)
    links = [(directory, index, plan.files_to_read(index, world.rank, world.size, resalted))
             for directory, index in chain]
    chosen = {}                   # (link, file, layer, table) -> rows loaded
    found = {}                    # (link, layer, table) -> [(saved keys, keys, tags)] per file
    deleted = {}                  # (link, layer, table) -> [deleted keys] per file
    for i, (directory, index, names) in enumerate(links):
        for name in names:
            source = TableFile(directory, name, index.get("files"))
            try:
                _scan(source, (i, name), index, routes, world, chosen, found, deleted)
            finally:
                source.close()
    plan.drop_overridden(links, routes, chosen, found, deleted)
    tables = _allocate(layouts, routes, found, links)
    filled = {}
    buffer = np.empty(CHUNK_BYTES, np.uint8)
    for i, (directory, index, names) in enumerate(links):
        for name in names:
            source = TableFile(directory, name, index.get("files"))
            try:
                buffer = _stream(source, (i, name), routes, chosen, tables, filled, buffer)
            finally:
                source.close()
    return [[TableState(layout, **arrays)
             for layout, arrays in zip(layer, layer_arrays, strict=True)]
            for layer, layer_arrays in zip(layouts, tables, strict=True)]


def _scan(source, file, index, routes, world, chosen, found, deleted):
    """Checks one table file's tensors and reads its keys, tags and deleted
    keys: which of its rows this rank loads, and under which keys.

    `file` is `(link, name)`; `found` gets, per file, the chosen rows'
    saved keys, their keys in the model (the same array unless re-salted)
    and their tags in the model."""
    link, file_name = file
    delta = index.get("kind") == "delta"
    expected = set()
    for li, layer in enumerate(index["layers"]):
        for t, entry in enumerate(layer):
            route = routes[li][t]
            counted = index["format_version"] >= 4
            aged = counted and index["windows"][li][t] is not None
            arrays = ["keys", "weights", "state"] + ["seen_steps"] * counted \
                + ["last_window"] * aged + ["tags"] * bool(entry.get("tags")) \
                + ["deleted"] * delta
            expected.update(tensor_name(li, t, a) for a in arrays)
            source.expect(tensor_name(li, t, "keys"), "I64", (None,))
            n = source.tensors[tensor_name(li, t, "keys")][1][0]
            source.expect(tensor_name(li, t, "weights"), ROW_CODES[entry.get("dtype", "float32")],
                          (n, entry["dim"]))
            source.expect(tensor_name(li, t, "state"), "F32", (n, route.width))
            if counted:
                source.expect(tensor_name(li, t, "seen_steps"), "I32", (n,))
            if aged:
                source.expect(tensor_name(li, t, "last_window"), "I32", (n,))
            if entry.get("tags"):
                source.expect(tensor_name(li, t, "tags"), TAG_CODES, (n,))
            if delta:
                source.expect(tensor_name(li, t, "deleted"), "I64", (None,))
            saved = source.read(tensor_name(li, t, "keys"))
            tags = source.read(tensor_name(li, t, "tags")).astype(np.int32) \
                if entry.get("tags") else \
                np.full(n, route.untagged, np.int32)
            kept = route.kept[tags]
            if not route.kept[-1] and bool((tags == -1).any()):
                raise source.error(
                    f"{int((tags == -1).sum())} rows of tables {route.tables} carry no "
                    f"table tag (they were loaded from an export without tags): a warm "
                    f"start that changes these tables cannot tell which table they are of")
            keys = saved ^ route.xor[tags] if route.xor.any() else saved
            mask = kept & (owner_of(torch.from_numpy(keys), world.size) == world.rank).numpy()
            chosen[link, file_name, li, t] = mask
            saved_chosen = saved[mask]
            found.setdefault((link, li, t), []).append(
                (saved_chosen, saved_chosen if keys is saved else keys[mask],
                 route.tag[tags[mask]]))
            if delta:
                deleted.setdefault((link, li, t), []).append(
                    source.read(tensor_name(li, t, "deleted")))
    extra = sorted(set(source.tensors) - expected)
    if extra:
        raise source.error(f"has tensors the model has no table for: {extra[:5]}")


def _allocate(layouts, routes, found, links):
    """This rank's arrays, once: keys and tags from the scan, the per-row
    arrays to be streamed in (rows in the order the files are streamed),
    and for a table that ages out by windows the last link's window count."""
    num_links = len(links)
    windows = links[-1][1].get("windows")
    tables = []
    for li, layer in enumerate(layouts):
        tables.append([])
        for target, layout in enumerate(layer):
            # At most one saved table per target: both are the layer's table of one dim.
            sources = [(t, route) for t, route in enumerate(routes[li]) if route.target == target]
            parts = [part for t, _ in sources for i in range(num_links)
                     for part in found.get((i, li, t), [])]
            width = sources[0][1].width if sources else layout.state_width
            keys = np.concatenate([k for _, k, _ in parts] + [np.empty(0, np.int64)])
            # Counts stay 0 for rows of a link saved before rows were counted.
            # Rows in the table's row dtype: a file of another converts as it streams.
            arrays = {"keys": keys,
                      "weights": np.empty((keys.size, layout.dim),
                                          numpy_dtype(ROW_DTYPES[layout.dtype])),
                      "state": np.empty((keys.size, width), np.float32),
                      "seen_steps": np.zeros(keys.size, np.int32)}
            if layout.ages_by_windows:
                # -1 (unknown) for rows of a link that saved no windows.
                arrays["last_window"] = np.full(keys.size, -1, np.int32)
                saved = [windows[li][t] for t, _ in sources] if windows else []
                if saved and saved[0] is not None:
                    arrays["window"] = saved[0]
            if layout.tracks_tags:
                arrays["tags"] = np.concatenate([g for _, _, g in parts]
                                                + [np.empty(0, np.int32)])
            tables[li].append(arrays)
    return tables


def _stream(source, file, routes, chosen, tables, filled, buffer):
    """Reads one table file whole in chunks, checking its CRC-32 and copying
    the chosen rows' per-row arrays (`STREAMED`) into `tables`; returns the
    (maybe grown) read buffer."""
    link, file_name = file
    crc = zlib.crc32(source.header)
    for tensor, (dtype, shape, begin, _) in source.tensors.items():
        li, t, array = parse_tensor_name(tensor)
        target = routes[li][t].target
        copied = array in STREAMED and target is not None and array in tables[li][target]
        mask = chosen[link, file_name, li, t] if copied else None
        out = tables[li][target][array] if copied else None
        width = math.prod(shape[1:])
        row_bytes = max(1, width) * TORCH_DTYPES[dtype].itemsize
        step = max(1, CHUNK_BYTES // row_bytes)
        position = filled.get((li, target, array), 0)
        source.file.seek(begin)
        for first in range(0, shape[0], step):
            count = min(step, shape[0] - first)
            owned = None if mask is None else mask[first:first + count]
            kept = 0 if owned is None else int(owned.sum())
            target_rows = None if out is None else out[position:position + kept]
            if owned is not None and kept == count and out.dtype == NUMPY_DTYPES[dtype]:
                chunk = target_rows.reshape(-1).view(np.uint8)   # all loaded: read in place
            else:
                if row_bytes * count > buffer.size:
                    buffer = np.empty(row_bytes * count, np.uint8)
                chunk = buffer[:count * width * TORCH_DTYPES[dtype].itemsize]
            source.read_exactly(chunk)
            crc = zlib.crc32(chunk, crc)
            if owned is not None and kept > 0 and not (kept == count and
                                                        out.dtype == NUMPY_DTYPES[dtype]):
                saved = chunk.view(NUMPY_DTYPES[dtype]).reshape(count, *shape[1:])
                if out.dtype == saved.dtype:
                    np.compress(owned, saved, axis=0, out=target_rows)
                else:           # rows of another dtype than the table's: converted
                    target_rows[...] = saved[owned]
            position += kept
        if copied:
            filled[li, target, array] = position
    _skip_absent(source, file, routes, chosen, tables, filled)
    source.verify(crc)
    return buffer


def _skip_absent(source, file, routes, chosen, tables, filled):
    """Moves past this file's rows in the arrays it does not hold (a link of
    an older format): they keep the values `_allocate` gave them."""
    link, file_name = file
    for li, t in {parse_tensor_name(tensor)[:2] for tensor in source.tensors}:
        target = routes[li][t].target
        if target is None:
            continue
        rows = int(chosen[link, file_name, li, t].sum())
        for array in STREAMED:
            if array in tables[li][target] and tensor_name(li, t, array) not in source.tensors:
                filled[li, target, array] = filled.get((li, target, array), 0) + rows
