"""Shared model and data of the distributed test workers."""

import dataclasses
import os

import reckeras as rk  # first: selects Keras's torch backend
from reckeras import distributed

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import torch.distributed as dist  # noqa: E402

GLOBAL_BATCH = 64


def data(rows=512, seed=0):
    rng = np.random.default_rng(seed)
    zipf = np.minimum(rng.zipf(1.3, size=(rows, 3)), 400)
    history = [list(rng.integers(0, 50, rng.integers(0, 6))) for _ in range(rows)]
    n = rng.normal(size=rows).astype(np.float32)
    logit = np.sin(zipf[:, 0]) + np.cos(zipf[:, 1]) * n
    label = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    return pa.table({"n": n, "a": zipf[:, 0], "b": zipf[:, 1] * 7919, "c": zipf[:, 2],
                     "h": pa.array(history, pa.list_(pa.int64())), "label": label})


def model():
    keras.utils.set_random_seed(1)
    columns = rk.layers.FeatureColumns([
        rk.features.Numeric("n"),
        rk.features.Categorical("a", dim=4),
        rk.features.Categorical("b", dim=4, table="shared"),
        rk.features.Categorical("c", dim=4, table="shared"),
        rk.features.Sequence("h", dim=4, max_len=4, combiner="mean")])
    options = {"shared": rk.embedding.TableOptions(admit_after=2, evict_idle_steps=3,
                                                   evict_every=4)} \
        if os.environ.get("RK_TEST_LIFECYCLE") else {}
    if os.environ.get("RK_TEST_CACHE"):
        # All tables (one physical table of dim 4) in host memory behind a
        # cache of 90 rows per rank: smaller than the rows each rank owns.
        policy = os.environ["RK_TEST_CACHE"]
        options = {name: dataclasses.replace(
            options.get(name, rk.embedding.TableOptions()), storage="host_cached",
            cache_rows=rows, cache_policy=policy)
            for name, rows in (("a", 30), ("shared", 40), ("h", 20))}
    if os.environ.get("RK_TEST_REGULARIZE"):
        # Every table (one physical table of dim 4) regularized, counted as asked.
        options = {name: dataclasses.replace(
            options.get(name, rk.embedding.TableOptions()),
            embeddings_regularizer=keras.regularizers.L2(0.05),
            regularize=os.environ["RK_TEST_REGULARIZE"]) for name in ("a", "shared", "h")}
    m = rk.models.dlrm(columns, bottom_units=(8, 4), top_units=(8, 1),
                       table_options=options or None, dropout=0.0, embedding_l2=0.0)
    m.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy",
              embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.1),
              metrics=[rk.metrics.AUC(), rk.metrics.GAUC(group="c")])
    return m


def _every_ranks(local):
    """`local` of every rank, in rank order (collective)."""
    if distributed.world().size == 1:
        return [local]
    parts = [None] * distributed.world().size
    dist.all_gather_object(parts, local)
    return parts


def gathered_tables(m):
    """{dim: {key: (row, state)}} over all ranks (every rank gets it)."""
    local = {table.dim: table.export() for layer in m.embedding_layers
             for table in layer.tables}
    merged = {}
    for part in _every_ranks(local):
        for dim, arrays in part.items():
            target = merged.setdefault(dim, {})
            for key, row, state in zip(arrays["keys"], arrays["weights"], arrays["state"]):
                assert key not in target, "a key is owned by two ranks"
                target[int(key)] = (row, state)
    return merged


def merged_over_ranks(local):
    """Every rank's `{key: value}` dict merged (collective; each key must be
    held by one rank only)."""
    merged = {}
    for part in _every_ranks(local):
        assert not merged.keys() & part.keys(), "a key is held by two ranks"
        merged.update(part)
    return merged


def _flatten_tables(tables):
    out = {}
    for dim, rows in tables.items():
        keys = np.array(sorted(rows), dtype=np.int64)
        out[f"keys{dim}"] = keys
        out[f"rows{dim}"] = np.stack([rows[k][0] for k in keys])
        out[f"state{dim}"] = np.stack([rows[k][1] for k in keys])
    return out


def save_all(m, path):
    """Gathers tables on every rank (collective), rank 0 writes them with the
    evaluation metrics (reduced over all ranks; evaluated with the pipeline
    that RK_TEST_PIPELINE=0|1 sets, else "auto")."""
    tables = gathered_tables(m)
    pipeline = {"0": False, "1": True}.get(os.environ.get("RK_TEST_PIPELINE"), "auto")
    logs = m.evaluate(data(), batch_size=GLOBAL_BATCH // distributed.world().size,
                      verbose=0, return_dict=True, pipeline=pipeline)
    if distributed.world().rank == 0:
        np.savez(path, **{f"dense{i}": w.numpy() for i, w in enumerate(m.weights)},
                 **_flatten_tables(tables),
                 **{f"metric_{k}": np.array(v) for k, v in logs.items()})
    if distributed.world().size > 1:
        dist.barrier()
