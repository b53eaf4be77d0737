"""The `aliccp_synth` generator: impressions with a click and a conversion label.

`aliccp_synth` is shaped after Ali-CCP (Alibaba's click and conversion
prediction log, the data of ESMM): every row is one impression of an item to
a user, with the user's profile, the item's attributes and the context, and
two labels drawn from a hidden teacher:

* `click` ~ Bernoulli(p_click);
* `conversion` = click * Bernoulli(p_cvr): a conversion only follows a click,
  so `conversion` is the click-and-convert label over the entire space of
  impressions (ESMM's CTCVR task), with probability p_click * p_cvr.

Columns (all ids non-negative int64):

* user: `user_id` (10,000 users, Zipf-distributed traffic), `user_gender`
  (2), `user_age` (7 buckets), `user_city_level` (5), `user_occupation` (8;
  null for a tenth of the users), `user_clicks_30d` (int64 count);
* item: `item_id` (20,000 items, Zipf), `item_category` (200), `item_shop`
  (2,000), `item_brand` (1,000; null for a quarter of the items),
  `item_price` (float32);
* context: `position` (display slot 0-9), `hour` (0-23);
* the teacher's probabilities of both labels: `teacher_click_prob`
  (p_click, rounded to 1e-4) and `teacher_conversion_prob` (p_click * p_cvr,
  rounded to 1e-5).

Profile columns are attributes of the user and item columns of the item:
they are drawn once per user and per item, as in a real log. About 19% of
the impressions are clicked and 14% of the clicks convert (2.6% of the
impressions).

The teacher reads only the columns (a null brand or occupation contributes
nothing), so its probabilities are the best any model can predict, and the
AUC of each teacher column against its label is that task's Bayes-optimal
AUC; `generate` records both in the file's description (`bayes_auc`). The
click logit:

```
-0.8 + user + item + category + shop + brand + gender + age + city + occupation
     - 0.35 log1p(position) + 0.25 cos(2 pi (hour - 21) / 24)
     + 0.5 tanh(log1p(clicks_30d) - 2) - 0.15 z_price
     + 0.8 taste                                     (interaction)
```

and the conversion logit (given a click):

```
-2.4 + user' + brand' + category' + occupation' + city'
     - 0.6 z_price + 0.3 z_age * z_price             (interaction)
     + 0.6 taste + 0.3 tanh(log1p(clicks_30d) - 2)
```

where `taste = <g[gender] + a[age], c[category]>` is a latent affinity of the
profile to the category (4-dimensional hidden vectors), `z_price` the
standardized log price and `z_age` the centred age bucket. Position shifts
clicks but not conversions, as a display slot does. An effect of a user,
item, shop, brand or category (and a category's hidden vector) shrinks with
the id's expected clicks, for conversion effects its expected conversions,
in the packaged train split: by n / (n + 100), so ids too rare to learn from
it carry little signal.
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

NAME = "aliccp_synth"
TEACHER_SEED = 20_261_214
SPLIT_SEEDS = {"train": 1, "test": 2}
DEFAULT_ROWS = {"train": 300_000, "test": 50_000}

NUM_USERS, NUM_ITEMS = 10_000, 20_000
NUM_CATEGORIES, NUM_SHOPS, NUM_BRANDS = 200, 2_000, 1_000
GENDERS, AGES, CITY_LEVELS, OCCUPATIONS = 2, 7, 5, 8
POSITIONS, HOURS = 10, 24
LATENT_DIM = 4

# Each label column and the teacher column holding its probability; the
# probabilities are stored rounded to these many decimals.
LABELS = {"click": "teacher_click_prob", "conversion": "teacher_conversion_prob"}
_DECIMALS = {"teacher_click_prob": 4, "teacher_conversion_prob": 5}

# An effect of an id (user, item, shop, brand, category) is scaled by
# n / (n + _HALF_EVENTS), n being the id's expected clicks (for click
# effects) or conversions (for conversion effects) in the packaged train
# split: an effect is learnable from about a hundred labelled events, and
# ids with fewer carry correspondingly less signal.
_HALF_EVENTS = 100.0
_EXPECTED_CTR, _EXPECTED_CVR = 0.18, 0.14
_LOG_PRICE_MEAN, _LOG_PRICE_STD = 4.0, 0.9

COLUMNS = ("user_id", "user_gender", "user_age", "user_city_level", "user_occupation",
           "user_clicks_30d", "item_id", "item_category", "item_shop", "item_brand",
           "item_price", "position", "hour")


def _schema() -> pa.Schema:
    fields = [pa.field(name, pa.int64(), nullable=False) for name in LABELS]
    for name in COLUMNS:
        nullable = name in ("user_occupation", "item_brand")
        kind = pa.float32() if name == "item_price" else pa.int64()
        fields.append(pa.field(name, kind, nullable=nullable))
    fields += [pa.field(name, pa.float32(), nullable=False) for name in LABELS.values()]
    return pa.schema(fields)


def _effects(rng: np.random.Generator, events: np.ndarray, half: float, scale: float,
             dim: int | None = None) -> np.ndarray:
    """Normal effects (vectors of `dim`, if given) of ids expecting `events`
    labelled events each, scaled by `scale * events / (events + half)`."""
    shrink = events / (events + half)
    if dim is None:
        return scale * shrink * rng.standard_normal(len(events))
    return scale * shrink[:, None] * rng.standard_normal((len(events), dim))


class _Teacher:
    """The hidden world: users, items, their attributes and every effect."""

    def __init__(self):
        rng = np.random.default_rng(TEACHER_SEED)
        rows = DEFAULT_ROWS["train"]
        # Users and items: traffic by popularity rank; a rank's id is a random
        # permutation, so ids carry no popularity order.
        self.user_cdf = zipf_cdf(NUM_USERS, 1.0)
        self.item_cdf = zipf_cdf(NUM_ITEMS, 1.2)
        self.user_ids = rng.permutation(NUM_USERS)
        self.item_ids = rng.permutation(NUM_ITEMS)
        user_count = rows * np.diff(self.user_cdf, prepend=0.0)
        item_count = rows * np.diff(self.item_cdf, prepend=0.0)
        # Profiles, one per user rank.
        self.gender = (rng.random(NUM_USERS) < 0.45).astype(np.int64)
        self.age = draw(np.cumsum([0.08, 0.22, 0.26, 0.19, 0.13, 0.08, 0.04]),
                         NUM_USERS, rng)
        self.city_level = draw(np.cumsum([0.1, 0.2, 0.3, 0.25, 0.15]), NUM_USERS, rng)
        self.occupation = rng.integers(0, OCCUPATIONS, NUM_USERS)
        self.occupation_missing = rng.random(NUM_USERS) < 0.1
        self.clicks_30d = np.maximum(
            np.floor(np.exp(rng.normal(1.5, 1.2, NUM_USERS))) - 1, 0).astype(np.int64)
        # Items' attributes, one per item rank; shops and brands by a Zipf law.
        self.category = draw(zipf_cdf(NUM_CATEGORIES, 0.9), NUM_ITEMS, rng)
        self.shop = draw(zipf_cdf(NUM_SHOPS, 0.8), NUM_ITEMS, rng)
        self.brand = draw(zipf_cdf(NUM_BRANDS, 0.8), NUM_ITEMS, rng)
        self.brand_missing = rng.random(NUM_ITEMS) < 0.25
        category_log_price = rng.normal(_LOG_PRICE_MEAN, 0.7, NUM_CATEGORIES)
        self.price = np.round(np.exp(category_log_price[self.category]
                                     + rng.normal(0, 0.55, NUM_ITEMS)), 2)
        self.category_ids = rng.permutation(NUM_CATEGORIES)
        self.shop_ids = rng.permutation(NUM_SHOPS)
        self.brand_ids = rng.permutation(NUM_BRANDS)
        # Expected impressions of shops, brands and categories: their items'.
        shop_count = np.bincount(self.shop, item_count, NUM_SHOPS)
        brand_count = np.bincount(self.brand, item_count * ~self.brand_missing, NUM_BRANDS)
        category_count = np.bincount(self.category, item_count, NUM_CATEGORIES)
        normal = rng.standard_normal
        clicks = {name: _EXPECTED_CTR * count for name, count in (
            ("user", user_count), ("item", item_count), ("shop", shop_count),
            ("brand", brand_count), ("category", category_count))}
        conversions = {name: _EXPECTED_CVR * count for name, count in clicks.items()}
        self.user_click = _effects(rng, clicks["user"], _HALF_EVENTS, 0.7)
        self.item_click = _effects(rng, clicks["item"], _HALF_EVENTS, 0.7)
        self.shop_click = _effects(rng, clicks["shop"], _HALF_EVENTS, 0.4)
        self.brand_click = _effects(rng, clicks["brand"], _HALF_EVENTS, 0.4)
        self.category_click = _effects(rng, clicks["category"], _HALF_EVENTS, 0.4)
        self.gender_click = 0.1 * normal(GENDERS)
        self.age_click = 0.15 * normal(AGES)
        self.city_click = 0.1 * normal(CITY_LEVELS)
        self.occupation_click = 0.1 * normal(OCCUPATIONS)
        self.user_cvr = _effects(rng, conversions["user"], _HALF_EVENTS, 0.6)
        self.brand_cvr = _effects(rng, conversions["brand"], _HALF_EVENTS, 0.4)
        self.category_cvr = _effects(rng, conversions["category"], _HALF_EVENTS, 0.6)
        self.occupation_cvr = 0.25 * normal(OCCUPATIONS)
        self.city_cvr = 0.15 * normal(CITY_LEVELS)
        # The profile's latent taste for a category.
        self.gender_vector = 0.5 * normal((GENDERS, LATENT_DIM))
        self.age_vector = 0.5 * normal((AGES, LATENT_DIM))
        self.category_vector = _effects(rng, clicks["category"], _HALF_EVENTS, 0.6,
                                        LATENT_DIM)
        self.position_cdf = zipf_cdf(POSITIONS, 0.5)
        hour_weight = 1.2 + np.cos(2 * np.pi * (np.arange(HOURS) - 20) / HOURS)
        self.hour_cdf = np.cumsum(hour_weight / hour_weight.sum())

    def probabilities(self, user: np.ndarray, item: np.ndarray, position: np.ndarray,
                      hour: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """p(click) and p(conversion | click) of impressions given by ranks."""
        gender, age, city = self.gender[user], self.age[user], self.city_level[user]
        occupation, has_occupation = self.occupation[user], ~self.occupation_missing[user]
        category, brand = self.category[item], self.brand[item]
        has_brand = ~self.brand_missing[item]
        z_price = (np.log(self.price[item]) - _LOG_PRICE_MEAN) / _LOG_PRICE_STD
        z_age = (age - 3) / 2
        activity = np.tanh(np.log1p(self.clicks_30d[user]) - 2)
        taste = np.einsum("ij,ij->i", self.gender_vector[gender] + self.age_vector[age],
                          self.category_vector[category])
        click_logit = (
            -0.8 + self.user_click[user] + self.item_click[item]
            + self.category_click[category] + self.shop_click[self.shop[item]]
            + has_brand * self.brand_click[brand] + self.gender_click[gender]
            + self.age_click[age] + self.city_click[city]
            + has_occupation * self.occupation_click[occupation]
            - 0.35 * np.log1p(position) + 0.25 * np.cos(2 * np.pi * (hour - 21) / HOURS)
            + 0.5 * activity - 0.15 * z_price + 0.8 * taste)
        cvr_logit = (
            -2.4 + self.user_cvr[user] + has_brand * self.brand_cvr[brand]
            + self.category_cvr[category] + has_occupation * self.occupation_cvr[occupation]
            + self.city_cvr[city] - 0.6 * z_price + 0.3 * z_age * z_price
            + 0.6 * taste + 0.3 * activity)
        return 1 / (1 + np.exp(-click_logit)), 1 / (1 + np.exp(-cvr_logit))

    def make_rows(self, rng: np.random.Generator, rows: int) -> dict[str, Any]:
        """Columns of `rows` impressions, with both labels and the teacher's
        probabilities; nullable columns are `(values, missing mask)` pairs."""
        user = draw(self.user_cdf, rows, rng)
        item = draw(self.item_cdf, rows, rng)
        position = draw(self.position_cdf, rows, rng)
        hour = draw(self.hour_cdf, rows, rng)
        p_click, p_cvr = self.probabilities(user, item, position, hour)
        click = rng.random(rows) < p_click
        conversion = click & (rng.random(rows) < p_cvr)
        return {
            "click": click.astype(np.int64), "conversion": conversion.astype(np.int64),
            "user_id": self.user_ids[user], "user_gender": self.gender[user],
            "user_age": self.age[user], "user_city_level": self.city_level[user],
            "user_occupation": (self.occupation[user], self.occupation_missing[user]),
            "user_clicks_30d": self.clicks_30d[user], "item_id": self.item_ids[item],
            "item_category": self.category_ids[self.category[item]],
            "item_shop": self.shop_ids[self.shop[item]],
            "item_brand": (self.brand_ids[self.brand[item]], self.brand_missing[item]),
            "item_price": self.price[item], "position": position, "hour": hour,
            "teacher_click_prob": np.round(p_click, _DECIMALS["teacher_click_prob"]),
            "teacher_conversion_prob": np.round(p_click * p_cvr,
                                                _DECIMALS["teacher_conversion_prob"]),
        }


@functools.cache
def _teacher() -> _Teacher:
    return _Teacher()


def _chunk_table(row_seed: list[int], chunk_index: int) -> pa.Table:
    rng = np.random.default_rng([TEACHER_SEED, *row_seed, chunk_index])
    return table_of(_teacher().make_rows(rng, CHUNK_ROWS), _schema())


class _AucCounter:
    """Exact ROC AUC of probabilities on a grid of 10**-decimals, streamed:
    label counts per grid point, so memory does not grow with the rows."""

    def __init__(self, decimals: int):
        self.scale = 10 ** decimals
        self.counts = np.zeros((2, self.scale + 1), np.int64)

    def add(self, labels: np.ndarray, probabilities: np.ndarray) -> None:
        points = np.rint(probabilities.astype(np.float64) * self.scale).astype(np.int64)
        for label in (0, 1):
            self.counts[label] += np.bincount(points[labels == label],
                                              minlength=self.scale + 1)

    def auc(self) -> float | None:
        negatives, positives = self.counts
        if not negatives.sum() or not positives.sum():
            return None
        below = np.cumsum(negatives) - negatives
        wins = (positives * (below + 0.5 * negatives)).sum()
        return float(wins / (positives.sum() * negatives.sum()))


def _description(split: str, rows: int, seed: int | None,
                 bayes_auc: dict[str, float | None]) -> dict[str, Any]:
    return {
        "name": NAME, "split": split, "rows": rows, "seed": seed,
        "description": (
            "Ali-CCP-like impression log: user profile, item attributes, display "
            "position and hour; click ~ Bernoulli(p_click) and conversion = click * "
            "Bernoulli(p_cvr) from a hidden teacher (a conversion only follows a "
            "click)."),
        "labels": LABELS,
        "teacher_click_prob": "p(click) under the hidden teacher",
        "teacher_conversion_prob": "p(click and conversion) under the hidden teacher",
        "bayes_auc": bayes_auc,
        "cardinalities": {
            "user_id": NUM_USERS, "user_gender": GENDERS, "user_age": AGES,
            "user_city_level": CITY_LEVELS, "user_occupation": OCCUPATIONS,
            "item_id": NUM_ITEMS, "item_category": NUM_CATEGORIES,
            "item_shop": NUM_SHOPS, "item_brand": NUM_BRANDS,
            "position": POSITIONS, "hour": HOURS},
    }


def generate_aliccp_synth(rows: int, path: str | os.PathLike, split: str = "train",
                          seed: int | None = None) -> Dataset:
    """Writes `rows` impressions of `aliccp_synth` to a parquet file.

    Rows are drawn in chunks of 65,536 (one row group each) from the split's
    seed, so the output depends only on the arguments and a file of N rows is
    a prefix of one of M > N rows; the packaged splits are
    `generate_aliccp_synth(300_000, ..., "train")` and
    `generate_aliccp_synth(50_000, ..., "test")` (`DEFAULT_ROWS`). The file's
    description (`Dataset.metadata`) records, under `"bayes_auc"`, the AUC of
    each teacher column against its label on the rows written (`"click"`,
    and `"conversion"` for click-and-conversion; None for a label that is
    constant on them).

    Args:
        rows: number of rows, a positive int.
        path: the parquet file to write (parent directories are created).
        split: "train" or "test", whose row seed is used.
        seed: an extra seed mixed into the split's, for independent replicas;
            None for the packaged rows.

    Returns:
        A `Dataset` over the written file. It has no `label` column: name
        the label columns in `fit(..., labels={"ctr": "click", "ctcvr":
        "conversion"})`.

    Raises:
        ValueError: for an unknown split or a non-positive `rows`.

    Example:

    ```python
    from reckeras.datasets.aliccp import generate_aliccp_synth

    big = generate_aliccp_synth(2_000_000, "/tmp/aliccp_2m.parquet")
    big.metadata["bayes_auc"]   # {"click": 0.7..., "conversion": 0.8...}
    ```
    """
    if split not in SPLIT_SEEDS:
        raise ValueError(f"dataset {NAME!r} has no split {split!r}; its splits are "
                         f"{list(SPLIT_SEEDS)}")
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise ValueError(f"rows must be a positive int, got {rows!r}")
    row_seed = [SPLIT_SEEDS[split]] + ([] if seed is None else [seed])
    counters = {label: _AucCounter(_DECIMALS[column]) for label, column in LABELS.items()}

    def counted(tables):
        for table in tables:
            for label, column in LABELS.items():
                counters[label].add(table[label].to_numpy(), table[column].to_numpy())
            yield table

    def footer():
        # The description holds the Bayes AUCs of all rows, so it goes into
        # the footer once every row is written.
        bayes_auc = {label: counter.auc() for label, counter in counters.items()}
        return {METADATA_KEY: json.dumps(_description(split, rows, seed, bayes_auc),
                                         sort_keys=True)}

    path = write_tables(path, _schema(),
                        counted(chunks(lambda i: _chunk_table(row_seed, i), rows)),
                        rows, f"{NAME}:{split}", footer)
    return open_files([path], f"{NAME}:{split}")
