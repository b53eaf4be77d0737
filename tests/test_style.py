"""Docstring style and type hints of every reckeras module (issue 13, item 8).

reckeras follows Keras's docstring style: a one-line summary, a Markdown body
with single-backtick `code`, then `Args:`, `Returns:` and `Example:` (with a
```python block) sections. This test walks every module of the package and,
for each public class, function and method *defined* in it (names imported
from elsewhere are checked where they are defined), checks:

* the docstring exists (module docstrings too);
* it has no reStructuredText double-backtick literals and no `>>>` doctest
  prompts (examples are ```python blocks under `Example:`; the backticks of
  a fence are not a literal);
* it has an `Args:` section when the signature takes parameters other than
  `self`/`cls`/`*args`/`**kwargs`; for a class, the parameters are those of
  its `__init__` and the section is in the class docstring, as in Keras;
* a function or method annotates every parameter (but the `self`/`cls` of a
  method) and its return (but `__init__`'s); a class annotates the
  parameters of the `__init__` it defines; a property annotates its return.

Public means: the name has no leading underscore. Modules whose own name is
private (`reckeras.datasets._dataset`) are checked all the same: the public
names they define are what the package exports. Dunder methods other than
`__init__` are not checked, nor classes nested in classes.

Keras overrides: a method in `KERAS_OVERRIDES` that overrides a method of
the same name on a Keras class the class inherits from (`call`, `build`,
`get_config` of a `keras.layers.Layer`; `update_state`, `result` of a
`keras.metrics.Metric`; ...) is documented once by Keras on the base class
and by the class docstring (`Call arguments:`, `Input shape:`), so like in
Keras's own layers it needs neither a docstring nor an `Args:` section. Its
signature still needs type hints, and a docstring it has follows the style.

`Returns:` and `Example:` sections are left to review: whether a function
returns something worth a section, or an object deserves an example, is not
read off its signature.

A module that does not import fails `test_module_imports` (and its other
tests); a package that does not import fails `test_walk_imports_every_package`
(the walk cannot list its modules). Every test is parametrized by module, so a
failure names the module, and its message lists every offending object with
what is wrong.
"""

import importlib
import inspect
import pkgutil
import re

import pytest

import reckeras

# Methods Keras documents on its base classes (Layer, Metric, Optimizer,
# Callback); see the module docstring.
KERAS_OVERRIDES = frozenset({
    # keras.layers.Layer / keras.Operation / keras.Model
    "build", "build_from_config", "call", "compute_mask",
    "compute_output_shape", "compute_output_spec", "from_config",
    "get_build_config", "get_config",
    # keras.metrics.Metric
    "reset_state", "result", "update_state",
    # keras.optimizers.Optimizer
    "update_step",
    # keras.callbacks.Callback
    "set_model", "set_params",
    "on_batch_begin", "on_batch_end", "on_epoch_begin", "on_epoch_end",
    "on_predict_batch_begin", "on_predict_batch_end", "on_predict_begin",
    "on_predict_end", "on_test_batch_begin", "on_test_batch_end",
    "on_test_begin", "on_test_end", "on_train_batch_begin",
    "on_train_batch_end", "on_train_begin", "on_train_end",
})


# Packages the walk could not import (it cannot list their submodules).
_WALK_ERRORS = []


def _module_names():
    names = [reckeras.__name__]
    for info in pkgutil.walk_packages(reckeras.__path__, prefix="reckeras.",
                                      onerror=_WALK_ERRORS.append):
        names.append(info.name)
    return sorted(names)


MODULES = _module_names()


def _import(name):
    # A module that cannot be imported fails its tests: none is skipped.
    return importlib.import_module(name)


def _is_public(name):
    return not name.startswith("_")


def _defined_here(obj, module):
    return getattr(obj, "__module__", None) == module.__name__


def _is_keras_override(cls, name):
    if name not in KERAS_OVERRIDES:
        return False
    for base in cls.__mro__[1:]:
        if (base.__module__.split(".")[0] == "keras"
                and name in vars(base)):
            return True
    return False


