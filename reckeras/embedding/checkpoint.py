"""Checked checkpoints of a whole model that re-shard from N ranks to M ranks.

Layout of a checkpoint directory::

    index.json                         world size, tables, every file's size and
                                       CRC-32, format version, the index's own CRC-32
    dense.safetensors                  dense weights and the Keras optimizer's state (rank 0)
    tables-00001-of-00004.safetensors  the rows rank 1 of 4 owns: for every
                                       embedding layer L and physical table T,
                                       L{L}.T{T}.keys / .weights / .state

Loading on M ranks: each rank keeps the keys it owns under M ranks
(`sharding.owner_of`), so any N -> M works. It streams the table files in
chunks and keeps only its own rows, so its memory grows with its share of
the tables, not with the whole checkpoint. It reads only the files that can
hold rows it owns: file r of N when r = rank (mod gcd(N, M)), so all of them
when N and M are coprime, one when N = M.

Loading verifies before it changes anything: every file a rank needs is
read whole, its size and CRC-32 compared with the index, its safetensors
header parsed and its tensors' names, dtypes and shapes compared with the
model, and the ranks agree that all of them passed, before the first dense
variable or table row is written. A damaged, missing or foreign file raises
`CheckpointError` naming it, and the model stays as it was, on every rank.

Writes are atomic: all ranks write into `<path>.tmp`; then rank 0 moves the
previous checkpoint to `<path>.old`, renames `<path>.tmp` to `<path>` and
deletes `<path>.old`. A crash at any point leaves a complete checkpoint at
`<path>` or, in the instant between the two renames, at `<path>.old`,
which `load_checkpoint` falls back to.

Example:

```python
from reckeras.embedding.checkpoint import CheckpointError

try:
    model.load_checkpoint("ckpt/epoch3")
except CheckpointError as error:      # names the damaged file; nothing changed
    print(error)
```
"""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
import zlib
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import save_file

from reckeras import distributed
from reckeras.embedding.sharding import owner_of

FORMAT_VERSION = 2
# Version 1 (no sizes, no checksums) still loads, with every check but those.
_READABLE_VERSIONS = (1, 2)
INDEX = "index.json"
DENSE = "dense.safetensors"
# Bytes read per step when a file is streamed: what a rank holds beyond its
# own rows while it loads.
CHUNK_BYTES = 8 * 2**20
_TABLE_ARRAYS = ("keys", "weights", "state")
_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
           "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
           "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}
_NUMPY = {"F32": np.float32, "I64": np.int64}


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded into this model; nothing was changed.

    Raised by `load_checkpoint` (and `rk.Model.load_checkpoint`) for a file
    that is missing, truncated, altered (its size or CRC-32 differs from the
    index), not a well-formed safetensors file, or holds tensors whose names,
    dtypes or shapes are not the model's; and for an unreadable or damaged
    `index.json`. The message names the file. On several ranks every rank
    raises it when any rank found a fault.

    Example:

    ```python
    try:
        model.load_checkpoint("ckpt/epoch3")
    except rk.embedding.CheckpointError:
        model.load_checkpoint("ckpt/epoch2")     # the one before
    ```
    """


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


def save_checkpoint(model: Any, path: str | os.PathLike) -> None:
    """Saves dense weights, tables and both optimizers' state (all ranks call it).

    The index records every file's size and CRC-32, which `load_checkpoint`
    checks.

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
    name = _table_file(world.rank, world.size)
    checked = [(name, _write(tables, os.path.join(tmp, name)))]
    del tables
    if world.size > 1:
        # Rank 0 writes every file's checksum into the index; the gather also
        # waits for every rank's table file.
        everyone = [None] * world.size
        with distributed.collective("gathering the checkpoint's table checksums"):
            dist.all_gather_object(everyone, checked[0])
        checked = everyone
    if world.is_main:
        dense = {name: torch.as_tensor(np.asarray(v.numpy())).clone()
                 for name, v in _dense_variables(model).items()}
        checked.append((DENSE, _write(dense, os.path.join(tmp, DENSE))))
        index = {"format_version": FORMAT_VERSION, "world_size": world.size,
                 "table_files": [_table_file(r, world.size) for r in range(world.size)],
                 "layers": [[{"dim": t.dim, "state_width": t.state.shape[1]}
                             for t in layer.engine.tables]
                            for layer in model.embedding_layers],
                 "files": dict(checked)}
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


