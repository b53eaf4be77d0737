"""reckeras: Keras 3 recommender training on the torch backend.

Importing reckeras selects Keras's torch backend when `KERAS_BACKEND` is
unset, and raises `reckeras.BackendError` when Keras already runs another
backend. It also tunes glibc's allocator for training (see
`reckeras._allocator`; `RECKERAS_MALLOC_TUNING=0` turns that off).

Example:

```python
import reckeras as rk   # before keras, or with KERAS_BACKEND=torch

columns = rk.layers.FeatureColumns([rk.features.Numeric("I1"),
                                    rk.features.Categorical("C1", dim=8)])
```
"""

from reckeras._allocator import tune_malloc
from reckeras._backend import BackendError, select_torch_backend

select_torch_backend()
tune_malloc()

from reckeras import callbacks  # noqa: E402
from reckeras import datasets  # noqa: E402
from reckeras import distributed  # noqa: E402
from reckeras import embedding  # noqa: E402
from reckeras import features  # noqa: E402
from reckeras import layers  # noqa: E402
from reckeras import metrics  # noqa: E402
from reckeras import models  # noqa: E402
from reckeras import optimizers  # noqa: E402
from reckeras.pipeline.guard import NonFiniteStepError  # noqa: E402
from reckeras.pipeline.model import Model  # noqa: E402


__version__ = "0.1.0"

__all__ = ["BackendError", "Model", "NonFiniteStepError", "callbacks", "datasets", "distributed", "embedding", "features",
           "layers", "metrics", "models", "optimizers"]
