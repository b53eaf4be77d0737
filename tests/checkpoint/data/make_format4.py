"""Writes `format4/` (a full checkpoint and a delta on it) and
`format4/expected.npz` (every table's rows at each save; the dense
weights are those of each `dense.safetensors`) with the code
before `reckeras.checkpoint` (commit a6327ca, `reckeras/embedding/checkpoint.py`,
format 4). Kept to show how the fixture was made; it needs that code:

    git archive a6327ca reckeras | tar -x -C /tmp/old
    PYTHONPATH=/tmp/old python tests/checkpoint/data/make_format4.py
"""

import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from old_model import build, window  # noqa: E402

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "format4")


def snapshot(model, prefix):
    """Every table's rows, sorted by key."""
    arrays = {}
    for t, store in enumerate(model.embedding_layers[0].engine.tables):
        table = store.export()
        if getattr(store, "ages_by_windows", False):
            table["last_window"] = store.last_windows(table["keys"])
            arrays[f"{prefix}/T{t}.window"] = np.asarray(store.window)
        order = np.argsort(table["keys"])
        arrays.update({f"{prefix}/T{t}.{name}": np.asarray(values)[order]
                       for name, values in table.items()})
    return arrays


model = build()
shutil.rmtree(HERE, ignore_errors=True)
os.makedirs(HERE)
model.fit_windows([window(0), window(1)], batch_size=16, verbose=0)
model.save_checkpoint(os.path.join(HERE, "full"))
expected = snapshot(model, "full")
model.fit_windows([window(2), window(3)], batch_size=16, verbose=0)
model.save_checkpoint(os.path.join(HERE, "delta"), base=os.path.join(HERE, "full"))
expected.update(snapshot(model, "delta"))
np.savez_compressed(os.path.join(HERE, "expected.npz"), **expected)
