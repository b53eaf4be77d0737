"""The `criteo_stream` generator: a daily click log whose teacher drifts.

`criteo_stream` has the columns of `criteo_synth` (label, I1..I13,
C1..C26, teacher_prob) and is written one day per hive partition,
`path/dt=2026-12-01/part-0.parquet`, ..., for training over time windows
with progressive validation (`Dataset.windows("dt")`, `rk.Model.fit_windows`).
Its teacher has the form of `criteo_synth`'s (per-id effects, latent
pairwise interactions, non-linear numeric effects; see `_synth`) with
parameters of its own, and changes from one day to the next:

* **ids churn**: every day each id of a field is retired with probability
  `ID_CHURN` and its popularity rank goes to a new id, never seen before,
  with a fresh latent vector: new ids appear, as many old ones stop, and the
  Zipf shape of every field stays the same;
* **effects drift**: every other id's latent vector (its main effect and
  its interactions) takes an AR(1) step, `v <- rho v + sqrt(1 - rho**2)
  s eps` with `rho = EFFECT_CORRELATION` and `s` the id's signal scale, so
  its spread stays that of day 0;
* **weights change**: every day `REWEIGHTED_PER_DAY` features (among the
  categoricals and the informative numerics) get a new weight, their base
  weight times a factor drawn from U(0.25, 1.75), kept until it changes
  again.

`vocabulary="production"` gives the stream the shape of production logs,
where the tables dominate a checkpoint and a day touches a small part of
them: the five large fields (`C3`, `C12`, `C16`, `C21`, `C24`) hold
`PRODUCTION_VOCABULARY_SCALE` times criteo_synth's ids (2 to 10 million)
under a flat Zipf law (exponent `PRODUCTION_ZIPF_EXPONENT`), so that most
of their ids are seen once or twice, and each day brings many never seen
before. The other fields, the drift and the teacher's form are the same.

Each day's file footer describes that day (`Dataset.metadata` of the
day's window): the date, the ids replaced per field, the features
reweighted and every feature's weight factor, and `bayes_auc`, the AUC of
`teacher_prob` against `label` on that day's rows (what `bayes_auc()` of
the window recomputes). A day's teacher scores any rows
(`day_teacher(seed, day).probabilities(table)`; an id it never had scores
as an id without effect), so the cost of drift can be measured: the
previous day's teacher ranks today's rows worse than today's.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from reckeras.datasets._dataset import LABEL, TEACHER_PROB, Dataset
from reckeras.datasets._parquet import METADATA_KEY, open_files
from reckeras.datasets._stats import roc_auc
from reckeras.datasets._synth import (
    _ID_BITS,
    CHUNK_ROWS,
    SPECS,
    chunks,
    draw_numerics,
    draw_ranks,
    numeric_term,
    popularity,
    scatter_ids,
    schema,
    table_of,
    unscatter_ids,
    write_tables,
)

NAME = "criteo_stream"
TEACHER_SEED = 20_261_216
DEFAULT_ROWS_PER_DAY = 100_000
DEFAULT_DAYS = 7
DEFAULT_START = "2026-12-01"

# The chance that an id is replaced by a new one from one day to the next.
ID_CHURN = 0.03
# Day-to-day correlation of an id's latent vector.
EFFECT_CORRELATION = 0.97
# Features whose weight changes every day, and the range of the new factor.
REWEIGHTED_PER_DAY = 3
_WEIGHT_FACTOR_RANGE = (0.25, 1.75)

# The columns, pairs and scales are criteo_synth's.
_SPEC = SPECS["criteo_synth"]
VOCABULARIES = ("criteo", "production")
# vocabulary="production": fields of at least _LARGE_FIELD ids get this many
# times their ids, drawn under this Zipf exponent.
PRODUCTION_VOCABULARY_SCALE = 10
PRODUCTION_ZIPF_EXPONENT = 1.05
_LARGE_FIELD = 100_000
_FEATURES = tuple(c.name for c in _SPEC.categoricals) + tuple(
    c.name for c in _SPEC.numerics if c.shape != "none")


def stream_spec(vocabulary: str = "criteo") -> Any:
    """The columns, vocabularies and teacher scales of a stream.

    Args:
        vocabulary: `"criteo"` (criteo_synth's) or `"production"` (its large
            fields `PRODUCTION_VOCABULARY_SCALE` times larger, with a flat
            Zipf law; see the module docstring).

    Returns:
        The stream's `_synth` spec.

    Raises:
        ValueError: for another `vocabulary`.

    Example:

    ```python
    from reckeras.datasets.criteo_stream import stream_spec

    {c.name: c.cardinality for c in stream_spec("production").categoricals}["C3"]
    # 10000000
    ```
    """
    if vocabulary not in VOCABULARIES:
        raise ValueError(f"vocabulary must be one of {VOCABULARIES}, got {vocabulary!r}")
    if vocabulary == "criteo":
        return _SPEC
    return dataclasses.replace(_SPEC, categoricals=tuple(
        dataclasses.replace(col, cardinality=col.cardinality * PRODUCTION_VOCABULARY_SCALE,
                            zipf_exponent=PRODUCTION_ZIPF_EXPONENT)
        if col.cardinality >= _LARGE_FIELD else col for col in _SPEC.categoricals))


@dataclasses.dataclass(frozen=True)
class _StreamConstants:
    """What stays fixed over the days: the columns, popularity, scatter,
    pair weights."""

    spec: Any
    cdf: dict[str, np.ndarray]
    signal: dict[str, np.ndarray]
    missing_latent: dict[str, np.ndarray]
    id_scatter: dict[str, tuple[np.uint64, np.uint64]]
    pair_weight: np.ndarray


@dataclasses.dataclass(eq=False)
class DayTeacher:
    """The hidden teacher of one day of the stream.

    Per field, popularity rank r holds the id `ids[field][r]` (scattered from
    an id slot that is never reused) with latent vector `latent[field][r]`.

    Args:
        day: the day's index, 0 for the first.
        slots: `{field: id slot of every rank}`, int64.
        next_slot: `{field: the next unused slot}`.
        latent: `{field: [cardinality, latent_dim] float32}`.
        weights: `{feature: factor}` multiplying its base weight.
        replaced: `{field: ids replaced since the day before}`.
        reweighted: `{feature: its new factor}`, for the features whose
            weight changed since the day before.
        common: the parameters every day shares (`_StreamConstants`).

    Example:

    ```python
    from reckeras.datasets.criteo_stream import day_teacher

    teacher = day_teacher(0, 3)
    prob = teacher.probabilities(table)   # the day-3 teacher on any rows
    ```
    """

    day: int
    slots: dict[str, np.ndarray]
    next_slot: dict[str, int]
    latent: dict[str, np.ndarray]
    weights: dict[str, float]
    replaced: dict[str, int]
    reweighted: dict[str, float]
    common: _StreamConstants

    @functools.cached_property
    def ids(self) -> dict[str, np.ndarray]:
        """`{field: the id of every popularity rank}`, int64."""
        return {name: scatter_ids(slots, *self.common.id_scatter[name])
                for name, slots in self.slots.items()}

    @functools.cached_property
    def _rank_of_slot(self) -> dict[str, np.ndarray]:
        # Per field: the popularity rank of every id slot used so far (-1:
        # retired), so an id's rank is two array reads away (see `latent_of`).
        ranks = {}
        for name, slots in self.slots.items():
            rank_of = np.full(self.next_slot[name], -1, dtype=np.int64)
            rank_of[slots] = np.arange(len(slots))
            ranks[name] = rank_of
        return ranks

    def latent_of(self, name: str, ids: np.ndarray, missing: np.ndarray) -> np.ndarray:
        """The latent vector of each id of one field on this day.

        Args:
            name: the categorical field.
            ids: int64 ids, any values.
            missing: where the id is null (those rows get the field's
                missing-value vector).

        Returns:
            `[len(ids), latent dim]`: the latent vector of the id's
            popularity rank; zeros for an id this day does not hold.
        """
        rank_of = self._rank_of_slot[name]
        slot = unscatter_ids(ids, *self.common.id_scatter[name])
        inside = (slot >= 0) & (slot < len(rank_of))
        rank = np.where(inside, rank_of[np.where(inside, slot, 0)], -1)
        known = (rank >= 0) & ~missing
        latent = np.where(known[:, None], self.latent[name][np.maximum(rank, 0)], 0.0)
        return np.where(missing[:, None], self.common.missing_latent[name], latent)

    def logit(self, columns: dict[str, tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
        """The teacher's logit of rows.

        Args:
            columns: `{name: (values, missing mask)}` of every numeric and
                categorical column (int64 values; what is under a mask is
                ignored).

        Returns:
            The logit of every row, float64. An id this day's teacher does
            not hold (retired, or not yet born) has no effect.
        """
        spec = self.common.spec
        logit = spec.bias + numeric_term(spec, columns, self.weights)
        latents = {}
        for col in spec.categoricals:
            ids, missing = columns[col.name]
            latents[col.name] = self.latent_of(col.name, ids, missing)
            logit = logit + (col.effect_scale * self.weights[col.name]
                             * latents[col.name][:, 0])
        for weight, (f, g) in zip(self.common.pair_weight, spec.interaction_pairs,
                                  strict=True):
            logit = logit + weight * np.einsum("ij,ij->i", latents[f], latents[g])
        return logit

    def probabilities(self, table: pa.Table) -> np.ndarray:
        """The teacher's probability of label 1 for rows of the stream's schema.

        Args:
            table: rows with the columns I1..I13 and C1..C26 (nulls for
                missing values), of any day.

        Returns:
            float64 probabilities, one per row.

        Example:

        ```python
        from reckeras.datasets.criteo_stream import day_teacher

        days = rk.datasets.generate("criteo_stream", path="/tmp/s").windows("dt")
        today = days[3].to_table()
        stale = day_teacher(0, 2).probabilities(today)   # yesterday's teacher
        ```
        """
        columns = {}
        spec = self.common.spec
        for col in (*spec.numerics, *spec.categoricals):
            column = table[col.name]
            columns[col.name] = (column.fill_null(0).to_numpy(),
                                 column.is_null().to_numpy())
        return 1.0 / (1.0 + np.exp(-self.logit(columns)))

    def make_rows(self, rng: np.random.Generator, num_rows: int) -> dict[str, Any]:
        """Draws rows of this day: counts, ids by popularity rank, labels.

        Args:
            rng: the generator the rows are drawn from.
            num_rows: the number of rows.

        Returns:
            `{name: array or (values, missing mask)}` for `table_of`.
        """
        spec = self.common.spec
        columns = draw_numerics(spec, rng, num_rows)
        for col in spec.categoricals:
            ranks, missing = draw_ranks(self.common.cdf[col.name], col, rng, num_rows)
            columns[col.name] = (self.ids[col.name][ranks], missing)
        prob = 1.0 / (1.0 + np.exp(-self.logit(columns)))
        columns[LABEL] = (rng.random(num_rows) < prob).astype(np.int64)
        columns[TEACHER_PROB] = prob.astype(np.float32)
        return columns

    def next_day(self, rng: np.random.Generator) -> DayTeacher:
        """The teacher of the day after: ids churned, effects and weights drifted.

        Args:
            rng: the generator of this transition.

        Returns:
            A new `DayTeacher`.
        """
        slots, next_slot, latent, replaced = {}, {}, {}, {}
        keep = np.float32(EFFECT_CORRELATION)
        step = np.float32(np.sqrt(1.0 - EFFECT_CORRELATION ** 2))
        spec = self.common.spec
        for col in spec.categoricals:
            name = col.name
            signal = self.common.signal[name][:, None]
            retired = rng.random(col.cardinality) < ID_CHURN
            count = int(retired.sum())
            slots[name] = self.slots[name].copy()
            slots[name][retired] = self.next_slot[name] + np.arange(count)
            next_slot[name] = self.next_slot[name] + count
            noise = rng.standard_normal(self.latent[name].shape, dtype=np.float32)
            latent[name] = keep * self.latent[name] + step * signal * noise
            latent[name][retired] = signal[retired] * rng.standard_normal(
                (count, spec.latent_dim), dtype=np.float32)
            replaced[name] = count
        chosen = rng.choice(len(_FEATURES), REWEIGHTED_PER_DAY, replace=False)
        factors = rng.uniform(*_WEIGHT_FACTOR_RANGE, size=REWEIGHTED_PER_DAY)
        reweighted = {_FEATURES[i]: round(float(f), 4)
                      for i, f in zip(sorted(chosen), factors[np.argsort(chosen)], strict=True)}
        return DayTeacher(self.day + 1, slots, next_slot, latent,
                          {**self.weights, **reweighted}, replaced, reweighted,
                          self.common)


def _first_day(seed: int, spec: Any) -> DayTeacher:
    rng = np.random.default_rng([TEACHER_SEED, seed, 0, 0])
    cdf, signal, missing_latent, id_scatter, latent = {}, {}, {}, {}, {}
    for col in spec.categoricals:
        cdf[col.name], signal[col.name] = popularity(col)
        latent[col.name] = signal[col.name][:, None] * rng.standard_normal(
            (col.cardinality, spec.latent_dim), dtype=np.float32)
        missing_latent[col.name] = rng.standard_normal(
            spec.latent_dim).astype(np.float32)
        # An odd multiplier modulo 2**40 keeps the ids of distinct slots distinct.
        id_scatter[col.name] = (np.uint64(rng.integers(1 << 20, 1 << _ID_BITS) | 1),
                                np.uint64(rng.integers(0, 1 << _ID_BITS)))
    signs = rng.choice([-1.0, 1.0], size=len(spec.interaction_pairs))
    common = _StreamConstants(
        spec, cdf, signal, missing_latent, id_scatter,
        signs * spec.interaction_scale / np.sqrt(spec.latent_dim))
    return DayTeacher(
        0, {c.name: np.arange(c.cardinality, dtype=np.int64) for c in spec.categoricals},
        {c.name: c.cardinality for c in spec.categoricals}, latent,
        {c.name: 1.0 for c in (*spec.categoricals, *spec.numerics)},
        {c.name: 0 for c in spec.categoricals}, {}, common)


def _teachers(seed: int, days: int, vocabulary: str) -> Iterator[DayTeacher]:
    # One day after the other: a production-sized teacher holds ~1 GB.
    teacher = _first_day(seed, stream_spec(vocabulary))
    yield teacher
    for day in range(1, days):
        teacher = teacher.next_day(np.random.default_rng([TEACHER_SEED, seed, day, 0]))
        yield teacher


def day_teacher(seed: int, day: int, vocabulary: str = "criteo") -> DayTeacher:
    """The hidden teacher of one day of a stream.

    Args:
        seed: the stream's seed (`generate`'s; 0 when it was None).
        day: the day's index, 0 for the first.
        vocabulary: the stream's `vocabulary` (`generate`'s).

    Returns:
        Its `DayTeacher`, the same as when the day was written.

    Raises:
        ValueError: for a negative or non-int `day`.

    Example:

    ```python
    from reckeras.datasets.criteo_stream import day_teacher

    day_teacher(0, 1).replaced["C6"]   # ids of C6 replaced on day 1
    ```
    """
    if isinstance(day, bool) or not isinstance(day, int) or day < 0:
        raise ValueError(f"day must be an int >= 0, got {day!r}")
    *_, teacher = _teachers(seed, day + 1, vocabulary)
    return teacher


def _check_count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def _description(teacher: DayTeacher, date: str, rows: int, days: int, seed: int,
                 vocabulary: str, bayes_auc: float) -> dict[str, Any]:
    return {
        "name": NAME, "day": teacher.day, "dt": date, "days": days, "rows": rows,
        "seed": seed, "vocabulary": vocabulary,
        "description": (
            "Criteo-like daily click log (criteo_synth's columns) whose hidden "
            "teacher drifts: ids are replaced by new ones, per-id effects take "
            "AR(1) steps and a few features' weights change from day to day."),
        "label": LABEL,
        "teacher_prob": "probability of label 1 under this day's hidden teacher",
        "bayes_auc": bayes_auc,
        "id_churn": ID_CHURN,
        "effect_correlation": EFFECT_CORRELATION,
        "replaced_ids": teacher.replaced,
        "reweighted": teacher.reweighted,
        "weights": teacher.weights,
        "cardinalities": {c.name: c.cardinality for c in teacher.common.spec.categoricals},
    }


def generate_criteo_stream(path: str | os.PathLike,
                           rows_per_day: int = DEFAULT_ROWS_PER_DAY,
                           days: int = DEFAULT_DAYS, seed: int | None = None,
                           start: str | datetime.date = DEFAULT_START,
                           vocabulary: str = "criteo") -> Dataset:
    """Writes `days` days of `criteo_stream`, one hive partition per day.

    Day d goes to `path/dt=<start + d days>/part-0.parquet` (ISO dates, so
    the windows sort in time order), in row groups of 65,536 rows, each file
    written under a temporary name and moved into place. The output depends
    only on the arguments; the teacher of day d depends only on `seed` and
    d, so a stream of more days or more rows per day has the same teachers.
    A day's footer description (its window's `metadata`) records its
    `bayes_auc` and its drift (see the module docstring).

    Args:
        path: the directory to write the days into (created if needed);
            other files there are left alone and not read by the returned
            dataset.
        rows_per_day: rows of every day.
        days: the number of days.
        seed: seed of the teacher's drift and of the rows; None for 0.
        start: the first day's date, `"YYYY-MM-DD"` or a `datetime.date`.
        vocabulary: `"criteo"` (criteo_synth's vocabularies) or
            `"production"` (the large fields 10x larger with flat Zipf
            tails, see the module docstring).

    Returns:
        A `Dataset` named "criteo_stream" over the days written, with the
        partition column `dt` (string); `windows("dt")` gives the days.

    Raises:
        ValueError: for a non-positive `rows_per_day` or `days`, a negative
            `seed`, a `start` that is not a date, or an unknown `vocabulary`.

    Example:

    ```python
    stream = rk.datasets.generate("criteo_stream", path="/tmp/stream",
                                  rows_per_day=100_000, days=7)
    for day in stream.windows("dt"):
        day.partition["dt"], day.metadata["bayes_auc"]
    ```
    """
    rows_per_day = _check_count("rows_per_day", rows_per_day)
    days = _check_count("days", days)
    seed = 0 if seed is None else seed
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an int >= 0 or None, got {seed!r}")
    try:
        first = start if isinstance(start, datetime.date) else \
            datetime.date.fromisoformat(start)
    except (TypeError, ValueError) as error:
        raise ValueError(f"start must be a date 'YYYY-MM-DD', got {start!r}") from error
    stream_spec(vocabulary)                  # checked before anything is written
    base = Path(os.path.abspath(path))
    files = [_write_day(base, teacher,
                        (first + datetime.timedelta(days=teacher.day)).isoformat(),
                        rows_per_day, days, seed, vocabulary)
             for teacher in _teachers(seed, days, vocabulary)]
    return open_files(files, NAME, partition_base_dir=base)


def _write_day(base: Path, teacher: DayTeacher, date: str, rows: int, days: int,
               seed: int, vocabulary: str) -> Path:
    labels, probabilities = [], []

    def make_chunk(chunk):
        rng = np.random.default_rng([TEACHER_SEED, seed, teacher.day, 1, chunk])
        return table_of(teacher.make_rows(rng, CHUNK_ROWS), schema(teacher.common.spec))

    def recorded(tables):
        for table in tables:
            labels.append(table[LABEL].to_numpy())
            probabilities.append(table[TEACHER_PROB].to_numpy())
            yield table

    def footer():
        # The Bayes AUC needs every row of the day: it goes into the footer.
        auc = roc_auc(np.concatenate(labels), np.concatenate(probabilities))
        return {METADATA_KEY: json.dumps(
            _description(teacher, date, rows, days, seed, vocabulary, auc),
            sort_keys=True)}

    return write_tables(base / f"dt={date}" / "part-0.parquet", schema(teacher.common.spec),
                        recorded(chunks(make_chunk, rows)), rows, f"{NAME}:{date}",
                        footer)
