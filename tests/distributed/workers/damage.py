"""Real damage to checkpoint files, for the fault tests (in process and on ranks)."""

import json
import os
import pathlib
import re
import struct


def largest_table_file(ckpt):
    files = [os.path.join(ckpt, n) for n in os.listdir(ckpt) if n.startswith("tables-")]
    return max(files, key=os.path.getsize)


def _data_start(path):
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
    return 8 + length


def _xor(path, at, count, mask):
    with open(path, "r+b") as f:
        f.seek(at)
        original = f.read(count)
        f.seek(at)
        f.write(bytes(b ^ mask for b in original))


def truncate(path):
    """Cuts the file to two thirds of its size."""
    os.truncate(path, os.path.getsize(path) * 2 // 3)


def flip_data(path):
    """Inverts 64 bytes in the middle of a safetensors file's data section."""
    start = _data_start(path)
    _xor(path, (start + os.path.getsize(path)) // 2, 64, 0xFF)


def flip_header_digit(path):
    """Flips the lowest bit of the last digit of the header's first shape:
    the header stays valid JSON, the shape is wrong."""
    with open(path, "rb") as f:
        header = f.read(_data_start(path))
    match = re.search(rb'"shape":\[(\d+)', header)
    _xor(path, match.end(1) - 1, 1, 0x01)


def flip_header_syntax(path):
    """Turns the header's opening brace into 'z': not JSON any more."""
    _xor(path, 8, 1, 0x01)


def delete(path):
    os.remove(path)


def flip_index_checksum(ckpt):
    """Flips the last digit of the first CRC-32 the index records (still JSON)."""
    path = os.path.join(ckpt, "index.json")
    text = pathlib.Path(path).read_bytes()
    match = re.search(rb'"crc32": (\d+)', text)
    _xor(path, match.end(1) - 1, 1, 0x01)
    json.loads(pathlib.Path(path).read_bytes())        # still valid JSON


def truncate_index(ckpt):
    path = os.path.join(ckpt, "index.json")
    os.truncate(path, os.path.getsize(path) // 2)


TABLE_FAULTS = {"truncated": truncate, "64 bytes flipped": flip_data,
                "header digit flipped": flip_header_digit,
                "header syntax flipped": flip_header_syntax, "deleted": delete}
