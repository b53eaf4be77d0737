"""Checkpoints of a whole model that re-shard from N ranks to M ranks.

Layout of a checkpoint directory::

    index.json                         world size, tables, files, format version
    dense.safetensors                  dense weights and the Keras optimizer's state (rank 0)
    tables-00001-of-00004.safetensors  the rows rank 1 of 4 owns: for every
                                       embedding layer L and physical table T,
                                       L{L}.T{T}.keys / .weights / .state

Loading on M ranks: every rank reads every table file and keeps the keys it
owns under M ranks (`sharding.owner_of`), so any N -> M works.

Writes are atomic: all ranks write into `<path>.tmp`; then rank 0 moves the
previous checkpoint to `<path>.old`, renames `<path>.tmp` to `<path>` and
deletes `<path>.old`. A crash at any point leaves a complete checkpoint at
`<path>` or, in the instant between the two renames, at `<path>.old`,
which `load_checkpoint` falls back to.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from reckeras import distributed
from reckeras.embedding.sharding import owner_of

FORMAT_VERSION = 1


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


def _write(tensors, filename, metadata=None):
    save_file({k: v.contiguous() for k, v in tensors.items()}, filename, metadata)
    with open(filename, "rb") as f:
        os.fsync(f.fileno())


def _table_file(rank, world):
    return f"tables-{rank:05d}-of-{world:05d}.safetensors"


def _dense_variables(model):
    variables = {f"model/{i}": v for i, v in enumerate(model.variables)}
    if model.optimizer is not None and model.optimizer.built:
        variables.update({f"optimizer/{i}": v
                          for i, v in enumerate(model.optimizer.variables)})
    return variables


def save_checkpoint(model: Any, path: str | os.PathLike) -> None:
    """Saves dense weights, tables and both optimizers' state (all ranks call it).

    Args:
        model: an `rk.Model`.
        path: checkpoint directory (on a filesystem all ranks share).

    Example:

    ```python
    save_checkpoint(model, "ckpt/epoch3")    # what model.save_checkpoint runs
    ```
    """
    world = distributed.world()
    path = os.fspath(path)
    tmp = path + ".tmp"
    if world.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    _barrier()
    tables = {}
    for l, layer in enumerate(model.embedding_layers):
        for t, arrays in enumerate(layer.engine.export_tables()):
            for name, array in arrays.items():
                tables[f"L{l}.T{t}.{name}"] = torch.from_numpy(np.ascontiguousarray(array))
    _write(tables, os.path.join(tmp, _table_file(world.rank, world.size)))
    if world.is_main:
        dense = {name: torch.as_tensor(np.asarray(v.numpy())).clone()
                 for name, v in _dense_variables(model).items()}
        _write(dense, os.path.join(tmp, "dense.safetensors"))
        index = {"format_version": FORMAT_VERSION, "world_size": world.size,
                 "table_files": [_table_file(r, world.size) for r in range(world.size)],
                 "layers": [[{"dim": t.dim, "state_width": t.state.shape[1]}
                             for t in layer.engine.tables]
                            for layer in model.embedding_layers]}
        with open(os.path.join(tmp, "index.json"), "w") as f:
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


def load_checkpoint(model: Any, path: str | os.PathLike) -> None:
    """Loads a checkpoint saved on any number of ranks into `model`.

    The model must be built with the same features and compiled (its Keras
    optimizer's state is restored too). Every rank calls it.

    Args:
        model: an `rk.Model`.
        path: checkpoint directory.

    Raises:
        FileNotFoundError: no complete checkpoint at `path`.
        ValueError: the checkpoint's tables do not match the model's.
    """
    path = os.fspath(path)
    if not os.path.exists(os.path.join(path, "index.json")):
        if os.path.exists(os.path.join(path + ".old", "index.json")):
            path = path + ".old"        # a crash between the two renames of a save
        else:
            raise FileNotFoundError(f"no checkpoint at {path!r}")
    with open(os.path.join(path, "index.json")) as f:
        index = json.load(f)
    if index.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"checkpoint {path!r} has format {index.get('format_version')}, "
                         f"this reckeras reads {FORMAT_VERSION}")
    expected = [[t.dim for t in layer.engine.tables] for layer in model.embedding_layers]
    found = [[t["dim"] for t in layer] for layer in index["layers"]]
    if expected != found:
        raise ValueError(f"checkpoint {path!r} holds tables of dims {found}, the model "
                         f"has {expected}")
    _load_dense(model, load_file(os.path.join(path, "dense.safetensors")))
    parts = [load_file(os.path.join(path, name)) for name in index["table_files"]]
    world = distributed.world()
    for l, layer in enumerate(model.embedding_layers):
        tables = []
        for t in range(len(layer.engine.tables)):
            arrays = {name: torch.cat([p[f"L{l}.T{t}.{name}"] for p in parts])
                      for name in ("keys", "weights", "state")}
            mine = owner_of(arrays["keys"], world.size) == world.rank
            tables.append({name: value[mine].numpy() for name, value in arrays.items()})
        layer.engine.load_tables(tables)
    _barrier()


def _load_dense(model, tensors):
    if model.optimizer is not None and not model.optimizer.built and any(
            name.startswith("optimizer/") for name in tensors):
        model.optimizer.build(model.trainable_variables)
    variables = _dense_variables(model)
    missing = sorted(set(tensors) - set(variables))
    if missing:
        raise ValueError(f"checkpoint has dense variables the model lacks: {missing[:5]}")
    for name, value in tensors.items():
        variable = variables[name]
        if tuple(variable.shape) != tuple(value.shape):
            raise ValueError(f"checkpoint variable {name} ({variable.path}) has shape "
                             f"{tuple(value.shape)}, the model's is {tuple(variable.shape)}")
        variable.assign(value.numpy())
