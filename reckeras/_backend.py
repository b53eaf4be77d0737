"""Selects Keras's torch backend before anything imports keras.

Keras reads `KERAS_BACKEND` once, when it is first imported, and its default
(TensorFlow) is usually not installed on recommender training hosts. reckeras
only runs on the torch backend, so it sets the variable when the user has not,
and refuses to start when Keras is already running another backend.
"""

import os
import sys


class BackendError(RuntimeError):
    """Raised when Keras runs a backend other than torch.

    Example:

    ```python
    import os

    os.environ["KERAS_BACKEND"] = "jax"
    import reckeras   # raises BackendError: reckeras needs Keras's torch backend
    ```
    """


def select_torch_backend() -> None:
    """Makes sure Keras runs, or will run, its torch backend.

    Sets `KERAS_BACKEND=torch` when the variable is unset and Keras is not
    imported yet; `import reckeras` calls it before importing keras.

    Raises:
        BackendError: when `KERAS_BACKEND` names another backend, or Keras
            was already imported with another backend.

    Example:

    ```python
    from reckeras._backend import select_torch_backend

    select_torch_backend()   # then `import keras` runs on torch
    ```
    """
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
