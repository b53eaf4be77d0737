"""Sparse optimizers for embedding tables.

They update only the rows a batch touched, inside the backward pass, with the
fused kernels of `reckeras.backend_kernels.sparse_optimizers`; Keras's own
optimizer never sees the tables. Pass one to `rk.Model.compile` as
`embedding_optimizer`.

Every optimizer keeps its state per row (float32, `state_width(dim)` values),
so a row's update depends only on the batches that touched it.
"""

from __future__ import annotations

from typing import Any, ClassVar

import keras
import torch

from reckeras.backend_kernels import sparse_optimizers as kernels


class SparseOptimizer:
    """Base class: a per-row update rule with per-row state.

    A subclass sets `kind`, the update rule of
    `backend_kernels.sparse_optimizers`, and may override
    `hyperparameters` and `get_config`. The embedding engine calls `apply`
    or `apply_pooled` once per table and step.

    Args:
        learning_rate: step size (a positive float).

    Example:

    ```python
    optimizer = rk.optimizers.SGD(0.1)          # a SparseOptimizer
    weights = torch.ones(4, 2)
    state = torch.zeros(4, optimizer.state_width(2))
    optimizer.apply(weights, state, torch.tensor([1, 3]), torch.ones(2, 2))
    weights[1]                                  # tensor([0.9000, 0.9000])
    ```
    """

    # The update rule in `backend_kernels.sparse_optimizers`; each subclass sets it.
    kind: ClassVar[int]

    def __init__(self, learning_rate: float):
        if isinstance(learning_rate, keras.optimizers.schedules.LearningRateSchedule):
            raise ValueError(
                f"{type(self).__name__}: learning_rate must be a number, not a schedule "
                f"({type(learning_rate).__name__}): the tables' rate is the float "
                f"`model.embedding_optimizer.learning_rate`, which a callback may set "
                f"between steps (docs/keras_api.md, 'Learning rates')")
        if isinstance(learning_rate, bool) or not isinstance(learning_rate, (int, float)) \
                or not learning_rate > 0:
            raise ValueError(f"{type(self).__name__}: learning_rate must be a "
                             f"positive number, got {learning_rate!r}")
        self.learning_rate = float(learning_rate)

    def state_width(self, dim: int) -> int:
        """Number of float32 state values per row.

        Args:
            dim: the row width of the table.

        Returns:
            The width of the table's `[num_rows, width]` state.
        """
        return kernels.state_width(self.kind, dim)

    def hyperparameters(self) -> tuple[float, float, float, float, float]:
        """The hyperparameters the kernels take.

        Returns:
            `(learning_rate, epsilon, beta_1, beta_2, weight_decay)`, 0.0 for
            those the rule does not use.
        """
        return (self.learning_rate, 0.0, 0.0, 0.0, 0.0)

    def apply(self, weights: torch.Tensor, state: torch.Tensor, rows: torch.Tensor,
              grads: torch.Tensor, round_seed: int = 0) -> None:
        """Updates `weights[rows]` and their state in place.

        Args:
            weights: float32, float16 or bfloat16 `[num_rows, D]`, the table.
            state: float32 `[num_rows, state_width(D)]`.
            rows: int64 `[U]`, distinct rows.
            grads: float32 `[U, D]`, the gradient of every row.
            round_seed: the seed of the stochastic rounding of half rows
                (`sparse_optimizers.rounding_seed`).
        """
        kernels.update(self.kind, weights, state, rows, grads, *self.hyperparameters(),
                       round_seed=round_seed)

    def apply_pooled(self, weights: torch.Tensor, state: torch.Tensor,
                     rows: torch.Tensor, grad_out: torch.Tensor,
                     unique_index: torch.Tensor, destination: torch.Tensor,
                     id_weight: torch.Tensor, round_seed: int = 0) -> None:
        """`apply` with the rows' gradients aggregated from a pooled gradient.

        On CUDA the aggregation and the update run as one kernel.

        Args:
            weights: float32, float16 or bfloat16 `[num_rows, D]`, the table.
            state: float32 `[num_rows, state_width(D)]`.
            rows: int64 `[U]`, the batch's distinct rows.
            grad_out: float32 `[num_slots, D]`, the gradient of the pooled
                output.
            unique_index: int64 `[n]`, each id's position in `rows`.
            destination: int64 `[n]`, each id's output slot.
            id_weight: float `[n]`, each id's pooling scale (as for
                `backend_kernels.aggregation.aggregate_row_grads`).
            round_seed: as for `apply`.
        """
        kernels.aggregate_and_update(self.kind, weights, state, rows, grad_out,
                                     unique_index, destination, id_weight,
                                     *self.hyperparameters(), round_seed=round_seed)

    def get_config(self) -> dict[str, Any]:
        """The constructor arguments of the optimizer.

        Returns:
            A dict, the keyword arguments that `from_config` takes.
        """
        return {"learning_rate": self.learning_rate}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> SparseOptimizer:
        """The optimizer of a config returned by `get_config`.

        Args:
            config: the optimizer's constructor arguments.

        Returns:
            A new optimizer of this class.
        """
        return cls(**config)

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"


