"""The `longtail_synth` generator: a click log whose ids are mostly rare.

`longtail_synth` is built to overfit the way real CTR logs do. Every row is
one impression of an item to a user, described by ten categorical fields and
nothing else (the layout of the open CTR benchmarks):

* user: `user_id` (200,000 users), `user_gender` (2), `user_age` (7
  buckets), `user_city` (500 cities);
* item: `item_id` (50,000 items), `item_category` (100), `item_brand`
  (5,000);
* context: `position` (display slot 0-7), `hour` (0-23), `device` (4).

Users and items are drawn by nearly flat Zipf laws over large vocabularies,
so in the packaged train split most user and item ids are seen a handful of
times (a median user id twice, a median item id three times; 92% of the
user ids and 74% of the item ids at most five times) and a few popular ones
thousands of times; cities and brands follow steeper Zipf laws. Profile
columns are attributes of the user and item columns of the item, drawn once
per user and per item.

The label comes from a hidden teacher with user x item interactions, a
latent-factor model:

```
logit = -1.3 + b_user + b_item + b_category + b_brand + b_city
        + b_gender + b_age + b_position + b_hour + b_device
        + <p_user, q_item>
p_user = P[gender] + P'[age] + s_user * u_user        (8-dim vectors)
q_item = Q[category] + s_item * v_item
```

`label ~ Bernoulli(sigmoid(logit))`, and `teacher_prob` holds that
probability (rounded to 1e-4), so `Dataset.bayes_auc()` is the AUC of the
best possible model. A user's and an item's own effects (`b_user`, `u_user`,
`b_item`, `v_item`, scale `s`) shrink with the id's expected impressions in
the packaged train split, by n / (n + 10): an id seen a few times carries a
little signal, but its embedding can memorize all of its labels' noise,
which is how a model overfits real logs. The attribute terms (the profile's
taste for a category) are learnable from any id's rows. About 30% of the
impressions are clicked.
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
from reckeras.datasets._synth import CHUNK_ROWS, chunks, draw, table_of, write_tables, zipf_cdf

NAME = "longtail_synth"
TEACHER_SEED = 20_261_227
SPLIT_SEEDS = {"train": 1, "valid": 2, "test": 3}
DEFAULT_ROWS = {"train": 400_000, "valid": 40_000, "test": 40_000}

# Field -> vocabulary size; the order is the column order.
CARDINALITIES = {
    "user_id": 200_000, "user_gender": 2, "user_age": 7, "user_city": 500,
    "item_id": 50_000, "item_category": 100, "item_brand": 5_000,
    "position": 8, "hour": 24, "device": 4,
}
LATENT_DIM = 8
_DECIMALS = 4
_BIAS = -1.3
# An id's own effects are scaled by n / (n + _HALF_IMPRESSIONS), n being its
# expected impressions in the packaged train split.
_HALF_IMPRESSIONS = 10.0


def _schema() -> pa.Schema:
    fields = [pa.field("label", pa.int64(), nullable=False)]
    fields += [pa.field(name, pa.int64(), nullable=False) for name in CARDINALITIES]
    fields.append(pa.field("teacher_prob", pa.float32(), nullable=False))
    return pa.schema(fields)


class _Teacher:
    """The hidden world: users, items, their attributes and every effect."""

    def __init__(self):
        rng = np.random.default_rng(TEACHER_SEED)
        size = CARDINALITIES
        normal = rng.standard_normal
        rows = DEFAULT_ROWS["train"]
        # Traffic by popularity rank; a rank's id is a random permutation, so
        # ids carry no popularity order.
        self.user_cdf = zipf_cdf(size["user_id"], 0.75)
        self.item_cdf = zipf_cdf(size["item_id"], 0.85)
        self.user_ids = rng.permutation(size["user_id"])
        self.item_ids = rng.permutation(size["item_id"])
        user_shrink = self._shrink(rows * np.diff(self.user_cdf, prepend=0.0))
        item_shrink = self._shrink(rows * np.diff(self.item_cdf, prepend=0.0))
        # Profiles, one per user rank; attributes, one per item rank.
        self.gender = (rng.random(size["user_id"]) < 0.45).astype(np.int64)
        self.age = draw(np.cumsum([0.08, 0.22, 0.26, 0.19, 0.13, 0.08, 0.04]),
                         size["user_id"], rng)
        self.city = draw(zipf_cdf(size["user_city"], 1.1), size["user_id"], rng)
        self.category = draw(zipf_cdf(size["item_category"], 0.9), size["item_id"], rng)
        self.brand = draw(zipf_cdf(size["item_brand"], 1.0), size["item_id"], rng)
        # Per-field effects.
        self.effect = {
            "user": 1.5 * user_shrink * normal(size["user_id"]),
            "item": 1.5 * item_shrink * normal(size["item_id"]),
            "category": 0.4 * normal(size["item_category"]),
            "brand": 0.4 * normal(size["item_brand"]),
            "city": 0.2 * normal(size["user_city"]),
            "gender": 0.1 * normal(size["user_gender"]),
            "age": 0.15 * normal(size["user_age"]),
            "position": -0.3 * np.log1p(np.arange(size["position"])),
            "hour": 0.2 * np.cos(2 * np.pi * (np.arange(size["hour"]) - 21) / 24),
            "device": 0.15 * normal(size["device"]),
        }
        # Latent factors: the profile's taste, the category's position, and
        # each user's and item's own part.
        scale = 1 / np.sqrt(LATENT_DIM)
        self.gender_vector = 0.8 * scale * normal((size["user_gender"], LATENT_DIM))
        self.age_vector = 0.8 * scale * normal((size["user_age"], LATENT_DIM))
        self.category_vector = 1.2 * scale * normal((size["item_category"], LATENT_DIM))
        self.user_vector = (2.0 * scale * user_shrink)[:, None] * normal(
            (size["user_id"], LATENT_DIM))
        self.item_vector = (2.0 * scale * item_shrink)[:, None] * normal(
            (size["item_id"], LATENT_DIM))
        self.position_cdf = zipf_cdf(size["position"], 0.7)
        hour_weight = 1.2 + np.cos(2 * np.pi * (np.arange(size["hour"]) - 20) / 24)
        self.hour_cdf = np.cumsum(hour_weight / hour_weight.sum())
        self.device_cdf = np.cumsum([0.55, 0.3, 0.1, 0.05])
        self.category_ids = rng.permutation(size["item_category"])
        self.brand_ids = rng.permutation(size["item_brand"])
        self.city_ids = rng.permutation(size["user_city"])

    @staticmethod
    def _shrink(expected_impressions: np.ndarray) -> np.ndarray:
        return expected_impressions / (expected_impressions + _HALF_IMPRESSIONS)

    def make_rows(self, rng: np.random.Generator, rows: int) -> dict[str, np.ndarray]:
        """Columns of `rows` impressions, the label and the teacher's probability."""
        user = draw(self.user_cdf, rows, rng)
        item = draw(self.item_cdf, rows, rng)
        position = draw(self.position_cdf, rows, rng)
        hour = draw(self.hour_cdf, rows, rng)
        device = draw(self.device_cdf, rows, rng)
        gender, age, city = self.gender[user], self.age[user], self.city[user]
        category, brand = self.category[item], self.brand[item]
        effect = self.effect
        taste = (self.gender_vector[gender] + self.age_vector[age]
                 + self.user_vector[user])
        placement = self.category_vector[category] + self.item_vector[item]
        logit = (_BIAS + effect["user"][user] + effect["item"][item]
                 + effect["category"][category] + effect["brand"][brand]
                 + effect["city"][city] + effect["gender"][gender] + effect["age"][age]
                 + effect["position"][position] + effect["hour"][hour]
                 + effect["device"][device]
                 + np.einsum("ij,ij->i", taste, placement))
        probability = 1 / (1 + np.exp(-logit))
        return {
            "label": (rng.random(rows) < probability).astype(np.int64),
            "user_id": self.user_ids[user], "user_gender": gender, "user_age": age,
            "user_city": self.city_ids[city], "item_id": self.item_ids[item],
            "item_category": self.category_ids[category],
            "item_brand": self.brand_ids[brand], "position": position, "hour": hour,
            "device": device, "teacher_prob": np.round(probability, _DECIMALS),
        }


