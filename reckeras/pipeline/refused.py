"""The `keras.Model` methods that cannot see reckeras's sharded tables.

The embedding tables are not Keras variables: they live in the embedding
engine, sharded over the ranks, and grow while training. A Keras method
that works on variables only would silently leave them out (a state tree
without the tables, a stateless call that still creates rows, an export
that cannot trace a hash-table lookup), and a Keras file written by one rank
holds only that rank's rows. Such methods are refused here, each with a
message naming what to use instead; `docs/keras_api.md` lists what works.
"""

from __future__ import annotations

import os
from typing import Any

from reckeras import _keras_compat, distributed


class RefusedKerasMethods(_keras_compat.ModelMixin):
    """Mixin of `rk.Model`: refuses, with a clear message, the Keras methods
    that would leave the embedding tables out.
    """

    def _refuse_with_tables(self, method, why, instead):
        if self.embedding_layers:
            raise NotImplementedError(f"rk.Model does not support {method}(): {why}. "
                                      f"Use {instead} instead")

    def _refuse_under_torchrun(self, method, instead):
        if distributed.world().size > 1:
            raise ValueError(f"{method}() under torchrun: each rank holds only its own "
                             f"share of the embedding table rows, so a Keras file of one "
                             f"rank is not the model. Use {instead}, which every rank "
                             f"calls and which loads on any number of ranks")

    def _legacy_hdf5_refusal(self, path: str) -> NotImplementedError:
        return NotImplementedError(
            f"rk.Model does not save to {path}: Keras's legacy HDF5 format holds "
            f"Keras variables only, not the embedding tables, and cannot be loaded "
            f"back. Use save('model.keras') instead")

    def get_config(self) -> dict:
        """`keras.Model.get_config`; refused while Keras writes a legacy HDF5
        file, as `keras.saving.save_model(model, "m.h5")` does around
        `save` (the file it opened is left empty).

        Returns:
            The model's config.

        Example:

        ```python
        config = model.get_config()
        ```
        """
        if self.embedding_layers and _keras_compat.writing_legacy_hdf5():
            raise self._legacy_hdf5_refusal("a legacy HDF5 file ('.h5')")
        return super().get_config()

    def stateless_call(self, *args: Any, **kwargs: Any) -> Any:
        """Refused for a model with embedding tables: they are not Keras
        variables, so they cannot be passed in or returned, and a training
        lookup changes them.

        Args:
            *args: as for `keras.Model.stateless_call`.
            **kwargs: as for `keras.Model.stateless_call`.

        Returns:
            What `keras.Model.stateless_call` returns (models without tables).

        Example:

        ```python
        outputs = model.predict_on_batch(batch)     # instead of stateless_call
        ```
        """
        self._refuse_with_tables(
            "stateless_call", "the embedding tables are not Keras variables: they "
            "cannot be passed in or returned, and a training lookup creates rows",
            "model(inputs), predict_on_batch() or train_on_batch()")
        return super().stateless_call(*args, **kwargs)

    def get_state_tree(self, *args: Any, **kwargs: Any) -> dict:
        """Refused for a model with embedding tables: Keras's state tree
        holds variables only.

        Args:
            *args: as for `keras.Model.get_state_tree`.
            **kwargs: as for `keras.Model.get_state_tree`.

        Returns:
            What `keras.Model.get_state_tree` returns (models without tables).

        Example:

        ```python
        state = model.get_weights()          # dense weights and tables
        ```
        """
        self._refuse_with_tables(
            "get_state_tree", "the state tree holds Keras variables only, not the "
            "embedding tables", "get_weights()/set_weights() (they carry the tables) "
            "or save_checkpoint()")
        return super().get_state_tree(*args, **kwargs)

    def set_state_tree(self, *args: Any, **kwargs: Any) -> None:
        """Refused for a model with embedding tables (see `get_state_tree`).

        Args:
            *args: as for `keras.Model.set_state_tree`.
            **kwargs: as for `keras.Model.set_state_tree`.

        Example:

        ```python
        model.set_weights(state)             # what get_weights() returned
        ```
        """
        self._refuse_with_tables(
            "set_state_tree", "the state tree holds Keras variables only, not the "
            "embedding tables", "set_weights(get_weights()) or load_checkpoint()")
        super().set_state_tree(*args, **kwargs)

    def export(self, *args: Any, **kwargs: Any) -> Any:
        """Refused for a model with embedding tables: Keras's export traces
        the model, and the tables' hash lookup cannot be traced.

        Args:
            *args: as for `keras.Model.export`.
            **kwargs: as for `keras.Model.export`.

        Returns:
            What `keras.Model.export` returns (models without tables).

        Example:

        ```python
        model.export_serving("exported/ctr")     # instead of export
        ```
        """
        self._refuse_with_tables(
            "export", "Keras's export traces the model, and the embedding tables' "
            "hash lookup cannot be traced", "export_serving(path), whose artifact "
            "rk.serving.load reads")
        return super().export(*args, **kwargs)

    def save(self, *args: Any, **kwargs: Any) -> None:
        """`keras.Model.save` (tables included); refused under torchrun, and
        to a legacy HDF5 file (`.h5`), which cannot hold the tables.

        Args:
            *args: as for `keras.Model.save`.
            **kwargs: as for `keras.Model.save`.

        Example:

        ```python
        model.save("ctr.keras")
        ```
        """
        self._refuse_under_torchrun("save", "save_checkpoint(path)")
        path = args[0] if args else kwargs.get("filepath")
        if self.embedding_layers and isinstance(path, (str, os.PathLike)) and \
                os.fspath(path).lower().endswith((".h5", ".hdf5")):
            raise self._legacy_hdf5_refusal(repr(os.fspath(path)))
        super().save(*args, **kwargs)

    def save_weights(self, *args: Any, **kwargs: Any) -> None:
        """`keras.Model.save_weights` (tables included); refused under torchrun.

        Args:
            *args: as for `keras.Model.save_weights`.
            **kwargs: as for `keras.Model.save_weights`.

        Example:

        ```python
        model.save_weights("ctr.weights.h5")
        ```
        """
        self._refuse_under_torchrun("save_weights", "save_checkpoint(path)")
        super().save_weights(*args, **kwargs)

    def load_weights(self, *args: Any, **kwargs: Any) -> None:
        """`keras.Model.load_weights` (tables included); refused under torchrun.

        Args:
            *args: as for `keras.Model.load_weights`.
            **kwargs: as for `keras.Model.load_weights`.

        Example:

        ```python
        model.load_weights("ctr.weights.h5")
        ```
        """
        self._refuse_under_torchrun("load_weights", "load_checkpoint(path)")
        super().load_weights(*args, **kwargs)
