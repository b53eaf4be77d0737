"""Bytes and seconds of a full and of a delta checkpoint after each day of
`criteo_stream`.

Writes `criteo_stream` (`--days` days of `--rows-per-day` rows), then trains
the quickstart DLRM (13 log1p numerics, 26 dim-16 categoricals, bottom MLP
512-256-16, top MLP 512-256-1, Adam(1e-3) and RowWiseAdagrad(0.05), batch
4096) over its days with `fit_windows` (each day evaluated before it is
trained on). After each day it saves a delta checkpoint whose base is the
previous day's full one (so it holds that day's changes: the rows written,
the dense weights and the Keras optimizer's state whole), then a full
checkpoint, and prints per day: the rows in the tables, the bytes and
seconds of both saves, the delta's share of the full's bytes (whole, and of
the table files alone), and the day's progressive AUC against its Bayes
AUC. The last line is `delta_to_full_bytes=<median over the days with a
delta>` (the first day has no base).

    python benchmarks/checkpoint_delta.py [--rows-per-day 100000] [--days 7]
        [--seed 0] [--bottom 512 256] [--top 512 256] [--dim 16]

`--bottom` and `--top` are the MLPs' hidden widths (the bottom MLP ends in
`--dim`, the top one in 1). About 5 minutes with the defaults on 2 CPU cores.
"""

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import reckeras as rk  # noqa: I001  (selects Keras's torch backend first)

import keras

F = rk.features


def directory_bytes(path):
    """`(dense bytes, table bytes, all bytes)` of a checkpoint directory."""
    sizes = {entry.name: entry.stat().st_size for entry in os.scandir(path)}
    dense = sizes.get("dense.safetensors", 0)
    tables = sum(size for name, size in sizes.items() if name.startswith("tables-"))
    return dense, tables, sum(sizes.values())


def timed_save(model, path, base=None):
    started = time.perf_counter()
    model.save_checkpoint(path, base=base)
    return time.perf_counter() - started, directory_bytes(path)


class SaveEachDay(keras.callbacks.Callback):
    """After each window: a delta against the previous full, then a full."""

    def __init__(self, directory, days):
        super().__init__()
        self.directory = Path(directory)
        self.days = days
        self.results = []
        self._previous_full = None

    def on_epoch_end(self, epoch, logs=None):
        day = self.days[epoch]
        name = day.partition["dt"]
        result = {"dt": name, "progressive_auc": logs["progressive_auc"],
                  "bayes_auc": day.metadata["bayes_auc"]}
        if self._previous_full is not None:
            result["delta_s"], result["delta"] = timed_save(
                self.model, self.directory / f"delta-{name}", base=self._previous_full)
        self._previous_full = self.directory / f"full-{name}"
        result["full_s"], result["full"] = timed_save(self.model, self._previous_full)
        result["rows"] = sum(table["rows"] for stats in self.model.embedding_stats().values()
                             for rank in stats["per_rank"] for table in rank["tables"])
        self.results.append(result)
        print(row(result), flush=True)


def row(result):
    full_dense, full_tables, full = result["full"]
    cells = [result["dt"], f"{result['rows']:,}", f"{full / 1e6:.3f}",
             f"{result['full_s']:.3f}"]
    if "delta" in result:
        _, delta_tables, delta = result["delta"]
        cells += [f"{delta / 1e6:.3f}", f"{result['delta_s']:.3f}",
                  f"{delta / full:.3f}", f"{delta_tables / full_tables:.3f}"]
    else:
        cells += ["-"] * 4
    cells += [f"{result['progressive_auc']:.4f}", f"{result['bayes_auc']:.4f}"]
    return "| " + " | ".join(cells) + " |"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows-per-day", type=int, default=100_000)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bottom", type=int, nargs="+", default=[512, 256])
    parser.add_argument("--top", type=int, nargs="+", default=[512, 256])
    parser.add_argument("--dim", type=int, default=16)
    args = parser.parse_args()
    if args.days < 2:
        parser.error("--days must be at least 2: the first day has no delta")
    with tempfile.TemporaryDirectory(prefix="checkpoint_delta_") as scratch:
        stream = rk.datasets.generate("criteo_stream", path=Path(scratch) / "stream",
                                      rows_per_day=args.rows_per_day, days=args.days,
                                      seed=args.seed)
        days = stream.windows("dt")
        keras.utils.set_random_seed(args.seed)
        columns = rk.layers.FeatureColumns(
            [F.Numeric(f"I{i}", transform="log1p") for i in range(1, 14)]
            + [F.Categorical(f"C{i}", dim=args.dim) for i in range(1, 27)])
        model = rk.models.dlrm(columns, bottom_units=(*args.bottom, args.dim),
                               top_units=(*args.top, 1), dropout=0.0, embedding_l2=0.0)
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="binary_crossentropy",
                      embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.05),
                      metrics=[rk.metrics.AUC()])
        saver = SaveEachDay(Path(scratch) / "checkpoints", days)
        print(f"criteo_stream: {args.days} days of {args.rows_per_day:,} rows, "
              f"dlrm bottom {args.bottom + [args.dim]} top {args.top + [1]} dim {args.dim}")
        print("| day | table rows | full MB | full s | delta MB | delta s | "
              "delta/full | tables delta/full | progressive AUC | Bayes AUC |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        model.fit_windows(days, batch_size=4096, verbose=0, seed=args.seed,
                          callbacks=[saver])
        dense = saver.results[-1]["full"][0]
        print(f"dense.safetensors (weights and Adam state, in every save): "
              f"{dense / 1e6:.2f} MB")
        ratios = [r["delta"][2] / r["full"][2] for r in saver.results if "delta" in r]
        print(f"delta_to_full_bytes={statistics.median(ratios):.4f}")


if __name__ == "__main__":
    main()
