"""Export of a trained `rk.Model` into a serving artifact (`artifact`).

This side runs in the training process, with Keras: it traces the model's
dense network with `torch.export` (the FeatureColumns and embedding layers
replaced by the program's inputs, so the program holds every other layer as
the model runs it) and writes every rank's rows. The predictor reads the
artifact without Keras.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import pyarrow as pa
import torch
import torch.distributed as dist
from safetensors import safe_open
from safetensors.numpy import save_file

import reckeras
from reckeras import _keras_compat, distributed
from reckeras.embedding.physical_table import MAX_COUNT
from reckeras.features.specs import Categorical, Numeric, Sequence, serialize
from reckeras.serving import artifact


def export_serving(model: Any, embedding_layers: list, path: str | os.PathLike,
                   rows: str | None = None, min_count: int | None = None,
                   base: str | os.PathLike | None = None) -> str:
    """Writes the serving artifact of a trained model, or a delta against an
    earlier one (every rank calls it).

    Without `base`, a full artifact: every row and the dense network as a
    `torch.export` program. With `base`, a delta: the rows created or
    trained since the base (in the base's row precision, filtered by its
    `min_count`), the ids removed since (aged out or evicted), and the dense
    weights whole; `Predictor.apply_delta` applies it to a predictor serving
    the base. Either way the manifest records the export's version and
    `rows_written_at` (the time the rows were read), and the model
    remembers the export as the base of its next delta.

    Args:
        model: a built `rk.Model`.
        embedding_layers: its embedding layers, each fed the FeatureColumns'
            packed batch (`rk.Model` passes them).
        path: the artifact directory (replaced if it exists; written beside
            it and renamed into place).
        rows: row precision, one of `artifact.ROW_PRECISIONS`, converted
            from each table's own row dtype (`"float16"` keeps a float16
            table's rows exactly; a bfloat16 table's rows are exact in
            `"float32"`). None: `"float32"`, or the base's for a delta.
        min_count: export only the rows seen in at least this many training
            steps (`PhysicalTable.seen_counts`; each rank filters its own);
            the others read zeros at serving, as unseen ids do. At most
            2047 (`physical_table.MAX_COUNT`): a row's count saturates
            there. None: every row (or the base's `min_count` for a delta).
        base: the model's latest export (full or delta), to write a delta
            against; None for a full artifact.

    Returns:
        The artifact's path.

    Raises:
        ValueError: an unknown precision, a `min_count` that is not an int
            in [1, 2047] or None, an embedding layer that does not read the
            FeatureColumns' output, or a `base` that is not this model's
            latest export, or whose precision or `min_count` differs from
            the one given.
        reckeras.serving.ArtifactError: a `base` with no readable manifest.
        NotImplementedError: a dense network `torch.export` cannot trace
            (a layer whose control flow depends on the data).

    Example:

    ```python
    export_serving(model, model.embedding_layers, "exported/ctr", rows="int8",
                   min_count=2)
    ...                                              # train on the next window
    export_serving(model, model.embedding_layers, "exported/ctr-2",
                   base="exported/ctr")              # a delta
    ```
    """
    fed = set(map(id, embedding_layers))
    stray = [layer.name for layer in model.embedding_layers if id(layer) not in fed]
    if stray:
        raise ValueError(f"embedding layer(s) {stray} do not read the FeatureColumns' "
                         f"packed batch; export_serving needs every embedding layer "
                         f"called once on it")
    network = ExportedNetwork(model.feature_columns, embedding_layers,
                              _DenseNetwork(model, embedding_layers),
                              list(_keras_compat.functional_inputs(model)),
                              _keras_compat.functional_outputs(model))
    return write_artifact(network, path, rows, min_count, base)


@dataclasses.dataclass
class ExportedNetwork:
    """What an artifact serves: the columns, the embedding layers fed their
    packed batch, and the module of the rest.

    Args:
        columns: the `FeatureColumns` (specs and adapted statistics).
        embedding_layers: the embedding layers, each fed the columns'
            packed batch.
        module: a `torch.nn.Module` whose `forward(inputs, dense, embedded)`
            maps the raw inputs it names, the columns' dense output and the
            embedding layers' outputs to the model's outputs.
        inputs: the raw inputs `module` reads.
        outputs: the model's outputs (a dict of them or one tensor):
            their names are recorded, or None for one output.
    """

    columns: Any
    embedding_layers: list
    module: torch.nn.Module
    inputs: list[str]
    outputs: Any


def write_artifact(network: ExportedNetwork, path: str | os.PathLike,
                   rows: str | None = None, min_count: int | None = None,
                   base: str | os.PathLike | None = None,
                   extra: Callable[[str], tuple[dict, list[str]]] | None = None) -> str:
    """Writes an artifact (or a delta) of `network`: `export_serving`'s
    work once the model is taken apart (every rank calls it).

    Args:
        network: what the artifact serves.
        path: the artifact directory.
        rows: as `export_serving`'s.
        min_count: as `export_serving`'s.
        base: as `export_serving`'s.
        extra: called on rank 0 with the staging directory before the
            manifest is written: it writes its own files there and returns
            `(manifest fields to add, the files it wrote)`; the files get
            checksums in the manifest like the others.

    Returns:
        The artifact's path.
    """
    if rows is not None and rows not in artifact.ROW_PRECISIONS:
        raise ValueError(f"rows must be one of {artifact.ROW_PRECISIONS}, got {rows!r}")
    if min_count is not None and (isinstance(min_count, bool) or not isinstance(
            min_count, (int, np.integer)) or min_count < 1):
        raise ValueError(f"export_serving: min_count must be an int >= 1 (the training "
                         f"steps a row was seen in) or None, got {min_count!r}")
    if min_count is not None and min_count > MAX_COUNT:
        raise ValueError(f"export_serving: min_count must be at most {MAX_COUNT}: a "
                         f"row's count of training steps saturates at {MAX_COUNT} "
                         f"(a row seen in more steps counts {MAX_COUNT}), so "
                         f"min_count={min_count} would keep no row")
    path = os.fspath(path)
    embedding_layers = network.embedding_layers
    engines = [layer.engine for layer in embedding_layers]
    based_on = None if base is None else _base(engines, path, os.fspath(base), rows,
                                                  min_count)
    if based_on is not None:
        rows, min_count = based_on["rows"], based_on["min_count"]
    rows = rows or "float32"
    world = distributed.world()
    staging = path + ".tmp"
    if world.rank == 0:
        shutil.rmtree(staging, ignore_errors=True)
        os.makedirs(os.path.join(staging, "tables"))
    distributed.barrier("the serving export's directory is made")
    read_at = time.time()
    for index, engine in enumerate(engines):
        states = engine.table_states() if based_on is None else \
            engine.changed_since(based_on["version"])
        for table, state in enumerate(states):
            kept = slice(None) if min_count is None else state.seen_steps >= min_count
            # Half-precision tables export their own dtype: encode from float32.
            stored = artifact.encode_rows(
                state.weights[kept].astype(np.float32, copy=False), rows)
            if state.deleted is not None:
                stored["deleted"] = state.deleted
            save_file({"keys": state.keys[kept], **stored},
                      os.path.join(staging, artifact.table_file(index, table, world.rank)))
    example = _example(network.columns, embedding_layers) if based_on is None else None
    if world.rank == 0:
        if based_on is None:
            dense_weights = _export_program(network, example,
                                            os.path.join(staging, artifact.PROGRAM))
        else:
            dense_weights = based_on["dense_weights"]
            _save_dense_weights(network.module, dense_weights,
                                os.path.join(staging, artifact.DENSE_WEIGHTS))
    distributed.barrier("every rank's rows and the dense network are written")
    version = None
    if world.rank == 0:
        added, files = ({}, []) if extra is None else extra(staging)
        version = _write_manifest(network, staging, rows, min_count, world.size, read_at,
                                  dense_weights, based_on, added, files)
        _replace(staging, path)
    if world.size > 1:
        agreed = [version]
        with distributed.collective("sharing the serving export's version"):
            dist.broadcast_object_list(agreed, src=0)
        version = agreed[0]
    distributed.barrier("the serving artifact is in place")
    for engine in engines:
        engine.mark_exported(version)
    return path


def _base(engines, path, base, rows, min_count):
    """The base's manifest, once it is checked to be the model's latest
    export and to match the precision and `min_count` asked for."""
    if os.path.abspath(path) == os.path.abspath(base):
        raise ValueError(f"a serving delta cannot be written over its own base {base!r}: "
                         f"give it another path")
    manifest = artifact.read_manifest(base, kind=None, check_files=False)
    filename = os.path.join(base, artifact.MANIFEST)
    if not all(engine.exported == manifest["version"] for engine in engines):
        latest = engines[0].exported if engines else None
        raise ValueError(
            f"{filename}: version {manifest['version']} is not this model's latest serving "
            f"export ({latest or 'none since the model was built'}), so the model does not "
            f"know what changed since it; write a full export (base=None) first")
    if manifest["dense_weights"] is None:
        raise ValueError(f"{filename}: the base's program holds a view of a dense weight "
                         f"that a delta cannot rewrite; write full exports of this model")
    if rows is not None and rows != manifest["rows"]:
        raise ValueError(f"{filename}: the base's rows are {manifest['rows']!r}, a delta "
                         f"cannot change them to {rows!r}; write a full export")
    if min_count is not None and min_count != manifest["min_count"]:
        raise ValueError(f"{filename}: the base's min_count is {manifest['min_count']!r}, "
                         f"a delta cannot change it to {min_count!r}; write a full export")
    return manifest


def _save_dense_weights(module, names, filename):
    """The current values of the program's weights, by their names in the
    program (`_weight_names`)."""
    held = dict(module.named_parameters(remove_duplicate=False))
    missing = sorted(set(names.values()) - set(held))
    if missing:
        raise ValueError(f"the model no longer holds the exported program's weight(s) "
                         f"{missing[:5]}: a changed model needs a full export")
    save_file({name: held[parameter].detach().cpu().contiguous().numpy()
               for name, parameter in names.items()}, filename)


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


def _example(columns, embedding_layers):
    """The program's example inputs. Every rank computes them: on several
    ranks the embedding lookup is a collective."""
    # A copy: encode may hand back read-only views of arrow memory.
    inputs = {name: torch.tensor(value)
              for name, value in columns.encode(example_batch(columns.specs)).items()}
    with torch.no_grad():
        dense, sparse = columns.pack(inputs)
        embedded = [layer(sparse, training=False) for layer in embedding_layers]
    return inputs, dense, embedded


def _export_program(exported, example, filename):
    inputs, dense, embedded = example
    inputs = {name: inputs[name] for name in exported.inputs}
    with torch.no_grad():
        network = exported.module.eval()
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
    return _weight_names(program, network)


def _weight_names(program, network):
    """`{tensor of the program: parameter of the network}`: the tensors a
    delta rewrites. Keras's variables enter the traced graph as constants
    that alias the parameters' memory, so they are matched by address,
    shape and strides. None when a constant is another view of a
    parameter (a delta could not rewrite it)."""
    def where(tensor):
        return tensor.data_ptr(), tuple(tensor.shape), tensor.stride()

    parameters = dict(network.named_parameters(remove_duplicate=False))
    by_place = {where(value): name for name, value in parameters.items()}
    storages = {value.untyped_storage().data_ptr() for value in parameters.values()}
    names = {name: name for name in program.state_dict}
    for name, value in program.constants.items():
        if not isinstance(value, torch.Tensor):
            continue
        if where(value) in by_place:
            names[name] = by_place[where(value)]
        elif value.untyped_storage().data_ptr() in storages:
            return None
    return dict(sorted(names.items()))


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


def _write_manifest(network, root, rows, min_count, world_size, read_at, dense_weights,
                    based_on, added, added_files):
    """Writes the manifest (the last file) and returns the export's version."""
    columns, outputs = network.columns, network.outputs
    dense = artifact.PROGRAM if based_on is None else artifact.DENSE_WEIGHTS
    files = {name: artifact.file_entry(root, name) for name in [dense, *added_files]}
    layers = []
    for index, layer in enumerate(network.embedding_layers):
        tables = []
        for table, layout in enumerate(layer.engine.table_layouts()):
            names = [artifact.table_file(index, table, rank) for rank in range(world_size)]
            files.update((name, artifact.file_entry(root, name)) for name in names)
            entry = {"dim": layout.dim, "files": names,
                     "num_rows": sum(_rows_in(root, name, "keys") for name in names)}
            if based_on is not None:
                entry["num_removed"] = sum(_rows_in(root, name, "deleted") for name in names)
                # Key, row in the stored precision, and int8's scale and bias.
                entry["bytes_per_row"] = 8 + layout.dim * np.dtype(rows).itemsize + \
                    (8 if rows == "int8" else 0)
            tables.append(entry)
        layers.append({"name": layer.name, "output": layer.output_mode,
                       "features": [serialize(s) for s in layer.specs], "tables": tables})
    number = 1 if based_on is None else artifact.version_number(based_on["version"]) + 1
    base = None if based_on is None else based_on["version"]
    version = artifact.version_of(number, files, base)
    manifest = {
        "format": artifact.FORMAT, "format_version": artifact.FORMAT_VERSION,
        "kind": "full" if based_on is None else "delta", "version": version,
        "base": base, "rows_written_at": read_at,
        "versions": {"reckeras": reckeras.__version__, "torch": torch.__version__},
        "rows": rows, "min_count": None if min_count is None else int(min_count),
        "world_size": world_size,
        "features": [serialize(s) for s in columns.specs],
        "statistics": {"mean": columns.mean.numpy().tolist(),
                       "std": columns.std.numpy().tolist()},
        "inputs": network.inputs,
        "outputs": sorted(outputs) if isinstance(outputs, dict) else None,
        "dense_weights": dense_weights, "embedding_layers": layers, "files": files,
        **added}
    if based_on is not None:
        manifest["bytes"] = sum(entry["bytes"] for entry in files.values())
    artifact.write_manifest(root, manifest)
    return version


def _rows_in(root, name, tensor):
    """Entries of one tensor of a table file, from its header (the file was
    written by any rank)."""
    with safe_open(os.path.join(root, name), framework="numpy") as stored:
        return stored.get_slice(tensor).get_shape()[0]


def _replace(staging, path):
    old = path + ".old"
    shutil.rmtree(old, ignore_errors=True)
    if os.path.exists(path):
        os.rename(path, old)
    os.rename(staging, path)
    shutil.rmtree(old, ignore_errors=True)
