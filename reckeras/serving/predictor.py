"""The Keras-free predictor of an exported model.

It runs what `model.predict` runs, read back from the artifact: the same
encoding and feature transforms (`features.encode`, `features.plan`, with the
adapted statistics), the same embedding lookup (`embedding.engine`, rows
loaded into plain tables; ids never seen in training read zeros) and the
dense network as the `torch.export` program written at export, its dense
layers rewritten onto prepacked weights (`packed_linear`). Only torch,
numpy, pyarrow and safetensors are needed.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from reckeras.embedding.engine import EmbeddingEngine
from reckeras.embedding.packing import PackingPlan
from reckeras.embedding.table_state import TableState
from reckeras.features.encode import as_tensors, encode, raw_columns
from reckeras.features.plan import TransformPlan
from reckeras.features.specs import FeatureSpec, deserialize
from reckeras.serving import artifact, packed_linear


class Predictor:
    """Predicts with an exported model, without Keras.

    `predict` is safe to call from several threads at once: a call reads
    the tables and the program and changes nothing they hold.

    Args:
        path: the artifact directory `rk.Model.export_serving` wrote.

    Raises:
        reckeras.serving.ArtifactError: a missing, damaged or foreign file
            (named).

    Example:

    ```python
    predictor = rk.serving.load("exported/ctr")
    scores = predictor.predict({"I1": [3.0], "C1": [123456789]})   # [1, 1]
    ```
    """

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        manifest = artifact.read_manifest(self.path)
        self.manifest = manifest
        self.specs: list[FeatureSpec] = [deserialize(s) for s in manifest["features"]]
        self.plan = TransformPlan(self.specs)
        self._mean = torch.tensor(manifest["statistics"]["mean"], dtype=torch.float32)
        self._std = torch.tensor(manifest["statistics"]["std"], dtype=torch.float32)
        self._layers = [self._embedding_layer(layer) for layer in manifest["embedding_layers"]]
        program = os.path.join(self.path, artifact.PROGRAM)
        try:
            self._program = torch.export.load(program).module()
        except Exception as error:      # torch raises many kinds for a bad file
            raise artifact.ArtifactError(f"{program}: not a loadable program "
                                         f"({error})") from error
        # The kernels of the dense layers never change at serving: packed
        # once for oneDNN here, they run in half the time.
        packed_linear.pack_linear_layers(self._program)
        self.outputs: list[str] | None = manifest["outputs"]

    def _embedding_layer(self, layer):
        specs = [deserialize(s) for s in layer["features"]]
        plan = TransformPlan(specs)
        # Plain tables: admission, eviction and caching are training matters.
        packing = PackingPlan(plan.slots, plan.sparse_in_declaration_order)
        engine = EmbeddingEngine(packing, device="cpu")     # requests arrive on the host
        tables = []
        for table, layout in enumerate(engine.table_layouts()):
            # The files the manifest names (and read_manifest checked).
            parts = [self._rows(os.path.join(self.path, name))
                     for name in layer["tables"][table]["files"]]
            keys = torch.cat([p[0] for p in parts]) if parts else torch.zeros(0, torch.int64)
            weights = torch.cat([p[1] for p in parts]) if parts else \
                torch.zeros(0, layout.dim)
            tables.append(TableState(layout, keys, weights, torch.zeros(keys.numel(), 0)))
        engine.load_table_states(tables)
        return packing, engine, layer["output"]

    def _rows(self, name):
        try:
            stored = load_file(name)
        except (SafetensorError, OSError) as error:
            raise artifact.ArtifactError(f"{name}: {error}") from error
        return stored["keys"], artifact.decode_rows(stored)

    @property
    def input_columns(self) -> list[str]:
        """The raw columns a batch must hold, in declaration order."""
        return raw_columns(self.specs)

    def predict(self, batch: pa.Table | pa.RecordBatch | dict[str, Any]
                ) -> np.ndarray | dict[str, np.ndarray]:
        """The model's outputs for a batch of raw columns.

        Args:
            batch: a dict of arrays (or lists) or a pyarrow Table /
                RecordBatch, keyed by the raw column names, as `fit` reads
                them; other columns are ignored.

        Returns:
            A float32 numpy array `[B, ...]`, or a dict of them for a model
            with dict outputs.

        Raises:
            reckeras.features.FeatureInputError: a missing column, a wrong
                dtype, a bad value (naming the feature).

        Example:

        ```python
        predictor.predict(test.slice(0, 256))     # [256, 1]
        ```
        """
        inputs = as_tensors(encode(self.specs, batch))
        with torch.inference_mode():
            if self.plan.numeric:
                dense = self.plan.dense(inputs, self._mean, self._std)
            else:
                dense = torch.zeros(len(next(iter(inputs.values()))), 0)
            sparse = self.plan.packed_sparse(inputs)
            embedded = [packing.assemble(engine.lookup(
                sparse["ids"], sparse["offsets"], training=False,
                weights=sparse.get("weights")), output)
                for packing, engine, output in self._layers]
            outputs = self._program(
                inputs={name: inputs[name] for name in self.manifest["inputs"]},
                dense=dense, embedded=embedded)
        if self.outputs is None:
            return outputs.numpy()
        return {name: outputs[name].numpy() for name in self.outputs}


def load(path: str | os.PathLike) -> Predictor:
    """Loads an exported model for prediction, without Keras.

    Args:
        path: the directory `rk.Model.export_serving` wrote.

    Returns:
        A `Predictor`.

    Raises:
        reckeras.serving.ArtifactError: a missing, damaged or foreign file
            (named), found before anything is served.

    Example:

    ```python
    import reckeras.serving

    predictor = reckeras.serving.load("exported/ctr")
    predictor.predict({"I1": [1.0, 2.0], "C1": [7, -3]})
    ```
    """
    return Predictor(path)
