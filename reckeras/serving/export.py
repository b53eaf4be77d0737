"""Export of a trained `rk.Model` into a serving artifact (`artifact`).

This side runs in the training process, with Keras: it traces the model's
dense network with `torch.export` (the FeatureColumns and embedding layers
replaced by the program's inputs, so the program holds every other layer as
the model runs it) and writes every rank's rows. The predictor reads the
artifact without Keras.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import keras
import numpy as np
import pyarrow as pa
import torch
from safetensors import safe_open
from safetensors.numpy import save_file

import reckeras
from reckeras import _keras_compat, distributed
from reckeras.features.specs import Categorical, Numeric, Sequence, serialize
from reckeras.serving import artifact


def export_serving(model: Any, embedding_layers: list, path: str | os.PathLike,
                   rows: str = "float32", min_count: int | None = None) -> str:
    """Writes the serving artifact of a trained model (every rank calls it).

    Args:
        model: a built `rk.Model`.
        embedding_layers: its embedding layers, each fed the FeatureColumns'
            packed batch (`rk.Model` passes them).
        path: the artifact directory (replaced if it exists).
        rows: row precision, one of `artifact.ROW_PRECISIONS`, converted
            from each table's own row dtype (`"float16"` keeps a float16
            table's rows exactly; a bfloat16 table's rows are exact in
            `"float32"`).
        min_count: export only the rows seen in at least this many training
            steps (`PhysicalTable.seen_steps`; each rank filters its own);
            the others read zeros at serving, as unseen ids do. None: every
            row.

    Returns:
        The artifact's path.

    Raises:
        ValueError: an unknown precision, a `min_count` that is not an int
            >= 1 or None, or an embedding layer that does not read the
            FeatureColumns' output.
        NotImplementedError: a dense network `torch.export` cannot trace
            (a layer whose control flow depends on the data).

    Example:

    ```python
    export_serving(model, model.embedding_layers, "exported/ctr", rows="int8",
                   min_count=2)
    ```
    """
    if rows not in artifact.ROW_PRECISIONS:
        raise ValueError(f"rows must be one of {artifact.ROW_PRECISIONS}, got {rows!r}")
    if min_count is not None and (isinstance(min_count, bool) or not isinstance(
            min_count, (int, np.integer)) or min_count < 1):
        raise ValueError(f"export_serving: min_count must be an int >= 1 (the training "
                         f"steps a row was seen in) or None, got {min_count!r}")
    fed = set(map(id, embedding_layers))
    stray = [layer.name for layer in model.embedding_layers if id(layer) not in fed]
    if stray:
        raise ValueError(f"embedding layer(s) {stray} do not read the FeatureColumns' "
                         f"packed batch; export_serving needs every embedding layer "
                         f"called once on it")
    path = os.fspath(path)
    world = distributed.world()
    staging = path + ".tmp"
    if world.rank == 0:
        shutil.rmtree(staging, ignore_errors=True)
        os.makedirs(os.path.join(staging, "tables"))
    distributed.barrier("the serving export's directory is made")
    for index, layer in enumerate(embedding_layers):
        for table, state in enumerate(layer.table_states()):
            kept = slice(None) if min_count is None else state.seen_steps >= min_count
            # Half-precision tables export their own dtype: encode from float32.
            stored = artifact.encode_rows(
                state.weights[kept].astype(np.float32, copy=False), rows)
            save_file({"keys": state.keys[kept], **stored},
                      os.path.join(staging, artifact.table_file(index, table, world.rank)))
    if world.rank == 0:
        _export_program(model, embedding_layers, os.path.join(staging, artifact.PROGRAM))
    distributed.barrier("every rank's rows and the program are written")
    if world.rank == 0:
        _write_manifest(model, embedding_layers, staging, rows, min_count, world.size)
        _replace(staging, path)
    distributed.barrier("the serving artifact is in place")
    return path


class _DenseNetwork(torch.nn.Module):
    """The model with its FeatureColumns' and embedding layers' outputs as
    inputs: what `torch.export` traces."""

    def __init__(self, model, embedding_layers):
        super().__init__()
        self.model = model
        self._columns = model.feature_columns
        self._embedding_layers = embedding_layers
        # Keras's flat order of the dict inputs (its tree sorts the keys).
        self._keys = keras.tree.flatten({key: key for key in
                                         _keras_compat.functional_inputs(model)})

    def forward(self, inputs: dict, dense: torch.Tensor, embedded: list) -> Any:
        flat = [inputs[key] for key in self._keys]
        # The graph maps the layer's outputs by structure: an empty packed batch.
        no_ids = {"ids": dense.new_zeros(0, dtype=torch.int64),
                  "offsets": dense.new_zeros(1, dtype=torch.int64)}
        if self._columns.plan.weighted:
            no_ids["weights"] = dense.new_zeros(0)
        replace = {self._columns: lambda *args, **kwargs: (dense, no_ids)}
        for layer, output in zip(self._embedding_layers, embedded, strict=True):
            replace[layer] = lambda *args, output=output, **kwargs: output
        return _keras_compat.run_functional_graph(self.model, flat, False, replace)


def _export_program(model, embedding_layers, filename):
    columns = model.feature_columns
    # A copy: encode may hand back read-only views of arrow memory.
    inputs = {name: torch.tensor(value)
              for name, value in columns.encode(example_batch(columns.specs)).items()}
    with torch.no_grad():
        dense, sparse = columns.pack(inputs)
        embedded = [layer(sparse, training=False) for layer in embedding_layers]
        network = _DenseNetwork(model, embedding_layers).eval()
        batch = torch.export.Dim.AUTO
        shapes = {"inputs": {name: {0: batch} for name in inputs}, "dense": {0: batch},
                  "embedded": [_batch_dim(output, batch) for output in embedded]}
        try:
            with _keras_compat.symbolic_shapes_kept():
                program = torch.export.export(
                    network, (), {"inputs": inputs, "dense": dense, "embedded": embedded},
                    dynamic_shapes=shapes, strict=False)
        except Exception as error:      # torch.export raises many kinds
            raise NotImplementedError(
                f"torch.export cannot trace this model's dense network: "
                f"{str(error).strip().splitlines()[0][:300]} (a layer whose control "
                f"flow depends on the data does not export)") from error
    torch.export.save(program, filename)


def _batch_dim(output, batch):
    if isinstance(output, dict):
        return {name: {0: batch} for name in output}
    return {0: batch}


def example_batch(specs: list, rows: int = 5) -> dict[str, Any]:
    """A small raw batch of every column the specs read: what export traces.

    Sequences get every length from 0 to their `max_len`, so no shape of the
    trace depends on one batch's lengths.

    Args:
        specs: the feature specs.
        rows: examples in the batch.

    Returns:
        A dict batch for `FeatureColumns.encode`.

    Example:

    ```python
    example_batch([rk.features.Numeric("I1"), rk.features.Categorical("C1", dim=8)])
    ```
    """
    batch: dict[str, Any] = {}
    for spec in specs:
        if isinstance(spec, Numeric):
            batch[spec.name] = np.ones((rows, *spec.shape), np.float32)
        elif isinstance(spec, Categorical) and spec.boundaries is not None:
            batch[spec.name] = np.linspace(-1.0, 1.0, rows)
        elif isinstance(spec, Categorical):
            batch[spec.name] = [str(i) for i in range(rows)] if spec.dtype == "string" \
                else np.arange(rows)
        elif isinstance(spec, Sequence):
            lengths = [i % (spec.max_len + 1) for i in range(rows)]
            values = [[str(j) if spec.dtype == "string" else j for j in range(n)]
                      for n in lengths]
            batch[spec.name] = pa.array(values)
            if spec.weights is not None:
                batch[spec.weights] = pa.array([[1.0] * n for n in lengths],
                                               pa.list_(pa.float32()))
    return batch


def _write_manifest(model, embedding_layers, root, rows, min_count, world_size):
    columns = model.feature_columns
    outputs = _keras_compat.functional_outputs(model)
    files = {artifact.PROGRAM: artifact.file_entry(root, artifact.PROGRAM)}
    layers = []
    for index, layer in enumerate(embedding_layers):
        tables = []
        for table, layout in enumerate(layer.engine.table_layouts()):
            names = [artifact.table_file(index, table, rank) for rank in range(world_size)]
            files.update((name, artifact.file_entry(root, name)) for name in names)
            tables.append({"dim": layout.dim, "files": names,
                           "num_rows": sum(_rows_in(root, name) for name in names)})
        layers.append({"name": layer.name, "output": layer.output_mode,
                       "features": [serialize(s) for s in layer.specs], "tables": tables})
    artifact.write_manifest(root, {
        "format": artifact.FORMAT, "format_version": artifact.FORMAT_VERSION,
        "versions": {"reckeras": reckeras.__version__, "torch": torch.__version__},
        "rows": rows, "min_count": None if min_count is None else int(min_count),
        "world_size": world_size,
        "features": [serialize(s) for s in columns.specs],
        "statistics": {"mean": columns.mean.numpy().tolist(),
                       "std": columns.std.numpy().tolist()},
        "inputs": list(_keras_compat.functional_inputs(model)),
        "outputs": sorted(outputs) if isinstance(outputs, dict) else None,
        "embedding_layers": layers, "files": files})


def _rows_in(root, name):
    """Rows of one table file, from its header (the file was written by any rank)."""
    with safe_open(os.path.join(root, name), framework="numpy") as stored:
        return stored.get_slice("keys").get_shape()[0]


def _replace(staging, path):
    old = path + ".old"
    shutil.rmtree(old, ignore_errors=True)
    if os.path.exists(path):
        os.rename(path, old)
    os.rename(staging, path)
    shutil.rmtree(old, ignore_errors=True)
