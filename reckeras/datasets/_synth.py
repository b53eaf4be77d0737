"""Synthetic click logs whose labels come from a known hidden teacher.

Every synthetic dataset is a `_SyntheticSpec`: its columns, a teacher seed from
which all hidden parameters are drawn (so every split and every `generate`
call share one teacher), and one default row seed per split. Rows are made in
fixed-size chunks, each from its own seed, so a file of N rows is a prefix of
a file of M > N rows made with the same seed.

The `criteo_synth` teacher's logit is

    bias + sum_f effect_f[id_f]                         (per-id effects)
         + sum_{(f, g) in pairs} w_fg <v_f[id_f], v_g[id_g]>  (latent interactions)
         + sum_j h_j(log1p(I_j))                        (bumps and steps)

Logistic regression on one-hot ids sees only the first term and a linear
version of the last; a DLRM's dot interaction and bottom MLP can represent all
three. Effects and latent vectors shrink with the id's expected count in
`_REFERENCE_ROWS` rows: an id seen a handful of times in the packaged train
split carries almost no signal, because no model could learn it from there.
"""

import dataclasses
import functools

import numpy as np
import pyarrow as pa

# Row-group size of generated files: several row groups per packaged split, so
# readers can shard and shuffle at row-group granularity.
CHUNK_ROWS = 65_536

# Ids are scattered over [0, 2**40) rather than 0..n-1, as hashed ids are.
_ID_BITS = 40
_ID_MASK = np.uint64((1 << _ID_BITS) - 1)

# Effects are scaled by count / (count + _HALF_SIGNAL_COUNT), where count is
# the id's expected number of occurrences in the packaged train split.
_REFERENCE_ROWS = 200_000
_HALF_SIGNAL_COUNT = 40.0
_LATENT_DIM = 4


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
    "bump" (a Gaussian bump, not monotone) or "step" (a smooth threshold).
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
    bias: float


def _criteo_synth_spec():
    # Cardinalities follow the Criteo Kaggle columns, with the ten-million-id
    # columns capped near one million so the teacher fits in memory.
    c = _Categorical
    categoricals = (
        c("C1", 1_460, 1.10, 0.00, 0.35),
        c("C2", 583, 1.05, 0.00, 0.45),
        c("C3", 1_000_000, 1.05, 0.03, 0.30),
        c("C4", 400_000, 1.08, 0.03, 0.25),
        c("C5", 305, 1.20, 0.00, 0.35),
        c("C6", 24, 1.00, 0.12, 0.45),
        c("C7", 12_517, 1.10, 0.00, 0.30),
        c("C8", 633, 1.20, 0.00, 0.25),
        c("C9", 3, 1.50, 0.00, 0.30),
        c("C10", 93_145, 1.10, 0.00, 0.30),
        c("C11", 5_683, 1.10, 0.00, 0.30),
        c("C12", 800_000, 1.05, 0.03, 0.25),
        c("C13", 3_194, 1.10, 0.00, 0.25),
        c("C14", 27, 1.10, 0.00, 0.35),
        c("C15", 14_992, 1.10, 0.00, 0.25),
        c("C16", 600_000, 1.05, 0.03, 0.25),
        c("C17", 10, 1.00, 0.00, 0.40),
        c("C18", 5_652, 1.10, 0.00, 0.25),
        c("C19", 2_173, 1.10, 0.44, 0.30),
        c("C20", 4, 1.00, 0.44, 0.35),
        c("C21", 700_000, 1.05, 0.03, 0.25),
        c("C22", 18, 1.10, 0.76, 0.30),
        c("C23", 15, 1.00, 0.00, 0.40),
        c("C24", 286_181, 1.08, 0.03, 0.25),
        c("C25", 105, 1.10, 0.44, 0.35),
        c("C26", 142_572, 1.08, 0.44, 0.25),
    )
    n = _Numeric
    numerics = (
        n("I1", 0.40, 0.30, 1.2, 1.0, "bump", 1.5, 0.6, 0.5),
        n("I2", 0.00, 0.20, 2.5, 1.8, "step", 3.0, 0.4, 0.4),
        n("I3", 0.20, 0.10, 2.2, 1.2, "bump", 2.5, 0.7, 0.5),
        n("I4", 0.20, 0.10, 1.8, 0.9, "step", 2.0, 0.3, 0.4),
        n("I5", 0.03, 0.05, 8.0, 2.0, "bump", 8.0, 1.2, 0.5),
        n("I6", 0.20, 0.15, 4.0, 1.5, "step", 4.5, 0.4, 0.3),
        n("I7", 0.04, 0.20, 2.0, 1.4, "bump", 1.0, 0.5, 0.4),
        n("I8", 0.00, 0.05, 2.5, 1.0, "step", 2.5, 0.3, 0.3),
        n("I9", 0.04, 0.05, 4.0, 1.2, "bump", 4.5, 0.8, 0.4),
        n("I10", 0.40, 0.50, 0.6, 0.5, "step", 0.9, 0.2, 0.4),
        n("I11", 0.04, 0.30, 1.2, 0.8, "bump", 1.2, 0.4, 0.3),
        n("I12", 0.40, 0.60, 0.5, 0.8, "step", 1.0, 0.3, 0.3),
        n("I13", 0.20, 0.10, 2.2, 1.1, "bump", 2.0, 0.6, 0.4),
    )
    # Pairs among fields whose ids repeat often enough in 200k rows to learn
    # a latent vector, plus the heads of a few large fields.
    pairs = (
        ("C1", "C2"), ("C1", "C6"), ("C2", "C5"), ("C5", "C8"), ("C6", "C14"),
        ("C8", "C17"), ("C9", "C23"), ("C14", "C20"), ("C17", "C23"),
        ("C2", "C25"), ("C6", "C22"), ("C5", "C7"), ("C3", "C14"),
        ("C10", "C6"), ("C11", "C17"), ("C13", "C1"), ("C19", "C23"),
        ("C7", "C9"),
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
        interaction_scale=1.0,
        bias=-1.35,
    )


