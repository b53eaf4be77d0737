"""The packaged datasets: listing, loading and generating them."""

from __future__ import annotations

import builtins
import json
import os
from pathlib import Path
from typing import Any

from reckeras.datasets import _synth, aliccp, criteo_stream, longtail, retrieval, taobao
from reckeras.datasets._dataset import Dataset
from reckeras.datasets._parquet import METADATA_KEY, open_files

DATA_DIR = Path(__file__).parent / "data"

# Datasets with a generator module of their own: each name's splits (and
# their row seeds) and its generator.
_GENERATED = {
    taobao.NAME: (taobao.SPLIT_SEEDS, taobao.generate_taobao_synth),
    aliccp.NAME: (aliccp.SPLIT_SEEDS, aliccp.generate_aliccp_synth),
    longtail.NAME: (longtail.SPLIT_SEEDS, longtail.generate_longtail_synth),
    retrieval.NAME: (retrieval.SPLITS, retrieval.generate_retrieval_synth),
}


def list() -> builtins.list[str]:  # noqa: A001 - the public name is rk.datasets.list
    """Names of the packaged datasets.

    Returns:
        A sorted list of names accepted by `load` and `generate`.

    Example:

    ```python
    rk.datasets.list()
    # ['aliccp_synth', 'criteo_synth', 'longtail_synth', 'retrieval_synth',
    #  'taobao_synth']
    ```
    """
    return sorted([*_synth.SPECS, *_GENERATED])


# What generate("criteo_stream", ...) takes besides path and seed.
_STREAM_OPTIONS = ("rows_per_day", "days", "start", "vocabulary")


def _spec(name: str, split: str) -> _synth._SyntheticSpec | None:
    if name == criteo_stream.NAME:
        raise ValueError(
            f"{name!r} is not packaged: write it with rk.datasets.generate("
            f"{name!r}, path=..., rows_per_day=..., days=...)")
    if name in _GENERATED:
        split_seeds, _ = _GENERATED[name]
        if split not in split_seeds:
            raise ValueError(f"dataset {name!r} has no split {split!r}; its splits "
                             f"are {builtins.list(split_seeds)}")
        return None
    if name not in _synth.SPECS:
        raise ValueError(f"unknown dataset {name!r}; the datasets are {list()}, "
                         f"and generate also writes {criteo_stream.NAME!r}")
    spec = _synth.SPECS[name]
    if split not in spec.split_seeds:
        raise ValueError(f"dataset {name!r} has no split {split!r}; its splits "
                         f"are {builtins.list(spec.split_seeds)}")
    return spec


def packaged_path(name: str, split: str) -> Path:
    """Where the packaged file of a split lives (it may be missing).

    Args:
        name: a dataset name, e.g. "criteo_synth".
        split: "train" or "test" ("valid" too for "longtail_synth";
            "valid" and "items" too for "retrieval_synth").

    Returns:
        The path `reckeras/datasets/data/<name>_<split>.parquet`.

    Example:

    ```python
    from reckeras.datasets._registry import packaged_path

    packaged_path("criteo_synth", "test").name   # 'criteo_synth_test.parquet'
    ```
    """
    return DATA_DIR / f"{name}_{split}.parquet"


def load(name: str, split: str = "train") -> Dataset:
    """Opens a split of a dataset shipped inside the package.

    Args:
        name: one of `list()`, e.g. "criteo_synth".
        split: "train" or "test" ("valid" too for "longtail_synth";
            "valid" and "items" too for "retrieval_synth").

    Returns:
        A `Dataset` named "<name>:<split>".

    Raises:
        ValueError: for an unknown name or split (listing the valid ones).
        FileNotFoundError: when the package was installed without its data
            (rebuild it with `python -m reckeras.datasets.build`).

    Example:

    ```python
    test = rk.datasets.load("criteo_synth", split="test")
    test.num_rows   # 50000
    ```
    """
    _spec(name, split)
    path = packaged_path(name, split)
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing from the installed package; rebuild it with "
            f"`python -m reckeras.datasets.build`")
    return open_files([path], f"{name}:{split}")


