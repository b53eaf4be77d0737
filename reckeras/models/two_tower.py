"""Two-tower retrieval (Yi et al. 2019; SimpleX, Mao et al. 2021) from public layers."""

from __future__ import annotations

import os
from collections.abc import Sequence as _Sequence
from typing import TYPE_CHECKING, Any

import keras
import numpy as np
import torch

from reckeras import _keras_compat, distributed
from reckeras.features.specs import Categorical, serialize
from reckeras.layers.mlp import MLP
from reckeras.layers.sharded_embedding import ShardedEmbedding
from reckeras.models.esmm import check_tower_options, check_units, embedding_regularizer
from reckeras.pipeline.model import Model
from reckeras.retrieval import cross_rank, losses
from reckeras.retrieval.frequency import FrequencyEstimator
from reckeras.retrieval.negatives import NegativeSampler

if TYPE_CHECKING:
    from reckeras.layers.feature_columns import FeatureColumns


def _split_columns(columns, query_features, candidate_features, candidate_id):
    """Checks the two sides' feature names; returns `candidate_id`."""
    names = [spec.name for spec in columns.specs]
    for side, features in (("query_features", query_features),
                           ("candidate_features", candidate_features)):
        if not features or not all(isinstance(n, str) for n in features):
            raise ValueError(f"two_tower: {side} must be a non-empty list of feature "
                             f"names, got {features!r}")
        unknown = [n for n in features if n not in names]
        if unknown:
            raise ValueError(f"two_tower: {side} names {unknown}, not features of the "
                             f"columns ({names})")
    both = sorted(set(query_features) & set(candidate_features))
    if both:
        raise ValueError(f"two_tower: features {both} are on both sides")
    candidate_id = candidate_features[0] if candidate_id is None else candidate_id
    spec = next((s for s in columns.specs if s.name == candidate_id), None)
    if (candidate_id not in candidate_features or not isinstance(spec, Categorical)
            or spec.boundaries is not None):
        raise ValueError(f"two_tower: candidate_id {candidate_id!r} must be an id "
                         f"Categorical among the candidate_features")
    return candidate_id


def _embedding_specs(columns, candidate_features, share_tables):
    """The sparse specs, the candidate side's tables renamed `<table>:candidate`
    unless the two sides share tables."""
    specs = []
    for spec in columns.sparse_specs:
        config = serialize(spec)
        if not share_tables and spec.name in candidate_features:
            config["config"] = {**config["config"], "table": f"{spec.table}:candidate"}
        specs.append(config)
    return specs


def _embedding_size(columns, features, units):
    """A tower's output width: its last unit, or its side's feature width
    (pooled embedding dims and numeric sizes) when it has no units."""
    if units:
        return units[-1]
    return sum(spec.dim for spec in columns.sparse_specs if spec.name in features) + \
        sum(spec.size for spec in columns.plan.numeric if spec.name in features)


def _side_columns(columns, features):
    """`(sparse feature names, dense column index or None)` of one side's
    features (a numeric feature of shape `(k,)` spans `k` dense columns),
    the index made once on Keras's device (not per batch)."""
    widths = [(spec.name, spec.size) for spec in columns.plan.numeric]
    starts = np.cumsum([0] + [width for _, width in widths])
    dense = [int(c) for (name, width), start in zip(widths, starts, strict=False)
             if name in features for c in range(start, start + width)]
    index = torch.as_tensor(dense, dtype=torch.int64,
                            device=_keras_compat.keras_device()) if dense else None
    return [s.name for s in columns.sparse_specs if s.name in features], index


def _tower_output(tower, side, dense, embedded, training):
    """A tower's L2-normalized output over one side's features."""
    sparse_names, dense_index = side
    parts = [embedded[name] for name in sparse_names]
    if dense_index is not None:
        parts.append(dense.index_select(1, dense_index))
    features = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
    if tower is not None:
        features = _keras_compat.call_built(tower, features, training=training)
    # torch's normalize clamps the norm: a zero output (every ReLU of a row
    # off, a zero bias, a zero row) has a finite gradient, where x / |x| has none.
    return torch.nn.functional.normalize(features, dim=-1)