SPECS = {spec.name: spec for spec in (_criteo_synth_spec(),)}


class _Teacher:
    """All hidden parameters of one spec, drawn from its teacher seed."""

    def __init__(self, spec):
        self.spec = spec
        rng = np.random.default_rng(spec.teacher_seed)
        in_pairs = {f for pair in spec.interaction_pairs for f in pair}
        self.cdf, self.effect, self.missing_effect = {}, {}, {}
        self.latent, self.missing_latent = {}, {}
        self.id_multiplier, self.id_offset = {}, {}
        for col in spec.categoricals:
            weights = (np.arange(col.cardinality) + 1.0) ** -col.zipf_exponent
            prob = weights / weights.sum()
            self.cdf[col.name] = np.cumsum(prob)
            count = _REFERENCE_ROWS * (1 - col.missing_rate) * prob
            signal = (count / (count + _HALF_SIGNAL_COUNT)).astype(np.float32)
            self.effect[col.name] = col.effect_scale * signal * rng.standard_normal(
                col.cardinality, dtype=np.float32)
            self.missing_effect[col.name] = col.effect_scale * rng.standard_normal()
            if col.name in in_pairs:
                self.latent[col.name] = signal[:, None] * rng.standard_normal(
                    (col.cardinality, _LATENT_DIM), dtype=np.float32)
                self.missing_latent[col.name] = rng.standard_normal(
                    _LATENT_DIM).astype(np.float32)
            # An odd multiplier modulo 2**40 is a bijection, so ids stay unique.
            self.id_multiplier[col.name] = np.uint64(
                rng.integers(1 << 20, 1 << _ID_BITS) | 1)
            self.id_offset[col.name] = np.uint64(rng.integers(0, 1 << _ID_BITS))
        signs = rng.choice([-1.0, 1.0], size=len(spec.interaction_pairs))
        self.pair_weight = signs * spec.interaction_scale / np.sqrt(_LATENT_DIM)

    def ids_of_ranks(self, name, ranks):
        mixed = (ranks.astype(np.uint64) * self.id_multiplier[name]
                 + self.id_offset[name]) & _ID_MASK
        # xor-shift is also a bijection on 40 bits; it scatters the low bits.
        mixed ^= mixed >> np.uint64(17)
        return mixed.astype(np.int64)

    def make_rows(self, rng, num_rows):
        """Draws rows and the teacher's logit split into its three terms.

        Returns:
            (columns, terms): columns maps a name to an array, or to a
            (values, missing mask) pair for nullable columns; terms maps
            "ids", "pairs" and "numeric" to that term of every row's logit.
        """
        spec = self.spec
        columns = {}
        numeric_term = np.zeros(num_rows)
        id_term = np.zeros(num_rows)
        pair_term = np.zeros(num_rows)
        activity = rng.standard_normal(num_rows)
        for col in spec.numerics:
            log_count = col.log_mean + col.log_std * (
                0.5 * activity + np.sqrt(0.75) * rng.standard_normal(num_rows))
            counts = np.floor(np.exp(np.maximum(log_count, 0.0))) - 1.0
            counts[rng.random(num_rows) < col.zero_rate] = 0.0
            missing = rng.random(num_rows) < col.missing_rate
            # The teacher reads a missing count as 0: filling nulls with 0 is
            # the Bayes-consistent policy for a model.
            z = np.where(missing, 0.0, np.log1p(counts))
            if col.shape == "bump":
                numeric_term += col.effect * np.exp(
                    -0.5 * ((z - col.center) / col.width) ** 2)
            else:
                numeric_term += col.effect * np.tanh((z - col.center) / col.width)
            columns[col.name] = (counts.astype(np.int64), missing)
        latents = {}
        for col in spec.categoricals:
            ranks = np.searchsorted(self.cdf[col.name], rng.random(num_rows),
                                    side="right")
            np.minimum(ranks, col.cardinality - 1, out=ranks)
            missing = rng.random(num_rows) < col.missing_rate
            id_term += np.where(missing, self.missing_effect[col.name],
                              self.effect[col.name][ranks])
            if col.name in self.latent:
                latents[col.name] = np.where(missing[:, None],
                                             self.missing_latent[col.name],
                                             self.latent[col.name][ranks])
            columns[col.name] = (self.ids_of_ranks(col.name, ranks), missing)
        for weight, (f, g) in zip(self.pair_weight, spec.interaction_pairs):
            pair_term += weight * np.einsum("ij,ij->i", latents[f], latents[g])
        logit = spec.bias + id_term + pair_term + numeric_term
        prob = 1.0 / (1.0 + np.exp(-logit))
        columns["label"] = (rng.random(num_rows) < prob).astype(np.int64)
        columns["teacher_prob"] = prob.astype(np.float32)
        return columns, {"ids": id_term, "pairs": pair_term, "numeric": numeric_term}


@functools.lru_cache(maxsize=None)
def teacher(name):
    return _Teacher(SPECS[name])


def schema(spec):
    fields = [pa.field("label", pa.int64(), nullable=False)]
    fields += [pa.field(c.name, pa.int64()) for c in spec.numerics]
    fields += [pa.field(c.name, pa.int64()) for c in spec.categoricals]
    fields.append(pa.field("teacher_prob", pa.float32(), nullable=False))
    return pa.schema(fields)


def chunk_table(spec, split_seed, chunk_index, num_rows):
    """The rows of one chunk, deterministic in (teacher, split seed, chunk)."""
    rng = np.random.default_rng([spec.teacher_seed, split_seed, chunk_index])
    columns, _ = teacher(spec.name).make_rows(rng, num_rows)
    arrays = []
    for field in schema(spec):
        values = columns[field.name]
        if isinstance(values, tuple):
            values, missing = values
            arrays.append(pa.array(values, mask=missing, type=field.type))
        else:
            arrays.append(pa.array(values, type=field.type))
    return pa.Table.from_arrays(arrays, schema=schema(spec))
