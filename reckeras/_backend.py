"""Selects Keras's torch backend before anything imports keras.

Keras reads ``KERAS_BACKEND`` once, when it is first imported, and its default
(TensorFlow) is usually not installed on recommender training hosts. reckeras
only runs on the torch backend, so it sets the variable when the user has not,
and refuses to start when Keras is already running another backend.
"""

import os
import sys


class BackendError(RuntimeError):
    """Raised when Keras runs a backend other than torch."""


def select_torch_backend():
    requested = os.environ.get("KERAS_BACKEND")
    if "keras" in sys.modules:
        import keras

        active = keras.backend.backend()
        if active != "torch":
            raise BackendError(
                f"reckeras needs Keras's torch backend, but Keras was already "
                f"imported with the {active!r} backend. Import reckeras before "
                f"keras, or set KERAS_BACKEND=torch.")
        return
    if requested is None:
        os.environ["KERAS_BACKEND"] = "torch"
    elif requested != "torch":
        raise BackendError(
            f"reckeras needs Keras's torch backend, but KERAS_BACKEND="
            f"{requested!r}. Unset it or set KERAS_BACKEND=torch.")
