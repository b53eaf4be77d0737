"""Checkpoints of a whole model: full and delta, re-sharded from N ranks to
M, and loadable into a changed model (warm start).

The package reads and writes the engine's table states
(`rk.embedding.TableState`; the engine never imports it): `format` is the
on-disk layout and its versions, `plan` what goes where on load (N -> M
ranks, warm start matching, chains), `write` full and delta saves
(atomic), `load` checked loads, `files` the bytes of each file.
`rk.Model.save_checkpoint` and `load_checkpoint` call `save_checkpoint` and
`load_checkpoint` here.

Example:

```python
model.save_checkpoint("ckpt/full")
model.save_checkpoint("ckpt/delta1", base="ckpt/full")
report = model.load_checkpoint("ckpt/delta1")   # rk.checkpoint.LoadReport
```
"""

from reckeras.checkpoint.format import CheckpointError
from reckeras.checkpoint.load import load_checkpoint
from reckeras.checkpoint.plan import LoadReport
from reckeras.checkpoint.write import save_checkpoint

__all__ = ["CheckpointError", "LoadReport", "load_checkpoint", "save_checkpoint"]
