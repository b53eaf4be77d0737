"""The `retrieval_synth` generator: implicit feedback from a latent-factor teacher.

`retrieval_synth` is a retrieval dataset whose best achievable Recall@K is
known. A hidden teacher gives every item and user a latent vector:

```
v_item = Q[category] + 0.6 * noise           (8-dim; 20 categories)
u_user = P[segment]  + 0.6 * noise           (8 segments)
logit(user, item) = <u_user, v_item> / 0.5 + log popularity(item)
```

with item popularity a Zipf law (exponent 0.9) over a random order of the
2,000 items. Each user interacts with `10 + NegativeBinomial(2, 2/17)`
distinct items (mean 25), drawn without replacement from
`softmax(logit(user, .))` (a Plackett-Luce draw, by the Gumbel top-k trick),
at random times: the order of a user's interactions carries no signal.

Every row is one interaction: `user_id`, `item_id`, `timestamp` (seconds),
`item_category` and `user_segment`. The splits share the users and cut each
user's interactions by time (`rk.datasets.split_per_user`'s rule): `test`
holds the last `ceil(0.1 n)` of a user's `n` interactions, `valid` the
`ceil(0.1 n)` before them, `train` the rest (at least 8). The `items` split is
the catalogue: every `item_id` in `[0, 2000)` with its `item_category`, the
candidates a retrieval model scores (an item id is its candidate position).

The footers of `valid` and `test` hold the teacher's own Recall@K for K in
(10, 20, 50, 100) (`Dataset.teacher_recall(k)`): the teacher ranks every item
by its logit, the user's train items left out, and its top K is scored on the
split's items with `rk.metrics.RecallAtK`'s definition (hits over the user's
held-out items, averaged over users). This is the Bayes analogue of
`bayes_auc`: no model that sees only the train split ranks better in
expectation.

For this dataset `generate`'s `rows` counts *users*: each user's rows go to
train, valid and test together, so the three splits of one call share their
users. User `u`'s rows depend only on `u` and `seed`: a file of N users is a
prefix of one of M > N users.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

import numpy as np
import pyarrow as pa

from reckeras.datasets._dataset import Dataset
from reckeras.datasets._parquet import METADATA_KEY, open_files
from reckeras.datasets._synth import draw, write_tables, zipf_cdf
from reckeras.datasets._user_splits import held_out_counts

NAME = "retrieval_synth"
TEACHER_SEED = 20_261_212
SPLITS = ("train", "valid", "test", "items")
# Users in the packaged splits (`rows` of `generate`, see the module docstring).
USERS = 6_000
DEFAULT_ROWS = {"train": USERS, "valid": USERS, "test": USERS, "items": USERS}
ITEMS = 2_000
CATEGORIES = 20
SEGMENTS = 8
LATENT_DIM = 8
RECALL_KS = (10, 20, 50, 100)
HELD_OUT_FRACTION = 0.1

_TEMPERATURE = 0.5
_POPULARITY_EXPONENT = 0.9
_OWN_SCALE = 0.6
_MIN_INTERACTIONS = 10
# Users made from one seed at a time: user u belongs to chunk u // _USER_CHUNK.
_USER_CHUNK = 1_024
_START = 1_767_225_600          # 2026-01-01T00:00:00Z
_DAY = 86_400


def _interaction_schema() -> pa.Schema:
    return pa.schema([pa.field(name, pa.int64(), nullable=False) for name in
                      ("user_id", "item_id", "timestamp", "item_category", "user_segment")])


def _items_schema() -> pa.Schema:
    return pa.schema([pa.field("item_id", pa.int64(), nullable=False),
                      pa.field("item_category", pa.int64(), nullable=False)])


class _Teacher:
    """The hidden world: the items, the segments' tastes and the popularity."""

    def __init__(self):
        rng = np.random.default_rng(TEACHER_SEED)
        scale = 1 / np.sqrt(LATENT_DIM)
        self.category_vector = scale * rng.standard_normal((CATEGORIES, LATENT_DIM))
        self.segment_vector = scale * rng.standard_normal((SEGMENTS, LATENT_DIM))
        self.item_category = draw(zipf_cdf(CATEGORIES, 0.7), ITEMS, rng)
        self.item_vector = self.category_vector[self.item_category] + (
            _OWN_SCALE * scale * rng.standard_normal((ITEMS, LATENT_DIM)))
        # Popularity by rank, given to the items in a random order, so an
        # item id says nothing of its popularity.
        popularity = np.diff(zipf_cdf(ITEMS, _POPULARITY_EXPONENT), prepend=0.0)
        self.log_popularity = np.log(popularity[rng.permutation(ITEMS)])
        self.segment_cdf = np.cumsum(np.full(SEGMENTS, 1 / SEGMENTS))

    def logits(self, user_vector: np.ndarray) -> np.ndarray:
        """`[users, ITEMS]` teacher logits of the given user vectors."""
        return user_vector @ self.item_vector.T / _TEMPERATURE + self.log_popularity

    def make_users(self, rng: np.random.Generator, first_user: int, users: int) -> dict:
        """`users` users from `first_user` on: their rows (in user, then time
        order), each row's split and the users' logits."""
        scale = 1 / np.sqrt(LATENT_DIM)
        segment = draw(self.segment_cdf, users, rng)
        user_vector = self.segment_vector[segment] + (
            _OWN_SCALE * scale * rng.standard_normal((users, LATENT_DIM)))
        counts = _MIN_INTERACTIONS + np.minimum(rng.negative_binomial(2, 2 / 17, users),
                                                ITEMS // 2)
        logits = self.logits(user_vector)
        # Gumbel top-n: the first n items of this order are a draw of n
        # distinct items from softmax(logits), without replacement.
        order = np.argsort(-(logits + rng.gumbel(size=logits.shape)), axis=1)
        taken = np.arange(ITEMS) < counts[:, None]
        items = order[taken]
        user = np.repeat(np.arange(users), counts)
        # Times: a start, then exponential gaps; the items land on them in a
        # random order (the draw's order would put likely items first).
        gaps = rng.exponential(_DAY, items.size)
        starts = np.cumsum(counts) - counts
        clock = np.cumsum(gaps)
        clock -= np.repeat(clock[starts] - gaps[starts], counts)
        timestamp = (_START + np.repeat(rng.uniform(0, 90 * _DAY, users), counts)
                     + clock).astype(np.int64)
        items = items[np.lexsort((rng.random(items.size), user))]
        # Rows are in time order within a user: the test rows are the last
        # ceil(0.1 n), the valid rows the ceil(0.1 n) before them.
        held = held_out_counts(counts, HELD_OUT_FRACTION)
        rank = np.arange(items.size) - np.repeat(starts, counts)
        from_end = np.repeat(counts, counts) - rank
        split = np.where(from_end <= np.repeat(held, counts), 2,
                         np.where(from_end <= 2 * np.repeat(held, counts), 1, 0))
        return {"user": user, "item": items, "timestamp": timestamp, "split": split,
                "segment": segment, "first_user": first_user, "logits": logits}


@functools.cache
def _teacher() -> _Teacher:
    return _Teacher()


def _user_chunks(users: int, seed: int | None):
    """The users `[0, users)`, `_USER_CHUNK` at a time."""
    teacher = _teacher()
    for chunk, first in enumerate(range(0, users, _USER_CHUNK)):
        rng = np.random.default_rng([TEACHER_SEED, *([] if seed is None else [seed]),
                                     chunk])
        made = teacher.make_users(rng, first, _USER_CHUNK)
        keep = made["user"] < users - first
        yield {**made, **{key: made[key][keep] for key in
                          ("user", "item", "timestamp", "split")},
               "segment": made["segment"][: users - first],
               "logits": made["logits"][: users - first]}


def _rows_table(made: dict, split_code: int) -> pa.Table:
    rows = made["split"] == split_code
    user, item = made["user"][rows], made["item"][rows]
    return pa.table({
        "user_id": made["first_user"] + user, "item_id": item,
        "timestamp": made["timestamp"][rows],
        "item_category": _teacher().item_category[item],
        "user_segment": made["segment"][user]}, schema=_interaction_schema())


def _teacher_hits(made: dict, split_code: int) -> np.ndarray:
    """`[len(RECALL_KS)]` sums over the chunk's users of the teacher's recall."""
    logits = made["logits"].copy()
    user, item, split = made["user"], made["item"], made["split"]
    train = split == 0
    logits[user[train], item[train]] = -np.inf
    top = np.argsort(-logits, axis=1, kind="stable")[:, :max(RECALL_KS)]
    rank_of = np.full(logits.shape, ITEMS, dtype=np.int64)
    np.put_along_axis(rank_of, top, np.arange(top.shape[1])[None, :], axis=1)
    held = split == split_code
    held_rank = rank_of[user[held], item[held]]
    relevant = np.bincount(user[held], minlength=len(logits))
    sums = []
    for k in RECALL_KS:
        hits = np.bincount(user[held], weights=held_rank < k, minlength=len(logits))
        sums.append((hits / relevant).sum())
    return np.array(sums)


def _description(split: str, users: int, seed: int | None) -> dict[str, Any]:
    return {
        "name": NAME, "split": split, "users": users, "seed": seed,
        "items": ITEMS, "categories": CATEGORIES, "segments": SEGMENTS,
        "description": (
            "Implicit feedback: each user's items drawn without replacement from "
            "softmax(<u, v> / 0.5 + log popularity) of a hidden latent-factor teacher; "
            "splits cut each user's interactions by time."),
        "candidates": "item_id is the candidate position, in [0, items)",
    }


def generate_retrieval_synth(rows: int, path: str | os.PathLike, split: str = "train",
                             seed: int | None = None) -> Dataset:
    """Writes a split of `retrieval_synth` for `rows` users to a parquet file.

    Every split of one `(rows, seed)` holds the same users; the packaged
    splits are written with `rows=USERS` (6,000 users, about 120k train
    rows). The `valid` and `test` footers carry the teacher's Recall@K
    (`Dataset.teacher_recall`).

    Args:
        rows: the number of users (not rows: see the module docstring), a
            positive int.
        path: the parquet file to write (parent directories are created).
        split: "train", "valid", "test" or "items" (the 2,000-item
            catalogue, the same for every `rows` and `seed`).
        seed: an extra seed for independent replicas of the users; None for
            the packaged users.

    Returns:
        A `Dataset` over the written file (no label column).

    Raises:
        ValueError: for an unknown split or a non-positive `rows`.

    Example:

    ```python
    from reckeras.datasets.retrieval import generate_retrieval_synth

    test = generate_retrieval_synth(50_000, "/tmp/retrieval_test.parquet", split="test")
    test.teacher_recall(20)
    ```
    """
    if split not in SPLITS:
        raise ValueError(f"dataset {NAME!r} has no split {split!r}; its splits are "
                         f"{list(SPLITS)}")
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise ValueError(f"rows (the number of users of {NAME!r}) must be a positive "
                         f"int, got {rows!r}")
    description = _description(split, rows, seed)
    if split == "items":
        table = pa.table({"item_id": np.arange(ITEMS),
                          "item_category": _teacher().item_category},
                         schema=_items_schema())
        schema = _items_schema().with_metadata({METADATA_KEY: json.dumps(
            description, sort_keys=True)})
        path = write_tables(path, schema, [table], ITEMS, f"{NAME}:{split}")
        return open_files([path], f"{NAME}:{split}")
    split_code = SPLITS.index(split)
    hit_sums = np.zeros(len(RECALL_KS))

    def tables():
        nonlocal hit_sums
        for made in _user_chunks(rows, seed):
            if split_code:
                hit_sums = hit_sums + _teacher_hits(made, split_code)
            yield _rows_table(made, split_code)

    def footer() -> dict[bytes, str]:
        recall = {str(k): float(total / rows) for k, total in zip(RECALL_KS, hit_sums,
                                                                   strict=True)}
        return {METADATA_KEY: json.dumps({**description, "teacher_recall": recall},
                                         sort_keys=True)}

    schema = _interaction_schema().with_metadata({METADATA_KEY: json.dumps(
        description, sort_keys=True)})
    path = write_tables(path, schema, tables(), None, f"{NAME}:{split}",
                        footer=footer if split_code else None)
    return open_files([path], f"{NAME}:{split}")