def generate(name: str, rows: int | None = None,
             path: str | os.PathLike | None = None, split: str = "train",
             seed: int | None = None, **options: Any) -> Dataset:
    """Writes a synthetic split of any size to a parquet file, or a stream.

    The rows come from the same hidden teacher as the packaged splits, in
    chunks of 65,536 rows (one row group each), under a tqdm progress bar.
    The output depends only on the arguments: the same call writes the same
    bytes, and a file of N rows is a prefix of one of M > N rows.

    `generate("criteo_stream", path=..., rows_per_day=..., days=...,
    start="2026-12-01", seed=...)` writes instead one hive partition per day
    (`path/dt=2026-12-01/part-0.parquet`, ...) of a click log whose teacher
    drifts from day to day, each day's Bayes AUC in its footer; see
    `reckeras.datasets.criteo_stream`.

    Args:
        name: one of `list()`, or "criteo_stream".
        rows: number of rows to write (not for "criteo_stream"); for
            "retrieval_synth", the number of users, whose rows go to its
            train, valid and test splits together (see
            `reckeras.datasets.retrieval`).
        path: the parquet file to write (parent directories are created);
            for "criteo_stream", the directory of the days.
        split: the split whose row seed is used; `generate(name, 200_000,
            path, "train")` rewrites the packaged train split exactly.
        seed: an extra seed mixed into the split's, for independent replicas
            of a split; None for the packaged rows (for "criteo_stream": the
            seed of its drift and rows, None for 0).
        **options: for "criteo_stream" only: `rows_per_day` (default
            100,000), `days` (default 7), `start` (the first date,
            default "2026-12-01") and `vocabulary` (`"criteo"`, the
            default, or `"production"`).

    Returns:
        A `Dataset` over the written file (for "criteo_stream", over the
        days, with a `dt` column; `windows("dt")` gives one per day).

    Raises:
        ValueError: for an unknown name or split, a non-positive `rows`, a
            missing `path`, or options the dataset does not take.

    Example:

    ```python
    big = rk.datasets.generate("criteo_synth", 5_000_000,
                               "/tmp/criteo_synth_5m.parquet")
    stream = rk.datasets.generate("criteo_stream", path="/tmp/stream", days=7,
                                  rows_per_day=100_000, seed=0)
    [day.metadata["bayes_auc"] for day in stream.windows("dt")]
    ```
    """
    if path is None:
        raise ValueError(f"generate({name!r}) needs the path to write to")
    if name == criteo_stream.NAME:
        if rows is not None or split != "train":
            raise ValueError(f"{name!r} is written day by day and has no splits: "
                             f"give rows_per_day= and days=, not rows or split")
        unknown = sorted(set(options) - set(_STREAM_OPTIONS))
        if unknown:
            raise ValueError(f"generate({name!r}) takes the options "
                             f"{builtins.list(_STREAM_OPTIONS)}, not {unknown}")
        return criteo_stream.generate_criteo_stream(path, seed=seed, **options)
    if options:
        raise ValueError(f"generate({name!r}) takes no options "
                         f"{sorted(options)}; only {criteo_stream.NAME!r} does")
    spec = _spec(name, split)
    if not isinstance(rows, int) or isinstance(rows, bool) or rows < 1:
        raise ValueError(f"rows must be a positive int, got {rows!r}")
    if spec is None:                # a dataset with a generator of its own
        _, generator = _GENERATED[name]
        return generator(rows, path, split=split, seed=seed)
    row_seed = [spec.split_seeds[split]] + ([] if seed is None else [seed])
    schema = _synth.schema(spec).with_metadata({METADATA_KEY: json.dumps(
        _synth.description(spec, split, rows, seed), sort_keys=True)})
    path = _synth.write_tables(
        path, schema, _synth.chunks(lambda i: _synth.chunk_table(spec, row_seed, i), rows),
        rows, f"{name}:{split}")
    return open_files([path], f"{name}:{split}")
