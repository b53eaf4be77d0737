"""The one-line-per-user format of the open graph/matching benchmarks.

Gowalla, Yelp2018 and Amazon-book as LightGCN and its successors ship them
(`train.txt`, `test.txt`) hold one line per user: the user id, then the ids
of the items the user interacted with, separated by whitespace:

```
0 12 7 301
1 5
```

`from_user_lines` reads such a file into a `Dataset` of `(user_id,
item_id)` rows, one per interaction, in file order.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

from reckeras.datasets._dataset import Dataset
from reckeras.datasets._files import BadFiles

# Rows per unit: the granularity of shuffling and sharding, as a row group
# of the generated parquet files.
_UNIT_ROWS = 65_536
_SCHEMA = pa.schema([pa.field("user_id", pa.int64(), nullable=False),
                     pa.field("item_id", pa.int64(), nullable=False)])


class _TableSource:
    """An in-memory table read as units of `_UNIT_ROWS` rows (a `Dataset` source)."""

    def __init__(self, table: pa.Table, path: str):
        self.files = [path]
        self.schema = table.schema
        self.bad_files = BadFiles("raise")
        self._table = table
        rows = table.num_rows
        self._unit_rows = [min(_UNIT_ROWS, rows - start)
                           for start in range(0, rows, _UNIT_ROWS)]

    def unit_rows(self) -> list[int]:
        return self._unit_rows

    def read_unit(self, unit: int, start: int, stop: int,
                  columns: Sequence[str] | None) -> Iterator[pa.Table]:
        table = self._table if columns is None else self._table.select(list(columns))
        yield table.slice(unit * _UNIT_ROWS + start, stop - start)


def _parse_line(path: str, number: int, tokens: list[str]) -> np.ndarray:
    try:
        ids = np.array([int(token) for token in tokens], dtype=np.int64)
    except (ValueError, OverflowError):
        bad = next(token for token in tokens if not _is_int64(token))
        raise ValueError(f"{path}, line {number}: {bad!r} is not an integer id "
                         f"(each line is 'user item item ...')") from None
    if (ids < 0).any():
        raise ValueError(f"{path}, line {number}: negative id {int(ids[ids < 0][0])}; "
                         f"user and item ids are non-negative")
    return ids


def _is_int64(token: str) -> bool:
    try:
        return -2**63 <= int(token) < 2**63
    except ValueError:
        return False


def from_user_lines(path: str | os.PathLike, name: str | None = None) -> Dataset:
    """Reads a one-line-per-user interaction file (`user item item ...`).

    Each non-blank line is a user id followed by the ids of that user's
    items, separated by spaces or tabs (the `train.txt`/`test.txt` files of
    Gowalla, Yelp2018 and Amazon-book as LightGCN ships them). A line with
    a user and no items gives no row; blank lines are skipped. Rows keep the
    file order: user by user, items in line order.

    Args:
        path: the text file.
        name: the dataset's name in messages; the file name when None.

    Returns:
        A `Dataset` with int64 columns `user_id` and `item_id` and no label.

    Raises:
        FileNotFoundError: when `path` does not exist.
        ValueError: for a file without any id, or a token that is not a
            non-negative int64 (naming the file and the line).

    Example:

    ```python
    train = rk.datasets.from_user_lines("gowalla/train.txt")
    test = rk.datasets.from_user_lines("gowalla/test.txt")
    train.num_rows   # 810128 for Gowalla
    ```
    """
    path = os.fspath(path)
    users, items = [], []
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            tokens = line.split()
            if not tokens:
                continue
            ids = _parse_line(path, number, tokens)
            users.append(np.full(len(ids) - 1, ids[0]))
            items.append(ids[1:])
    if not users:
        raise ValueError(f"{path}: the file has no lines of 'user item item ...'")
    table = pa.table({"user_id": np.concatenate(users), "item_id": np.concatenate(items)},
                     schema=_SCHEMA)
    return Dataset(_TableSource(table, path), name or Path(path).name, {"format": "user_lines"})