@functools.cache
def _teacher() -> _Teacher:
    return _Teacher()


def _chunk_table(row_seed: list[int], chunk_index: int) -> pa.Table:
    rng = np.random.default_rng([TEACHER_SEED, *row_seed, chunk_index])
    return table_of(_teacher().make_rows(rng, CHUNK_ROWS), _schema())


def _description(split: str, rows: int, seed: int | None) -> dict[str, Any]:
    return {
        "name": NAME, "split": split, "rows": rows, "seed": seed,
        "description": (
            "Long-tail click log: ten categorical fields, user and item ids mostly "
            "rare; label ~ Bernoulli(teacher_prob) from a hidden latent-factor "
            "teacher with user x item interactions."),
        "label": "label",
        "teacher_prob": "p(click) under the hidden teacher",
        "cardinalities": dict(CARDINALITIES),
    }


def generate_longtail_synth(rows: int, path: str | os.PathLike, split: str = "train",
                            seed: int | None = None) -> Dataset:
    """Writes `rows` impressions of `longtail_synth` to a parquet file.

    Rows are drawn in chunks of 65,536 (one row group each) from the split's
    seed, so the output depends only on the arguments and a file of N rows is
    a prefix of one of M > N rows; the packaged splits are written with
    `DEFAULT_ROWS` (400,000 train, 40,000 valid and 40,000 test rows).

    Args:
        rows: number of rows, a positive int.
        path: the parquet file to write (parent directories are created).
        split: "train", "valid" or "test", whose row seed is used.
        seed: an extra seed mixed into the split's, for independent replicas;
            None for the packaged rows.

    Returns:
        A `Dataset` over the written file, label column `label`; its
        `bayes_auc()` is the AUC of `teacher_prob`.

    Raises:
        ValueError: for an unknown split or a non-positive `rows`.

    Example:

    ```python
    from reckeras.datasets.longtail import generate_longtail_synth

    big = generate_longtail_synth(1_000_000, "/tmp/longtail_1m.parquet")
    big.bayes_auc()
    ```
    """
    if split not in SPLIT_SEEDS:
        raise ValueError(f"dataset {NAME!r} has no split {split!r}; its splits are "
                         f"{list(SPLIT_SEEDS)}")
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise ValueError(f"rows must be a positive int, got {rows!r}")
    row_seed = [SPLIT_SEEDS[split]] + ([] if seed is None else [seed])
    schema = _schema().with_metadata({METADATA_KEY: json.dumps(
        _description(split, rows, seed), sort_keys=True)})
    path = write_tables(path, schema,
                        chunks(lambda i: _chunk_table(row_seed, i), rows),
                        rows, f"{NAME}:{split}")
    return open_files([path], f"{NAME}:{split}")
