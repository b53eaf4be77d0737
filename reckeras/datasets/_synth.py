"""Synthetic click logs whose labels come from a known hidden teacher.

Every synthetic dataset is a `_SyntheticSpec`: its columns, a teacher seed from
which all hidden parameters are drawn (so every split and every `generate`
call share one teacher), and one default row seed per split. Rows are made in
fixed-size chunks, each from its own seed, so a file of N rows is a prefix of
a file of M > N rows made with the same seed.

The `criteo_synth` teacher gives every id of field f a latent vector v_f[id]
and draws the label from sigmoid of

```
bias + sum_f s_f v_f[id_f][0]                         (per-id effects)
     + sum_{(f, g) in pairs} w_fg <v_f[id_f], v_g[id_g]>  (interactions)
     + sum_j h_j(log1p(I_j))                          (steps and a bump)
```

Logistic regression on one-hot ids sees only the first term and a linear
version of the last; a DLRM's dot interaction and bottom MLP can represent all
three. Latent vectors shrink with the id's expected count in
`_REFERENCE_ROWS` rows: an id seen rarely in the packaged train split carries
almost no signal, because no model could learn it from there.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm.auto import tqdm

# Row-group size of generated files: several row groups per packaged split, so
# readers can shard and shuffle at row-group granularity.
CHUNK_ROWS = 65_536

# zstd level 9 shrinks the packaged files by about a tenth over the default
# level at a few seconds of extra build time.
_COMPRESSION_LEVEL = 9

# Ids are scattered over [0, 2**40) rather than 0..n-1, as hashed ids are.
_ID_BITS = 40
_ID_MASK = np.uint64((1 << _ID_BITS) - 1)

# Latent vectors are scaled by count / (count + _HALF_SIGNAL_COUNT), where
# count is the id's expected number of occurrences in the packaged train split.
_REFERENCE_ROWS = 200_000
_HALF_SIGNAL_COUNT = 1000.0


@dataclasses.dataclass(frozen=True)
class _Categorical:
    name: str
    cardinality: int
    zipf_exponent: float
    missing_rate: float
    effect_scale: float


@dataclasses.dataclass(frozen=True)
class _Numeric:
    """A heavy-tailed count: floor(exp(N(log_mean, log_std))) - 1, or 0.

    `shape` is the kind of non-linear effect of log1p(count) on the logit:
    "bump" (a Gaussian bump, not monotone), "step" (a smooth threshold) or
    "none" (an uninformative column).
    """

    name: str
    missing_rate: float
    zero_rate: float
    log_mean: float
    log_std: float
    shape: str
    center: float
    width: float
    effect: float


@dataclasses.dataclass(frozen=True)
class _SyntheticSpec:
    name: str
    description: str
    teacher_seed: int
    split_seeds: dict
    default_rows: dict
    categoricals: tuple
    numerics: tuple
    interaction_pairs: tuple
    interaction_scale: float
    latent_dim: int
    bias: float


def _criteo_synth_spec() -> _SyntheticSpec:
    # A few huge id spaces (200k to 1M ids) and many small ones, as in
    # Criteo. The Zipf exponents are steep (1.4 to 1.8) wherever there are
    # more than ~100 ids: the quickstart DLRM gives every id its own row, and
    # rows seen only a few times in 200k examples memorize label noise, so
    # rows with rare ids must be a small share of the data. Effects sit on
    # the small fields, whose ids each occur hundreds of times or more.
    c = _Categorical
    categoricals = (
        c("C1", 1_460, 1.80, 0.00, 0.11),
        c("C2", 583, 1.70, 0.00, 0.29),
        c("C3", 1_000_000, 1.80, 0.03, 0.11),
        c("C4", 400, 1.70, 0.03, 0.22),
        c("C5", 305, 1.60, 0.00, 0.29),
        c("C6", 24, 1.00, 0.12, 0.71),
        c("C7", 12_517, 1.80, 0.00, 0.11),
        c("C8", 633, 1.80, 0.00, 0.22),
        c("C9", 3, 1.50, 0.00, 0.43),
        c("C10", 900, 1.80, 0.00, 0.11),
        c("C11", 5_683, 1.80, 0.00, 0.11),
        c("C12", 800_000, 1.80, 0.03, 0.07),
        c("C13", 700, 1.80, 0.00, 0.22),
        c("C14", 27, 1.10, 0.00, 0.71),
        c("C15", 250, 1.50, 0.00, 0.36),
        c("C16", 600_000, 1.80, 0.03, 0.11),
        c("C17", 10, 1.00, 0.00, 0.43),
        c("C18", 150, 1.40, 0.00, 0.43),
        c("C19", 2_173, 1.80, 0.44, 0.14),
        c("C20", 4, 1.00, 0.44, 0.43),
        c("C21", 400_000, 1.80, 0.03, 0.07),
        c("C22", 18, 1.10, 0.76, 0.65),
        c("C23", 15, 1.00, 0.00, 0.71),
        c("C24", 200_000, 1.80, 0.03, 0.07),
        c("C25", 105, 1.10, 0.44, 0.57),
        c("C26", 60, 1.10, 0.44, 0.57),
    )
    n = _Numeric
    numerics = (
        n("I1", 0.40, 0.30, 1.2, 1.0, "step", 1.0, 0.8, 0.4),
        n("I2", 0.00, 0.20, 2.5, 1.8, "step", 2.5, 1.5, 0.4),
        n("I3", 0.20, 0.10, 2.2, 1.2, "none", 0.0, 1.0, 0.0),
        n("I4", 0.20, 0.10, 1.8, 0.9, "none", 0.0, 1.0, 0.0),
        n("I5", 0.03, 0.05, 8.0, 2.0, "bump", 7.5, 2.5, 0.3),
        n("I6", 0.20, 0.15, 4.0, 1.5, "step", 4.0, 1.5, -0.4),
        n("I7", 0.04, 0.20, 2.0, 1.4, "none", 0.0, 1.0, 0.0),
        n("I8", 0.00, 0.05, 2.5, 1.0, "none", 0.0, 1.0, 0.0),
        n("I9", 0.04, 0.05, 4.0, 1.2, "step", 4.0, 1.5, 0.3),
        n("I10", 0.40, 0.50, 0.6, 0.5, "none", 0.0, 1.0, 0.0),
        n("I11", 0.04, 0.30, 1.2, 0.8, "step", 1.0, 0.8, -0.3),
        n("I12", 0.40, 0.60, 0.5, 0.8, "none", 0.0, 1.0, 0.0),
        n("I13", 0.20, 0.10, 2.2, 1.1, "step", 2.0, 1.0, 0.3),
    )
    # Pairs among fields of 15 to 105 ids: each id occurs hundreds to
    # thousands of times in 200k rows, enough to learn its latent vector.
    pairs = (
        ("C6", "C14"), ("C6", "C22"), ("C22", "C23"), ("C14", "C23"),
        ("C25", "C26"), ("C6", "C25"), ("C14", "C26"), ("C23", "C25"),
    )
    return _SyntheticSpec(
        name="criteo_synth",
        description=(
            "Criteo-like click log: 13 heavy-tailed counts I1..I13 and 26 "
            "Zipf-distributed categorical ids C1..C26, labels drawn from a "
            "hidden teacher with per-id effects, latent pairwise field "
            "interactions and non-linear numeric effects."),
        teacher_seed=20_261_130,
        split_seeds={"train": 1, "test": 2},
        default_rows={"train": 200_000, "test": 50_000},
        categoricals=categoricals,
        numerics=numerics,
        interaction_pairs=pairs,
        interaction_scale=0.8,
        latent_dim=1,
        bias=-0.3,
    )


SPECS = {spec.name: spec for spec in (_criteo_synth_spec(),)}


def popularity(col: _Categorical) -> tuple[np.ndarray, np.ndarray]:
    """How often each popularity rank of a field is drawn, and its signal.

    Args:
        col: the categorical column.

    Returns:
        `(cdf, signal)`: the cumulative Zipf probabilities of the ranks, and
        each rank's latent scale count / (count + `_HALF_SIGNAL_COUNT`),
        count being its expected occurrences in `_REFERENCE_ROWS` rows.

    Example:

    ```python
    from reckeras.datasets._synth import SPECS, popularity

    cdf, signal = popularity(SPECS["criteo_synth"].categoricals[5])   # C6
    signal[0] > signal[-1]   # True: popular ids carry more signal
    ```
    """
    weights = (np.arange(col.cardinality) + 1.0) ** -col.zipf_exponent
    prob = weights / weights.sum()
    count = _REFERENCE_ROWS * (1 - col.missing_rate) * prob
    return np.cumsum(prob), (count / (count + _HALF_SIGNAL_COUNT)).astype(np.float32)


def scatter_ids(values: np.ndarray, multiplier: np.uint64,
                offset: np.uint64) -> np.ndarray:
    """Distinct non-negative integers mapped to scattered 40-bit int64 ids.

    Args:
        values: non-negative integers below 2**40 (ranks, or id slots).
        multiplier: an odd multiplier (a bijection modulo 2**40).
        offset: added before the xor-shift.

    Returns:
        The ids, int64; distinct values give distinct ids.

    Example:

    ```python
    from reckeras.datasets._synth import scatter_ids

    scatter_ids(np.arange(3), np.uint64(2**21 + 1), np.uint64(7))
    ```
    """
    mixed = (values.astype(np.uint64) * multiplier + offset) & _ID_MASK
    # xor-shift is also a bijection on 40 bits; it scatters the low bits.
    mixed ^= mixed >> np.uint64(17)
    return mixed.astype(np.int64)


def unscatter_ids(ids: np.ndarray, multiplier: np.uint64,
                  offset: np.uint64) -> np.ndarray:
    """The inverse of `scatter_ids`: the value each id was scattered from.

    A teacher finds an id's popularity rank through it in time linear in
    the ids (sorting a production vocabulary's 10 million ids took a second
    a field and a day).

    Args:
        ids: int64 ids, any values.
        multiplier: the odd multiplier `scatter_ids` was given.
        offset: the offset `scatter_ids` was given.

    Returns:
        int64 values; -1 where an id is outside `[0, 2**40)`, which no
        value scatters to.

    Example:

    ```python
    from reckeras.datasets._synth import scatter_ids, unscatter_ids

    m, o = np.uint64(2**21 + 1), np.uint64(7)
    unscatter_ids(scatter_ids(np.arange(3), m, o), m, o)   # [0, 1, 2]
    ```
    """
    inside = (ids >= 0) & (ids <= np.int64(_ID_MASK))
    mixed = ids.astype(np.uint64) & _ID_MASK
    # x ^ (x >> 17) on 40 bits is undone by two more shifts (17 and 34).
    mixed ^= mixed >> np.uint64(17)
    mixed ^= mixed >> np.uint64(34)
    inverse = _inverse_mod_id_space(multiplier)
    values = ((mixed - offset) * inverse) & _ID_MASK
    return np.where(inside, values.astype(np.int64), -1)


def _inverse_mod_id_space(multiplier: np.uint64) -> np.uint64:
    """The inverse of an odd multiplier modulo 2**40."""
    return np.uint64(pow(int(multiplier), -1, 1 << _ID_BITS))


def draw_numerics(spec: _SyntheticSpec, rng: np.random.Generator,
                  num_rows: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Draws the heavy-tailed counts of a spec's numeric columns.

    Args:
        spec: a value of `SPECS`.
        rng: the generator the rows are drawn from.
        num_rows: the number of rows.

    Returns:
        `{name: (int64 counts, missing mask)}`.

    Example:

    ```python
    from reckeras.datasets._synth import SPECS, draw_numerics

    columns = draw_numerics(SPECS["criteo_synth"], np.random.default_rng(0), 10)
    counts, missing = columns["I1"]
    ```
    """
    columns = {}
    activity = rng.standard_normal(num_rows)
    for col in spec.numerics:
        log_count = col.log_mean + col.log_std * (
            0.5 * activity + np.sqrt(0.75) * rng.standard_normal(num_rows))
        counts = np.floor(np.exp(np.maximum(log_count, 0.0))) - 1.0
        counts[rng.random(num_rows) < col.zero_rate] = 0.0
        missing = rng.random(num_rows) < col.missing_rate
        columns[col.name] = (counts.astype(np.int64), missing)
    return columns


