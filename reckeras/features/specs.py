"""Declarative feature specs: what a raw column is and how it becomes input.

Specs are plain, immutable descriptions validated when constructed; the
FeatureColumns layer compiles a list of them into one transform plan.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence as _Sequence
from typing import Any

NUMERIC_TRANSFORMS = (None, "log1p", "standardize")
COMBINERS = ("sum", "mean", "sqrtn", None)
ID_DTYPES = ("int64", "string")
# The model input that carries the lengths of every sparse feature's ids
# (`encode.LENGTHS`); feature and column names may not start with "__".
RESERVED_PREFIX = "__"


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError(f"feature name must be a non-empty string, got {name!r}")
    if name.startswith(RESERVED_PREFIX):
        raise ValueError(f"feature name {name!r}: names starting with "
                         f"{RESERVED_PREFIX!r} are reserved")
    return name


def _check_positive_int(feature: str, field: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(
            f"feature {feature!r}: {field} must be an int >= {minimum}, got {value!r}")
    return value


class FeatureSpec:
    """Base class of the feature specs.

    A subclass lists its constructor arguments in `_fields`; they are its
    attributes and its config. `sparse` tells whether the feature is
    embedded (every spec but `Numeric`), `pooled` whether it is one vector
    per example. Specs compare equal when their type and config are equal.

    Example:

    ```python
    spec = rk.features.Categorical("C1", dim=16)
    spec.sparse, spec.pooled        # (True, True)
    ```
    """

    _fields: tuple[str, ...] = ()
    sparse = True
    name: str                       # every spec's constructor sets it

    @property
    def pooled(self) -> bool:
        """Whether the feature is one vector per example (a `Sequence` may not be)."""
        return True

    def get_config(self) -> dict[str, Any]:
        """The constructor arguments of the spec.

        Returns:
            A dict, the keyword arguments that `from_config` takes.
        """
        return {field: getattr(self, field) for field in self._fields}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> FeatureSpec:
        """The spec of a config returned by `get_config`.

        Args:
            config: the spec's constructor arguments.

        Returns:
            A new spec of this class.
        """
        return cls(**config)

    def __eq__(self, other):
        return type(self) is type(other) and self.get_config() == other.get_config()

    def __hash__(self):
        return hash((type(self).__name__, self.name))

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"


class Numeric(FeatureSpec):
    """A dense numeric column: one number per example, or a fixed-size vector.

    A scalar feature is one column of the dense block; a vector feature of
    `shape=(k,)` is `k` columns, in order, and every policy below applies
    to each element on its own: missing values (a null or NaN, or every
    element of a null vector) become `default`; +-inf is rejected; the
    transform, `standardize`'s statistics included, is per element.

    Args:
        name: column name. A vector feature reads a list column (fixed-size
            or not) whose every non-null row has `k` numbers, or a 2-D
            array of width `k` in a dict batch.
        transform: `None`, `"log1p"` (`sign(x) * log1p(|x|)`, which keeps
            negative counts finite) or `"standardize"` (`(x - mean) / std`
            with statistics from `FeatureColumns.adapt`; fit adapts on the
            training data when they are missing).
        default: value used for missing entries, before the transform.
        shape: `()` for a scalar feature, `(k,)` with `k >= 1` for a
            vector of `k` numbers per example.

    Example:

    ```python
    rk.features.Numeric("I1", transform="log1p")
    rk.features.Numeric("price", transform="standardize", default=-1.0)
    rk.features.Numeric("user_vector", shape=(64,), transform="standardize")
    ```
    """

    _fields = ("name", "transform", "default", "shape")
    sparse = False

    def __init__(self, name: str, transform: str | None = None,
                 default: float = 0.0, shape: tuple[int, ...] = ()):
        self.name = _check_name(name)
        if transform not in NUMERIC_TRANSFORMS:
            raise ValueError(f"feature {name!r}: unknown transform {transform!r}; "
                             f"expected one of {NUMERIC_TRANSFORMS}")
        self.transform = transform
        if isinstance(default, bool) or not isinstance(default, (int, float)) \
                or not math.isfinite(default):
            raise ValueError(f"feature {name!r}: default must be a finite number, "
                             f"got {default!r}")
        self.default = float(default)
        # A list is accepted too: it is what a JSON config gives back.
        if not isinstance(shape, (tuple, list)) or len(shape) > 1:
            raise ValueError(f"feature {name!r}: shape must be () or a 1-tuple (k,), "
                             f"got {shape!r}")
        self.shape = tuple(_check_positive_int(name, "shape[0]", k) for k in shape)

    @property
    def size(self) -> int:
        """The number of dense-block columns of the feature (1 for a scalar)."""
        return self.shape[0] if self.shape else 1


class Categorical(FeatureSpec):
    """A single-valued categorical column embedded into `dim` dimensions.

    Ids are int64 (every value, negative ones included, is an id) or
    strings; there is no vocabulary: every new id gets its own embedding row
    the first time it is seen. A missing value (a null) has no id: its
    embedding is zeros, as for an empty bag.

    Args:
        name: column name.
        dim: embedding dimension.
        table: name of the embedding table; features naming the same table
            share rows (their dims must agree). Defaults to `name`.
        hash_buckets: if set, ids are hashed into this many buckets first
            (bounded table size).
        boundaries: if set, the column is numeric and bucketized by these
            sorted boundaries (`len(boundaries) + 1` buckets, plus one for
            missing values: bucket `len(boundaries) + 1` holds NaN and nulls).
        dtype: `"int64"` or `"string"` (strings are hashed with the stable
            64-bit hash of `reckeras.backend_kernels.hashing`). Ignored with
            `boundaries`.

    Example:

    ```python
    rk.features.Categorical("C1", dim=16)
    rk.features.Categorical("site", dim=8, dtype="string", hash_buckets=10**6)
    rk.features.Categorical("age", dim=4, boundaries=[18, 25, 35, 50])
    ```
    """

    _fields = ("name", "dim", "table", "hash_buckets", "boundaries", "dtype")

    def __init__(self, name: str, dim: int, table: str | None = None,
                 hash_buckets: int | None = None,
                 boundaries: _Sequence[float] | None = None, dtype: str = "int64"):
        self.name = _check_name(name)
        self.dim = _check_positive_int(name, "dim", dim)
        self.table = name if table is None else _check_name(table)
        self.hash_buckets = None if hash_buckets is None else _check_positive_int(
            name, "hash_buckets", hash_buckets)
        if boundaries is not None:
            boundaries = [float(b) for b in boundaries]
            if not boundaries or any(not math.isfinite(b) for b in boundaries):
                raise ValueError(f"feature {name!r}: boundaries must be a non-empty "
                                 f"list of finite numbers")
            if any(a >= b for a, b in itertools.pairwise(boundaries)):
                raise ValueError(f"feature {name!r}: boundaries must be strictly "
                                 f"increasing, got {boundaries}")
            dtype = "float32"
        elif dtype not in ID_DTYPES:
            raise ValueError(f"feature {name!r}: dtype must be one of {ID_DTYPES}, "
                             f"got {dtype!r}")
        self.boundaries = boundaries
        self.dtype = dtype

    def get_config(self) -> dict[str, Any]:
        """The constructor arguments of the spec (without `dtype` when bucketized).

        Returns:
            A dict, the keyword arguments that `from_config` takes.
        """
        config = super().get_config()
        if self.boundaries is not None:
            del config["dtype"]
        return config


class Sequence(FeatureSpec):
    """A variable-length list of ids (for example a behaviour history).

    Sequences longer than `max_len` keep their last `max_len` ids (the most
    recent behaviour); this truncation is the documented policy. Every int64
    value is an id: the length of each row, not a padding value, says where
    it ends (`FeatureColumns.sequence_mask`).

    A weighted sequence (`weights="col"`) reads a second list column of
    floats aligned with the ids (a score per id, such as `tag:weight`
    lists). Pooling then weighs each id's row: `"sum"` is `sum(w_i e_i)`,
    `"mean"` is `sum(w_i e_i) / sum(w_i)` and `"sqrtn"` is
    `sum(w_i e_i) / sqrt(sum(w_i^2))` (TensorFlow's `embedding_lookup_sparse`
    rules; a bag whose denominator is 0 pools to zeros); an unpooled
    sequence returns `w_i e_i` at each position.

    Args:
        name: column name (a `list<int64>` or `list<string>` column).
        dim: embedding dimension.
        max_len: longest sequence kept.
        table: embedding table name; share it with a Categorical feature to
            embed history and target in one space. Defaults to `name`.
        combiner: `"sum"`, `"mean"` or `"sqrtn"` pooling over the ids,
            or `None` to keep the sequence unpooled: ShardedEmbedding then
            returns it as `[B, max_len, dim]` with zero rows past each
            row's length (`FeatureColumns.sequence_mask` is its mask).
        hash_buckets: as for Categorical.
        dtype: `"int64"` or `"string"`.
        weights: the name of a `list<float>` column holding one finite
            weight per id, or None for an unweighted sequence.

    Example:

    ```python
    rk.features.Sequence("hist_items", dim=16, max_len=50, table="item")
    rk.features.Sequence("hist_items", dim=16, max_len=50, combiner=None)
    rk.features.Sequence("tags", dim=8, max_len=20, weights="tag_weights")
    ```
    """

    _fields = ("name", "dim", "max_len", "table", "combiner", "hash_buckets", "dtype",
               "weights")

    def __init__(self, name: str, dim: int, max_len: int, table: str | None = None,
                 combiner: str | None = "sum", hash_buckets: int | None = None,
                 dtype: str = "int64", weights: str | None = None):
        self.name = _check_name(name)
        self.dim = _check_positive_int(name, "dim", dim)
        self.max_len = _check_positive_int(name, "max_len", max_len)
        self.table = name if table is None else _check_name(table)
        if combiner not in COMBINERS:
            raise ValueError(f"feature {name!r}: unknown combiner {combiner!r}; "
                             f"expected one of {COMBINERS}")
        self.combiner = combiner
        self.hash_buckets = None if hash_buckets is None else _check_positive_int(
            name, "hash_buckets", hash_buckets)
        if dtype not in ID_DTYPES:
            raise ValueError(f"feature {name!r}: dtype must be one of {ID_DTYPES}, "
                             f"got {dtype!r}")
        self.dtype = dtype
        if weights is not None and _check_name(weights) == name:
            raise ValueError(f"feature {name!r}: its weights need a column of their "
                             f"own, not the ids' column")
        self.weights = weights

    @property
    def pooled(self) -> bool:
        """Whether the sequence is pooled to one vector (it has a combiner)."""
        return self.combiner is not None


class Cross(FeatureSpec):
    """A hashed cross of 2 or 3 Categorical features, embedded like one.

    Args:
        names: the Categorical features crossed (declared in the same
            FeatureColumns). The cross combines their ids before their own
            `hash_buckets`, with `transforms.cross`.
        dim: embedding dimension.
        hash_buckets: number of hash buckets of the crossed id.
        name: feature name; defaults to `"_x_".join(names)`.
        table: embedding table name; defaults to the feature name.

    Example:

    ```python
    cross = rk.features.Cross(["C1", "C2"], dim=16, hash_buckets=100_000)
    cross.name   # 'C1_x_C2'
    ```
    """

    _fields = ("names", "dim", "hash_buckets", "name", "table")

    def __init__(self, names: _Sequence[str], dim: int, hash_buckets: int,
                 name: str | None = None, table: str | None = None):
        names = list(names)
        if not 2 <= len(names) <= 3 or len(set(names)) != len(names):
            raise ValueError(f"Cross needs 2 or 3 distinct feature names, got {names}")
        self.names = [_check_name(n) for n in names]
        self.name = "_x_".join(names) if name is None else _check_name(name)
        self.dim = _check_positive_int(self.name, "dim", dim)
        self.hash_buckets = _check_positive_int(self.name, "hash_buckets", hash_buckets)
        self.table = self.name if table is None else _check_name(table)


SPEC_TYPES = {cls.__name__: cls for cls in (Numeric, Categorical, Sequence, Cross)}

LENGTHS = RESERVED_PREFIX + "lengths__"


def with_lengths(specs: _Sequence[FeatureSpec]) -> list[FeatureSpec]:
    """The specs whose ids carry a length: column `j` of the `LENGTHS` input.

    An id Categorical's length is 1, or 0 for a missing value; a
    Sequence's is its number of ids (at most `max_len`). Bucketized
    Categoricals (NaN has its own bucket) and Crosses (computed from their
    members) carry none.

    Args:
        specs: the feature specs.

    Returns:
        The id Categoricals in declaration order, then the Sequences in
        declaration order (the slot order of the packed batch).

    Example:

    ```python
    from reckeras.features.specs import with_lengths

    [s.name for s in with_lengths([rk.features.Sequence("h", dim=4, max_len=5),
                                   rk.features.Categorical("c", dim=4)])]   # ['c', 'h']
    ```
    """
    ids = [s for s in specs if isinstance(s, Categorical) and s.boundaries is None]
    return ids + [s for s in specs if isinstance(s, Sequence)]


def serialize(spec: FeatureSpec) -> dict[str, Any]:
    """The serialized config of a spec.

    Args:
        spec: a `Numeric`, `Categorical`, `Sequence` or `Cross`.

    Returns:
        `{"class_name": ..., "config": spec.get_config()}`, which
        `deserialize` turns back into an equal spec.

    Example:

    ```python
    from reckeras.features.specs import deserialize, serialize

    config = serialize(rk.features.Categorical("C1", dim=16))
    config["class_name"]   # 'Categorical'
    ```
    """
    return {"class_name": type(spec).__name__, "config": spec.get_config()}


def deserialize(config: dict[str, Any] | FeatureSpec) -> FeatureSpec:
    """The spec of a serialized config.

    Args:
        config: a config returned by `serialize`, or a spec (returned as is).

    Returns:
        The spec.

    Raises:
        ValueError: for an unknown `class_name`.

    Example:

    ```python
    from reckeras.features.specs import deserialize, serialize

    spec = rk.features.Sequence("hist_items", dim=16, max_len=50)
    deserialize(serialize(spec)) == spec   # True
    ```
    """
    if isinstance(config, FeatureSpec):
        return config
    try:
        cls = SPEC_TYPES[config["class_name"]]
    except KeyError:
        raise ValueError(f"unknown feature spec {config.get('class_name')!r}") from None
    return cls.from_config(config["config"])