def _objects(module):
    """`(qualified name, kind, object, owning class)` of everything checked.

    `kind` is "class", "function", "method", "init" or "property"; the
    owning class is None for module-level objects.
    """
    found = []
    for name, obj in sorted(vars(module).items()):
        if not _is_public(name) or not _defined_here(obj, module):
            continue
        if inspect.isfunction(inspect.unwrap(obj)):
            # unwrap: a functools.lru_cache'd function is not a function.
            found.append((name, "function", obj, None))
        elif inspect.isclass(obj):
            found.append((name, "class", obj, None))
            for attr, member in sorted(vars(obj).items()):
                qualname = f"{name}.{attr}"
                if attr == "__init__" and inspect.isfunction(member):
                    # Not the one typing.Protocol puts on a protocol class.
                    if _defined_here(member, module):
                        found.append((qualname, "init", member, obj))
                elif not _is_public(attr):
                    continue
                elif isinstance(member, property):
                    if member.fget is not None:
                        found.append((qualname, "property", member.fget, obj))
                elif isinstance(member, (staticmethod, classmethod)):
                    found.append((qualname, "method", member.__func__, obj))
                elif inspect.isfunction(member):
                    found.append((qualname, "method", member, obj))
    return found


def _documented_params(function, skip_first):
    """The parameters an `Args:` section must describe."""
    params = list(inspect.signature(function).parameters.values())
    if skip_first and params:
        params = params[1:]
    return [p for p in params
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _has_section(doc, section):
    return any(line.strip() == section for line in doc.splitlines())


# Two backticks that are not part of a ```python fence.
_DOUBLE_BACKTICKS = re.compile(r"(?<!`)``(?!`)")


def _style_problems(doc):
    problems = []
    if _DOUBLE_BACKTICKS.search(doc):
        problems.append("has ``double backticks`` (use single backticks)")
    if ">>>" in doc:
        problems.append("has a >>> example (use a ```python block under "
                        "Example:)")
    return problems


def _docstring_problems(module):
    problems = []
    if not module.__doc__:
        problems.append(f"{module.__name__} (module): no docstring")
    else:
        problems += [f"{module.__name__} (module): {p}"
                     for p in _style_problems(module.__doc__)]
    for qualname, kind, obj, owner in _objects(module):
        if kind == "init":
            continue  # documented by the class docstring, checked with it
        doc = obj.__doc__  # not inspect.getdoc: it inherits a base's
        exempt = (owner is not None
                  and _is_keras_override(owner, qualname.rsplit(".", 1)[1]))
        if not doc:
            if not exempt:
                problems.append(f"{qualname}: no docstring")
            continue
        problems += [f"{qualname}: {p}" for p in _style_problems(doc)]
        if kind == "class":
            init = vars(obj).get("__init__")
            params = (_documented_params(init, skip_first=True)
                      if inspect.isfunction(init) else [])
        elif kind == "property":
            params = []
        else:
            params = _documented_params(obj, skip_first=owner is not None
                                        and not isinstance(
                                            vars(owner)[qualname.rsplit(
                                                ".", 1)[1]], staticmethod))
        if params and not exempt and not _has_section(doc, "Args:"):
            names = ", ".join(p.name for p in params)
            problems.append(f"{qualname}: no Args: section (takes {names})")
    return problems


def _annotation_problems(module):
    problems = []
    for qualname, kind, obj, owner in _objects(module):
        if kind == "class":
            continue  # its __init__ is checked as kind "init"
        params = list(inspect.signature(obj).parameters.values())
        first_is_bound = (owner is not None and not isinstance(
            vars(owner)[qualname.rsplit(".", 1)[1]], staticmethod))
        if first_is_bound and params:
            params = params[1:]
        missing = [p.name for p in params
                   if p.annotation is inspect.Parameter.empty]
        if missing:
            problems.append(f"{qualname}: parameters without a type hint: "
                            f"{', '.join(missing)}")
        if kind != "init" and (inspect.signature(obj).return_annotation
                               is inspect.Signature.empty):
            problems.append(f"{qualname}: no return type hint")
    return problems


@pytest.mark.parametrize("module_name", MODULES)
def test_module_imports(module_name):
    _import(module_name)


@pytest.mark.parametrize("module_name", MODULES)
def test_docstrings(module_name):
    problems = _docstring_problems(_import(module_name))
    assert not problems, (f"{module_name}: {len(problems)} docstring "
                          f"problem(s):\n  " + "\n  ".join(problems))


@pytest.mark.parametrize("module_name", MODULES)
def test_type_hints(module_name):
    problems = _annotation_problems(_import(module_name))
    assert not problems, (f"{module_name}: {len(problems)} missing type "
                          f"hint(s):\n  " + "\n  ".join(problems))


def test_walk_imports_every_package():
    # walk_packages ignores a package it cannot import unless told otherwise.
    assert not _WALK_ERRORS, f"packages that do not import: {_WALK_ERRORS}"


def test_walk_finds_the_package():
    # Guards the parametrization: an empty or partial walk would pass vacuously.
    for name in ("reckeras", "reckeras.layers.mlp", "reckeras.models.dlrm",
                 "reckeras.datasets._dataset", "reckeras.backend_kernels.hashing"):
        assert name in MODULES