def numeric_term(spec: _SyntheticSpec, columns: dict[str, Any],
                 scales: dict[str, float] | None = None) -> np.ndarray:
    """The teacher's non-linear effect of the numeric columns on the logit.

    The teacher reads a missing count as 0: filling nulls with 0 is the
    Bayes-consistent policy for a model.

    Args:
        spec: a value of `SPECS`.
        columns: `{name: (counts, missing mask)}` of every numeric column.
        scales: a factor per column multiplying its effect; None for 1.

    Returns:
        The term of every row, float64.

    Example:

    ```python
    from reckeras.datasets._synth import SPECS, draw_numerics, numeric_term

    spec = SPECS["criteo_synth"]
    term = numeric_term(spec, draw_numerics(spec, np.random.default_rng(0), 10))
    ```
    """
    term = np.zeros(len(columns[spec.numerics[0].name][0]))
    for col in spec.numerics:
        counts, missing = columns[col.name]
        z = np.where(missing, 0.0, np.log1p(counts.astype(np.float64)))
        effect = col.effect * (1.0 if scales is None else scales[col.name])
        if col.shape == "bump":
            term += effect * np.exp(-0.5 * ((z - col.center) / col.width) ** 2)
        elif col.shape == "step":
            term += effect * np.tanh((z - col.center) / col.width)
    return term


