"""The one door into Keras internals.

Everything reckeras takes from `keras.src` or from a private Keras member is
reached through this module, and each shim has a test in
`tests/test_keras_compat.py`. When a Keras upgrade moves or changes one of
them, that test fails and this file is the only place to mend.

`pyproject.toml` admits the Keras releases CI runs the suite on: the newest
(`scripts/test.sh`) and the oldest (`scripts/test_oldest_keras.sh`). The range
stops before 3.16: Keras's main branch after 3.15 wraps the model in DDP
inside `make_train_function` and all-reduces metric variables in
`get_metrics_result`, while reckeras averages gradients and reduces metrics
itself, so that release must be checked (and this module mended) before the
range is widened.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeAlias

import keras
import torch
from keras.src import backend as _backend
from keras.src.backend import in_stateless_scope as _in_stateless_scope
from keras.src.backend.common import global_state as _global_state
from keras.src.backend.torch import core as _torch_core
from keras.src.models import functional as _functional
from keras.src.models import model as _model

# A mixin of `rk.Model` (its methods run on a `keras.Model`) derives from
# `ModelMixin`: the type checker reads `self.fit(...)` and `super().save(...)`
# as the Keras model's; at run time the base is `object` and `rk.Model` lists
# `keras.Model` itself.
if TYPE_CHECKING:
    ModelMixin: TypeAlias = keras.Model
else:
    ModelMixin = object

# ---- backend ---------------------------------------------------------------------

def keras_device() -> torch.device:
    """The torch device Keras places tensors on (`cuda` when available).

    Returns:
        A `torch.device`.
    """
    return torch.device(_torch_core.get_device())


def torch_dtype(dtype: str) -> torch.dtype:
    """The torch dtype of a Keras dtype name (`"float32"` -> `torch.float32`).

    Args:
        dtype: a Keras dtype name.

    Returns:
        The `torch.dtype`.
    """
    return _torch_core.to_torch_dtype(dtype)


def in_stateless_scope() -> bool:
    """Whether Keras is tracing a stateless call (no variable may change).

    Returns:
        True inside `keras.StatelessScope`.
    """
    return _in_stateless_scope()


def writing_legacy_hdf5() -> bool:
    """Whether Keras is writing (or reading) a legacy HDF5 model file.

    `keras.saving.save_model(model, "m.h5")` asks the model for its config
    inside this scope, before it writes any weight: the one moment an
    `rk.Model` saved that way, not through its own `save`, can refuse.

    Returns:
        True inside Keras's legacy-config scope (`.h5`/`.hdf5` files).
    """
    return bool(_global_state.get_global_attribute("use_legacy_config", False))


class DeferredAssignments(keras.StatelessScope):
    """A scope around a training step's forward: the variables it assigns
    (BatchNormalization's moving statistics, a seeded Dropout's seed, a
    loss tracker) keep their values until `commit`, and layers' added losses
    are collected as in any stateless scope.

    Keras's `StatelessScope` keeps the assigned values by variable id; this
    one also keeps the variables (its `add_update`, which `Variable.assign`
    calls inside a scope) so that `commit` can write them back.

    Example:

    ```python
    with DeferredAssignments() as assigned:
        loss = model.compute_loss(y=y, y_pred=model(x, training=True))
    if torch.isfinite(loss):
        assigned.commit(model)
    ```
    """

    def __init__(self) -> None:
        super().__init__(collect_losses=True)
        self.assigned: dict[int, Any] = {}
        self.writes: list[Callable[[], None]] = []

    def add_update(self, update: tuple) -> None:
        """Keeps `(variable, value)` until `commit` (Keras's scope hook).

        Args:
            update: `(variable, value)`, what `Variable.assign` hands the scope.
        """
        self.assigned[id(update[0])] = update[0]
        super().add_update(update)

    def commit(self, model: keras.Model) -> None:
        """Gives each variable assigned in the scope its last value, and
        hands `model`'s layers the losses they added, as `model.losses`
        reads them after an unscoped call (call it after the scope closed).

        Args:
            model: the model whose forward ran in the scope.
        """
        for key, variable in self.assigned.items():
            variable.assign(self.state_mapping[key])
        for write in self.writes:
            write()
        if self.losses:
            for layer in model._flatten_layers(include_self=True, recursive=True):
                layer._losses.extend(loss for loss in self.losses
                                     if id(loss) in layer._loss_ids)


def defer_write(write: Callable[[], None]) -> bool:
    """Holds an in-place state write until the training step commits.

    A layer that updates its variables in place (not through `assign`)
    hands the write here: inside a training step's `DeferredAssignments` it
    runs at `commit`, so a refused step does not write it.

    Args:
        write: writes the new state.

    Returns:
        True when it waits for the commit; False outside a training step,
        where the caller writes at once.
    """
    scope = _backend.get_stateless_scope() if _in_stateless_scope() else None
    if not isinstance(scope, DeferredAssignments):
        return False
    scope.writes.append(write)
    return True


# ---- layers ----------------------------------------------------------------------

def accept_raw_inputs(layer: keras.layers.Layer) -> None:
    """Lets `layer.__call__` pass its positional inputs through unconverted.

    A layer that converts raw columns itself (FeatureColumns, hundreds of
    inputs) would otherwise pay Keras's per-input conversion, a pytree walk
    per call, only to repeat it.

    Args:
        layer: the layer, in its `__init__`.
    """
    layer._convert_input_args = False
    layer._allow_non_tensor_positional_args = True


def walk_layers(model: keras.Model) -> list:
    """Every layer inside `model`, nested models included, each once.

    Args:
        model: a built Keras model.

    Returns:
        The layers, without `model` itself.
    """
    return list(model._flatten_layers(include_self=False))


def call_built(layer: keras.layers.Layer, inputs: Any, **kwargs: Any) -> Any:
    """`layer(inputs, **kwargs)` from inside a model's `call`, without
    Keras's per-call bookkeeping where that bookkeeping changes nothing.

    A built layer called eagerly on torch tensors, with no autocast (its
    compute dtype is its variable dtype, no autocast scope open), outside a
    stateless scope other than a training step's `DeferredAssignments`,
    with no activity regularizer, no mask support and no torch hooks, gets
    nothing from `__call__` but pytree walks over its inputs, a call context
    and a name scope (80 to 200 us a layer on CPU, ~0.5 ms of a two-tower
    step): it runs `layer.call` directly. Any other call goes through
    `__call__`. The caller passes `training` itself
    (`__call__` would resolve it from the outer call), and the outer
    model's `__call__` still clears the layer's losses each step.

    Args:
        layer: a Keras layer inside the calling model.
        inputs: its first argument: a tensor, or a dict of tensors.
        **kwargs: its other arguments.

    Returns:
        What `layer(inputs, **kwargs)` returns.
    """
    first = next(iter(inputs.values()), None) if isinstance(inputs, dict) else inputs
    policy = layer.dtype_policy
    if (layer.built and isinstance(first, torch.Tensor)
            and policy.compute_dtype == policy.variable_dtype
            and _backend.get_autocast_scope() is None
            and (not _in_stateless_scope()
                 or isinstance(_backend.get_stateless_scope(), DeferredAssignments))
            and layer.activity_regularizer is None and not layer.supports_masking
            and not (layer._forward_hooks or layer._forward_pre_hooks)):
        return layer.call(inputs, **kwargs)
    return layer(inputs, **kwargs)


# ---- trainer ---------------------------------------------------------------------

def update_loss_tracker(model: keras.Model, loss: torch.Tensor, count: int) -> None:
    """Adds a step's loss to the `loss` entry of `model.metrics`.

    Args:
        model: a compiled Keras model.
        loss: the step's (scalar) loss.
        count: the examples it averages over.
    """
    model._loss_tracker.update_state(loss, sample_weight=count)


def initial_epoch(model: keras.Model, requested: int) -> int:
    """The epoch `fit` starts at: a callback's choice (`BackupAndRestore`
    sets one in `on_train_begin`) or else the one `fit` was given.

    Args:
        model: the model being fitted.
        requested: `fit`'s `initial_epoch` argument.

    Returns:
        The epoch to start at.
    """
    return getattr(model, "_initial_epoch", None) or requested


# ---- functional graph --------------------------------------------------------------

def run_functional_graph(model: keras.Model, flat_inputs: list, training: bool,
                         replace: dict) -> Any:
    """Runs a functional model's graph on flat inputs, without `__call__`.

    `Layer.__call__` walks the whole input structure several times
    (conversion, masks, symbolic checks); with hundreds of feature inputs
    that is a measurable part of a step. Here the model opens the call context
    itself (clearing the last call's losses and passing `training` on, as
    `__call__` does) and runs its graph.

    Args:
        model: a built functional model whose inputs `flat_inputs` already
            match (dtype, rank, device), in Keras's flat order.
        flat_inputs: the input tensors.
        training: the `training` flag passed to every layer that takes one.
        replace: `{layer: fn}`: the graph calls `fn(*args, **kwargs)` instead
            of the layer (`fn` passes `training` on itself where it should).

    Returns:
        The model's outputs, as `model(...)` returns them, or None when a
        call context is already open (the model is called inside another
        layer): the caller then calls the model as usual.
    """
    if _global_state.get_global_attribute("current_call_ctx") is not None:
        return None
    context = model._get_call_context()        # the model is the entry layer
    context.set_value("training", training)

    def operation(op):
        return replace.get(op) or _functional.operation_fn(op, training=training)

    try:
        outputs = model._run_through_graph(flat_inputs, operation_fn=operation)
    finally:
        model._maybe_reset_call_context()
    return _functional.unpack_singleton(outputs)


@contextlib.contextmanager
def symbolic_shapes_kept() -> Iterator[None]:
    """While `torch.export` traces Keras layers: their symbolic sizes kept.

    A layer's input-spec check standardizes its input's shape; Keras before
    3.14 does it with `int(d)` on every dimension, which fixes a symbolic
    batch size to the example's (the exported program then refuses any other
    batch) and fails on a data-dependent size (the packed tokens of a
    `TransformerBlock`). Inside this context a symbolic dimension reads as
    None (unknown), as newer Keras reads it. Not thread-safe: the export
    holds it for its trace only.
    """
    original = _backend.standardize_shape

    def keep_symbolic(shape):
        if isinstance(shape, (tuple, list, torch.Size)):
            shape = tuple(None if isinstance(d, torch.SymInt) else d for d in shape)
        return original(shape)

    _backend.standardize_shape = keep_symbolic
    try:
        yield
    finally:
        _backend.standardize_shape = original


Functional = _functional.Functional


def functional_init_arguments(args: tuple, kwargs: dict) -> bool:
    """Whether a model's constructor arguments are a functional model's
    (`inputs` and `outputs`), by Keras's own signature detection.

    Args:
        args: the constructor's positional arguments.
        kwargs: its keyword arguments.

    Returns:
        True for `Model(inputs, outputs)` and its keyword forms.
    """
    return _model.functional_init_arguments(args, kwargs)


def init_functional_model(model: keras.Model, args: tuple, kwargs: dict) -> None:
    """`keras.Model.__init__` of a functional model, without the rewrite of
    class bases that Keras does for a subclass given `(inputs, outputs)`.

    Keras's `Model.__init__` first initializes the backend trainer, then
    rewrites the `__bases__` of every class between the instance's class and
    `keras.Model` to put `Functional` in (the class itself is changed, for
    every later instance too). A class whose `__mro__` already holds
    `Functional` needs no rewrite: this runs the two initializations only.

    Args:
        model: an instance whose class has `Functional` in its `__mro__`.
        args: the `(inputs, outputs, ...)` positional arguments.
        kwargs: the keyword arguments.
    """
    # The class right after keras.Model in the MRO is the backend's trainer.
    super(keras.Model, model).__init__()
    _functional.Functional.__init__(model, *args, **kwargs)


def functional_inputs(model: keras.Model) -> Any:
    """The structure of `keras.Input` a functional model was built on.

    Args:
        model: a functional model.

    Returns:
        The inputs as declared (a dict for `rk.Model`).
    """
    return model._inputs_struct


def functional_outputs(model: keras.Model) -> Any:
    """The structure of outputs a functional model was built with.

    Args:
        model: a functional model.

    Returns:
        A tensor, a list or a dict of symbolic tensors, as given.
    """
    return model._outputs_struct


class DeclaredInputsShortcut(ModelMixin):
    """Mixin for a functional `keras.Model`: inputs that already match what
    the model declares skip Keras's per-call standardization.

    Keras converts, re-ranks and checks every input through pytree walks;
    with hundreds of feature inputs that was a fifth of a training step. The
    call's clearing of the layers' losses also skips the InputLayers. The
    mixin asks `self.inputs_as_declared(inputs)` (the subclass's fast check:
    the flat input list, or None) and gives every other input Keras's own
    path and messages.
    """

    def inputs_as_declared(self, inputs: Any) -> list | None:
        """The flat input list when `inputs` match the declaration, else None.

        Args:
            inputs: what the model is called on.

        Returns:
            The tensors in Keras's flat order, or None.
        """
        raise NotImplementedError

    def _standardize_inputs(self, inputs):
        flat = self.inputs_as_declared(inputs)
        return flat if flat is not None else super()._standardize_inputs(inputs)

    def _assert_input_compatibility(self, *args):
        if args and self.inputs_as_declared(args[0]) is not None:
            return
        super()._assert_input_compatibility(*args)

    def _clear_losses(self):
        # Keras's `Layer._clear_losses`, without visiting the InputLayers: an
        # InputLayer has no call and holds no loss, and with hundreds of
        # feature inputs the visit was ~4% of a `wide` training step (the
        # model clears its layers' losses at the start of every call).
        if _in_stateless_scope():
            scope = _backend.get_stateless_scope()
            if scope.collect_losses:
                scope.losses[:] = [x for x in scope.losses if id(x) not in self._loss_ids]
        self._losses.clear()
        self._loss_ids.clear()
        for layer in self._layers:
            if not isinstance(layer, keras.layers.InputLayer):
                layer._clear_losses()

    def _maybe_warn_inputs_struct_mismatch(self, inputs, raise_exception=False):
        # A dict with exactly the model's input names is told apart in one set
        # comparison instead of a pytree walk over every input.
        struct = self._inputs_struct
        if isinstance(inputs, dict) and isinstance(struct, dict) \
                and inputs.keys() == struct.keys() \
                and not any(isinstance(v, (dict, list, tuple)) for v in inputs.values()):
            return
        super()._maybe_warn_inputs_struct_mismatch(inputs, raise_exception)


def freeze_input_spec(model: keras.Model) -> None:
    """Builds a functional model's input spec once.

    Keras rebuilds it (one InputSpec per input) on every call; with hundreds
    of feature inputs that showed in the step time, and the graph is fixed.

    Args:
        model: a functional model, in its `__init__`.
    """
    model.input_spec = model.input_spec


def called_once_on_outputs_of(layer: keras.layers.Layer,
                              source: keras.layers.Layer) -> bool:
    """Whether `layer` is called exactly once in its graph, on outputs of
    `source` only.

    Args:
        layer: a layer of a functional model.
        source: another layer of it.

    Returns:
        True when the layer has one inbound node and every tensor it takes
        comes straight from a call of `source`.
    """
    nodes = layer._inbound_nodes
    if len(nodes) != 1:
        return False
    parents = nodes[0].parent_nodes
    return bool(parents) and all(parent.operation is source for parent in parents)


def metrics_in_order(model: keras.Model, logs: dict) -> Any:
    """`logs` as the list Keras's `evaluate` and `*_on_batch` return.

    Keras orders the values by its metrics (the loss first, then the
    compiled metrics), not by the dict's order, which differs between Keras
    releases (3.10 puts the compiled metrics first).

    Args:
        model: the compiled model.
        logs: `{name: value}` of its metrics.

    Returns:
        The values in Keras's order: a list, or the value when there is one.
    """
    return model._flatten_metrics_in_order(logs)
