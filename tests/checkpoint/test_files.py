"""Checkpoint files: `TableFile` (the streaming reader kept for bounded
memory, see `reckeras.checkpoint.files`) reads what the safetensors library
wrote, a load streamed in chunks smaller than a row gives the same rows,
and a damaged dense file (read with the library) is named."""

import os
import shutil
import zlib

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from checkpoint.old_model import build, window
from checkpoint.test_format import DATA, assert_holds
from reckeras.checkpoint import CheckpointError, load
from reckeras.checkpoint.files import TableFile, read_dense

TABLES = "tables-00000-of-00001.safetensors"


def test_table_file_reads_what_the_library_wrote(tmp_path):
    arrays = {"L0.T0.keys": np.arange(5, dtype=np.int64) - 2,
              "L0.T0.weights": np.linspace(-1, 1, 15, dtype=np.float32).reshape(5, 3),
              "L0.T0.seen_steps": np.array([3, 0, 1, 7, 2], np.int32)}
    save_file(arrays, tmp_path / TABLES)
    data = (tmp_path / TABLES).read_bytes()
    source = TableFile(str(tmp_path), TABLES, {TABLES: {"bytes": len(data),
                                                       "crc32": zlib.crc32(data)}})
    try:
        with safe_open(tmp_path / TABLES, "numpy") as library:
            assert set(source.tensors) == set(library.keys())
        for name, values in arrays.items():
            np.testing.assert_array_equal(source.read(name), values)
        source.expect("L0.T0.weights", "F32", (None, 3))
        with pytest.raises(CheckpointError, match="the model needs F32 \\['n', 4\\]"):
            source.expect("L0.T0.weights", "F32", (None, 4))
        source.verify(zlib.crc32(data))
        with pytest.raises(CheckpointError, match="CRC-32"):
            source.verify(zlib.crc32(data[1:]))
    finally:
        source.close()


def test_a_load_streamed_in_tiny_chunks_gives_the_same_rows(tmp_path, monkeypatch):
    shutil.copytree(DATA, tmp_path / "format4")
    monkeypatch.setattr(load, "CHUNK_BYTES", 24)     # under one row of the dim-4 table
    model = build()
    model.fit(window(9), batch_size=16, epochs=1, verbose=0)
    model.load_checkpoint(tmp_path / "format4" / "delta")
    assert_holds(model, tmp_path / "format4", "delta")


def test_a_damaged_dense_header_is_named(tmp_path):
    save_file({"model/0": np.ones(3, np.float32)}, tmp_path / "dense.safetensors")
    good = read_dense(str(tmp_path), None)
    np.testing.assert_array_equal(good["model/0"].numpy(), np.ones(3, np.float32))
    data = bytearray((tmp_path / "dense.safetensors").read_bytes())
    data[9] ^= 0xFF                                   # inside the JSON header
    (tmp_path / "dense.safetensors").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="dense.safetensors: not a well-formed"):
        read_dense(str(tmp_path), None)               # format 1: no CRC-32 to catch it
    os.remove(tmp_path / "dense.safetensors")
    with pytest.raises(CheckpointError, match="dense.safetensors is missing"):
        read_dense(str(tmp_path), None)
