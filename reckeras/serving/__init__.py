"""Serving: a trained model's artifact, predicted on without Keras.

`rk.Model.export_serving(path)` writes the artifact (feature specs with their
adapted statistics, the tables' rows, the dense network as a `torch.export`
program, a manifest with checksums); `load(path)` returns a `Predictor`
whose `predict` takes raw columns and returns numpy. After more training,
`export_serving(path, base=...)` writes a delta, which
`Predictor.apply_delta` applies atomically between requests (`DeltaError`
when it is damaged, partial or out of order). Importing this package
imports no Keras. `python -m reckeras.serving PATH --port N` serves it over
HTTP (`--watch DIR` and `--admin-port N` take deltas).

A two-tower model's export is a retrieval artifact: `load` returns a
`RetrievalPredictor`, whose `retrieve` answers the top K items of the corpus
for raw query rows, exact or through a faiss index (`index="hnsw"`/`"ivf"`),
and the server adds `POST /retrieve`.

Example:

```python
import reckeras.serving

predictor = reckeras.serving.load("exported/ctr")
predictor.predict({"I1": [1.0], "C1": [42]})
```
"""

from reckeras.serving.artifact import ArtifactError, DeltaError
from reckeras.serving.loader import load
from reckeras.serving.predictor import Predictor, ServedVersion
from reckeras.serving.retrieval import RetrievalPredictor

__all__ = ["ArtifactError", "DeltaError", "Predictor", "RetrievalPredictor", "ServedVersion",
           "load"]
