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
holds the ids of slot `s` for example `b`: one id, or none for a missing
value, in a single-valued slot.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from reckeras import ragged
from reckeras.backend_kernels import ragged_layout, transforms
from reckeras.features.specs import (
    LENGTHS,
    Categorical,
    Cross,
    FeatureSpec,
    Numeric,
    Sequence,
    with_lengths,
)


class TablePlanError(ValueError):
    """Raised for inconsistent table declarations."""


class TransformPlan:
    """Feature specs sorted by kind, with per-feature parameters as tensors.

    Single-valued slots: a Categorical's id is kept as is (any int64); a
    bucketized Categorical's value gets the number of its boundaries
    `<= value` (NaN: the missing bucket, one past the last; +inf: the last
    bucket); a Cross combines its members' ids (after bucketizing, before
    their own `hash_buckets`) with `transforms.cross`; then every slot with
    `hash_buckets` is hashed into `[0, hash_buckets)`. A Categorical of
    length 0 (a missing value) has an empty bag, and so has every Cross of
    it. Sequences arrive as int64 `[B, max_len]` left-aligned rows; the bag
    of a row holds its first `length` ids, hashed likewise, and a weighted
    sequence's bag carries their weights. Lengths arrive in the `LENGTHS`
    input (`encode`).

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
        self.with_lengths = with_lengths(specs)
        self.weighted = any(s.weights is not None for s in self.sequences)
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
        weight_columns = [s.weights for s in self.sequences if s.weights is not None]
        clashing = sorted(set(weight_columns) & set(names)
                          | {w for w in weight_columns if weight_columns.count(w) > 1})
        if clashing:
            raise ValueError(f"weights column(s) {clashing} of weighted sequences must "
                             f"be distinct and not feature names")
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
            # The largest length of each column of LENGTHS.
            "length_bounds": torch.tensor(
                [s.max_len if isinstance(s, Sequence) else 1 for s in self.with_lengths],
                dtype=torch.int32),
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
                Categoricals, int `[B, max_len]` left-aligned rows of
                Sequences (and float `[B, max_len]` weights of weighted
                ones), and int `[B, R]` `LENGTHS` (all on one device).
                Without `LENGTHS` every id Categorical has its id and every
                Sequence row is full (`max_len` ids).

        Returns:
            `{"ids": int64 [N], "offsets": int64 [S * B + 1]}`, the slots in
            the order of `slots` (see `reckeras.ragged`), and with weighted
            sequences `"weights"`: float32 `[N]`, every id's weight (1 for
            the ids of unweighted features).

        Raises:
            ValueError: a length out of its feature's range (naming it).

        Example:

        ```python
        plan = TransformPlan([rk.features.Categorical("a", dim=4),
                              rk.features.Sequence("s", dim=4, max_len=3)])
        plan.packed_sparse({"a": torch.tensor([-7, 0]),
                            "s": torch.tensor([[4, 5, 0], [0, 0, 0]]),
                            "__lengths__": torch.tensor([[1, 2], [0, 0]])})
        # {"ids": [-7, 4, 5], "offsets": [0, 1, 1, 3, 3]}
        ```
        """
        lengths, every_id_present = self._checked_lengths(inputs) \
            if LENGTHS in inputs else (None, True)
        weights = None
        if self.sequences:
            values, offsets, weights = self._sequences(
                inputs, None if lengths is None else lengths[len(self.ids):])
            if not self.single_slots:
                return self._packed(values, offsets, weights)
        single = self._single_valued(inputs)
        present = None if every_id_present or lengths is None else \
            self._single_present(lengths[:len(self.ids)])
        if present is None:          # one id per bag
            single = single.reshape(-1)
            single_offsets = torch.arange(single.numel() + 1, device=single.device)
        else:
            single, single_offsets = ragged_layout.compact_present(single.reshape(-1),
                                                                   present.reshape(-1))
        if not self.sequences:
            return {"ids": single, "offsets": single_offsets}
        if weights is not None:
            weights = torch.cat([weights.new_ones(single.numel()), weights])
        return self._packed(torch.cat([single, values]),
                            torch.cat([single_offsets[:-1], offsets + single.numel()]),
                            weights)

    @staticmethod
    def _packed(ids, offsets, weights):
        packed = {"ids": ids, "offsets": offsets}
        if weights is not None:
            packed["weights"] = weights
        return packed

    def _checked_lengths(self, inputs):
        """`(lengths, every_id_present)`: the `[R, B]` LENGTHS (column by
        column), each checked in its range, and whether every id Categorical
        has its id in every example (one sync)."""
        lengths = inputs[LENGTHS].t()
        if lengths.shape[0] != len(self.with_lengths):
            raise ValueError(f"{LENGTHS!r} has {lengths.shape[0]} columns, expected "
                             f"{len(self.with_lengths)}: one per id Categorical and "
                             f"Sequence")
        if not lengths.shape[1]:
            return lengths, True
        # amin and amax, not aminmax: on this transposed view aminmax takes a
        # slow path (5.6 ms for one example of 26 features, against 3 us).
        low, high = lengths.amin(dim=1), lengths.amax(dim=1)
        bad = (low < 0) | (high > self._on(lengths.device)["length_bounds"])
        any_bad, every_id_present = torch.stack(
            [bad.any(), (low[:len(self.ids)] == 1).all()]).tolist()
        if any_bad:
            spec = self.with_lengths[int(bad.to(torch.int8).argmax())]
            bound = spec.max_len if isinstance(spec, Sequence) else 1
            raise ValueError(f"feature {spec.name!r}: its lengths must lie in "
                             f"[0, {bound}]")
        return lengths, every_id_present

    def _single_present(self, id_lengths):
        """`[S_single, B]` bool: where each single-valued slot has its id (a
        Cross where all its members have theirs)."""
        present = id_lengths.bool()
        if self.bucketized:
            present = torch.cat([present, present.new_ones(len(self.bucketized),
                                                           present.shape[1])])
        if self.crosses:
            members = self._on(present.device)["cross_members"]
            # A cross of a missing member is missing; past its arity, present.
            crossed = torch.where((members >= 0)[:, :, None],
                                  present[members.clamp(min=0)], True).all(dim=1)
            present = torch.cat([present, crossed])
        return present

    def _single_valued(self, inputs):
        blocks = []
        if self.ids:
            blocks.append(_stacked([inputs[s.name] for s in self.ids]).long())
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

    def _sequences(self, inputs, lengths):
        batch = len(inputs[self.sequences[0].name])
        flat = torch.cat([_rows(inputs[s.name], s, batch) for s in self.sequences])
        weights = None
        if self.weighted:
            weights = torch.cat([
                _rows(inputs[s.weights], s, batch).float() if s.weights is not None
                else torch.ones(batch * s.max_len, device=flat.device)
                for s in self.sequences])
        planned = self._on(flat.device)
        widths = planned["sequence_width_offsets"]
        lengths = widths.diff().repeat_interleave(batch) if lengths is None \
            else lengths.reshape(-1).long()          # None: every row is full
        return transforms.pack_sequences(flat.long(), lengths, widths,
                                         planned["sequence_buckets"], batch, weights)



