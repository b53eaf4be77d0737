"""A functional model's declared dict inputs, matched in one pass.

Keras converts, re-ranks and checks every input of a functional model through
pytree walks; with hundreds of feature inputs that was a fifth of a training
step. What the loops feed (a dict of exactly the input names, torch tensors
of the declared dtypes, ranks and fixed sizes on the Keras device) is told
apart here with one signature comparison; anything else takes Keras's own
path and messages (`_keras_compat.DeclaredInputsShortcut`).
"""

from __future__ import annotations

from typing import Any

import keras
import torch

from reckeras import _keras_compat


class DeclaredInputs:
    """A functional model's dict inputs in Keras's flat order, with the dtype,
    rank and fixed axis sizes each one is declared with.

    Args:
        keys: the input names in Keras's flat order.
        tensors: their `keras.Input` tensors, in that order.

    Example:

    ```python
    declared = DeclaredInputs.of(columns.inputs())
    flat = declared.match(batch_inputs)     # the tensors in flat order, or None
    ```
    """

    def __init__(self, keys: list, tensors: list):
        self.keys = keys
        self.names = set(keys)
        self._dtypes_and_ranks = [(_keras_compat.torch_dtype(t.dtype), len(t.shape))
                                  for t in tensors]
        self._signatures: dict[str, list[tuple[torch.dtype, int, str]]] = {}
        self.fixed_sizes = [(index, axis, size) for index, t in enumerate(tensors)
                            for axis, size in enumerate(t.shape) if size is not None]

    @classmethod
    def of(cls, inputs_struct: Any) -> DeclaredInputs | None:
        """The declaration of a dict of `keras.Input`.

        Args:
            inputs_struct: what the functional model was built on.

        Returns:
            A `DeclaredInputs`, or None for any other structure (or sparse or
            ragged inputs).
        """
        if not isinstance(inputs_struct, dict) or any(
                not isinstance(t, keras.KerasTensor) or t.sparse or t.ragged
                for t in inputs_struct.values()):
            return None
        keys = keras.tree.flatten({key: key for key in inputs_struct})
        return cls(keys, [inputs_struct[key] for key in keys])

    def signature(self, device_type: str) -> list:
        """`(dtype, rank, device type)` of every input, in flat order.

        Args:
            device_type: `"cpu"`, `"cuda"`, ...

        Returns:
            The list (built once per device type).
        """
        if device_type not in self._signatures:
            self._signatures[device_type] = [(dtype, rank, device_type)
                                             for dtype, rank in self._dtypes_and_ranks]
        return self._signatures[device_type]

    def match(self, inputs: Any) -> list | None:
        """The flat input list when `inputs` is a dict of exactly the input
        names holding torch tensors of the declared dtypes and shapes on the
        Keras device, else None.

        Args:
            inputs: what the model is called on.

        Returns:
            The tensors in Keras's flat order, or None.
        """
        if not isinstance(inputs, dict) or inputs.keys() != self.names:
            return None
        flat = [inputs[key] for key in self.keys]
        try:
            signature = [(x.dtype, x.dim(), x.device.type) for x in flat]
        except AttributeError:               # not torch tensors
            return None
        if signature != self.signature(_keras_compat.keras_device().type) \
                or any(flat[i].shape[axis] != size for i, axis, size in self.fixed_sizes):
            return None
        return flat
