"""The transform plan: feature specs compiled once into per-kind tensors.

At build time the specs are sorted into kinds and every per-feature parameter
is put into a small tensor (per-column defaults and transform masks, padded
bucket boundaries, cross members, hash bucket counts, sequence widths); each is
copied once to every device a batch arrives on. Per batch, each kind is then
one entry point of `backend_kernels.transforms` over all of its features:
one Triton launch on CUDA tensors (two for sequences: count, then pack), one
vectorized torch op on CPU tensors. There is no loop over features or ids on
the hot path beyond gathering the inputs into one tensor per kind.

Packed sparse layout (see `reckeras.ragged`): sparse features are numbered
in *slot order* -- single-valued slots (Categorical, bucketized Categorical,
Cross) first, in declaration order, then Sequence slots. Bag `s * B + b`
holds the ids of slot `s` for example `b`.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from reckeras import ragged
from reckeras.backend_kernels import transforms
from reckeras.features.specs import Categorical, Cross, FeatureSpec, Numeric, Sequence

MISSING_ID = transforms.MISSING_ID   # a missing single-valued id; sequence padding


class TablePlanError(ValueError):
    """Raised for inconsistent table declarations."""


class TransformPlan:
    """Feature specs sorted by kind, with per-feature parameters as tensors.

    Single-valued slots: a Categorical's id is kept as is (`-1`, a missing
    value, is its own id); a bucketized Categorical's value gets the number
    of its boundaries `<= value` (NaN: `-1`; +inf: the last bucket); a Cross
    combines its members' ids (after bucketizing, before their own
    `hash_buckets`) with `transforms.cross`; then every slot with
    `hash_buckets` is hashed into `[0, hash_buckets)` (any int64 id, `-1`
    included). Sequences arrive as int64 `[B, max_len]` rows padded with
    `-1`; their bag holds the ids that are not `-1`, hashed likewise.

    Args:
        specs: the feature specs, in declaration order.

    Attributes:
        numeric: the Numeric specs, in declaration order (the columns of
            `dense`: one per scalar feature, `k` per vector of `shape=(k,)`).
        dense_width: the number of columns of `dense`, the sum of the
            numeric features' `size`.
        numeric_default: float32 `[dense_width]`, the default of each column.
        slots: the sparse specs in slot order.
        sparse_in_declaration_order: the sparse specs in declaration order.

    Example:

    ```python
    plan = TransformPlan([rk.features.Numeric("price", transform="log1p"),
                          rk.features.Categorical("item", dim=8, hash_buckets=1000)])
    dense = plan.dense({"price": torch.tensor([3.0])}, torch.zeros(1), torch.ones(1))
    # [[log1p(3.0)]]
    sparse = plan.packed_sparse({"item": torch.tensor([42])})
    # {"ids": [mix64(42) mod 1000], "offsets": [0, 1]}
    ```
    """

    def __init__(self, specs: Iterable[FeatureSpec]):
        specs = list(specs)
        if not specs:
            raise ValueError("FeatureColumns needs at least one feature spec")
        names = [s.name for s in specs]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate feature names: {duplicates}")
        self.specs = specs
        by_name = {s.name: s for s in specs}
        self.numeric = [s for s in specs if isinstance(s, Numeric)]
        self.dense_width = sum(s.size for s in self.numeric)
        # Scalars only (the common case): `dense` stacks the inputs as they come.
        self._scalar_numeric_only = not any(s.shape for s in self.numeric)
        self.ids = [s for s in specs
                    if isinstance(s, Categorical) and s.boundaries is None]
        self.bucketized = [s for s in specs
                           if isinstance(s, Categorical) and s.boundaries is not None]
        self.crosses = [s for s in specs if isinstance(s, Cross)]
        self.sequences = [s for s in specs if isinstance(s, Sequence)]
        categorical = self.ids + self.bucketized
        categorical_names = [s.name for s in categorical]
        for cross in self.crosses:
            for member in cross.names:
                if member not in by_name:
                    raise ValueError(f"feature {cross.name!r} crosses unknown "
                                     f"feature {member!r}")
                if member not in categorical_names:
                    raise ValueError(f"feature {cross.name!r} crosses {member!r}, "
                                     f"which is not a Categorical feature")
        self.single_slots = categorical + self.crosses
        self.slots = self.single_slots + self.sequences
        self.sparse_in_declaration_order = [s for s in specs if s.sparse]
        self._check_tables()
        self._build_tensors(categorical_names)

    def _check_tables(self):
        dims = {}
        for spec in self.slots:
            first = dims.setdefault(spec.table, spec)
            if first.dim != spec.dim:
                raise TablePlanError(
                    f"table {spec.table!r} is shared by features {first.name!r} "
                    f"(dim {first.dim}) and {spec.name!r} (dim {spec.dim}); "
                    f"features sharing a table need the same dim")
        self.tables = {table: spec.dim for table, spec in dims.items()}

    def _build_tensors(self, categorical_names):
        # Per dense column: a vector feature repeats its parameters k times.
        self.numeric_default = torch.tensor(
            [s.default for s in self.numeric for _ in range(s.size)], dtype=torch.float32)
        widest = max((len(s.boundaries) for s in self.bucketized), default=0)
        boundaries = torch.full((len(self.bucketized), widest), float("inf"))
        for row, spec in enumerate(self.bucketized):   # build time only
            boundaries[row, :len(spec.boundaries)] = torch.tensor(spec.boundaries)
        single_buckets = [s.hash_buckets or 0 for s in self.single_slots]
        sequence_buckets = [s.hash_buckets or 0 for s in self.sequences]
        self._hashes_single = any(single_buckets)
        # Every tensor a batch reads, on the CPU; `_on` copies them to a
        # batch's device once.
        self._planned = {
            "numeric_default": self.numeric_default,
            "numeric_log1p": torch.tensor(
                [s.transform == "log1p" for s in self.numeric for _ in range(s.size)],
                dtype=torch.bool),
            "numeric_standardize": torch.tensor(
                [s.transform == "standardize" for s in self.numeric
                 for _ in range(s.size)], dtype=torch.bool),
            "boundaries": boundaries,
            # The rows of the categorical block each cross combines, -1 past its arity.
            "cross_members": torch.tensor(
                [[categorical_names.index(m) for m in c.names] + [-1] * (3 - len(c.names))
                 for c in self.crosses], dtype=torch.int64).reshape(-1, 3),
            "single_buckets": torch.tensor(single_buckets, dtype=torch.int64),
            "sequence_width_offsets": ragged.lengths_to_offsets(
                torch.tensor([s.max_len for s in self.sequences], dtype=torch.int64)),
            "sequence_buckets": torch.tensor(sequence_buckets, dtype=torch.int64),
        }
        self._devices = {torch.device("cpu"): self._planned}

    def _on(self, device):
        """The planned tensors on `device` (copied there on its first batch)."""
        found = self._devices.get(device)
        if found is None:
            found = {name: t.to(device) for name, t in self._planned.items()}
            self._devices[device] = found
        return found

    @property
    def num_slots(self) -> int:
        """The number of sparse slots `S` (`len(slots)`)."""
        return len(self.slots)

    # ---- per batch ---------------------------------------------------------

    def dense(self, inputs: dict, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
        """The numeric features after their transforms.

        NaN (a missing value) becomes the feature's `default`, then `log1p`
        features get `sign(x) * log1p(|x|)` and `standardize` features
        `(x - mean) / std`, element by element for a vector feature.

        Args:
            inputs: `{name: float tensor}`, at least the numeric features:
                `[B]` for a scalar, `[B, k]` for a vector of `shape=(k,)`.
            mean: float32 `[dense_width]`, read for the `standardize` columns.
            std: float32 `[dense_width]`, likewise.

        Returns:
            float32 `[B, dense_width]`: the features' columns in the order of
            `numeric`, a vector's `k` columns in element order.

        Example:

        ```python
        plan = TransformPlan([rk.features.Numeric("a", transform="log1p")])
        plan.dense({"a": torch.tensor([0.0, float("nan")])}, torch.zeros(1),
                   torch.ones(1))                  # [[0.0], [0.0]]
        ```
        """
        if self._scalar_numeric_only:
            x = torch.stack([inputs[s.name] for s in self.numeric], dim=1).float()
        else:
            batch = len(inputs[self.numeric[0].name])
            x = torch.cat([_columns(inputs[s.name], s, batch) for s in self.numeric],
                          dim=1).float()
        planned = self._on(x.device)
        x = torch.where(torch.isnan(x), planned["numeric_default"], x)
        logged = torch.sign(x) * torch.log1p(x.abs())
        x = torch.where(planned["numeric_log1p"], logged, x)
        scaled = (x - mean) / std
        return torch.where(planned["numeric_standardize"], scaled, x)

    def packed_sparse(self, inputs: dict) -> dict:
        """The packed sparse batch of every sparse feature, transformed.

        Args:
            inputs: `{name: tensor}`, at least the sparse features: int
                `[B]` ids of Categoricals, float `[B]` values of bucketized
                Categoricals, int `[B, max_len]` rows of Sequences padded
                with `-1` (all on one device).

        Returns:
            `{"ids": int64 [N], "offsets": int64 [S * B + 1]}`, the slots in
            the order of `slots` (see `reckeras.ragged`).

        Example:

        ```python
        plan = TransformPlan([rk.features.Categorical("a", dim=4),
                              rk.features.Sequence("s", dim=4, max_len=3)])
        plan.packed_sparse({"a": torch.tensor([7, -1]),
                            "s": torch.tensor([[4, 5, -1], [-1, -1, -1]])})
        # {"ids": [7, -1, 4, 5], "offsets": [0, 1, 2, 4, 4]}
        ```
        """
        if self.sequences:
            values, offsets = self._sequences(inputs)
            if not self.single_slots:
                return {"ids": values, "offsets": offsets}
        single = self._single_valued(inputs).reshape(-1)     # one id per bag
        single_offsets = torch.arange(single.numel() + 1, device=single.device)
        if not self.sequences:
            return {"ids": single, "offsets": single_offsets}
        return {"ids": torch.cat([single, values]),
                "offsets": torch.cat([single_offsets[:-1], offsets + single.numel()])}

    def _single_valued(self, inputs):
        blocks = []
        if self.ids:
            blocks.append(torch.stack([inputs[s.name] for s in self.ids]).long())
        if self.bucketized:
            values = torch.stack([inputs[s.name] for s in self.bucketized]).float()
            blocks.append(transforms.bucketize(values,
                                               self._on(values.device)["boundaries"]))
        categorical = torch.cat(blocks) if len(blocks) > 1 else blocks[0]
        planned = self._on(categorical.device)
        if self.crosses:
            crossed = transforms.cross(categorical, planned["cross_members"])
            categorical = torch.cat([categorical, crossed])
        if not self._hashes_single:
            return categorical
        return transforms.hash_into_buckets(categorical, planned["single_buckets"])

    def _sequences(self, inputs):
        batch = len(inputs[self.sequences[0].name])
        flat = torch.cat([_rows(inputs[s.name], s, batch) for s in self.sequences])
        planned = self._on(flat.device)
        return transforms.pack_sequences(flat.long(), planned["sequence_width_offsets"],
                                         planned["sequence_buckets"], batch)


def _columns(values, spec, batch):
    """The `[batch, size]` dense columns of a numeric feature."""
    if tuple(values.shape) != (batch, *spec.shape):
        raise ValueError(f"feature {spec.name!r}: expected {[batch, *spec.shape]} "
                         f"values, got {list(values.shape)}")
    return values.reshape(batch, spec.size)


def _rows(padded, spec, batch):
    """The `[batch, max_len]` rows of a sequence feature, flattened."""
    if tuple(padded.shape) != (batch, spec.max_len):
        raise ValueError(f"feature {spec.name!r}: expected [{batch}, {spec.max_len}] "
                         f"padded ids, got {list(padded.shape)}")
    return padded.reshape(-1)