def zipf_cdf(size: int, exponent: float) -> np.ndarray:
    """The running sum of Zipf probabilities over `size` ranks.

    Args:
        size: the number of ranks.
        exponent: the Zipf exponent (rank r has weight `(r + 1) ** -exponent`).

    Returns:
        float64 `[size]`, increasing to 1.

    Example:

    ```python
    from reckeras.datasets._synth import zipf_cdf

    zipf_cdf(3, 1.0)     # [0.545..., 0.818..., 1.0]
    ```
    """
    weights = (np.arange(size) + 1.0) ** -exponent
    return np.cumsum(weights / weights.sum())


def draw(cdf: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` ranks drawn from the distribution whose running sum is `cdf`.

    Args:
        cdf: running sum of the ranks' probabilities (e.g. `zipf_cdf`).
        count: how many ranks to draw.
        rng: the generator to draw from.

    Returns:
        int64 `[count]` ranks in `[0, len(cdf))`.

    Example:

    ```python
    from reckeras.datasets._synth import draw, zipf_cdf

    draw(zipf_cdf(100, 1.1), 5, np.random.default_rng(0))
    ```
    """
    return np.searchsorted(cdf, rng.random(count), side="right").clip(max=len(cdf) - 1)


def draw_ranks(cdf: np.ndarray, col: _Categorical, rng: np.random.Generator,
               num_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Draws the popularity ranks of a categorical column, and its nulls.

    Args:
        cdf: the column's cumulative rank probabilities (`popularity`).
        col: the column.
        rng: the generator the rows are drawn from.
        num_rows: the number of rows.

    Returns:
        `(ranks, missing mask)`.

    Example:

    ```python
    from reckeras.datasets._synth import SPECS, draw_ranks, popularity

    col = SPECS["criteo_synth"].categoricals[0]
    ranks, missing = draw_ranks(popularity(col)[0], col, np.random.default_rng(0), 5)
    ```
    """
    ranks = np.searchsorted(cdf, rng.random(num_rows), side="right")
    np.minimum(ranks, col.cardinality - 1, out=ranks)
    return ranks, rng.random(num_rows) < col.missing_rate


class _Teacher:
    """All hidden parameters of one spec, drawn from its teacher seed."""

    def __init__(self, spec: _SyntheticSpec):
        self.spec = spec
        rng = np.random.default_rng(spec.teacher_seed)
        self.cdf, self.latent, self.missing_latent = {}, {}, {}
        self.id_multiplier, self.id_offset = {}, {}
        for col in spec.categoricals:
            self.cdf[col.name], signal = popularity(col)
            # Coordinate 0 of an id's latent vector is also its main effect, so
            # a model that has learned the main effects has a head start on
            # the interactions, as in real logs where strong ids interact.
            self.latent[col.name] = signal[:, None] * rng.standard_normal(
                (col.cardinality, spec.latent_dim), dtype=np.float32)
            self.missing_latent[col.name] = rng.standard_normal(
                spec.latent_dim).astype(np.float32)
            # An odd multiplier modulo 2**40 is a bijection, so ids stay unique.
            self.id_multiplier[col.name] = np.uint64(
                rng.integers(1 << 20, 1 << _ID_BITS) | 1)
            self.id_offset[col.name] = np.uint64(rng.integers(0, 1 << _ID_BITS))
        signs = rng.choice([-1.0, 1.0], size=len(spec.interaction_pairs))
        self.pair_weight = signs * spec.interaction_scale / np.sqrt(spec.latent_dim)

    def ids_of_ranks(self, name: str, ranks: np.ndarray) -> np.ndarray:
        """The scattered int64 ids of the given popularity ranks of a field."""
        return scatter_ids(ranks, self.id_multiplier[name], self.id_offset[name])

    def make_rows(self, rng: np.random.Generator,
                  num_rows: int) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """Draws rows and the teacher's logit split into its three terms.

        Args:
            rng: the generator the rows are drawn from.
            num_rows: the number of rows.

        Returns:
            `(columns, terms)`: `columns` maps a name to an array, or to a
            `(values, missing mask)` pair for nullable columns; `terms` maps
            "ids", "pairs" and "numeric" to that term of every row's logit.
        """
        spec = self.spec
        columns = draw_numerics(spec, rng, num_rows)
        numeric = numeric_term(spec, columns)
        id_term = np.zeros(num_rows)
        pair_term = np.zeros(num_rows)
        latents = {}
        for col in spec.categoricals:
            ranks, missing = draw_ranks(self.cdf[col.name], col, rng, num_rows)
            latent = np.where(missing[:, None], self.missing_latent[col.name],
                              self.latent[col.name][ranks])
            id_term += col.effect_scale * latent[:, 0]
            latents[col.name] = latent
            columns[col.name] = (self.ids_of_ranks(col.name, ranks), missing)
        for weight, (f, g) in zip(self.pair_weight, spec.interaction_pairs, strict=True):
            pair_term += weight * np.einsum("ij,ij->i", latents[f], latents[g])
        logit = spec.bias + id_term + pair_term + numeric
        prob = 1.0 / (1.0 + np.exp(-logit))
        columns["label"] = (rng.random(num_rows) < prob).astype(np.int64)
        columns["teacher_prob"] = prob.astype(np.float32)
        return columns, {"ids": id_term, "pairs": pair_term,
                         "numeric": numeric}


@functools.cache
def teacher(name: str) -> _Teacher:
    """The hidden teacher of a synthetic dataset, drawn once per process.

    Args:
        name: a key of `SPECS`, e.g. "criteo_synth".

    Returns:
        The teacher: every hidden parameter, drawn from the spec's teacher
        seed.

    Example:

    ```python
    from reckeras.datasets._synth import teacher

    columns, terms = teacher("criteo_synth").make_rows(
        np.random.default_rng(0), 1000)
    terms["pairs"].shape   # (1000,)
    ```
    """
    return _Teacher(SPECS[name])


def schema(spec: _SyntheticSpec) -> pa.Schema:
    """The schema of a synthetic dataset's files.

    Args:
        spec: a value of `SPECS`.

    Returns:
        `label`, the numeric columns, the categorical columns (all int64)
        and `teacher_prob` (float32).

    Example:

    ```python
    from reckeras.datasets._synth import SPECS, schema

    schema(SPECS["criteo_synth"]).names[:3]   # ['label', 'I1', 'I2']
    ```
    """
    fields = [pa.field("label", pa.int64(), nullable=False)]
    fields += [pa.field(c.name, pa.int64()) for c in spec.numerics]
    fields += [pa.field(c.name, pa.int64()) for c in spec.categoricals]
    fields.append(pa.field("teacher_prob", pa.float32(), nullable=False))
    return pa.schema(fields)


def chunk_table(spec: _SyntheticSpec, row_seed: list[int],
                chunk_index: int) -> pa.Table:
    """Rows of one `CHUNK_ROWS` chunk, fixed by (teacher, row seed, chunk).

    Always drawing whole chunks keeps shorter files prefixes of longer ones.

    Args:
        spec: a value of `SPECS`.
        row_seed: the split's row seed, then the extra seed if any.
        chunk_index: which chunk of the file.

    Returns:
        A table of `CHUNK_ROWS` rows with `schema(spec)`.

    Example:

    ```python
    from reckeras.datasets._synth import SPECS, chunk_table

    first = chunk_table(SPECS["criteo_synth"], [1], 0)   # train's first rows
    first.num_rows   # 65536
    ```
    """
    rng = np.random.default_rng([spec.teacher_seed, *row_seed, chunk_index])
    columns, _ = teacher(spec.name).make_rows(rng, CHUNK_ROWS)
    return table_of(columns, schema(spec))


def table_of(columns: dict[str, Any], table_schema: pa.Schema) -> pa.Table:
    """A table of generated columns, in the order of `table_schema`.

    Args:
        columns: maps each name of the schema to an array, or to a
            `(values, missing mask)` pair for a column with nulls.
        table_schema: the table's schema.

    Returns:
        The `pyarrow.Table`, nulls where the masks are true.

    Example:

    ```python
    import numpy as np
    import pyarrow as pa
    from reckeras.datasets._synth import table_of

    schema = pa.schema([pa.field("id", pa.int64())])
    table_of({"id": (np.array([3, 4]), np.array([False, True]))}, schema)
    # id: [3, null]
    ```
    """
    arrays = []
    for field in table_schema:
        values = columns[field.name]
        if isinstance(values, tuple):
            values, missing = values
            arrays.append(pa.array(values, mask=missing, type=field.type))
        else:
            arrays.append(pa.array(values, type=field.type))
    return pa.Table.from_arrays(arrays, schema=table_schema)


def chunks(make_chunk: Callable[[int], pa.Table], rows: int) -> Iterator[pa.Table]:
    """The first `rows` rows of a generated file, chunk by chunk.

    Args:
        make_chunk: the `CHUNK_ROWS` rows of chunk i of the file, from i.
        rows: the number of rows.

    Returns:
        An iterator over the chunks, the last one cut to end at `rows`.

    Example:

    ```python
    from reckeras.datasets._synth import SPECS, chunk_table, chunks

    spec = SPECS["criteo_synth"]
    parts = chunks(lambda i: chunk_table(spec, [1], i), 100_000)
    [part.num_rows for part in parts]   # [65536, 34464]
    ```
    """
    for chunk, start in enumerate(range(0, rows, CHUNK_ROWS)):
        yield make_chunk(chunk).slice(0, min(CHUNK_ROWS, rows - start))


def write_tables(path: str | os.PathLike, table_schema: pa.Schema,
                 tables: Iterable[pa.Table], rows: int | None, name: str,
                 footer: Callable[[], dict[bytes, str]] | None = None) -> Path:
    """Writes generated tables to a parquet file, one row group each.

    The file is written under a temporary name (`<path>.partial`) and moved
    to `path` once complete, so an interrupted run leaves no truncated file
    behind; a tqdm progress bar counts the rows.

    Args:
        path: the parquet file to write (parent directories are created).
        table_schema: the file's schema, with its metadata.
        tables: the tables to write, each of `table_schema`'s columns.
        rows: the total number of rows, for the progress bar; None when
            it is known only once every table is made.
        name: the progress bar's label, e.g. "criteo_synth:train".
        footer: called once every table is written; its key-value pairs go
            into the file's footer (the description of data that is known
            only after all rows are made).

    Returns:
        `path`, as a `Path`.

    Example:

    ```python
    from reckeras.datasets._synth import SPECS, chunk_table, chunks, schema, write_tables

    spec = SPECS["criteo_synth"]
    write_tables("/tmp/c.parquet", schema(spec),
                 chunks(lambda i: chunk_table(spec, [1], i), 1_000), 1_000,
                 "criteo_synth:train")
    ```
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with pq.ParquetWriter(partial, table_schema, compression="zstd",
                          compression_level=_COMPRESSION_LEVEL) as writer, \
            tqdm(total=rows, unit="rows", unit_scale=True, desc=name) as progress:
        for table in tables:
            writer.write_table(table.replace_schema_metadata(table_schema.metadata),
                               row_group_size=CHUNK_ROWS)
            progress.update(table.num_rows)
        if footer is not None:
            writer.add_key_value_metadata(footer())
    os.replace(partial, path)
    return path


def description(spec: _SyntheticSpec, split: str, rows: int,
                seed: int | None) -> dict[str, Any]:
    """The JSON-able metadata `generate` stores in a file's footer.

    Args:
        spec: a value of `SPECS`.
        split: the split written.
        rows: the number of rows written.
        seed: the extra seed, or `None`.

    Returns:
        A dict: name, split, rows, seed, description, and the columns'
        cardinalities, Zipf exponents and missing rates.

    Example:

    ```python
    from reckeras.datasets._synth import SPECS, description

    description(SPECS["criteo_synth"], "test", 50_000, None)["rows"]   # 50000
    ```
    """
    return {
        "name": spec.name,
        "split": split,
        "rows": rows,
        "seed": seed,
        "description": spec.description,
        "label": "label",
        "teacher_prob": "probability of label 1 under the hidden teacher",
        "cardinalities": {c.name: c.cardinality for c in spec.categoricals},
        "zipf_exponents": {c.name: c.zipf_exponent for c in spec.categoricals},
        "missing_rates": {c.name: c.missing_rate
                          for c in spec.numerics + spec.categoricals},
    }
