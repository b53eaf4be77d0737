"""A streaming estimate of how often each candidate id is trained on.

In-batch negatives are drawn by the data: a popular item is everyone's
negative far more often than a rare one, and the softmax learns to push it
down. Yi et al. (RecSys 2019, "Sampling-bias-corrected neural modeling for
large corpus item recommendations") correct each candidate's logit by
`- log q`, its sampling probability, estimated while streaming: per hash
bucket of the id, `A` holds the last step the id was seen and `B` a moving
average of the steps between two sightings; `q = 1 / B`.
"""

from __future__ import annotations

import numbers
from typing import Any

import keras
import torch

from reckeras import _keras_compat
from reckeras.backend_kernels.hashing import mix64


@keras.saving.register_keras_serializable(package="reckeras")
class FrequencyEstimator(keras.layers.Layer):
    """Streaming estimate of each id's sampling probability (Yi et al. 2019).

    Every id hashes to one of `num_buckets` buckets. A training call counts
    one step `t` and, for every bucket `h` of the batch's ids, moves the
    bucket's gap estimate toward the steps since its last sighting:
    `B[h] = (1 - alpha) * B[h] + alpha * (t - A[h])`, then `A[h] = t`. The
    call returns `log q = -log B[h]` of every id, after the update.

    Duplicates in a batch: the batch's ids are taken one after the other
    at the same step, as the paper's per-example loop does. An id seen `c`
    times contributes one gap `t - A[h]` and `c - 1` gaps of 0, so its
    bucket ends at `(1 - alpha)**c * B[h] + alpha * (1 - alpha)**(c - 1) *
    (t - A[h])` whatever the order: the update is computed in that closed
    form over the distinct buckets (one vectorized step, deterministic).
    Ids that share a bucket count as one id.

    `A`, `B` and the step count are non-trainable weights: they save with
    the model (`model.save`, `get_weights`). `B` starts at 0: an estimate
    needs about `1 / alpha` sightings to forget its start.

    Args:
        num_buckets: size of the hashed arrays `A` and `B`.
        alpha: the moving average's learning rate, in `(0, 1]`.
        **kwargs: base Layer arguments (`name`, ...).

    Call arguments:
        ids: int64 ids, any shape.
        training: update the estimate with `ids` first (one step).

    Returns:
        float32 `log q` of every id, shaped as `ids`.

    Example:

    ```python
    estimator = rk.retrieval.FrequencyEstimator(num_buckets=2**20, alpha=0.01)
    log_q = estimator(item_ids, training=True)     # counts one step
    logits = logits - log_q[None, :]               # logQ correction
    ```
    """

    def __init__(self, num_buckets: int = 2**20, alpha: float = 0.01, **kwargs: Any):
        super().__init__(**kwargs)
        if (not isinstance(num_buckets, numbers.Integral) or isinstance(num_buckets, bool)
                or num_buckets < 1):
            raise ValueError(f"FrequencyEstimator {self.name!r}: num_buckets must be a "
                             f"positive int, got {num_buckets!r}")
        if (not isinstance(alpha, numbers.Real) or isinstance(alpha, bool)
                or not 0.0 < float(alpha) <= 1.0):
            raise ValueError(f"FrequencyEstimator {self.name!r}: alpha must be in (0, 1], "
                             f"got {alpha!r}")
        self.num_buckets: int = int(num_buckets)
        self.alpha: float = float(alpha)

    def build(self, input_shape: Any = None) -> None:
        """Makes the estimate's state (its size is `num_buckets`, whatever
        the ids' shape).

        Args:
            input_shape: the ids' shape (unused).
        """
        buckets = (self.num_buckets,)
        self.last_step: keras.Variable = self.add_weight(
            shape=buckets, initializer="zeros", dtype="int64", trainable=False,
            name="last_step")
        self.gap: keras.Variable = self.add_weight(
            shape=buckets, initializer="zeros", dtype="float32", trainable=False, name="gap")
        self.step: keras.Variable = self.add_weight(
            shape=(), initializer="zeros", dtype="int64", trainable=False, name="step")
        self.built = True

    def buckets(self, ids: torch.Tensor) -> torch.Tensor:
        """The bucket of every id: its 64-bit mix, modulo `num_buckets`.

        Args:
            ids: int64 ids.

        Returns:
            int64 buckets in `[0, num_buckets)`, shaped as `ids`.
        """
        return torch.remainder(mix64(ids.to(torch.int64)), self.num_buckets)

    def update(self, ids: torch.Tensor) -> torch.Tensor:
        """Counts one step in which `ids` were seen (see the class docstring).

        Args:
            ids: int64 ids of one step, any shape.

        Returns:
            float32 `log q` of every id after the update, shaped as `ids`
            (what `log_probability(ids)` would read, without hashing again).
            Inside a training step the update is written when the step is
            applied (a refused step leaves the estimate as it was).
        """
        with torch.no_grad():
            step = self.step.value + 1
            buckets, inverse, counts = torch.unique(self.buckets(ids).reshape(-1),
                                                    return_inverse=True,
                                                    return_counts=True)
            last, gap = self.last_step.value, self.gap.value
            since = (step - last[buckets]).to(torch.float32)
            keep = 1.0 - self.alpha
            # (1-a)^c B + a (1-a)^(c-1) since, with one power: since >= 1,
            # so the new gap is > 0 and its log finite.
            updated = torch.pow(keep, counts.to(torch.float32) - 1).mul_(
                torch.add(gap[buckets].mul_(keep), since, alpha=self.alpha))
            log_q = updated.log().neg_()[inverse].reshape(ids.shape)

        def write() -> None:
            with torch.no_grad():
                gap[buckets] = updated
                last[buckets] = step
                self.step.value.copy_(step)

        # In a training step the state moves only if the step is applied.
        if not _keras_compat.defer_write(write):
            write()
        return log_q

    def log_probability(self, ids: torch.Tensor) -> torch.Tensor:
        """`log q = -log B` of every id, without updating anything.

        A bucket never seen (`B = 0`) reads as `q = 1`: no correction.

        Args:
            ids: int64 ids.

        Returns:
            float32 `log q`, shaped as `ids`.
        """
        gap = self.gap.value[self.buckets(ids)]
        return -torch.log(torch.where(gap > 0, gap, torch.ones_like(gap)))

    def call(self, ids: Any, training: bool = False) -> torch.Tensor:
        ids = torch.as_tensor(ids)
        return self.update(ids) if training else self.log_probability(ids)

    def compute_output_spec(self, ids: Any, training: bool = False) -> keras.KerasTensor:
        return keras.KerasTensor(ids.shape, dtype="float32")

    def get_config(self) -> dict:
        return {**super().get_config(), "num_buckets": self.num_buckets,
                "alpha": self.alpha}
