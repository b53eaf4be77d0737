"""Lazy submodules, and Keras's registry filled once Keras is imported.

`import reckeras` must not import Keras: the serving predictor
(`reckeras.serving`) runs without it. Yet a model saved with reckeras layers
loads with `keras.models.load_model` only if those layers are registered with
Keras, which happens when their modules are imported: Keras resolves a class
of a package other than its own only through its registry
(`registered_name`, e.g. `"reckeras>MLP"`), and imports a class's `module`
only for `keras`, `keras_hub`, `keras_cv` and `keras_nlp`
(`keras/src/saving/serialization_lib.py`, `_retrieve_class_or_fn`). So the
Keras-facing modules are imported as soon as Keras itself is: right away when
it already is, otherwise by a finder that watches for the first
`import keras` and imports them after Keras's own module has run.

The finder is the one thing `import reckeras` adds to the process when Keras
is not imported yet: one entry at the front of `sys.meta_path` that answers
only for the name `keras` (every other import passes it by with a string
comparison), runs once and removes itself. There is no other way to register
the classes at the first `import keras` without importing Keras earlier.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Callable


def after_import(module: str, callback: Callable[[], None]) -> None:
    """Runs `callback` once `module` is imported, by whoever imports it.

    Args:
        module: a top-level module name, e.g. `"keras"`.
        callback: called with no arguments right after the module has run
            (now, if it is imported already).

    Example:

    ```python
    from reckeras._lazy import after_import

    after_import("keras", lambda: importlib.import_module("reckeras.layers"))
    ```
    """
    if module in sys.modules:
        callback()
        return
    sys.meta_path.insert(0, _AfterImport(module, callback))


def importing_submodule_of(package: str) -> bool:
    """Whether a submodule of `package` is being imported right now.

    Args:
        package: a package name, e.g. `"reckeras"`.

    Returns:
        True while some `package.*` module's code is still running (the
        import system marks its spec as initializing).

    Example:

    ```python
    from reckeras._lazy import importing_submodule_of

    importing_submodule_of("reckeras")   # False outside of an import
    ```
    """
    prefix = package + "."
    return any(getattr(getattr(module, "__spec__", None), "_initializing", False)
               for name, module in list(sys.modules.items()) if name.startswith(prefix))


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds `module` with the other finders and wraps its loader."""

    def __init__(self, module: str, callback: Callable[[], None]):
        self.module = module
        self.callback = callback

    def __repr__(self) -> str:
        return f"<reckeras._lazy: {self.callback.__qualname__}() after import {self.module}>"

    def find_spec(self, fullname: str, path: object = None,
                  target: types.ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.module:
            return None
        sys.meta_path.remove(self)      # once; and the search below skips it
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenCall(spec.loader, self.callback)
        return spec


class _ThenCall(importlib.abc.Loader):
    """A loader that runs the wrapped loader, then the callback."""

    def __init__(self, loader: importlib.abc.Loader, callback: Callable[[], None]):
        self._loader = loader
        self._callback = callback

    def create_module(self, spec: importlib.machinery.ModuleSpec
                      ) -> types.ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._loader.exec_module(module)
        # The module's own loader from now on (resource readers and the like).
        module.__loader__ = self._loader
        if module.__spec__ is not None:      # set by the import system; typeshed allows None
            module.__spec__.loader = self._loader
        self._callback()

    def __getattr__(self, name: str) -> object:
        return getattr(self._loader, name)
