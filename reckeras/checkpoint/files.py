"""The bytes of a checkpoint's files: written and synced with their sizes
and CRC-32s, read back and checked.

Files are written with the `safetensors` library, and the dense file is
read with it (after its size and CRC-32 are checked: it is read whole).
Table files are read by `TableFile`, which parses the safetensors header
itself, for a measured reason: a rank must hold no more than its own share
of the rows while it loads, and check each file's CRC-32 as it goes. It
streams a file once, in `CHUNK_BYTES` pieces, checksumming every byte and
copying only the rows the rank owns into place (straight into the rank's
array when a whole chunk is its own); that needs each tensor's byte
offsets, which the library does not give, and one pass over the bytes
where the library plus a separate checksum pass would read each file twice
(and a memory map keeps every touched page resident). Measured
(`tests/distributed/test_checkpoint.py`, the memory test): a 3-rank save of
62 MB loads on 2 ranks with a peak of ~80 MiB per rank, under twice the
rank's share plus 32 MiB; reading the files whole took 200 MiB.
"""

from __future__ import annotations

import json
import math
import os
import struct
import zlib

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from safetensors.torch import save_file

from reckeras.checkpoint.format import DENSE, NUMPY_DTYPES, TORCH_DTYPES, CheckpointError

# Bytes read per step when a file is streamed: what a rank holds beyond its
# own rows while it loads.
CHUNK_BYTES = 8 * 2**20