def load_checkpoint(model: Any, path: str | os.PathLike) -> None:
    """Loads a checkpoint saved on any number of ranks into `model`.

    The model must be built with the same features and compiled (its Keras
    optimizer's state is restored too; an optimizer not built yet is built
    first). Every rank calls it. Every file this rank needs is read and
    checked before anything changes (see the module docstring), and only
    this rank's rows are kept.

    Args:
        model: an `rk.Model`.
        path: checkpoint directory.

    Raises:
        FileNotFoundError: no checkpoint (no `index.json`) at `path`.
        CheckpointError: a file of the checkpoint is missing, damaged or
            does not match the model (on any rank); the model is unchanged.

    Example:

    ```python
    load_checkpoint(model, "ckpt/epoch3")    # what model.load_checkpoint runs
    ```
    """
    path = _resolve(os.fspath(path))
    world = distributed.world()
    try:
        dense, tables = _read(model, path, world)
        failure = None
    except Exception as error:  # noqa: BLE001 -- the other ranks must hear of any failure
        failure = error
    _agree(failure, path, world)
    # Everything is read and checked on every rank: from here on, only writes.
    variables = _dense_variables(model)
    for name, value in dense.items():
        variables[name].assign(value)
    del dense
    for layer in model.embedding_layers:
        layer.engine.load_tables(tables.pop(0))
    _barrier()


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


def _read(model, path, world):
    """Every array the load writes, read and checked: `(dense tensors by
    name, per embedding layer a list of table arrays)`."""
    index = _read_index(model, path)
    files = index.get("files")
    dense = _read_dense(path, files)
    tables = _read_tables(model, path, index, world)
    _check_dense(model, dense, os.path.join(path, DENSE))
    return dense, tables


def _read_index(model, path):
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
                              f"reads {' and '.join(map(str, _READABLE_VERSIONS))}")
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
                and isinstance(t.get("state_width"), int) for t in layer)
            for layer in layers)):
        raise bad(f"layers {layers!r}")
    if version >= 2:
        files = index.get("files")
        names = [DENSE, *index["table_files"]]
        if not (isinstance(files, dict) and sorted(files) == sorted(names) and all(
                isinstance(files[n], dict) and isinstance(files[n].get("bytes"), int)
                and isinstance(files[n].get("crc32"), int) for n in names)):
            raise bad(f"files {files!r} do not give bytes and crc32 of {names}")
    expected = [[t.dim for t in layer.engine.tables] for layer in model.embedding_layers]
    found = [[t["dim"] for t in layer] for layer in layers]
    if expected != found:
        raise CheckpointError(f"checkpoint {path!r} holds tables of dims {found}, the "
                              f"model has {expected}")
    return index


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
        variable = variables[name]
        if tuple(variable.shape) != tuple(value.shape):
            raise CheckpointError(f"{filename}: variable {name} ({variable.path}) has "
                                  f"shape {tuple(value.shape)}, the model's is "
                                  f"{tuple(variable.shape)}")
        dtype = str(value.dtype).removeprefix("torch.")
        if dtype != variable.dtype:
            raise CheckpointError(f"{filename}: variable {name} ({variable.path}) is "
                                  f"{dtype}, the model's is {variable.dtype}")


