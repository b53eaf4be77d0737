"""What `import reckeras` adds to the process for Keras's registry: one
finder that waits for `import keras`, registers reckeras's classes (a saved
model then loads with `keras.models.load_model`) and removes itself; none
when Keras is already imported. Each case runs in a fresh process."""

import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

import reckeras as rk


def run(code, **env):
    environment = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    environment.update(env)
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)],
                            capture_output=True, text=True, env=environment, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.splitlines()


@pytest.mark.slow
def test_one_finder_waits_for_keras_then_registers_and_goes():
    lines = run("""
        import sys
        before = list(sys.meta_path)
        import reckeras
        added = [finder for finder in sys.meta_path if finder not in before]
        print(len(added), "keras" in sys.modules, repr(added[0]))
        import json, reckeras.serving            # other imports pass it by
        print(added[0] in sys.meta_path, "keras" in sys.modules)
        import keras
        print(added[0] in sys.meta_path,
              any(type(f).__module__.startswith("reckeras") for f in sys.meta_path))
        print(keras.saving.get_registered_object("reckeras>MLP").__module__)
    """)
    assert lines == ["1 False <reckeras._lazy: _import_keras_facing() after import keras>",
                     "True False", "False False", "reckeras.layers.mlp"]


@pytest.mark.slow
def test_with_keras_already_imported_nothing_is_added():
    lines = run("""
        import sys
        import keras
        import reckeras
        print(not any(type(f).__module__.startswith("reckeras") for f in sys.meta_path))
        print(keras.saving.get_registered_object("reckeras>MLP").__module__)
    """, KERAS_BACKEND="torch")
    assert lines == ["True", "reckeras.layers.mlp"]


@pytest.mark.slow
def test_a_saved_model_loads_with_keras_after_import_reckeras(tmp_path):
    keras.utils.set_random_seed(0)
    inputs = keras.Input(shape=(5,))
    outputs = rk.layers.MLP([4, 2], norm="layer")(inputs)
    model = keras.Model(inputs, outputs)
    path = tmp_path / "mlp.keras"
    model.save(path)
    x = np.random.default_rng(0).normal(size=(3, 5)).astype("float32")
    np.save(tmp_path / "x.npy", x)
    lines = run(f"""
        import numpy as np
        import reckeras
        import keras                       # after reckeras: the finder registers
        model = keras.models.load_model({str(path)!r})
        print(type(model.layers[1]).__name__)
        np.save({str(tmp_path / "y.npy")!r},
                keras.ops.convert_to_numpy(model(np.load({str(tmp_path / "x.npy")!r}))))
    """)
    assert lines == ["MLP"]
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"),
                               keras.ops.convert_to_numpy(model(x)), rtol=1e-6)
