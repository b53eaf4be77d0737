"""The model and data of the format-4 fixture in `data/format4/`, which the
code before `reckeras.checkpoint` wrote (`data/make_format4.py`)."""

import reckeras as rk  # first: selects Keras's torch backend

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402


def build():
    """Two physical tables: `a` and `b` packed (dim 4, rows tagged), `c`
    (dim 2) aging out after 2 idle windows."""
    keras.utils.set_random_seed(0)
    columns = rk.layers.FeatureColumns([rk.features.Numeric("n"),
                                        rk.features.Categorical("a", dim=4),
                                        rk.features.Categorical("b", dim=4),
                                        rk.features.Categorical("c", dim=2)])
    model = rk.models.dcn_v2(columns, cross_layers=1, deep_units=(4,),
                             dropout=0.0, embedding_l2=0.0,
                             table_options={"c": rk.embedding.TableOptions(
                                 evict_idle_windows=2)})
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.Adagrad(0.1))
    return model


def window(w, n=64):
    """Window `w`'s examples: a few ids per feature, `c` changing by window."""
    rng = np.random.default_rng(w)
    return pa.table({"n": rng.normal(size=n).astype(np.float32),
                     "a": rng.integers(0, 12, n), "b": rng.integers(0, 6, n),
                     "c": rng.integers(0, 3, n) + 3 * w,
                     "label": (rng.random(n) < 0.5).astype(np.float32)})