def _stacked(tensors):
    """`torch.stack(tensors)`, without its copy when they already lie one
    after another in memory, as `encode.as_tensors` hands over the columns
    `encode` takes block-wise (at 1000 fields the copy was 6 ms a batch).
    The checks run as comprehensions over the tensors, not one Python
    statement per tensor: at 1000 fields they are the whole cost."""
    first = tensors[0]
    shape, dtype, size = first.shape, first.dtype, first.numel()
    step = size * first.element_size()
    if first.dim() == 1 and size and first.stride() == (1,) and \
            first.untyped_storage().nbytes() >= \
            (first.storage_offset() + len(tensors) * size) * first.element_size():
        addresses = np.fromiter([t.data_ptr() for t in tensors], np.int64, len(tensors))
        # List comprehensions, not generators: ~15% faster at 1000 tensors, and
        # the checks pass (nothing to short-circuit) on every batch but a bad one.
        if bool((np.diff(addresses) == step).all()) and \
                all([t.dtype == dtype for t in tensors]) and \
                all([t.shape == shape for t in tensors]) and \
                all([t.stride() == (1,) for t in tensors]):  # noqa: C419
            # The memory is the first tensor's storage's: a view reads the same values.
            return first.as_strided((len(tensors), size), (size, 1))
    return torch.stack(tensors)


def _columns(values, spec, batch):
    """The `[batch, size]` dense columns of a numeric feature."""
    if tuple(values.shape) != (batch, *spec.shape):
        raise ValueError(f"feature {spec.name!r}: expected {[batch, *spec.shape]} "
                         f"values, got {list(values.shape)}")
    return values.reshape(batch, spec.size)


def _rows(rows, spec, batch):
    """The `[batch, max_len]` rows of a sequence feature (or of its weights),
    flattened."""
    if tuple(rows.shape) != (batch, spec.max_len):
        raise ValueError(f"feature {spec.name!r}: expected [{batch}, {spec.max_len}] "
                         f"rows, got {list(rows.shape)}")
    return rows.reshape(-1)