def _read_tables(model, path, index, world):
    """This rank's rows of every table, from every file that can hold some.

    Three steps: open each file (size, header, tensor names and shapes) and
    read its keys to find the rows this rank owns; allocate this rank's
    arrays once; stream each file whole, checking its CRC-32 on the way and
    copying the owned rows of each chunk into place.
    """
    files = index.get("files")
    saved = index["world_size"]
    layout = [[(store.dim, width["state_width"], store)
               for store, width in zip(layer.engine.tables, widths)]
              for layer, widths in zip(model.embedding_layers, index["layers"])]
    for layer in layout:
        for dim, width, store in layer:
            if store.state.shape[1] not in (0, width):
                raise CheckpointError(
                    f"checkpoint {path!r}: table {store.name} was saved with "
                    f"{width} optimizer state values per row, the model's sparse "
                    f"optimizer keeps {store.state.shape[1]}")
    # The owner of a key is h mod (world size) for one hash h (owner_of), so
    # file r of N holds h = r (mod N); this rank m of M owns h = m (mod M);
    # both hold for some h exactly when r = m (mod gcd(N, M)).
    common = math.gcd(saved, world.size)
    names = [name for r, name in enumerate(index["table_files"])
             if r % common == world.rank % common]
    masks = {}                    # (file, layer, table) -> owned rows
    for name in names:
        source = _File(path, name, files)
        try:
            expected = set()
            for l, layer in enumerate(layout):
                for t, (dim, width, _) in enumerate(layer):
                    prefix = f"L{l}.T{t}."
                    expected.update(prefix + a for a in _TABLE_ARRAYS)
                    source.expect(prefix + "keys", "I64", (None,))
                    n = source.tensors[prefix + "keys"][1][0]
                    source.expect(prefix + "weights", "F32", (n, dim))
                    source.expect(prefix + "state", "F32", (n, width))
                    keys = torch.from_numpy(source.read(prefix + "keys"))
                    masks[name, l, t] = (owner_of(keys, world.size) == world.rank).numpy()
            extra = sorted(set(source.tensors) - expected)
            if extra:
                raise source.error(f"has tensors the model has no table for: {extra[:5]}")
        finally:
            source.close()
    tables = []
    for l, layer in enumerate(layout):
        tables.append([])
        for t, (dim, width, _) in enumerate(layer):
            rows = sum(int(masks[name, l, t].sum()) for name in names)
            tables[l].append({"keys": np.empty(rows, np.int64),
                              "weights": np.empty((rows, dim), np.float32),
                              "state": np.empty((rows, width), np.float32)})
    filled = {}
    buffer = np.empty(CHUNK_BYTES, np.uint8)
    for name in names:
        source = _File(path, name, files)
        try:
            crc = zlib.crc32(source.header)
            for tensor, (dtype, shape, begin, end) in source.tensors.items():
                l, t, array = _parse_name(tensor)
                mask, out = masks[name, l, t], tables[l][t][array]
                width = math.prod(shape[1:])
                row_bytes = max(1, width) * _DTYPES[dtype].itemsize
                step = max(1, CHUNK_BYTES // row_bytes)
                position = filled.get((l, t, array), 0)
                source.file.seek(begin)
                for first in range(0, shape[0], step):
                    count = min(step, shape[0] - first)
                    owned = mask[first:first + count]
                    kept = int(owned.sum())
                    target = out[position:position + kept]
                    if kept == count:    # all this rank's (always when N = M): read in place
                        chunk = target.reshape(-1).view(np.uint8)
                    else:
                        if row_bytes * count > buffer.size:
                            buffer = np.empty(row_bytes * count, np.uint8)
                        chunk = buffer[:count * width * _DTYPES[dtype].itemsize]
                    source.read_exactly(chunk)
                    crc = zlib.crc32(chunk, crc)
                    if kept != count:
                        np.compress(owned, chunk.view(_NUMPY[dtype]).reshape(count, *shape[1:]),
                                    axis=0, out=target)
                    position += kept
                filled[l, t, array] = position
            source.verify(crc)
        finally:
            source.close()
    return tables


def _parse_name(tensor):
    layer, table, array = tensor.split(".")
    return int(layer[1:]), int(table[1:]), array