@keras.saving.register_keras_serializable(package="reckeras")
class SGD(SparseOptimizer):
    """Plain SGD on touched rows: `w -= lr * g`.

    Args:
        learning_rate: step size.

    Example:

    ```python
    model.compile(optimizer="adam", loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.SGD(0.1))
    ```
    """

    kind = kernels.SGD

    def __init__(self, learning_rate: float = 0.01):
        super().__init__(learning_rate)


class _AdagradBase(SparseOptimizer):
    def __init__(self, learning_rate: float = 0.05, epsilon: float = 1e-8,
                 initial_accumulator_value: float = 0.0):
        super().__init__(learning_rate)
        if not epsilon > 0:
            raise ValueError(f"{type(self).__name__}: epsilon must be > 0, got {epsilon!r}")
        if initial_accumulator_value < 0:
            raise ValueError(f"{type(self).__name__}: initial_accumulator_value must "
                             f"be >= 0, got {initial_accumulator_value!r}")
        self.epsilon = float(epsilon)
        self.initial_accumulator_value = float(initial_accumulator_value)

    def hyperparameters(self) -> tuple[float, float, float, float, float]:
        return (self.learning_rate, self.epsilon, 0.0, 0.0, 0.0)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "epsilon": self.epsilon,
                "initial_accumulator_value": self.initial_accumulator_value}


@keras.saving.register_keras_serializable(package="reckeras")
class Adagrad(_AdagradBase):
    """Element-wise Adagrad on touched rows (torch.optim.Adagrad's rule).

    For each touched row with aggregated gradient `g` and accumulator `s`
    (one per element, starting at `initial_accumulator_value`):

    ```
    s += g * g
    w -= learning_rate * g / (sqrt(s) + epsilon)
    ```

    Args:
        learning_rate: step size.
        epsilon: added to the denominator.
        initial_accumulator_value: starting value of `s`.

    Example:

    ```python
    model.compile(optimizer="adam", loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.Adagrad(0.05))
    ```
    """

    kind = kernels.ADAGRAD


@keras.saving.register_keras_serializable(package="reckeras")
class RowWiseAdagrad(_AdagradBase):
    """Row-wise Adagrad (fbgemm/TorchRec's default): one accumulator per row.

    For each touched row with aggregated gradient `g` (a `dim` vector) and
    scalar accumulator `s`:

    ```
    s += mean(g * g)
    w -= learning_rate * g / (sqrt(s) + epsilon)
    ```

    It keeps 4 bytes of state per row instead of `4 * dim`.

    Args:
        learning_rate: step size.
        epsilon: added to the denominator.
        initial_accumulator_value: starting value of `s`.

    Example:

    ```python
    model.compile(optimizer="adam", loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.05))
    ```
    """

    kind = kernels.ROWWISE_ADAGRAD


class _AdamBase(SparseOptimizer):
    default_weight_decay = 0.0

    def __init__(self, learning_rate: float = 0.001, beta_1: float = 0.9,
                 beta_2: float = 0.999, epsilon: float = 1e-8,
                 weight_decay: float | None = None):
        super().__init__(learning_rate)
        weight_decay = self.default_weight_decay if weight_decay is None else weight_decay
        name = type(self).__name__
        for field, value in (("beta_1", beta_1), ("beta_2", beta_2)):
            if not 0 <= value < 1:
                raise ValueError(f"{name}: {field} must be in [0, 1), got {value!r}")
        if not epsilon > 0:
            raise ValueError(f"{name}: epsilon must be > 0, got {epsilon!r}")
        if not weight_decay >= 0:
            raise ValueError(f"{name}: weight_decay must be >= 0, got {weight_decay!r}")
        self.beta_1, self.beta_2 = float(beta_1), float(beta_2)
        self.epsilon, self.weight_decay = float(epsilon), float(weight_decay)

    def hyperparameters(self) -> tuple[float, float, float, float, float]:
        return (self.learning_rate, self.epsilon, self.beta_1, self.beta_2,
                self.weight_decay)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "beta_1": self.beta_1, "beta_2": self.beta_2,
                "epsilon": self.epsilon, "weight_decay": self.weight_decay}


