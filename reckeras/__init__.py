"""reckeras: Keras 3 recommender training on the torch backend.

Importing reckeras selects Keras's torch backend when ``KERAS_BACKEND`` is
unset, and raises :class:`reckeras.BackendError` when Keras already runs
another backend.
"""

from reckeras._backend import BackendError, select_torch_backend

select_torch_backend()


__version__ = "0.1.0"

__all__ = ["BackendError", "Model", "datasets", "features", "layers",
           "metrics", "models", "optimizers"]
