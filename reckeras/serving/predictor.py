"""The Keras-free predictor of an exported model.

It runs what `model.predict` runs, read back from the artifact: the same
encoding and feature transforms (`features.encode`, `features.plan`, with the
adapted statistics), the same embedding lookup (`embedding.engine`, rows
loaded into plain tables; ids never seen in training read zeros) and the
dense network as the `torch.export` program written at export, its dense
layers rewritten onto prepacked weights (`packed_linear`). Only torch,
numpy, pyarrow and safetensors are needed.

What a request reads (tables, program, statistics) is one immutable
`ServedVersion`. The tables are held twice (`table_copies`): `apply_delta`
writes the delta into the copy no request reads, swaps the predictor's one
reference to a version of it, waits until the last request reading the
other copy has ended and writes the delta there too. A request takes the
reference once when it starts (and says it reads that copy), so it is
answered wholly by one version, and an old version's program is freed when
the last request holding it ends.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from reckeras.embedding.packing import PackingPlan
from reckeras.embedding.table_state import TableState
from reckeras.features.encode import RawBatch, as_tensors, encode, raw_columns
from reckeras.features.plan import TransformPlan
from reckeras.features.specs import FeatureSpec, deserialize
from reckeras.serving import artifact, delta, packed_linear
from reckeras.serving.table_copies import TableCopy, new_engine

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ServedVersion:
    """One version of the served model: everything a request reads.

    Never changed once built; `Predictor.apply_delta` builds a new one.

    Args:
        version: the export's version, `"{number}-{hash}"`.
        rows_written_at: when the export read the rows (seconds since the
            epoch, from the manifest; None for a version-1 artifact).
        layers: per embedding layer, `(packing, engine, output mode)`.
        copy: which of the predictor's two table copies `layers` are (0 or 1).
        program: the dense network (the loaded program, layers packed).
        mean: the Numeric features' adapted means.
        std: their standard deviations.

    Example:

    ```python
    served = predictor.served
    served.version, time.time() - served.rows_written_at
    ```
    """

    version: str
    rows_written_at: float | None
    layers: tuple
    copy: int
    program: torch.nn.Module
    mean: torch.Tensor
    std: torch.Tensor


class Predictor:
    """Predicts with an exported model, without Keras.

    `predict` is safe to call from several threads at once: a call reads
    the tables and the program and changes nothing they hold.
    `apply_delta` may run beside them: each call is answered wholly by the
    version that was served when it started.

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
        program = os.path.join(self.path, artifact.PROGRAM)
        try:
            # Kept: each version's dense network is a module of it.
            self._exported = torch.export.load(program)
            module = self._exported.module()
        except Exception as error:      # torch raises many kinds for a bad file
            raise artifact.ArtifactError(f"{program}: not a loadable program "
                                         f"({error})") from error
        layers = []
        for layer in manifest["embedding_layers"]:
            specs = [deserialize(s) for s in layer["features"]]
            plan = TransformPlan(specs)
            packing = PackingPlan(plan.slots, plan.sparse_in_declaration_order)
            states = []
            for table, layout in enumerate(new_engine(packing).table_layouts()):
                keys, rows, _ = delta.table_rows(self.path, layer["tables"][table]["files"],
                                                 artifact.ArtifactError)
                states.append(TableState(layout, keys.numpy(), rows.numpy(),
                                         np.zeros((keys.numel(), 0), np.float32)))
            layers.append((packing, states, layer["output"]))
        # Two copies of the tables: a delta is written into the one no
        # request reads (see `table_copies`).
        self._copies = [TableCopy([(packing, new_engine(packing, states), output)
                                   for packing, states, output in layers]) for _ in range(2)]
        self._readers = [0, 0]          # requests reading each copy now
        self._stale = [False, False]    # a copy a failed write left half-written
        self._reading = threading.Condition()
        self._served = self._version(manifest, 0, module)
        self._applying = threading.Lock()       # one delta at a time
        self.outputs: list[str] | None = manifest["outputs"]

    def _version(self, manifest, copy, program):
        # The kernels of the dense layers never change within a version:
        # packed once for oneDNN here, they run in half the time.
        packed_linear.pack_linear_layers(program)
        statistics = manifest["statistics"]
        return ServedVersion(manifest["version"], manifest["rows_written_at"],
                             tuple(self._copies[copy].layers), copy, program,
                             torch.tensor(statistics["mean"], dtype=torch.float32),
                             torch.tensor(statistics["std"], dtype=torch.float32))

    @property
    def served(self) -> ServedVersion:
        """The version requests are answered with now."""
        return self._served

    @property
    def version(self) -> str:
        """The served version, `"{number}-{hash}"` (the manifest's)."""
        return self._served.version

    def apply_delta(self, path: str | os.PathLike) -> str:
        """Applies a delta written by `export_serving(..., base=...)`, atomically.

        The delta is read and checked whole first; then its rows are
        written, in place, into the copy of the tables no request reads
        (rows rewritten or added, removed ids' rows zeroed: they read
        zeros, as an id never seen does), and the dense network is a new
        module with the delta's weights. Then one reference is swapped:
        requests already running finish on the old version, later ones
        read the new one. The call returns once the requests that read the
        other copy have ended and the delta is written there too (that
        copy is rebuilt from its live rows when removed ids left too many
        dead rows, see `table_copies`). A delta that fails a check changes
        nothing. Deltas are applied one at a time (a second call waits).

        Args:
            path: the delta's directory.

        Returns:
            The new served version.

        Raises:
            reckeras.serving.DeltaError: a damaged, partial or foreign
                delta, or one whose base is not the served version (named);
                the served version stays.

        Example:

        ```python
        predictor = rk.serving.load("exported/day1")
        predictor.apply_delta("exported/day2")     # '2-…'
        ```
        """
        path = os.fspath(path)
        with self._applying:
            served = self._served
            manifest = delta.read_delta(path, self.manifest, served.version)
            changes = [[delta.table_rows(path, table["files"], artifact.DeltaError)
                        for table in entry["tables"]]
                       if any(table["num_rows"] or table["num_removed"]
                              for table in entry["tables"]) else None
                       for entry in manifest["embedding_layers"]]
            file = os.path.join(path, artifact.DENSE_WEIGHTS)
            try:
                weights = load_file(file)
            except (SafetensorError, OSError) as error:
                raise artifact.DeltaError(f"{file}: {error}") from error
            program = self._exported.module()
            for name, value in weights.items():
                # The new module gets its own tensors; the served version's
                # are not touched.
                _replace_tensor(program, name, value)
            spare = 1 - served.copy
            self._until_unread(spare)      # requests of the version before `served`
            self._write(spare, changes)    # raises: the served version is untouched
            self._served = self._version(manifest, spare, program)
            self._until_unread(served.copy)
            try:
                self._write(served.copy, changes)
                self._copies[served.copy].compact()
            except (MemoryError, RuntimeError):
                # The delta is served; the copy is rebuilt before its next write.
                _log.exception("%s: writing the delta into the standby copy of the "
                               "tables failed; it is rebuilt from the served copy "
                               "before the next delta", path)
            return self._served.version

    def _write(self, copy, changes):
        """Writes a delta into table copy `copy`; a copy a failed write left
        half-written is first rebuilt from the other, which holds the served
        version's rows."""
        if self._stale[copy]:
            self._copies[copy] = TableCopy.of_live_rows(self._copies[1 - copy])
            self._stale[copy] = False
        try:
            self._copies[copy].write(changes)
        except BaseException:
            self._stale[copy] = True
            raise

    def _until_unread(self, copy):
        """Waits until no request reads table copy `copy` (none starts to:
        it is not the served one)."""
        with self._reading:
            self._reading.wait_for(lambda: self._readers[copy] == 0)

    @property
    def input_columns(self) -> list[str]:
        """The raw columns a batch must hold, in declaration order."""
        return raw_columns(self.specs)

    def predict(self, batch: RawBatch) -> np.ndarray | dict[str, np.ndarray]:
        """The model's outputs for a batch of raw columns.

        Args:
            batch: a dict of arrays (or lists), a pyarrow Table /
                RecordBatch or a pandas DataFrame, keyed by the raw column
                names, as `fit` reads them, or a list of dicts, one per
                example (`{"I1": 1.0, "C1": 7}`: every example gives every
                column, `None` for a missing value); other columns are
                ignored.

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
        return self.predict_with_version(batch)[0]

    def predict_with_version(self, batch: RawBatch
                             ) -> tuple[np.ndarray | dict[str, np.ndarray], str]:
        """`predict`'s outputs and the version that computed all of them.

        Args:
            batch: as for `predict`.

        Returns:
            `(outputs, version)`.

        Raises:
            reckeras.features.FeatureInputError: as `predict`.

        Example:

        ```python
        scores, version = predictor.predict_with_version({"I1": [1.0], "C1": [7]})
        ```
        """
        with self._reading:     # this request's version, whatever is applied now
            served = self._served
            self._readers[served.copy] += 1
        try:
            return self._predict(served, batch)
        finally:
            with self._reading:
                self._readers[served.copy] -= 1
                self._reading.notify_all()

    def _predict(self, served, batch):
        inputs = as_tensors(encode(self.specs, batch))
        with torch.inference_mode():
            if self.plan.numeric:
                dense = self.plan.dense(inputs, served.mean, served.std)
            else:
                dense = torch.zeros(len(next(iter(inputs.values()))), 0)
            sparse = self.plan.packed_sparse(inputs)
            embedded = [packing.assemble(engine.lookup(
                sparse["ids"], sparse["offsets"], training=False,
                weights=sparse.get("weights")), output)
                for packing, engine, output in served.layers]
            outputs = served.program(
                inputs={name: inputs[name] for name in self.manifest["inputs"]},
                dense=dense, embedded=embedded)
        if self.outputs is None:
            return outputs.numpy(), served.version
        return {name: outputs[name].numpy() for name in self.outputs}, served.version


def _replace_tensor(module: torch.nn.Module, name: str, value: torch.Tensor) -> None:
    """Points the module's tensor `name` (a parameter, buffer or constant
    of a loaded program, dotted path) at `value`."""
    *path, attribute = name.split(".")
    for part in path:
        module = getattr(module, part)
    if isinstance(getattr(module, attribute), torch.nn.Parameter):
        value = torch.nn.Parameter(value, requires_grad=False)
    setattr(module, attribute, value)