@keras.saving.register_keras_serializable(package="reckeras")
class Adam(_AdamBase):
    """Adam on touched rows (torch.optim.Adam's rule), with a step count per row.

    For each touched row with aggregated gradient `g`, moments `m`, `v`
    and step count `t` (the number of batches that touched the row):

    ```
    t += 1
    g += weight_decay * w                      # L2 penalty, as torch.optim.Adam
    m = beta_1 * m + (1 - beta_1) * g
    v = beta_2 * v + (1 - beta_2) * g * g
    w -= learning_rate / (1 - beta_1**t) * m / (sqrt(v / (1 - beta_2**t)) + epsilon)
    ```

    A row that a batch does not touch keeps its moments and its step count,
    as if the batch had not happened for it (lazy Adam). State per row:
    `2 * dim + 1` floats.

    Args:
        learning_rate: step size.
        beta_1: decay of the first moment.
        beta_2: decay of the second moment.
        epsilon: added to the denominator.
        weight_decay: L2 penalty coefficient (default 0).

    Example:

    ```python
    model.compile(optimizer="adam", loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.Adam(0.001))
    ```
    """

    kind = kernels.ADAM


@keras.saving.register_keras_serializable(package="reckeras")
class AdamW(_AdamBase):
    """AdamW on touched rows (torch.optim.AdamW's rule), a step count per row.

    As `Adam`, except that the weight decay is decoupled: the row is first
    shrunk, `w *= 1 - learning_rate * weight_decay`, and the gradient is not
    penalized. Only touched rows decay.

    Args:
        learning_rate: step size.
        beta_1: decay of the first moment.
        beta_2: decay of the second moment.
        epsilon: added to the denominator.
        weight_decay: decoupled decay coefficient (default 0.01, as torch).

    Example:

    ```python
    model.compile(optimizer="adam", loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.AdamW(0.001, weight_decay=0.01))
    ```
    """

    kind = kernels.ADAMW
    default_weight_decay = 0.01


# Each built-in rule has a default learning rate (the base class has none).
_BY_NAME: dict[str, type[SGD | _AdagradBase | _AdamBase]] = {
    "sgd": SGD, "adagrad": Adagrad, "rowwise_adagrad": RowWiseAdagrad, "adam": Adam,
    "adamw": AdamW}


def get(identifier: SparseOptimizer | str | dict[str, Any]) -> SparseOptimizer:
    """A SparseOptimizer from an instance, a name or a serialized config.

    Args:
        identifier: a `SparseOptimizer` (returned as is), a name (`"sgd"`,
            `"adagrad"`, `"rowwise_adagrad"`, `"adam"`, `"adamw"`, any case;
            default hyperparameters) or a config returned by `serialize`.

    Returns:
        The optimizer.

    Raises:
        ValueError: for anything else.

    Example:

    ```python
    rk.optimizers.get("rowwise_adagrad")   # RowWiseAdagrad(learning_rate=0.05, ...)
    ```
    """
    if isinstance(identifier, SparseOptimizer):
        return identifier
    if isinstance(identifier, str) and identifier.lower() in _BY_NAME:
        return _BY_NAME[identifier.lower()]()
    if isinstance(identifier, dict) and identifier.get("class_name") in \
            {c.__name__ for c in _BY_NAME.values()}:
        cls = {c.__name__: c for c in _BY_NAME.values()}[identifier["class_name"]]
        return cls.from_config(identifier["config"])
    raise ValueError(f"unknown embedding optimizer {identifier!r}; expected a "
                     f"reckeras.optimizers.SparseOptimizer or one of {sorted(_BY_NAME)}")


def serialize(optimizer: SparseOptimizer) -> dict[str, Any]:
    """The serialized config of an optimizer.

    Args:
        optimizer: a `SparseOptimizer`.

    Returns:
        `{"class_name": ..., "config": optimizer.get_config()}`, which `get`
        turns back into an equal optimizer.

    Example:

    ```python
    config = rk.optimizers.serialize(rk.optimizers.Adam(0.001))
    rk.optimizers.get(config)   # Adam(learning_rate=0.001, ...)
    ```
    """
    return {"class_name": type(optimizer).__name__, "config": optimizer.get_config()}
