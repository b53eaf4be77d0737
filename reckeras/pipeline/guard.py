"""The non-finite guard of a training step.

A step whose loss, or any dense or embedding gradient, is NaN or inf must
change no dense weight, no table row and no optimizer state. `rk.Model`'s
`train_step` runs backward with the tables' updates deferred
(`EmbeddingEngine.deferred_updates`), asks `step_is_finite`, and only then
applies the updates and the dense optimizer; else it discards them and, under
`compile(nonfinite="raise")`, raises `NonFiniteStepError` naming what was not
finite (`nonfinite_parts`).

The check costs one scalar read per step: each tensor's flag
(`embedding.updates.all_finite`, one sum) stays on the device, the flags are
stacked into one, all-reduced across ranks (so that every rank applies or
skips together: one rank's NaN is every rank's) and read once.
"""

from __future__ import annotations

import torch

from reckeras import distributed
from reckeras.embedding.updates import all_finite


class NonFiniteStepError(FloatingPointError):
    """A training step's loss or gradients were not finite (NaN or inf).

    Raised by `fit` under `compile(nonfinite="raise")` after the step was
    undone: no dense weight, table row or optimizer state changed.

    Example:

    ```python
    try:
        model.fit(train)
    except rk.NonFiniteStepError as error:
        print(error)        # "training step 17 of epoch 2: the loss is not finite ..."
    ```
    """


def step_is_finite(loss: torch.Tensor, gradients: list, updates: list) -> bool:
    """Whether a step may be applied, agreed by every rank.

    Args:
        loss: the step's loss.
        gradients: the dense gradients (None entries are skipped).
        updates: the `DeferredUpdates` of every embedding engine.

    Returns:
        True when the loss and every gradient are finite on every rank.
    """
    flags = [all_finite(loss)]
    flags += [all_finite(g) for g in gradients if g is not None]
    flags += [update.finite() for update in updates]
    finite = torch.stack(flags).all().to(torch.int32)
    if distributed.world().size > 1:
        with distributed.collective("agreeing that the step is finite"):
            torch.distributed.all_reduce(finite, op=torch.distributed.ReduceOp.MIN)
    return bool(finite)               # the step's one scalar read


def nonfinite_parts(loss: torch.Tensor, named_gradients: list,
                    named_updates: list) -> list[str]:
    """What was not finite in a refused step, for its error message.

    Runs only once a step is refused, so it may read a flag per tensor.

    Args:
        loss: the step's loss.
        named_gradients: `(variable path, gradient or None)` pairs.
        named_updates: `(embedding layer name, DeferredUpdates)` pairs.

    Returns:
        Descriptions such as `"the loss"`; empty when only another rank's
        values were not finite.
    """
    parts = [] if bool(all_finite(loss)) else ["the loss"]
    parts += [f"the gradient of {path}" for path, gradient in named_gradients
              if gradient is not None and not bool(all_finite(gradient))]
    parts += [f"an embedding gradient of {name}" for name, update in named_updates
              if not bool(update.finite())]
    return parts
