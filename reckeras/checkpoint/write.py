"""Writing a checkpoint: full or delta, atomic, from every rank.

A *full* checkpoint holds every row. A *delta* (`save_checkpoint(...,
base=...)`) holds the dense weights whole and only the rows written since
its base, with their optimizer state, plus the keys deleted since (rows the
lifecycle evicted). Its index names the base by the base's id (a random
128-bit id every save draws) and by its path relative to the delta. The
rows come from the engine (`EmbeddingEngine.table_states` or
`changed_since`), which tracks changes cheaply and remembers which
checkpoints its tables equal (`mark_saved`): a base must be a checkpoint
this model saved, or loaded exactly, since its last full save or load.

Writes are atomic: all ranks write into `<path>.tmp`; then rank 0 moves the
previous checkpoint to `<path>.old`, renames `<path>.tmp` to `<path>` and
deletes `<path>.old`. A crash at any point leaves a complete checkpoint at
`<path>` or, in the instant between the two renames, at `<path>.old`,
which `load_checkpoint` falls back to (`format.resolve`).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from reckeras import distributed
from reckeras.checkpoint.files import fsync_dir, write_tensors
from reckeras.checkpoint.format import (
    DENSE,
    INDEX,
    dense_variables,
    narrow_tags,
    new_index,
    read_index,
    resolve,
    table_file,
    tensor_name,
)
from reckeras.embedding.row_dtypes import to_torch


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
    engines = [layer.engine for layer in model.embedding_layers]
    link = None if base is None else _base_link(engines, path, os.fspath(base))
    tmp = path + ".tmp"
    if world.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    distributed.barrier("the checkpoint's directory is made")
    states = [engine.table_states() if link is None else engine.changed_since(link["id"])
              for engine in engines]
    tensors = {tensor_name(li, t, name): to_torch(
                   narrow_tags(array, len(state.layout.tables)) if name == "tags" else array)
               for li, layer in enumerate(states) for t, state in enumerate(layer)
               for name, array in state.arrays().items()}
    name = table_file(world.rank, world.size)
    checked = [(name, write_tensors(tensors, os.path.join(tmp, name)))]
    # The rows are written: only what the index needs stays.
    layouts = [[state.layout for state in layer] for layer in states]
    windows = [[state.window for state in layer] for layer in states]
    del tensors, states
    identity = uuid.uuid4().hex
    if world.size > 1:
        # Rank 0 writes every file's checksum into the index (and its id is
        # the checkpoint's); the gather also waits for every rank's table file.
        everyone: list[Any] = [None] * world.size
        with distributed.collective("gathering the checkpoint's table checksums"):
            dist.all_gather_object(everyone, (checked[0], identity))
        checked = [entry for entry, _ in everyone]
        identity = everyone[0][1]
    if world.is_main:
        dense = {name: torch.as_tensor(np.asarray(v.numpy())).clone()
                 for name, v in dense_variables(model).items()}
        checked.append((DENSE, write_tensors(dense, os.path.join(tmp, DENSE))))
        index = new_index("full" if link is None else "delta", identity, world.size,
                          layouts, windows, [v.path for v in model.variables],
                          dict(checked), link, model.loop_state.epochs_fitted)
        with open(os.path.join(tmp, INDEX), "w") as f:
            json.dump(index, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(tmp)
    distributed.barrier("every file of the checkpoint is written")
    if world.is_main:
        old = path + ".old"
        if os.path.exists(path):
            shutil.rmtree(old, ignore_errors=True)
            os.rename(path, old)
        os.rename(tmp, path)
        fsync_dir(os.path.dirname(os.path.abspath(path)))
        shutil.rmtree(old, ignore_errors=True)
    distributed.barrier("the checkpoint is in place")
    for engine in engines:
        engine.mark_saved(identity, full=link is None)


def _same_path(a, b):
    return os.path.normpath(os.path.abspath(a)) == os.path.normpath(os.path.abspath(b))


def _base_link(engines, path, base):
    """The link a delta's index records, `{"id", "path"}`, once the base is
    checked to be one the engines can compare with."""
    if _same_path(path, base):
        raise ValueError(f"a delta checkpoint cannot be saved over its own base {base!r}: "
                         f"give it another path")
    directory = resolve(base)
    index = read_index(directory)
    filename = os.path.join(directory, INDEX)
    if index["format_version"] < 3:
        raise ValueError(f"{filename} is of format {index['format_version']}, which has no "
                         f"checkpoint id: a delta needs a base saved by this reckeras")
    if not all(index["id"] in engine.delta_bases for engine in engines):
        raise ValueError(
            f"{filename}: checkpoint {index['id']} is not one this model saved, or loaded "
            f"exactly, since its last full checkpoint, so the model does not know what "
            f"changed since it; save a full checkpoint (base=None) first")
    relative = os.path.relpath(os.path.abspath(base), os.path.dirname(os.path.abspath(path)))
    return {"id": index["id"], "path": relative}
