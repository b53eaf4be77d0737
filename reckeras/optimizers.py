"""Sparse optimizers for embedding tables.

They update only the rows a batch touched, inside the backward pass, with the
fused kernels of ``reckeras.backend_kernels.sparse_optimizers``; Keras's own
optimizer never sees the tables. Pass one to ``rk.Model.compile`` as
``embedding_optimizer``.
"""

import keras

from reckeras.backend_kernels import sparse_optimizers as kernels


class SparseOptimizer:
    """Base class: a per-row update rule with per-row state.

    Args:
        learning_rate: step size (a positive float).
    """

    state_name = None

    def __init__(self, learning_rate):
        if isinstance(learning_rate, bool) or not isinstance(learning_rate, (int, float)) \
                or not learning_rate > 0:
            raise ValueError(f"{type(self).__name__}: learning_rate must be a "
                             f"positive number, got {learning_rate!r}")
        self.learning_rate = float(learning_rate)

    def state_width(self, dim):
        """Number of float32 state values per row for a table of ``dim``."""
        return 0

    def apply(self, weights, state, rows, grads):
        raise NotImplementedError

    def get_config(self):
        return {"learning_rate": self.learning_rate}

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"


@keras.saving.register_keras_serializable(package="reckeras")
class SGD(SparseOptimizer):
    """Plain SGD on touched rows: ``w -= lr * g``.

    Example:
        >>> model.compile(..., embedding_optimizer=rk.optimizers.SGD(0.1))
    """

    def apply(self, weights, state, rows, grads):
        kernels.sgd_update(weights, rows, grads, self.learning_rate)


class _AdagradBase(SparseOptimizer):
    def __init__(self, learning_rate=0.05, epsilon=1e-8, initial_accumulator_value=0.0):
        super().__init__(learning_rate)
        if not epsilon > 0:
            raise ValueError(f"{type(self).__name__}: epsilon must be > 0, got {epsilon!r}")
        if initial_accumulator_value < 0:
            raise ValueError(f"{type(self).__name__}: initial_accumulator_value must "
                             f"be >= 0, got {initial_accumulator_value!r}")
        self.epsilon = float(epsilon)
        self.initial_accumulator_value = float(initial_accumulator_value)

    def get_config(self):
        return {**super().get_config(), "epsilon": self.epsilon,
                "initial_accumulator_value": self.initial_accumulator_value}


@keras.saving.register_keras_serializable(package="reckeras")
class Adagrad(_AdagradBase):
    """Element-wise Adagrad on touched rows (torch.optim.Adagrad's rule).

    For each touched row with aggregated gradient ``g`` and accumulator ``s``
    (one per element, starting at ``initial_accumulator_value``)::

        s += g * g
        w -= learning_rate * g / (sqrt(s) + epsilon)

    Args:
        learning_rate: step size.
        epsilon: added to the denominator.
        initial_accumulator_value: starting value of ``s``.

    Example:
        >>> rk.optimizers.Adagrad(0.05)
    """

    def state_width(self, dim):
        return dim

    def apply(self, weights, state, rows, grads):
        kernels.adagrad_update(weights, state, rows, grads, self.learning_rate,
                               self.epsilon)


@keras.saving.register_keras_serializable(package="reckeras")
class RowWiseAdagrad(_AdagradBase):
    """Row-wise Adagrad (fbgemm/TorchRec's default): one accumulator per row.

    For each touched row with aggregated gradient ``g`` (a ``dim`` vector) and
    scalar accumulator ``s``::

        s += mean(g * g)
        w -= learning_rate * g / (sqrt(s) + epsilon)

    It keeps 4 bytes of state per row instead of ``4 * dim``.

    Args:
        learning_rate: step size.
        epsilon: added to the denominator.
        initial_accumulator_value: starting value of ``s``.

    Example:
        >>> model.compile(optimizer="adam", loss="binary_crossentropy",
        ...               embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.05))
    """

    def state_width(self, dim):
        return 1

    def apply(self, weights, state, rows, grads):
        kernels.rowwise_adagrad_update(weights, state, rows, grads,
                                       self.learning_rate, self.epsilon)


_BY_NAME = {"sgd": SGD, "adagrad": Adagrad, "rowwise_adagrad": RowWiseAdagrad}


def get(identifier):
    """A SparseOptimizer from an instance, a name or a serialized config."""
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


def serialize(optimizer):
    return {"class_name": type(optimizer).__name__, "config": optimizer.get_config()}
