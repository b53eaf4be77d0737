"""The transform plan: feature specs compiled once into per-kind tensors.

At build time the specs are sorted into kinds and every per-feature parameter
is put into a small tensor (defaults, transform masks, hash bucket counts,
padded bucket boundaries, cross member indices). Per batch, each kind is then
one vectorized torch op over all of its features: there is no loop over
features or ids on the hot path.

Packed sparse layout (see ``reckeras.ragged``): sparse features are numbered
in *slot order* -- single-valued slots (Categorical, bucketized Categorical,
Cross) first, in declaration order, then Sequence slots. Bag ``s * B + b``
holds the ids of slot ``s`` for example ``b``.
"""

import torch

from reckeras import ragged
from reckeras.backend_kernels.hashing import hash_combine, mix64
from reckeras.features.specs import Categorical, Cross, Numeric, Sequence

MISSING_ID = -1   # single-valued ids: the row of missing values; sequences: padding


class TablePlanError(ValueError):
    """Raised for inconsistent table declarations."""


class TransformPlan:
    """Specs sorted by kind, with per-feature parameters as tensors.

    Args:
        specs: list of FeatureSpec.
    """

    def __init__(self, specs):
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
        self.numeric_default = torch.tensor([s.default for s in self.numeric],
                                            dtype=torch.float32)
        self.numeric_log1p = torch.tensor([s.transform == "log1p" for s in self.numeric])
        self.numeric_standardize = torch.tensor(
            [s.transform == "standardize" for s in self.numeric])
        widest = max((len(s.boundaries) for s in self.bucketized), default=0)
        self.boundaries = torch.full((len(self.bucketized), widest), float("inf"))
        for row, spec in enumerate(self.bucketized):   # build time only
            self.boundaries[row, :len(spec.boundaries)] = torch.tensor(spec.boundaries)
        self.bucket_count = torch.tensor([len(s.boundaries) + 1 for s in self.bucketized],
                                         dtype=torch.int64)
        self.cross_members = [
            torch.tensor([[categorical_names.index(m) for m in c.names]
                          for c in self.crosses if len(c.names) == arity],
                         dtype=torch.int64).reshape(-1, arity)
            for arity in (2, 3)]
        self.cross_order = torch.tensor(
            [i for arity in (2, 3) for i, c in enumerate(self.crosses)
             if len(c.names) == arity], dtype=torch.int64)
        single_buckets = [s.hash_buckets or 0 for s in self.single_slots]
        self.single_hash_buckets = torch.tensor(single_buckets, dtype=torch.int64)
        self.single_hashed = torch.tensor(
            [i for i, b in enumerate(single_buckets) if b], dtype=torch.int64)
        sequence_buckets = [s.hash_buckets or 0 for s in self.sequences]
        self.sequence_hash_buckets = torch.tensor(sequence_buckets, dtype=torch.int64)
        self.sequence_hashed = torch.tensor(
            [i for i, b in enumerate(sequence_buckets) if b], dtype=torch.int64)
        self.max_sequence_len = max((s.max_len for s in self.sequences), default=0)

    @property
    def num_slots(self):
        return len(self.slots)

    # ---- per batch ---------------------------------------------------------

    def dense(self, inputs, mean, std):
        """``[B, n_numeric]`` float32 block of the numeric features."""
        x = torch.stack([inputs[s.name] for s in self.numeric], dim=1).float()
        x = torch.where(torch.isnan(x), self.numeric_default.to(x.device), x)
        logged = torch.sign(x) * torch.log1p(x.abs())
        x = torch.where(self.numeric_log1p.to(x.device), logged, x)
        scaled = (x - mean) / std
        return torch.where(self.numeric_standardize.to(x.device), scaled, x)

    def packed_sparse(self, inputs):
        """The packed sparse batch ``{"ids": [N], "offsets": [S * B + 1]}``."""
        single = self._single_valued(inputs)                  # [S1, B]
        batch = single.shape[1] if single is not None else None
        parts, lengths = [], []
        if single is not None:
            parts.append(single.reshape(-1))
        if self.sequences:
            values, seq_lengths = self._sequences(inputs)
            batch = seq_lengths.shape[1]
            parts.append(values)
            lengths.append(seq_lengths.reshape(-1))
        device = parts[0].device
        if lengths:
            lengths.insert(0, torch.ones(len(self.single_slots) * batch,
                                         dtype=torch.int64, device=device))
            offsets = ragged.lengths_to_offsets(torch.cat(lengths))
        else:
            offsets = torch.arange(len(self.single_slots) * batch + 1, device=device)
        ids = torch.cat(parts) if len(parts) > 1 else parts[0]
        return {"ids": ids, "offsets": offsets}

    def _single_valued(self, inputs):
        blocks = []
        if self.ids:
            blocks.append(torch.stack([inputs[s.name] for s in self.ids]).long())
        if self.bucketized:
            values = torch.stack([inputs[s.name] for s in self.bucketized]).float()
            bounds = self.boundaries.to(values.device)
            buckets = torch.searchsorted(bounds, values.contiguous(), right=True)
            blocks.append(torch.where(torch.isnan(values), MISSING_ID, buckets))
        if not blocks:
            return None
        categorical = torch.cat(blocks) if len(blocks) > 1 else blocks[0]
        if self.crosses:
            crossed = [hash_combine(categorical[members.to(categorical.device)]
                                    .permute(1, 0, 2))
                       for members in self.cross_members if members.numel()]
            crossed = torch.cat(crossed) if len(crossed) > 1 else crossed[0]
            order = self.cross_order.to(crossed.device)
            crossed = torch.empty_like(crossed).index_copy_(0, order, crossed)
            categorical = torch.cat([categorical, crossed])
        buckets = self.single_hash_buckets.to(categorical.device).unsqueeze(1)
        return _hash_into_buckets(categorical, buckets, self.single_hashed)

    def _sequences(self, inputs):
        width = self.max_sequence_len
        padded = torch.stack([
            torch.nn.functional.pad(inputs[s.name].long(),
                                    (0, width - s.max_len), value=MISSING_ID)
            for s in self.sequences])                          # [S2, B, L]
        present = padded != MISSING_ID
        lengths = present.sum(dim=2)
        buckets = self.sequence_hash_buckets.to(padded.device).view(-1, 1, 1)
        values = _hash_into_buckets(padded, buckets, self.sequence_hashed)[present]
        return values, lengths


def _hash_into_buckets(ids, buckets, hashed_rows):
    """``mix64(id) mod buckets`` on the rows (features) with ``buckets > 0``.

    ``hashed_rows`` (planned once) lists those rows, so features without
    hash buckets cost nothing here.
    """
    if hashed_rows.numel() == 0:
        return ids
    hashed_rows = hashed_rows.to(ids.device)
    chosen = ids.index_select(0, hashed_rows)
    modulus = buckets.index_select(0, hashed_rows)
    return ids.index_copy(0, hashed_rows, torch.remainder(mix64(chosen), modulus))
