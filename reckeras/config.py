"""reckeras's options: one object, read from the environment once.

Every `RECKERAS_*` environment variable is read here and nowhere else, the
first time an option is needed (not at `import reckeras`). Code reads the
options with `rk.config.options()` and changes them with `rk.config.set`:

| option | variable | default | what it does |
|---|---|---|---|
| `malloc_tuning` | `RECKERAS_MALLOC_TUNING` | `True` | `fit` tunes glibc's allocator |
| `onednn_dense` | `RECKERAS_ONEDNN_DENSE` | `True` | the model's `Dense` in oneDNN on CPU |
| `native_kernels` | `RECKERAS_NATIVE` | `None` | C kernels: where built; `True` required |
| `native_sanitize` | `RECKERAS_NATIVE_SANITIZE` | `False` | C kernels built with ASan, UBSan |
| `cache_dir` | `RECKERAS_CACHE_DIR` | `~/.cache/reckeras` | where C kernels are compiled to |
| `timeout_s` | `RECKERAS_TIMEOUT_S` | `300.0` | `rk.distributed.init`'s timeout |
| `ranks_per_node` | `RECKERAS_RANKS_PER_NODE` | `None` | ranks per node (or `LOCAL_WORLD_SIZE`) |

A boolean variable is `1`, `true`, `yes`, `on` or `0`, `false`, `no`,
`off` (any case); an empty variable counts as unset. A value that does not
parse raises a `ValueError` naming the variable.

Each option is read where it acts: `malloc_tuning` when `fit` starts,
`onednn_dense` at a model's first step, the kernel options when the C
kernels are first loaded, the distributed ones by `rk.distributed.init`.
Set an option before that point; afterwards it changes nothing.

Variables of other tools keep their owners' meaning and are read where they
act: `KERAS_BACKEND` (Keras; `import reckeras` sets it to `torch` when
unset), `WORLD_SIZE` and `LOCAL_WORLD_SIZE` (torchrun), `TRITON_INTERPRET`
(Triton) and `CC` (the C compiler).

Example:

```python
import reckeras as rk

rk.config.options().malloc_tuning        # True unless RECKERAS_MALLOC_TUNING=0
rk.config.set(malloc_tuning=False, onednn_dense=False)
```
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Mapping
from typing import Any

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclasses.dataclass(frozen=True)
class Options:
    """reckeras's options (see the table in `reckeras.config`).

    Build one with `Options.from_environment`, or get the ones in force with
    `rk.config.options()`.

    Args:
        malloc_tuning: whether `fit` (and `fit_windows`) tune glibc's
            allocator for the whole process before training: freed memory
            stays in the process instead of being returned to the OS and
            faulted in again every step (see `reckeras._allocator`).
        onednn_dense: whether the float32 CPU matmuls of the model's own
            `keras.layers.Dense` layers (those in the model's graph, and
            those inside reckeras's layers such as `rk.layers.MLP`) run in
            oneDNN instead of MKL. Other code is never routed.
        native_kernels: whether the C kernels are used on CPU. `None` (the
            default): where they build, else a warning names what is
            missing and the torch reference kernels run. `True`: required,
            so a failed build raises a `RuntimeError` that says why (e.g. no
            C compiler). `False`: never; the torch reference kernels run.
        native_sanitize: whether the C kernels are built with AddressSanitizer
            and UndefinedBehaviorSanitizer (a failed build then raises).
        cache_dir: the directory the C kernels are compiled into.
        timeout_s: the timeout of collective operations, in seconds, when
            `rk.distributed.init` is not given one.
        ranks_per_node: ranks per node when `rk.distributed.init` is not
            given it; None takes torchrun's `LOCAL_WORLD_SIZE`, else the
            world size.

    Example:

    ```python
    options = Options.from_environment({"RECKERAS_MALLOC_TUNING": "0"})
    options.malloc_tuning                 # False
    ```
    """

    malloc_tuning: bool = True
    onednn_dense: bool = True
    native_kernels: bool | None = None
    native_sanitize: bool = False
    cache_dir: pathlib.Path = pathlib.Path.home() / ".cache" / "reckeras"
    timeout_s: float = 300.0
    ranks_per_node: int | None = None

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            checked = _CHECKS[field.name](field.name, value)
            object.__setattr__(self, field.name, checked)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> Options:
        """The options the `RECKERAS_*` variables of `environ` ask for.

        Args:
            environ: the environment, e.g. `os.environ`.

        Returns:
            The `Options`: a variable that is unset (or empty) leaves its
            option at the default.

        Raises:
            ValueError: for a value that does not parse, naming the variable.

        Example:

        ```python
        Options.from_environment({"RECKERAS_TIMEOUT_S": "60"}).timeout_s   # 60.0
        ```
        """
        found: dict[str, Any] = {}           # each option's own type
        for name, variable in VARIABLES.items():
            text = environ.get(variable, "")
            if text:
                found[name] = _PARSERS[name](variable, text)
        return cls(**found)


# The environment variable of each option.
VARIABLES = {
    "malloc_tuning": "RECKERAS_MALLOC_TUNING",
    "onednn_dense": "RECKERAS_ONEDNN_DENSE",
    "native_kernels": "RECKERAS_NATIVE",
    "native_sanitize": "RECKERAS_NATIVE_SANITIZE",
    "cache_dir": "RECKERAS_CACHE_DIR",
    "timeout_s": "RECKERAS_TIMEOUT_S",
    "ranks_per_node": "RECKERAS_RANKS_PER_NODE",
}


def _parse_bool(variable: str, text: str) -> bool:
    if text.strip().lower() in _TRUE:
        return True
    if text.strip().lower() in _FALSE:
        return False
    raise ValueError(f"{variable}={text!r} is not a boolean: use 1 or 0 "
                     f"(or true/false, yes/no, on/off)")


def _parse_seconds(variable: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{variable}={text!r} is not a number of seconds") from None


def _parse_count(variable: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{variable}={text!r} is not a whole number") from None


_PARSERS = {"malloc_tuning": _parse_bool, "onednn_dense": _parse_bool,
            "native_kernels": _parse_bool, "native_sanitize": _parse_bool,
            "cache_dir": lambda variable, text: pathlib.Path(text),
            "timeout_s": _parse_seconds, "ranks_per_node": _parse_count}


def _where(name: str) -> str:
    return f"rk.config option {name} ({VARIABLES[name]})"


def _check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{_where(name)} must be True or False, got {value!r}")
    return value


def _check_optional_bool(name: str, value: Any) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"{_where(name)} must be True, False or None, got {value!r}")
    return value


def _check_path(name: str, value: Any) -> pathlib.Path:
    if not isinstance(value, (str, os.PathLike)):
        raise ValueError(f"{_where(name)} must be a path, got {value!r}")
    return pathlib.Path(value)


def _check_seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{_where(name)} must be a positive number of seconds, "
                         f"got {value!r}")
    return float(value)


def _check_count(name: str, value: Any) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or value < 1):
        raise ValueError(f"{_where(name)} must be a positive int or None, got {value!r}")
    return value


_CHECKS = {"malloc_tuning": _check_bool, "onednn_dense": _check_bool,
           "native_kernels": _check_optional_bool, "native_sanitize": _check_bool,
           "cache_dir": _check_path, "timeout_s": _check_seconds,
           "ranks_per_node": _check_count}

_current: Options | None = None


def options() -> Options:
    """The options in force: the environment's, read at the first call,
    with what `set` changed since.

    Returns:
        The `Options` (frozen: change them with `set`).

    Raises:
        ValueError: at the first call, for a `RECKERAS_*` variable whose
            value does not parse.

    Example:

    ```python
    rk.config.options().timeout_s      # 300.0 unless RECKERAS_TIMEOUT_S is set
    ```
    """
    global _current
    if _current is None:
        _current = Options.from_environment(os.environ)
    return _current


def set(**changes: Any) -> None:  # noqa: A001 - rk.config.set, as keras.config's setters
    """Changes options for the rest of the process (the environment is not
    changed, nor read again).

    Args:
        **changes: option names and their new values, e.g.
            `malloc_tuning=False`.

    Raises:
        ValueError: for a name that is not an option (the message lists
            them) or a value of the wrong kind.

    Example:

    ```python
    rk.config.set(onednn_dense=False)     # the next model runs torch's matmul
    ```
    """
    global _current
    unknown = sorted(name for name in changes if name not in VARIABLES)
    if unknown:
        raise ValueError(f"rk.config has no option {', '.join(map(repr, unknown))}; "
                         f"the options are {', '.join(VARIABLES)}")
    _current = dataclasses.replace(options(), **changes)
