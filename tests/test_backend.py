import os
import subprocess
import sys

import keras
import pytest


def run(code, **env):
    environment = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    environment.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=environment, timeout=120)


@pytest.mark.slow
def test_import_selects_torch_backend():
    assert keras.backend.backend() == "torch"
    result = run("import reckeras, keras; print(keras.backend.backend())")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "torch"


def test_other_backend_is_refused_clearly():
    result = run("import reckeras", KERAS_BACKEND="jax")
    assert result.returncode != 0
    assert "reckeras needs Keras's torch backend" in result.stderr
    assert "KERAS_BACKEND='jax'" in result.stderr
