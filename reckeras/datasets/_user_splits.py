"""Per-user splits of interaction logs, and each user's items as a padded matrix.

Retrieval is evaluated per user: some of each user's interactions are held
out, a model ranks every candidate for the user with the user's remaining
(train) items left out, and the held-out items are the relevant ones.
`split_per_user` cuts the rows; `user_items` turns either part into the
padded `[users, width]` matrices that `rk.retrieval.exact_top_k` (its
`exclude`) and the retrieval metrics (their `y_true`) take.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

SPLIT_BY = ("random", "time")
# Float slack in ceil(fraction * n): 0.1 * 30 is 3.0000000000000004 in floats.
_CEIL_SLACK = 1e-9


def held_out_counts(counts: np.ndarray, fraction: float) -> np.ndarray:
    """How many of each user's interactions are held out: `ceil(fraction * n)`,
    but at most `n - 1`, so every user keeps at least one train interaction.

    Args:
        counts: int `[users]`, each user's number of interactions.
        fraction: the share held out, in (0, 1).

    Returns:
        int64 `[users]`.

    Example:

    ```python
    from reckeras.datasets._user_splits import held_out_counts

    held_out_counts(np.array([1, 2, 10, 11]), 0.1)   # [0, 1, 1, 2]
    ```
    """
    counts = np.asarray(counts, dtype=np.int64)
    held = np.ceil(fraction * counts - _CEIL_SLACK).astype(np.int64)
    return np.minimum(held, np.maximum(counts - 1, 0))


def _as_table(data: Any, what: str) -> pa.Table:
    if isinstance(data, pa.Table):
        return data
    if hasattr(data, "to_table"):
        return data.to_table()
    raise TypeError(f"{what} takes a rk.datasets.Dataset or a pyarrow Table, got "
                    f"{type(data).__name__}")


def _int_column(table: pa.Table, name: str, what: str) -> np.ndarray:
    if name not in table.column_names:
        raise ValueError(f"{what}: the data has no column {name!r}; its columns are "
                         f"{table.column_names}")
    column = table[name]
    if column.null_count or not pa.types.is_integer(column.type):
        raise ValueError(f"{what}: column {name!r} must hold integers without nulls, "
                         f"got {column.type} with {column.null_count} nulls")
    return column.to_numpy()


def split_per_user(data: Any, by: str = "random", fraction: float = 0.2, seed: int = 0,
                   user: str = "user_id",
                   timestamp: str = "timestamp") -> tuple[pa.Table, pa.Table]:
    """Holds out a share of every user's interactions.

    A user with `n` interactions keeps `n - h` in train and `h =
    ceil(fraction * n)` held out, except that at least one stays in train
    (a user with one interaction has none held out). With `by="random"` the
    `h` rows are drawn at random (from `seed`); with `by="time"` they are the
    user's last `h` rows by `timestamp`, ties going to the later row. Both
    parts keep the rows in their input order.

    Args:
        data: the interactions, a `rk.datasets.Dataset` or a pyarrow Table.
        by: `"random"` or `"time"`.
        fraction: the share of each user's rows held out, in (0, 1).
        seed: the seed of `by="random"`.
        user: the user id column.
        timestamp: the time column read by `by="time"` (integers).

    Returns:
        `(train, held_out)` pyarrow Tables with the columns of `data`.

    Raises:
        ValueError: for an unknown `by`, a `fraction` outside (0, 1), or a
            missing column or one holding nulls or non-integers (naming it).

    Example:

    ```python
    log = rk.datasets.from_user_lines("gowalla/train.txt")
    train, test = rk.datasets.split_per_user(log, by="random", fraction=0.2, seed=0)
    exclude = rk.datasets.user_items(train, users)   # [len(users), E], -1 padded
    ```
    """
    if by not in SPLIT_BY:
        raise ValueError(f"split_per_user: by must be one of {SPLIT_BY}, got {by!r}")
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) \
            or not 0 < fraction < 1:
        raise ValueError(f"split_per_user: fraction must be in (0, 1), got {fraction!r}")
    table = _as_table(data, "split_per_user")
    users = _int_column(table, user, "split_per_user")
    if by == "time":
        key = _int_column(table, timestamp, "split_per_user")
    else:
        key = np.random.default_rng(seed).random(len(users))
    # Rows by user, then key, then position: each user's held-out rows are
    # the last of its run.
    order = np.lexsort((np.arange(len(users)), key, users))
    sorted_users = users[order]
    starts = np.flatnonzero(np.r_[True, sorted_users[1:] != sorted_users[:-1]])
    counts = np.diff(np.r_[starts, len(users)])
    from_end = np.repeat(starts + counts, counts) - np.arange(len(users))
    held = np.zeros(len(users), dtype=bool)
    held[order] = from_end <= np.repeat(held_out_counts(counts, fraction), counts)
    return table.filter(pa.array(~held)), table.filter(pa.array(held))


def user_items(data: Any, users: Any, user: str = "user_id",
               item: str = "item_id") -> np.ndarray:
    """Each given user's items, as a padded int64 matrix.

    Row `i` holds the items of user `users[i]` in the order of `data`,
    then -1 up to the width, which is the largest count among `users`; a
    user without rows gets a row of -1. With a train split this is the
    `exclude` of `rk.retrieval.exact_top_k`; with a held-out split it is the
    `y_true` of `rk.metrics.RecallAtK` and its siblings.

    Args:
        data: the interactions, a `rk.datasets.Dataset` or a pyarrow Table.
        users: int `[U]`, the user ids whose rows are wanted, in the order
            of the result.
        user: the user id column.
        item: the item column (candidate positions: non-negative integers).

    Returns:
        int64 `[U, width]`, -1 padded.

    Raises:
        ValueError: for a missing column, or one holding nulls, non-integers
            or (items) negative values.

    Example:

    ```python
    test = rk.datasets.load("retrieval_synth", "test")
    users = np.unique(test.to_table()["user_id"].to_numpy())
    relevant = rk.datasets.user_items(test, users)
    ```
    """
    table = _as_table(data, "user_items")
    user_ids = _int_column(table, user, "user_items")
    items = _int_column(table, item, "user_items")
    if (items < 0).any():
        raise ValueError(f"user_items: column {item!r} holds a negative item "
                         f"{int(items[items < 0][0])}; items are candidate positions")
    wanted = np.asarray(users, dtype=np.int64).reshape(-1)
    order = np.argsort(user_ids, kind="stable")
    sorted_users = user_ids[order]
    first = np.searchsorted(sorted_users, wanted, side="left")
    counts = np.searchsorted(sorted_users, wanted, side="right") - first
    width = int(counts.max()) if len(counts) else 0
    result = np.full((len(wanted), width), -1, dtype=np.int64)
    rows = np.repeat(np.arange(len(wanted)), counts)
    within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    result[rows, within] = items[order[np.repeat(first, counts) + within]]
    return result
