"""reckeras: Keras 3 recommender training on the torch backend.

Submodules load when first used, and importing reckeras imports no Keras:
`reckeras.serving` predicts without it. Options live in `rk.config`, read
from the `RECKERAS_*` variables at first use. What importing reckeras does
to the process, all of it:

* it sets `KERAS_BACKEND=torch` when the variable is unset, and raises
  `reckeras.BackendError` when Keras already runs another backend;
* it registers reckeras's Keras classes once Keras is imported, so that
  `keras.models.load_model` finds them: right away when Keras already is,
  else one finder on `sys.meta_path` waits for `import keras`, then removes
  itself (`reckeras._lazy` says why nothing else can).

Training changes more, and says so: `fit` tunes glibc's allocator for the
process unless `rk.config.set(malloc_tuning=False)`.

Example:

```python
import reckeras as rk   # before keras, or with KERAS_BACKEND=torch

columns = rk.layers.FeatureColumns([rk.features.Numeric("I1"),
                                    rk.features.Categorical("C1", dim=8)])
```
"""

import importlib

from reckeras import _lazy
from reckeras._backend import BackendError, select_torch_backend
from reckeras._lazy import after_import

select_torch_backend()

__version__ = "0.1.0"

_SUBMODULES = ("callbacks", "checkpoint", "config", "datasets", "distributed", "embedding",
               "features", "layers", "metrics", "models", "optimizers", "retrieval", "serving")
_NAMES = {"Model": "reckeras.pipeline.model", "NonFiniteStepError": "reckeras.pipeline.guard"}
# What registers reckeras's classes with Keras (layers, losses, metrics, the
# Model): imported as soon as Keras is, so `keras.models.load_model` finds them.
_KERAS_FACING = ("reckeras.layers", "reckeras.callbacks", "reckeras.metrics",
                 "reckeras.optimizers", "reckeras.models", "reckeras.retrieval",
                 "reckeras.pipeline.model")

__all__ = ["BackendError", "Model", "NonFiniteStepError"]
__all__.extend(_SUBMODULES)


def __getattr__(name: str) -> object:
    # Submodules load on first use: `import reckeras.serving` stays Keras-free.
    if name not in _SUBMODULES and name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if f"{__name__}.{name}" in _KERAS_FACING or name in _NAMES:
        importlib.import_module("keras")    # registers every Keras-facing module
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    return getattr(importlib.import_module(_NAMES[name]), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def _import_keras_facing() -> None:
    # Keras imported by one of these modules mid-import (`import
    # reckeras.layers` before Keras): importing the others now would meet it
    # half-initialized; what the user imports registers itself then.
    if not _lazy.importing_submodule_of(__name__):
        for module in _KERAS_FACING:
            importlib.import_module(module)


after_import("keras", _import_keras_facing)