@keras.saving.register_keras_serializable(package="reckeras")
class TwoTower(Model):
    """What `rk.models.two_tower` builds: a query and a candidate tower.

    Each example is a (query, positive candidate) interaction. Called on a
    batch it returns `{"query": [B, D], "candidate": [B, D]}`, both
    L2-normalized; training adds the loss over the batch's candidates
    (`compute_loss`). See `two_tower` for the arguments.

    Args:
        columns: the `rk.layers.FeatureColumns` of both sides.
        query_features: names of the query side's features.
        candidate_features: names of the candidate side's features.
        candidate_id: the candidate's id feature.
        query_units: widths of the query tower.
        candidate_units: widths of the candidate tower.
        share_tables: whether the two sides share tables of one name.
        loss: `"softmax"`, `"bpr"` or `"cosine_contrastive"`.
        temperature: the softmax's temperature.
        margin: the cosine contrastive loss's margin.
        negative_weight: the cosine contrastive loss's negative weight.
        logq_correction: subtract the candidates' streaming log q (softmax).
        negatives: a `rk.retrieval.NegativeSampler`, or None.
        in_batch_negatives: whether the batch's other candidates are negatives.
        frequency_buckets: `FrequencyEstimator`'s `num_buckets`.
        frequency_alpha: `FrequencyEstimator`'s `alpha`.
        dropout: tower dropout.
        norm: tower normalization.
        embedding_l2: L2 factor of the tables' regularizer.
        table_options: per-table options of the `ShardedEmbedding`.
        **kwargs: base Model arguments (`name`).
    """

    def __init__(self, columns: FeatureColumns, query_features: list[str],
                 candidate_features: list[str], candidate_id: str | None = None,
                 query_units: _Sequence[int] = (64, 32),
                 candidate_units: _Sequence[int] | None = None, share_tables: bool = True,
                 loss: str = "softmax", temperature: float = 0.05, margin: float = 0.0,
                 negative_weight: float = 1.0, logq_correction: bool = True,
                 negatives: NegativeSampler | None = None, in_batch_negatives: bool = True,
                 frequency_buckets: int = 2**20, frequency_alpha: float = 0.01,
                 dropout: float = 0.0, norm: str | None = None, embedding_l2: float = 0.0,
                 table_options: dict[str, Any] | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        query_features, candidate_features = list(query_features), list(candidate_features)
        self.candidate_id = _split_columns(columns, query_features, candidate_features,
                                           candidate_id)
        self.query_units = check_units("two_tower", "query_units", query_units)
        self.candidate_units = self.query_units if candidate_units is None else \
            check_units("two_tower", "candidate_units", candidate_units)
        query_size = _embedding_size(columns, query_features, self.query_units)
        candidate_size = _embedding_size(columns, candidate_features, self.candidate_units)
        if query_size != candidate_size:
            raise ValueError(f"two_tower: the towers' embedding sizes must match (the last "
                             f"width of a tower, or the width of its side's features when "
                             f"its units are empty), got {query_size} (query) and "
                             f"{candidate_size} (candidate)")
        self.embedding_size = query_size
        self.dropout, self.norm = check_tower_options("two_tower", dropout, norm)
        losses.check_loss_options("two_tower", loss, temperature, margin, negative_weight)
        candidate_inputs = [s.name for s in columns.specs if s.name in candidate_features]
        if negatives is not None and candidate_inputs != [self.candidate_id]:
            raise ValueError(f"two_tower: sampled negatives need a candidate tower of "
                             f"the id alone (a sampled id has no other features), got "
                             f"candidate_features {candidate_features}")
        if negatives is not None and not isinstance(negatives, NegativeSampler):
            raise ValueError(f"two_tower: negatives must be a rk.retrieval.NegativeSampler "
                             f"or None, got {negatives!r}")
        if not isinstance(in_batch_negatives, bool):
            raise ValueError(f"two_tower: in_batch_negatives must be a bool, got "
                             f"{in_batch_negatives!r}")
        if not in_batch_negatives and negatives is None:
            raise ValueError("two_tower: in_batch_negatives=False leaves the sampled "
                             "negatives only: pass a rk.retrieval.NegativeSampler as "
                             "negatives")
        self.columns = columns
        self.query_features, self.candidate_features = query_features, candidate_features
        self.share_tables = bool(share_tables)
        self.loss_name, self.temperature = loss, float(temperature)
        self.margin, self.negative_weight = float(margin), float(negative_weight)
        self.logq_correction = bool(logq_correction)
        self.negatives, self.in_batch_negatives = negatives, in_batch_negatives
        self.frequency_buckets, self.frequency_alpha = frequency_buckets, frequency_alpha
        self.embedding_l2 = embedding_l2
        self.embedding = ShardedEmbedding(
            _embedding_specs(columns, candidate_features, share_tables), output="dict",
            table_options=table_options,
            embeddings_regularizer=embedding_regularizer("two_tower", embedding_l2))
        # Empty units: no tower, the side's embeddings are its embedding
        # (matrix factorization when each side is one id).
        self.query_tower = MLP(self.query_units, dropout=self.dropout, norm=self.norm,
                               name="query_tower") if self.query_units else None
        self.candidate_tower = MLP(self.candidate_units, dropout=self.dropout,
                                   norm=self.norm, name="candidate_tower") \
            if self.candidate_units else None
        self.frequency = FrequencyEstimator(frequency_buckets, frequency_alpha) \
            if loss == "softmax" and logq_correction else None
        if self.frequency is not None:
            # Built now: `call` never runs it (the loss does), so Keras's
            # symbolic build of this model would leave it unbuilt.
            self.frequency.build()
        self._sides = {"query": _side_columns(columns, query_features),
                       "candidate": _side_columns(columns, candidate_features)}
        self._id_slot = [s.name for s in columns.sparse_specs].index(self.candidate_id)

    def _tower(self, side, dense, embedded, training):
        """One side's L2-normalized embedding from its features."""
        tower = self.query_tower if side == "query" else self.candidate_tower
        return _tower_output(tower, self._sides[side], dense, embedded, training)

    def _packed_ids(self, ids):
        """A packed sparse batch holding `ids` in the candidate id's slot only."""
        count, slots = ids.shape[0], len(self.columns.sparse_specs)
        offsets = torch.cat([
            torch.zeros(self._id_slot * count, dtype=torch.int64, device=ids.device),
            torch.arange(count, dtype=torch.int64, device=ids.device),
            torch.full(((slots - self._id_slot - 1) * count + 1,), count,
                       dtype=torch.int64, device=ids.device)])
        return {"ids": ids.to(torch.int64), "offsets": offsets}

    def _id_embeddings(self, ids, training):
        """Candidate embeddings of bare ids (an id-only candidate tower)."""
        embedded = _keras_compat.call_built(self.embedding, self._packed_ids(ids),
                                            training=training)
        return self._tower("candidate", None, embedded, training)

    def call(self, inputs: dict, training: bool = False) -> dict:
        # The inner layers without Keras's per-call bookkeeping, where it
        # changes nothing (`call_built`): ~0.5 ms of a CPU training step.
        dense, sparse = _keras_compat.call_built(self.columns, inputs)
        embedded = _keras_compat.call_built(self.embedding, sparse, training=training)
        outputs = {"query": self._tower("query", dense, embedded, training),
                   "candidate": self._tower("candidate", dense, embedded, training)}
        if training and self.negatives is not None:
            # Each rank draws its own ids (its rank is the generator's stream).
            ids, log_q = self.negatives.sample(distributed.world().rank, dense.device)
            outputs.update(negative=self._id_embeddings(ids, training),
                           negative_ids=ids, negative_log_q=log_q)
        return outputs

    def compute_loss(self, x: dict | None = None, y: Any = None, y_pred: Any = None,
                     sample_weight: Any = None, training: bool = True) -> torch.Tensor:
        """The retrieval loss of a batch, plus the layers' added losses.

        Each row's positive is its own candidate; the negatives are the
        other candidates of the global batch (every rank's, under
        torchrun; in training not with `in_batch_negatives=False`) and, in
        training, the sampled ones. Accidental hits
        (a negative with the positive's id) are left out. With the softmax
        loss and `logq_correction`, the candidates' frequency estimate is
        updated with the global batch's ids (in training) and its `log q`
        subtracted from their logits, a sampled negative's own `log q`
        from its logit.

        Args:
            x: the batch's inputs (the candidate ids are read from them).
            y: unused (the labels are the interactions themselves).
            y_pred: `call`'s outputs.
            sample_weight: per-row weights of the mean, or None.
            training: whether the step trains (updates the estimate).

        Returns:
            The scalar loss.
        """
        if x is None:
            raise ValueError("a two_tower model's loss reads the candidate ids from the "
                             "inputs: compute_loss needs x")
        query, ids = y_pred["query"], torch.as_tensor(x[self.candidate_id]).to(torch.int64)
        candidates, candidate_ids, _, offset = cross_rank.gather_candidates(
            y_pred["candidate"], ids.to(y_pred["candidate"].device), None)
        log_q = None
        if self.frequency is not None:       # its methods: no Keras call per step
            log_q = self.frequency.update(candidate_ids) if training else \
                self.frequency.log_probability(candidate_ids)
        positive_index = offset + torch.arange(query.shape[0], device=query.device)
        # Evaluation samples nothing: its negatives are the batch's candidates.
        if self.in_batch_negatives or "negative" not in y_pred:
            if "negative" in y_pred:
                candidates = torch.cat([candidates, y_pred["negative"]])
                candidate_ids = torch.cat([candidate_ids, y_pred["negative_ids"]])
                if log_q is not None:
                    log_q = torch.cat([log_q, y_pred["negative_log_q"]])
            hits = losses.accidental_hits(candidate_ids[positive_index], candidate_ids,
                                          positive_index)
            scores = query @ candidates.T
        else:
            scores, positive_index, log_q, hits = self._own_and_sampled(
                query, candidates[positive_index], candidate_ids[positive_index],
                None if log_q is None else log_q[positive_index], y_pred)
        if self.loss_name == "softmax":
            rows = losses.sampled_softmax_loss(scores, positive_index, self.temperature,
                                               log_q, hits)
        elif self.loss_name == "bpr":
            rows = losses.bpr_loss(scores, positive_index, hits)
        else:
            rows = losses.cosine_contrastive_loss(scores, positive_index, self.margin,
                                                  self.negative_weight, hits)
        if sample_weight is None:
            total = rows.mean()
        else:
            weights = torch.as_tensor(sample_weight, dtype=rows.dtype).reshape(-1)
            total = (rows * weights).sum() / weights.sum().clamp(min=1e-12)
        for penalty in self.losses:
            total = total + penalty
        return total

    @staticmethod
    def _own_and_sampled(query, own, own_ids, own_log_q, y_pred):
        """Without in-batch negatives: each row's scores are its own
        positive (column 0) and the sampled negatives (columns 1..M), with
        their log q (`[B, 1 + M]`: the positive's is the row's) and the
        sampled ids equal to the row's positive left out."""
        sampled, sampled_ids = y_pred["negative"], y_pred["negative_ids"]
        scores = torch.cat([(query * own).sum(dim=1, keepdim=True), query @ sampled.T], 1)
        log_q = None if own_log_q is None else torch.cat(
            [own_log_q[:, None], y_pred["negative_log_q"][None, :].expand(own.shape[0], -1)],
            1)
        none = torch.full_like(own_ids, -1)            # no sampled column is a positive
        rows, columns = losses.accidental_hits(own_ids, sampled_ids, none)
        return scores, torch.zeros_like(own_ids), log_q, (rows, columns + 1)

    def compile(self, optimizer: Any = "rmsprop", loss: Any = None,
                embedding_optimizer: Any = None, metrics: list | None = None,
                nonfinite: str = "raise", steps_per_execution: int = 1,
                jit_compile: bool | str = "auto", **kwargs: Any) -> None:
        """`rk.Model.compile` without a `loss`: the model brings its own.

        Args:
            optimizer: Keras optimizer of the dense weights.
            loss: must be None (the loss is `two_tower`'s `loss` argument).
            embedding_optimizer: as in `rk.Model.compile`.
            metrics: as in `rk.Model.compile`.
            nonfinite: as in `rk.Model.compile`.
            steps_per_execution: as in `rk.Model.compile`.
            jit_compile: as in `rk.Model.compile`.
            **kwargs: `rk.Model.compile`'s other arguments.

        Raises:
            ValueError: a `loss` is given.
        """
        if loss is not None:
            raise ValueError(f"a two_tower model trains with the loss it was built with "
                             f"({self.loss_name!r}, see two_tower's loss argument); "
                             f"compile it without loss=, got {loss!r}")
        super().compile(optimizer=optimizer, loss=None,
                        embedding_optimizer=embedding_optimizer, metrics=metrics,
                        nonfinite=nonfinite, steps_per_execution=steps_per_execution,
                        jit_compile=jit_compile, **kwargs)

    def candidate_embeddings(self, item_ids: Any, batch_size: int = 65536) -> np.ndarray:
        """The candidate tower's embedding of every id, chunk by chunk.

        For a candidate tower of the id alone: the corpus an exact top-K
        or an index searches. Ids never trained read the tower of a zero
        row. Under torchrun every rank must call it with the same ids (the
        rows live on their owners).

        Args:
            item_ids: int `[N]` candidate ids.
            batch_size: ids per chunk (bounds the memory of one lookup).

        Returns:
            float32 `[N, D]`, L2-normalized.

        Raises:
            ValueError: the candidate tower reads more than the id.
        """
        inputs = [s.name for s in self.columns.specs if s.name in self.candidate_features]
        if inputs != [self.candidate_id]:
            raise ValueError(f"candidate_embeddings needs a candidate tower of the id "
                             f"{self.candidate_id!r} alone, got {inputs}; predict on "
                             f"the candidates' rows and read the 'candidate' output")
        # A writable copy (np.array of a pyarrow array is read-only, copy or not).
        ids = torch.from_numpy(np.asarray(item_ids, dtype=np.int64).copy())
        device = _keras_compat.keras_device()
        with torch.no_grad():
            chunks = [self._id_embeddings(ids[start:start + batch_size].to(device), False)
                      for start in range(0, max(len(ids), 1), batch_size)]
        return torch.cat(chunks).cpu().numpy() if len(ids) else \
            np.zeros((0, self.embedding_size), np.float32)

    def export_serving(self, path: str | os.PathLike, rows: str | None = None,
                       min_count: int | None = None, base: str | os.PathLike | None = None,
                       item_ids: Any = None) -> str:
        """Writes a retrieval artifact: the query tower and the corpus.

        `rk.serving.load(path)` reads it without Keras: its `retrieve`
        answers the top K items of raw query rows (exact or through an ANN
        index), and `python -m reckeras.serving path` serves it over HTTP
        (`POST /retrieve`). The artifact holds the query tower as a ranking
        artifact holds a model (feature specs with their statistics, the
        tables' rows, a `torch.export` program) and the candidate tower's
        embedding of every id of `item_ids` (`candidate_embeddings`),
        with checksums in the manifest. Under torchrun every rank calls it
        with the same `item_ids`. See `docs/retrieval.md`.

        Args:
            path: the artifact directory (replaced if it exists).
            rows: the row precision of the tables, as `rk.Model.export_serving`.
            min_count: as `rk.Model.export_serving`.
            base: must be None: a retrieval artifact has no deltas.
            item_ids: int `[N]` distinct ids of the corpus retrieval picks
                from (the candidate id feature's raw values, e.g. every item
                of the catalogue): the ids `retrieve` answers. Required.

        Returns:
            The artifact's path.

        Raises:
            ValueError: `item_ids` missing, empty, not int, or repeated;
                `rows`/`min_count` as `rk.Model.export_serving`; a candidate
                tower that reads more than the id.
            NotImplementedError: a `base` (a delta).

        Example:

        ```python
        model.export_serving("exported/retrieval", item_ids=catalogue_ids)
        rk.serving.load("exported/retrieval").retrieve({"user_id": [7]}, k=20)
        ```
        """
        from reckeras.serving.retrieval_export import export_retrieval

        return export_retrieval(self, path, item_ids, rows, min_count, base)

    def query_model(self) -> QueryTower:
        """The query tower as its own `rk.Model`, sharing this model's layers.

        Returns:
            A `QueryTower`: `predict` gives the `[B, D]` query embeddings.
        """
        return QueryTower(self.columns, self.embedding, self.query_tower,
                          self.query_features)

    def get_config(self) -> dict:
        return {**super().get_config(),
                "columns": keras.saving.serialize_keras_object(self.columns),
                "query_features": self.query_features,
                "candidate_features": self.candidate_features,
                "candidate_id": self.candidate_id, "query_units": self.query_units,
                "candidate_units": self.candidate_units, "share_tables": self.share_tables,
                "loss": self.loss_name, "temperature": self.temperature,
                "margin": self.margin, "negative_weight": self.negative_weight,
                "logq_correction": self.logq_correction,
                "negatives": None if self.negatives is None else
                keras.saving.serialize_keras_object(self.negatives),
                "in_batch_negatives": self.in_batch_negatives,
                "frequency_buckets": self.frequency_buckets,
                "frequency_alpha": self.frequency_alpha, "dropout": self.dropout,
                "norm": self.norm, "embedding_l2": self.embedding_l2,
                "table_options": self.embedding.get_config()["table_options"] or None}

    @classmethod
    def from_config(cls, config: dict) -> TwoTower:
        config = dict(config)
        for key in ("columns", "negatives"):
            if config.get(key) is not None:
                config[key] = keras.saving.deserialize_keras_object(config[key])
        return cls(**config)


@keras.saving.register_keras_serializable(package="reckeras")
class QueryTower(Model):
    """A two-tower model's query side as an `rk.Model` of its own.

    `TwoTower.query_model()` makes it from the two-tower's own layers
    (trained together, saved apart): `predict` returns the `[B, D]`
    L2-normalized query embeddings. Its data needs the query side's
    columns only: the candidate side's are unread (`unread_features`), so
    they may be absent or null.

    Args:
        columns: the two-tower's `rk.layers.FeatureColumns`.
        embedding: its `ShardedEmbedding`.
        tower: its query tower (`rk.layers.MLP`), or None (no tower).
        query_features: names of the query side's features.
        **kwargs: base Model arguments (`name`).

    Example:

    ```python
    queries = two_tower_model.query_model()
    embeddings = queries.predict(users, batch_size=4096)     # [N, D]
    ```
    """

    def __init__(self, columns: FeatureColumns, embedding: ShardedEmbedding, tower: MLP | None,
                 query_features: list[str], **kwargs: Any):
        super().__init__(**kwargs)
        self.columns, self.embedding, self.tower = columns, embedding, tower
        self.query_features = list(query_features)
        self._side = _side_columns(columns, self.query_features)

    @property
    def unread_features(self) -> tuple[str, ...]:
        """The candidate side's features (see `rk.Model.unread_features`)."""
        return tuple(s.name for s in self.columns.specs if s.name not in self.query_features)

    def call(self, inputs: dict, training: bool = False) -> torch.Tensor:
        dense, sparse = _keras_compat.call_built(self.columns, inputs)
        embedded = _keras_compat.call_built(self.embedding, sparse, training=training)
        return self.tower_output(dense, embedded, training)

    def tower_output(self, dense: torch.Tensor, embedded: dict,
                     training: bool = False) -> torch.Tensor:
        """The query embeddings of the columns' dense output and the
        embedding's dict output: `call` past the lookup (what a serving
        export traces).

        Args:
            dense: the FeatureColumns' dense output `[B, F]`.
            embedded: the `ShardedEmbedding`'s `{feature: [B, d]}`.
            training: whether the tower runs in training mode.

        Returns:
            The `[B, D]` L2-normalized query embeddings.
        """
        return _tower_output(self.tower, self._side, dense, embedded, training)

    def get_config(self) -> dict:
        return {**super().get_config(), "query_features": self.query_features,
                **{key: keras.saving.serialize_keras_object(getattr(self, key))
                   for key in ("columns", "embedding", "tower")}}

    @classmethod
    def from_config(cls, config: dict) -> QueryTower:
        config = dict(config)
        for key in ("columns", "embedding", "tower"):
            config[key] = keras.saving.deserialize_keras_object(config[key])
        return cls(**config)


def two_tower(columns: FeatureColumns, query_features: _Sequence[str],
              candidate_features: _Sequence[str], candidate_id: str | None = None,
              query_units: _Sequence[int] = (64, 32),
              candidate_units: _Sequence[int] | None = None, share_tables: bool = True,
              loss: str = "softmax", temperature: float = 0.05, margin: float = 0.0,
              negative_weight: float = 1.0, logq_correction: bool = True,
              negatives: NegativeSampler | None = None, in_batch_negatives: bool = True,
              frequency_buckets: int = 2**20,
              frequency_alpha: float = 0.01, dropout: float = 0.0, norm: str | None = None,
              embedding_l2: float = 0.0,
              table_options: dict[str, Any] | None = None) -> TwoTower:
    """An uncompiled two-tower retrieval model over `columns`.

    The query features (pooled embeddings and numeric columns) go through
    the query tower, the candidate features through the candidate tower;
    both outputs are L2-normalized, so a score is a cosine. It trains with
    `fit` on interaction rows (a query's features and its positive
    candidate's), without labels: each row's negatives are the other
    candidates of the batch (of the global batch under torchrun, gathered
    from every rank), plus `negatives.num_negatives` sampled ids when a
    `negatives` sampler is given; a negative with the positive's id (an
    accidental hit) is left out.

    Args:
        columns: a `rk.layers.FeatureColumns` holding both sides' features
            (sparse ones pooled).
        query_features: names of the query side's features.
        candidate_features: names of the candidate side's features.
        candidate_id: the candidate's id Categorical (default: the first of
            `candidate_features`): accidental hits, the frequency estimate,
            sampled negatives and `candidate_embeddings` read it.
        query_units: widths of the query tower's layers (ReLU between, the
            last linear): its last width is the embedding size. Empty
            (`()`): no tower, the query side's pooled embeddings and
            numeric features, concatenated, are the embedding (with one id
            a side, matrix factorization).
        candidate_units: widths of the candidate tower (default
            `query_units`), or empty for none; the two sides' embedding
            sizes must match.
        share_tables: features of both sides on one table name share its
            rows (e.g. a history of items and the candidate item); False
            gives the candidate side tables of its own (`<table>:candidate`).
        loss: `"softmax"` (sampled softmax over the candidates),
            `"bpr"` or `"cosine_contrastive"` (SimpleX).
        temperature: the softmax logits are the cosines over it.
        margin: the cosine contrastive loss's margin.
        negative_weight: the cosine contrastive loss's negative weight.
        logq_correction: with the softmax, subtract each candidate's log
            sampling probability: a `rk.retrieval.FrequencyEstimator` for
            the in-batch candidates (updated by every training step), the
            sampler's own for sampled ones.
        negatives: a `rk.retrieval.NegativeSampler` of extra negatives (the
            candidate tower must read the id alone), or None.
        in_batch_negatives: whether the batch's other candidates are
            negatives. False leaves each row its positive and the sampled
            negatives only (needs `negatives`): SimpleX's MF-CCL setup,
            where in-batch negatives, drawn by popularity, push popular
            items down (on a 6,000-user synthetic, Recall@20 after 12
            epochs: 0.066 without them, 0.039 with them).
        frequency_buckets: the estimator's hashed array size.
        frequency_alpha: the estimator's learning rate.
        dropout: dropout rate after each hidden layer of the towers.
        norm: normalization of the towers' hidden layers: `None`,
            `"batch"` or `"layer"`.
        embedding_l2: the L2 factor of a regularizer on every table (as in
            the other zoo models); 0 adds none.
        table_options: per-table options, passed to `ShardedEmbedding`.

    Returns:
        A `TwoTower` (an `rk.Model`): `predict` gives `{"query": [B, D],
        "candidate": [B, D]}`; `candidate_embeddings(ids)` the corpus side;
        `query_model()` the query tower alone.

    Raises:
        ValueError: for unknown or overlapping feature names, a
            `candidate_id` that is not an id Categorical of the candidate
            side, towers of different last widths, bad loss or tower options.

    Example:

    ```python
    columns = rk.layers.FeatureColumns([
        rk.features.Categorical("user", dim=32),
        rk.features.Sequence("history", dim=32, max_len=50, table="item"),
        rk.features.Categorical("item", dim=32, table="item")])
    model = rk.models.two_tower(columns, ["user", "history"], ["item"],
                                query_units=(64, 32), temperature=0.05)
    model.compile(optimizer="adam",
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.05))
    model.fit(interactions, batch_size=1024)
    ```
    """
    return TwoTower(columns, list(query_features), list(candidate_features),
                    candidate_id=candidate_id, query_units=query_units,
                    candidate_units=candidate_units, share_tables=share_tables, loss=loss,
                    temperature=temperature, margin=margin,
                    negative_weight=negative_weight, logq_correction=logq_correction,
                    negatives=negatives, in_batch_negatives=in_batch_negatives,
                    frequency_buckets=frequency_buckets,
                    frequency_alpha=frequency_alpha, dropout=dropout, norm=norm,
                    embedding_l2=embedding_l2, table_options=table_options,
                    name="two_tower")