def fsync_dir(path: str) -> None:
    """Makes a directory's entries (new files, renames) durable.

    Args:
        path: the directory.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def crc32_file(filename: str) -> tuple[int, int]:
    """The size and CRC-32 of a file, read in chunks.

    Args:
        filename: the file.

    Returns:
        `(bytes, crc32)`.
    """
    crc, size = 0, 0
    buffer = bytearray(CHUNK_BYTES)
    with open(filename, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            crc = zlib.crc32(memoryview(buffer)[:n], crc)
            size += n
    return size, crc


def write_tensors(tensors: dict[str, torch.Tensor], filename: str) -> dict:
    """Writes a safetensors file and syncs it to disk.

    Args:
        tensors: the tensors, by name.
        filename: where.

    Returns:
        `{"bytes", "crc32"}`, the file's entry in the index.
    """
    save_file({k: v.contiguous() for k, v in tensors.items()}, filename)
    with open(filename, "rb") as f:
        os.fsync(f.fileno())
    size, crc = crc32_file(filename)
    return {"bytes": size, "crc32": crc}


def _check_size(filename, size, expected):
    if expected is not None and size != expected["bytes"]:
        raise CheckpointError(f"{filename}: has {size} bytes, the index records "
                              f"{expected['bytes']}: the file is truncated or was "
                              f"overwritten")


def _check_crc(filename, crc, expected):
    if expected is not None and crc != expected["crc32"]:
        raise CheckpointError(f"{filename}: its CRC-32 is {crc:#010x}, the index records "
                              f"{expected['crc32']:#010x}: the file was altered after the "
                              f"save, or the index is another save's")


def _missing(filename):
    return CheckpointError(f"{filename} is missing: the checkpoint is incomplete")


def read_dense(path: str, files: dict | None) -> dict[str, torch.Tensor]:
    """The dense file's tensors, the whole file read and checked.

    Args:
        path: the checkpoint directory.
        files: the index's `"files"` (None for format 1: no size or CRC-32).

    Returns:
        `{name: tensor}`.

    Raises:
        CheckpointError: the file is missing, of another size or CRC-32
            than the index records, or not a well-formed safetensors file.
    """
    filename = os.path.join(path, DENSE)
    expected = None if files is None else files[DENSE]
    try:
        with open(filename, "rb") as f:
            data = f.read()
    except FileNotFoundError as error:
        raise _missing(filename) from error
    _check_size(filename, len(data), expected)
    _check_crc(filename, zlib.crc32(data), expected)
    try:
        return load_safetensors(data)
    except SafetensorError as error:
        raise CheckpointError(f"{filename}: not a well-formed safetensors file "
                              f"({error})") from error


class TableFile:
    """One table file of a checkpoint, open, its header parsed and its size
    checked against the index (see the module docstring for why it parses
    the header itself).

    `tensors` maps a name to `(dtype, shape, begin, end)`, byte offsets from
    the file's start, in file order.

    Args:
        path: the checkpoint directory.
        name: the file's name.
        files: the index's `"files"` (None for format 1).

    Example:

    ```python
    source = TableFile("ckpt", "tables-00000-of-00001.safetensors", index["files"])
    keys = source.read("L0.T0.keys")
    source.close()
    ```
    """

    def __init__(self, path: str, name: str, files: dict | None):
        self.filename = os.path.join(path, name)
        self.expected = None if files is None else files[name]
        try:
            # Open for the object's life, not a block: `close` closes it.
            self.file = open(self.filename, "rb", buffering=0)  # noqa: SIM115
        except FileNotFoundError as error:
            raise _missing(self.filename) from error
        try:
            self._parse()
        except BaseException:
            self.file.close()
            raise

    def error(self, what: str) -> CheckpointError:
        """A `CheckpointError` naming this file.

        Args:
            what: what is wrong with it.

        Returns:
            The error (to raise).
        """
        return CheckpointError(f"{self.filename}: {what}")

    def _parse(self):
        self.size = os.fstat(self.file.fileno()).st_size
        _check_size(self.filename, self.size, self.expected)
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
                ok = (dtype in TORCH_DTYPES and all(isinstance(d, int) and d >= 0 for d in shape)
                      and isinstance(begin, int) and isinstance(end, int) and begin <= end)
            except (KeyError, TypeError, ValueError):
                ok = False
            if not ok:
                raise self.error(f"its safetensors header has a malformed entry for "
                                 f"{name!r}: {entry!r}")
            nbytes = math.prod(shape) * TORCH_DTYPES[dtype].itemsize
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

    def expect(self, name: str, dtype: str | tuple[str, ...], shape: tuple) -> None:
        """Checks that tensor `name` exists with this dtype and shape.

        Args:
            name: the tensor's name.
            dtype: its safetensors dtype code (`"F32"`, ...), or the codes
                it may have.
            shape: its shape, None for a dimension of any size.

        Raises:
            CheckpointError: it is missing or another dtype or shape.
        """
        if name not in self.tensors:
            raise self.error(f"has no tensor {name!r}")
        found, found_shape = self.tensors[name][:2]
        allowed = (dtype,) if isinstance(dtype, str) else dtype
        if found not in allowed or len(found_shape) != len(shape) or any(
                s is not None and s != f for s, f in zip(shape, found_shape, strict=True)):
            raise self.error(f"tensor {name!r} is {found} {list(found_shape)}, the model "
                             f"needs {' or '.join(allowed)} "
                             f"{[s if s is not None else 'n' for s in shape]}")

    def read(self, name: str) -> np.ndarray:
        """Tensor `name` as a numpy array (read now, not checked against the
        file's checksum yet).

        Args:
            name: the tensor's name.

        Returns:
            Its values.
        """
        dtype, shape, begin, _ = self.tensors[name]
        array = np.empty(shape, NUMPY_DTYPES[dtype])
        self.file.seek(begin)
        self.read_exactly(array.reshape(-1).view(np.uint8))
        return array

    def read_exactly(self, target: np.ndarray) -> None:
        """Fills the uint8 array `target` from the current position (a read
        may return less than asked).

        Args:
            target: a contiguous uint8 array.

        Raises:
            CheckpointError: the file ended first.
        """
        view, got = target.data, 0
        while got < target.size:
            n = self.file.readinto(view[got:])
            if not n:
                raise self.error("ended while it was read: it was truncated meanwhile")
            got += n

    def verify(self, crc: int) -> None:
        """Checks the CRC-32 of the whole file, computed while it streamed.

        Args:
            crc: the checksum of every byte, header included.

        Raises:
            CheckpointError: it is not the one the index records.
        """
        _check_crc(self.filename, crc, self.expected)

    def close(self) -> None:
        """Closes the file."""
        self.file.close()
