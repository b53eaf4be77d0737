"""Bad files on 2 ranks (issue 17, item 3): with on_bad_file="skip" every
rank drops the same file found bad when opened, so the shards are cut from
one file list, and a rank that loses a row group while reading makes its
rows up, so both ranks take the same number of steps and fit completes.

The faults are real: one file truncated, one parquet page's bytes flipped
(the files carry page checksums).
"""

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from launch import torchrun

pytestmark = pytest.mark.slow  # spawns torchrun processes

FILES, ROWS, GROUP_ROWS = 4, 256, 64


def write_files(directory):
    directory.mkdir()
    rng = np.random.default_rng(0)
    paths = []
    for part in range(FILES):
        keys = np.arange(part * ROWS, (part + 1) * ROWS)
        n = rng.normal(size=ROWS).astype(np.float32)
        a = rng.integers(0, 20, ROWS)
        label = (rng.random(ROWS) < 1 / (1 + np.exp(-(n + (a % 3 - 1))))).astype(np.float32)
        path = directory / f"part-{part}.parquet"
        pq.write_table(pa.table({"key": keys, "n": n, "a": a, "label": label}), path,
                       row_group_size=GROUP_ROWS, write_page_checksum=True)
        paths.append(path)
    return paths


def test_ranks_agree_on_the_files_and_take_the_same_steps(tmp_path):
    paths = write_files(tmp_path / "data")
    os.truncate(paths[1], os.path.getsize(paths[1]) // 2)     # bad when opened
    chunk = pq.ParquetFile(paths[3]).metadata.row_group(1).column(1)   # column n
    first = chunk.dictionary_page_offset if chunk.has_dictionary_page \
        else chunk.data_page_offset
    middle = first + chunk.total_compressed_size // 2
    with open(paths[3], "r+b") as file:                        # bad when read
        file.seek(middle)
        data = file.read(4)
        file.seek(middle)
        file.write(bytes(byte ^ 0xFF for byte in data))
    torchrun("bad_files.py", 2, tmp_path / "data", tmp_path / "out")
    ranks = [json.loads((tmp_path / f"out.{rank}.json").read_text()) for rank in range(2)]

    good = [str(paths[0]), str(paths[2]), str(paths[3])]
    for rank in ranks:
        assert rank["files"] == good
        opened = [s for s in rank["skipped"] if s[1] == "open"]
        assert [s[0] for s in opened] == [str(paths[1])]
        # Each rank reads its half of the 768 good rows: 12 batches of 32,
        # made up to 12 by the rank that lost the bad row group.
        assert rank["batches"] == rank["num_batches"] == 12
        assert rank["fit_steps"] == 2 * 12
        assert len(rank["loss"]) == 2 and all(np.isfinite(rank["loss"]))
    assert ranks[0]["skipped"][0] == ranks[1]["skipped"][0]

    bad_rows = set(range(3 * ROWS + GROUP_ROWS, 3 * ROWS + 2 * GROUP_ROWS))
    good_rows = set(range(ROWS)) | set(range(2 * ROWS, 4 * ROWS))
    read = [rank for rank in ranks if any(s[1] == "read" for s in rank["skipped"])]
    assert read, "the flipped page was read by one of the ranks"
    reason = next(s[2] for s in read[0]["skipped"] if s[1] == "read")
    assert f"{paths[3]}, row group 1: " in reason and "CRC" in reason
    keys = [rank["keys"] for rank in ranks]
    assert all(len(k) == len(set(k)) == 384 for k in keys)
    assert not (set(keys[0]) | set(keys[1])) & bad_rows
    assert set(keys[0]) | set(keys[1]) == good_rows - bad_rows
    # The 64 rows made up were another shard's: read twice, by both ranks.
    assert len(set(keys[0]) & set(keys[1])) == GROUP_ROWS
