"""Negatives beyond the batch: ids sampled from a given item set."""

from __future__ import annotations

import numbers
from typing import Any

import keras
import numpy as np
import torch


@keras.saving.register_keras_serializable(package="reckeras")
class NegativeSampler:
    """Draws extra negative ids, uniformly or by popularity.

    In-batch negatives follow the data's popularity; a few ids drawn from
    the whole item set add the rare items a batch seldom holds (Yang et
    al. 2020, "mixed negative sampling"). Each call draws `num_negatives`
    ids with replacement: uniformly over `item_ids`, or, with `counts`,
    with probability proportional to `counts ** power`. It also returns each
    drawn id's `log q`, the log of its expected number of draws
    (`num_negatives * p`), for the logQ correction.

    The draws come from a `torch.Generator` seeded with `seed` (plus the
    `stream` a caller gives, e.g. its rank): the same seed draws the same
    ids; the generator's position is not saved with a model.

    Args:
        item_ids: the int64 ids to draw from (distinct).
        num_negatives: ids drawn per call.
        counts: how often each of `item_ids` occurs (same length, `>= 0`,
            not all 0), or None for uniform draws.
        power: exponent of `counts` (0.75 flattens popularity as word2vec
            does); only with `counts`.
        seed: the generator's seed.

    Example:

    ```python
    sampler = rk.retrieval.NegativeSampler(item_ids, num_negatives=256,
                                           counts=item_counts, power=0.75)
    ids, log_q = sampler.sample()
    ```
    """

    def __init__(self, item_ids: Any, num_negatives: int, counts: Any = None,
                 power: float = 1.0, seed: int = 0):
        ids = np.asarray(item_ids)
        if ids.ndim != 1 or not len(ids) or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"NegativeSampler: item_ids must be a non-empty 1-D array "
                             f"of int ids, got shape {ids.shape} of {ids.dtype}")
        if len(np.unique(ids)) != len(ids):
            raise ValueError("NegativeSampler: item_ids must be distinct")
        if (not isinstance(num_negatives, numbers.Integral)
                or isinstance(num_negatives, bool) or num_negatives < 1):
            raise ValueError(f"NegativeSampler: num_negatives must be a positive int, "
                             f"got {num_negatives!r}")
        if not isinstance(power, numbers.Real) or not float(power) >= 0:
            raise ValueError(f"NegativeSampler: power must be a number >= 0, got {power!r}")
        if counts is None:
            probability = np.full(len(ids), 1.0 / len(ids))
        else:
            counts = np.asarray(counts, dtype=np.float64)
            if (counts.shape != ids.shape or not np.isfinite(counts).all()
                    or (counts < 0).any() or not counts.any()):
                raise ValueError(f"NegativeSampler: counts must hold one finite count >= 0 "
                                 f"per item id ({len(ids)}), not all 0")
            weights = counts ** float(power)
            probability = weights / weights.sum()
        self.item_ids: np.ndarray = ids.astype(np.int64)
        self.counts: np.ndarray | None = counts
        self.num_negatives: int = int(num_negatives)
        self.power: float = float(power)
        self.seed: int = int(seed)
        self._ids: torch.Tensor = torch.as_tensor(self.item_ids)
        self._cumulative: torch.Tensor = torch.as_tensor(np.cumsum(probability))
        with np.errstate(divide="ignore"):      # an item of count 0 is never drawn
            log_q = np.log(self.num_negatives * probability)
        self._log_q: torch.Tensor = torch.as_tensor(log_q, dtype=torch.float32)
        self._generators: dict[int, torch.Generator] = {}

    def sample(self, stream: int = 0,
               device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """Draws `num_negatives` ids (with replacement).

        Args:
            stream: which generator draws (seeded `seed + stream`): ranks
                pass their rank, so that they draw different ids.
            device: where the results go.

        Returns:
            `(ids, log_q)`: int64 `[num_negatives]` ids and their float32
            log expected number of draws.
        """
        if stream not in self._generators:
            self._generators[stream] = torch.Generator().manual_seed(self.seed + stream)
        uniform = torch.rand(self.num_negatives, generator=self._generators[stream],
                             dtype=torch.float64)
        # Inverse CDF: the first item whose cumulative probability exceeds u.
        index = torch.searchsorted(self._cumulative, uniform, right=True)
        index = index.clamp(max=len(self.item_ids) - 1)  # u past a rounded last sum
        return self._ids[index].to(device), self._log_q[index].to(device)

    def get_config(self) -> dict:
        """The sampler's arguments (the id set and counts as lists).

        Returns:
            A dict `from_config` (and `keras.saving`) reads back.
        """
        return {"item_ids": self.item_ids.tolist(), "num_negatives": self.num_negatives,
                "counts": None if self.counts is None else self.counts.tolist(),
                "power": self.power, "seed": self.seed}

    @classmethod
    def from_config(cls, config: dict) -> NegativeSampler:
        """A sampler from `get_config()`.

        Args:
            config: what `get_config` returned.

        Returns:
            The sampler.
        """
        return cls(**config)
