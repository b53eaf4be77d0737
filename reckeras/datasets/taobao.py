"""Behaviour sequences: the `taobao_synth` generator and a Taobao CSV reader.

`taobao_synth` is a Taobao-like click log in which the history matters the
way it does in DIN's and BST's data: each row is a user (profile columns), a
target item and its category, and the user's behaviour history (items and
their categories, oldest first, 0 to 100 behaviours, long-tailed). Users have
one to three interest categories (tilted by gender); most behaviours and half
of the targets come from them, and about one target in five repeats an item
of the history. The label comes from a hidden teacher whose main term is
*attention-like*: every one of the last `TEACHER_WINDOW` behaviours is scored
against the target,

```
relevance_j = [cat(h_j) == cat(t)] + REPEAT_BOOST * [h_j == t]
```

and the logit grows with `HISTORY_WEIGHT * log1p(sum_j relevance_j)`, DIN's
unnormalized attention, saturated. The relevance is an exact match of each
(target, behaviour) pair, among 2,000 items and 100 categories: a model that
pools the history first (a sum of embeddings dotted with the target) can only
approximate it with 16-dim embeddings, which cannot all be orthogonal; a
model that scores every behaviour against the target (DIN's activation unit,
a transformer with the target as a token) can represent it. Smaller terms: a
per-item quality (shrunk for rare items, which no model could learn), a
per-category effect, and profile effects (gender x category affinity through
hidden category vectors, age and city).

`taobao_user_behavior` reads the public Taobao UserBehavior CSV (user, item,
category, behaviour type, timestamp per line) into the same kind of rows.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from reckeras.datasets._dataset import Dataset
from reckeras.datasets._parquet import METADATA_KEY, open_files

NAME = "taobao_synth"
TEACHER_SEED = 20_261_206
SPLIT_SEEDS = {"train": 1, "test": 2}
DEFAULT_ROWS = {"train": 230_000, "test": 30_000}
CHUNK_ROWS = 65_536

NUM_ITEMS = 2_000
NUM_CATEGORIES = 100
MAX_HISTORY = 100
TEACHER_WINDOW = 50          # behaviours the teacher reads (the most recent)
LATENT_DIM = 4               # of the hidden category vectors
REPEAT_BOOST = 4.0
HISTORY_WEIGHT = 1.2
GENDERS, AGES, CITIES = 2, 7, 5

# Item quality is scaled by count / (count + _HALF_SIGNAL_COUNT), count being
# the item's expected number of target occurrences in the packaged train rows.
_HALF_SIGNAL_COUNT = 200.0

COLUMNS = ("user_gender", "user_age", "user_city", "hist_len", "item", "category",
           "hist_items", "hist_cats")


def _schema() -> pa.Schema:
    fields = [pa.field("label", pa.int64(), nullable=False)]
    fields += [pa.field(name, pa.int64(), nullable=False) for name in COLUMNS[:6]]
    fields += [pa.field(name, pa.list_(pa.int64()), nullable=False)
               for name in COLUMNS[6:]]
    fields.append(pa.field("teacher_prob", pa.float32(), nullable=False))
    return pa.schema(fields)


class _Teacher:
    """The hidden world: items, categories, their effects, users' interests."""

    def __init__(self):
        rng = np.random.default_rng(TEACHER_SEED)
        category_weight = (np.arange(NUM_CATEGORIES) + 1.0) ** -0.8
        self.category_prob = category_weight / category_weight.sum()
        # Items are numbered by category, so a category's items are a range.
        sizes = rng.multinomial(NUM_ITEMS - NUM_CATEGORIES,
                                np.sqrt(self.category_prob) /
                                np.sqrt(self.category_prob).sum()) + 1
        self.category_start = np.concatenate([[0], np.cumsum(sizes)])
        self.item_category = np.repeat(np.arange(NUM_CATEGORIES), sizes)
        within = np.arange(NUM_ITEMS) - self.category_start[self.item_category]
        item_weight = (within + 1.0) ** -1.0
        totals = np.bincount(self.item_category, item_weight)
        item_prob = item_weight / totals[self.item_category]   # within its category
        # Each category's probabilities sum to 1, so the running sum over
        # items numbered by category runs over [c, c + 1) in category c: one
        # searchsorted samples an item of any given category.
        self.item_cdf = np.cumsum(item_prob)
        vectors = rng.standard_normal((NUM_CATEGORIES, LATENT_DIM))
        self.category_vector = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        self.category_effect = 0.3 * rng.standard_normal(NUM_CATEGORIES)
        expected = DEFAULT_ROWS["train"] * self.category_prob[self.item_category] \
            * item_prob
        shrink = expected / (expected + _HALF_SIGNAL_COUNT)
        self.item_effect = shrink * 0.5 * rng.standard_normal(NUM_ITEMS)
        self.gender_vector = rng.standard_normal((GENDERS, LATENT_DIM))
        self.age_effect = 0.15 * rng.standard_normal(AGES)
        self.city_effect = 0.1 * rng.standard_normal(CITIES)
        self.bias = -2.2

    def items_of(self, categories: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One item of each given category, by popularity within it."""
        items = np.searchsorted(self.item_cdf, categories + rng.random(len(categories)),
                                side="right")
        # Rounding in the running sum must not leak into a neighbour category.
        return np.clip(items, self.category_start[categories],
                       self.category_start[categories + 1] - 1)

    def popular_categories(self, count: int, rng: np.random.Generator) -> np.ndarray:
        """`count` categories drawn by popularity."""
        return np.searchsorted(np.cumsum(self.category_prob), rng.random(count),
                               side="right").clip(max=NUM_CATEGORIES - 1)

    def make_rows(self, rng: np.random.Generator, rows: int) -> dict[str, Any]:
        """Columns of `rows` examples, with label and teacher probability."""
        gender = rng.integers(0, GENDERS, rows)
        age = rng.integers(0, AGES, rows)
        city = rng.integers(0, CITIES, rows)
        # Interests: 1 to 3 categories, tilted towards the gender's taste.
        num_interests = rng.integers(1, 4, rows)
        interests = self.popular_categories(rows * 3, rng).reshape(rows, 3)
        taste = self.category_vector[interests] @ self.gender_vector[gender][:, :, None]
        swap = rng.random((rows, 3)) < 0.5 * (taste[..., 0] < 0)
        interests = np.where(swap, self.popular_categories(rows * 3, rng)
                             .reshape(rows, 3), interests)
        # History lengths: long-tailed (median 5, mean 10), about 10% empty, at
        # most MAX_HISTORY.
        lengths = np.floor(np.exp(rng.normal(1.8, 1.1, rows))).astype(np.int64)
        lengths = np.where(rng.random(rows) < 0.05, 0, np.minimum(lengths, MAX_HISTORY))
        row = np.repeat(np.arange(rows), lengths)
        from_interest = rng.random(len(row)) < 0.8
        pick = (rng.random(len(row)) * num_interests[row]).astype(np.int64)
        categories = np.where(from_interest, interests[row, pick],
                              self.popular_categories(len(row), rng))
        hist_items = self.items_of(categories, rng)
        # Target: a repeat of a past behaviour, an item of an interest, or a
        # popular item.
        kind = rng.random(rows)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        repeat = (kind < 0.25) & (lengths > 0)
        interest = ~repeat & (kind < 0.55)
        target_category = self.popular_categories(rows, rng)
        chosen = interests[np.arange(rows),
                           (rng.random(rows) * num_interests).astype(np.int64)]
        target_category = np.where(interest, chosen, target_category)
        target = self.items_of(target_category, rng)
        past = offsets[:-1] + (rng.random(rows) * np.maximum(lengths, 1)).astype(np.int64)
        target = np.where(repeat, hist_items[np.minimum(past, len(row) - 1)]
                          if len(row) else target, target)
        target_category = self.item_category[target]

        position = np.arange(len(row)) - offsets[:-1][row]
        seen = position >= (lengths[row] - TEACHER_WINDOW)
        relevance = (categories == target_category[row]) + \
            REPEAT_BOOST * (hist_items == target[row])
        attention = np.bincount(row, relevance * seen, minlength=rows)
        affinity = np.einsum("ij,ij->i", self.gender_vector[gender],
                             self.category_vector[target_category])
        logit = (self.bias + HISTORY_WEIGHT * np.log1p(attention)
                 + self.item_effect[target] + self.category_effect[target_category]
                 + 0.4 * affinity + self.age_effect[age] + self.city_effect[city])
        prob = 1.0 / (1.0 + np.exp(-logit))
        return {
            "label": (rng.random(rows) < prob).astype(np.int64),
            "user_gender": gender, "user_age": age, "user_city": city,
            "hist_len": lengths, "item": target, "category": target_category,
            "hist_items": (offsets, hist_items),
            "hist_cats": (offsets, self.item_category[hist_items]),
            # Rounded to 1e-4 (a third of the file otherwise); the Bayes AUC
            # moves by less than 1e-4.
            "teacher_prob": np.round(prob, 4).astype(np.float32),
        }


@functools.cache
def _teacher() -> _Teacher:
    return _Teacher()


def _chunk_table(row_seed: list[int], chunk_index: int) -> pa.Table:
    rng = np.random.default_rng([TEACHER_SEED, *row_seed, chunk_index])
    columns = _teacher().make_rows(rng, CHUNK_ROWS)
    schema = _schema()
    arrays = []
    for field in schema:
        values = columns[field.name]
        if isinstance(values, tuple):
            offsets, flat = values
            arrays.append(pa.ListArray.from_arrays(pa.array(offsets, pa.int32()),
                                                   pa.array(flat, pa.int64())))
        else:
            arrays.append(pa.array(values, type=field.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _description(split: str, rows: int, seed: int | None) -> dict[str, Any]:
    return {
        "name": NAME, "split": split, "rows": rows, "seed": seed,
        "description": (
            "Taobao-like behaviour log: user profile (gender, age, city), target "
            "item and category, histories of items and categories (oldest "
            "first, 0 to 100 behaviours); labels from a hidden teacher whose "
            "main term scores every recent behaviour against the target "
            "(attention-like)."),
        "label": "label",
        "teacher_prob": "probability of label 1 under the hidden teacher",
        "num_items": NUM_ITEMS, "num_categories": NUM_CATEGORIES,
        "max_history": MAX_HISTORY, "teacher_window": TEACHER_WINDOW,
    }


def generate_taobao_synth(rows: int, path: str | os.PathLike, split: str = "train",
                          seed: int | None = None) -> Dataset:
    """Writes `rows` rows of `taobao_synth` to a parquet file.

    Rows are drawn in chunks of 65,536 (one row group each) from the split's
    seed, so the output depends only on the arguments and a file of N rows is
    a prefix of one of M > N rows; the packaged splits are
    `generate_taobao_synth(230_000, ..., "train")` and
    `generate_taobao_synth(30_000, ..., "test")` (`DEFAULT_ROWS`).

    Args:
        rows: number of rows, a positive int.
        path: the parquet file to write (parent directories are created).
        split: "train" or "test", whose row seed is used.
        seed: an extra seed mixed into the split's, for independent replicas;
            None for the packaged rows.

    Returns:
        A `Dataset` over the written file (with a `teacher_prob` column, so
        `bayes_auc()` works).

    Raises:
        ValueError: for an unknown split or a non-positive `rows`.

    Example:

    ```python
    from reckeras.datasets.taobao import generate_taobao_synth

    big = generate_taobao_synth(1_000_000, "/tmp/taobao_1m.parquet")
    big.bayes_auc()
    ```
    """
    if split not in SPLIT_SEEDS:
        raise ValueError(f"{NAME} has no split {split!r}; its splits are "
                         f"{list(SPLIT_SEEDS)}")
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise ValueError(f"rows must be a positive int, got {rows!r}")
    row_seed = [SPLIT_SEEDS[split]] + ([] if seed is None else [seed])
    schema = _schema().with_metadata({METADATA_KEY: json.dumps(
        _description(split, rows, seed), sort_keys=True)})
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with pq.ParquetWriter(partial, schema, compression="zstd",
                          compression_level=9) as writer:
        for chunk, start in enumerate(range(0, rows, CHUNK_ROWS)):
            table = _chunk_table(row_seed, chunk)
            table = table.slice(0, min(CHUNK_ROWS, rows - start))
            writer.write_table(table.replace_schema_metadata(schema.metadata),
                               row_group_size=CHUNK_ROWS)
    os.replace(partial, path)
    return open_files([path], f"{NAME}:{split}")


# ---- the public Taobao UserBehavior CSV -------------------------------------------------

BEHAVIOR_TYPES = ("pv", "buy", "cart", "fav")


def taobao_user_behavior(path: str | os.PathLike, split: str = "test",
                         max_history: int = MAX_HISTORY, negatives: int = 1,
                         behaviors: Collection[str] | None = None,
                         seed: int = 0) -> pa.Table:
    """Reads the Taobao UserBehavior CSV into next-item prediction rows.

    The file (Alibaba's public `UserBehavior.csv`) has no header; each line is
    `user_id,item_id,category_id,behavior_type,timestamp` with a behaviour
    type among "pv", "buy", "cart", "fav". A user's behaviours, in time order,
    form their history; a *target* is one of them, with the behaviours before
    it (at most the last `max_history`) as its history:

    * `split="test"`: each user's last behaviour;
    * `split="train"`: every behaviour of a user but the first and the last
      (so train targets always precede the test target).

    Each target is a positive (label 1) and gets `negatives` negatives (label
    0) with the same history and a random other item (drawn from all
    behaviours, hence by popularity, with its category).

    Args:
        path: the CSV file (optionally compressed, as pyarrow reads it).
        split: "train" or "test".
        max_history: longest history kept (the most recent behaviours).
        negatives: negatives per positive, an int >= 0.
        behaviors: behaviour types to keep (e.g. `("buy",)`); all by default.
        seed: seed of the negative sampling.

    Returns:
        A `pyarrow.Table` with int64 columns `label`, `user`, `item`,
        `category`, `hist_len` (history length) and list<int64> columns
        `hist_items`, `hist_cats`, `hist_types` (behaviour type codes: index
        in `BEHAVIOR_TYPES`), positives followed by their negatives, users in
        ascending order. Feed it to `rk.Model.fit`, or write it with
        `pyarrow.parquet.write_table` and open it with
        `rk.datasets.from_parquet`.

    Raises:
        ValueError: for a bad argument or an unknown behaviour type in the
            file (naming it).

    Example:

    ```python
    train = rk.datasets.taobao_user_behavior("UserBehavior.csv", split="train")
    test = rk.datasets.taobao_user_behavior("UserBehavior.csv", split="test")
    model.fit(train, validation_data=test)   # a model over item, category, ...
    ```
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    for name, value, minimum in (("max_history", max_history, 1),
                                 ("negatives", negatives, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    table = pa_csv.read_csv(
        path, read_options=pa_csv.ReadOptions(
            column_names=["user", "item", "category", "behavior", "timestamp"]),
        convert_options=pa_csv.ConvertOptions(column_types={
            "user": pa.int64(), "item": pa.int64(), "category": pa.int64(),
            "behavior": pa.string(), "timestamp": pa.int64()}))
    user, item, category, timestamp = (
        table[name].to_numpy() for name in ("user", "item", "category", "timestamp"))
    behavior_names = np.asarray(table["behavior"].to_numpy(zero_copy_only=False),
                                dtype=object)
    codes = np.full(len(behavior_names), -1, dtype=np.int64)
    for code, name in enumerate(BEHAVIOR_TYPES):
        codes[behavior_names == name] = code
    if (codes < 0).any():
        raise ValueError(f"{path}: unknown behaviour type "
                         f"{behavior_names[codes < 0][0]!r}; expected one of "
                         f"{BEHAVIOR_TYPES}")
    if behaviors is not None:
        unknown = sorted(set(behaviors) - set(BEHAVIOR_TYPES))
        if unknown:
            raise ValueError(f"unknown behaviour types {unknown}; expected some of "
                             f"{BEHAVIOR_TYPES}")
        keep = np.isin(codes, [BEHAVIOR_TYPES.index(b) for b in behaviors])
        user, item, category, timestamp, codes = (
            a[keep] for a in (user, item, category, timestamp, codes))
    # Stable: behaviours of one user at one time keep their file order.
    order = np.lexsort((timestamp, user))
    user, item, category, codes = (a[order] for a in (user, item, category, codes))
    first = np.flatnonzero(np.r_[True, user[1:] != user[:-1]]) if len(user) else \
        np.zeros(0, np.int64)
    count = np.diff(np.r_[first, len(user)])
    start = np.repeat(first, count)
    position = np.arange(len(user)) - start
    last = position == np.repeat(count, count) - 1
    targets = np.flatnonzero(last & (position > 0) if split == "test"
                             else ~last & (position > 0))
    history_start = np.maximum(start[targets], targets - max_history)
    lengths = targets - history_start
    offsets = np.r_[0, np.cumsum(lengths)]
    take = np.arange(offsets[-1]) - np.repeat(offsets[:-1] - history_start, lengths)

    def lists(values: np.ndarray) -> pa.ListArray:
        return pa.ListArray.from_arrays(pa.array(offsets, pa.int64()).cast(pa.int32()),
                                        pa.array(values[take], pa.int64()))

    rng = np.random.default_rng(seed)
    sample = rng.integers(0, max(len(item), 1), (len(targets), negatives))
    clash = item[sample] == item[targets][:, None]
    sample = np.where(clash, rng.integers(0, max(len(item), 1), sample.shape), sample)
    # Each positive, then its negatives: example e of target t is row
    # t * (negatives + 1) + e.
    rows = np.repeat(np.arange(len(targets)), negatives + 1)
    chosen = np.concatenate([targets[:, None], sample], axis=1).reshape(-1)
    label = np.tile(np.r_[1, np.zeros(negatives, np.int64)], len(targets))
    history = {name: lists(values).take(pa.array(rows))
               for name, values in (("hist_items", item), ("hist_cats", category),
                                    ("hist_types", codes))}
    return pa.table({
        "label": pa.array(label, pa.int64()),
        "user": pa.array(user[targets][rows], pa.int64()),
        "item": pa.array(item[chosen], pa.int64()),
        "category": pa.array(category[chosen], pa.int64()),
        "hist_len": pa.array(lengths[rows], pa.int64()),
        **history,
    })
