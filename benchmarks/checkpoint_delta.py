"""Bytes and seconds of a full and of a delta checkpoint after each day of
`criteo_stream`, on its production-shaped vocabularies.

Writes `criteo_stream` (`--days` days of `--rows-per-day` rows, with
`vocabulary="production"` by default: the large fields hold 2 to 10 million
ids under flat Zipf tails, so the tables dominate a checkpoint and a day
touches a small part of them), then trains the quickstart DLRM (13 log1p
numerics, 26 dim-16 categoricals, bottom MLP 512-256-16, top MLP 512-256-1,
Adam(1e-3) and RowWiseAdagrad(0.05), batch 4096) over its days with
`fit_windows` (each day evaluated before it is trained on). The first
`--history-days` days are the model's history, as a production model has
months of it behind it; from the last of them on, after each day it saves a
delta checkpoint whose base is the previous day's full one (so it holds
that day's changes: the rows written, the dense weights and the Keras
optimizer's state whole), then a full checkpoint, and prints per day:

* the rows in the tables and the rows the delta holds (changed or created
  that day), and their share;
* the bytes and seconds of both saves, the delta's share of the full's
  bytes (whole, and of the table files alone);
* the encoding's overhead: the delta's table bytes over (rows changed x
  bytes per row), a row being its key, its weights and its optimizer state
  (what a delta cannot do without; the rest is tracking and framing);
* the day's progressive AUC against its Bayes AUC.

The last line is `delta_to_full_bytes=<median over the days after the
history>`.

    python benchmarks/checkpoint_delta.py [--rows-per-day 300000] [--days 14]
        [--history-days 7] [--vocabulary production] [--seed 0]
        [--bottom 512 256] [--top 512 256] [--dim 16]

`--bottom` and `--top` are the MLPs' hidden widths (the bottom MLP ends in
`--dim`, the top one in 1). About 15 minutes with the defaults on 2 CPU cores
(the stream alone takes 3).
"""

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import reckeras as rk  # noqa: I001  (selects Keras's torch backend first)

import keras
from safetensors import safe_open

F = rk.features


def directory_bytes(path):
    """`(dense bytes, table bytes, all bytes)` of a checkpoint directory."""
    sizes = {entry.name: entry.stat().st_size for entry in os.scandir(path)}
    dense = sizes.get("dense.safetensors", 0)
    tables = sum(size for name, size in sizes.items() if name.startswith("tables-"))
    return dense, tables, sum(sizes.values())


def table_rows_and_row_bytes(path):
    """`(rows, bytes of their keys, weights and optimizer state)` held by a
    checkpoint's table files."""
    rows = essential = 0
    for entry in os.scandir(path):
        if not entry.name.startswith("tables-"):
            continue
        with safe_open(entry.path, framework="numpy") as tables:
            for name in tables.keys():
                field = name.rsplit(".", 1)[1]
                if field in ("keys", "weights", "state"):
                    array = tables.get_slice(name)
                    shape = array.get_shape()
                    count = 1
                    for size in shape:
                        count *= size
                    essential += count * _ITEM_BYTES[array.get_dtype()]
                    if field == "keys":
                        rows += shape[0]
    return rows, essential


_ITEM_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4}


def timed_save(model, path, base=None):
    started = time.perf_counter()
    model.save_checkpoint(path, base=base)
    return time.perf_counter() - started, directory_bytes(path)


class SaveEachDay(keras.callbacks.Callback):
    """After each window: a delta against the previous full, then a full."""

    def __init__(self, directory, days, history_days):
        super().__init__()
        self.directory = Path(directory)
        self.days = days
        self.history_days = history_days
        self.results = []
        self._previous_full = None

    def on_epoch_end(self, epoch, logs=None):
        day = self.days[epoch]
        name = day.partition["dt"]
        result = {"dt": name, "progressive_auc": logs["progressive_auc"],
                  "bayes_auc": day.metadata["bayes_auc"],
                  "rows": sum(table["rows"]
                              for stats in self.model.embedding_stats().values()
                              for rank in stats["per_rank"] for table in rank["tables"])}
        if epoch + 1 < self.history_days:       # history: nothing saved yet
            print(row(result), flush=True)
            return
        if self._previous_full is not None:
            delta = self.directory / f"delta-{name}"
            result["delta_s"], result["delta"] = timed_save(self.model, delta,
                                                            base=self._previous_full)
            result["changed"], result["essential"] = table_rows_and_row_bytes(delta)
            shutil.rmtree(delta)
        full = self.directory / f"full-{name}"
        result["full_s"], result["full"] = timed_save(self.model, full)
        if self._previous_full is not None:
            shutil.rmtree(self._previous_full)      # the disk holds one full at a time
        self._previous_full = full
        self.results.append(result)
        print(row(result), flush=True)


def row(result):
    cells = [result["dt"], f"{result['rows']:,}"]
    if "delta" in result:
        cells += [f"{result['changed']:,}", f"{result['changed'] / result['rows']:.3f}"]
    else:
        cells += ["-"] * 2
    if "full" in result:
        _, full_tables, full = result["full"]
        cells += [f"{full / 1e6:.3f}", f"{result['full_s']:.3f}"]
    else:
        cells += ["-"] * 2
    if "delta" in result:
        _, delta_tables, delta = result["delta"]
        cells += [f"{delta / 1e6:.3f}", f"{result['delta_s']:.3f}",
                  f"{delta / full:.3f}", f"{delta_tables / full_tables:.3f}",
                  f"{delta_tables / result['essential']:.3f}"]
    else:
        cells += ["-"] * 5
    cells += [f"{result['progressive_auc']:.4f}", f"{result['bayes_auc']:.4f}"]
    return "| " + " | ".join(cells) + " |"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows-per-day", type=int, default=300_000)
    parser.add_argument("--days", type=int, default=14)
    parser.add_argument("--history-days", type=int, default=7,
                        help="days trained before the measured ones (the first "
                             "saved full is the last history day's)")
    parser.add_argument("--vocabulary", choices=("production", "criteo"),
                        default="production")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bottom", type=int, nargs="+", default=[512, 256])
    parser.add_argument("--top", type=int, nargs="+", default=[512, 256])
    parser.add_argument("--dim", type=int, default=16)
    args = parser.parse_args()
    if not 1 <= args.history_days < args.days:
        parser.error("--history-days must be at least 1 and below --days: the "
                     "measured days follow the history")
    with tempfile.TemporaryDirectory(prefix="checkpoint_delta_") as scratch:
        stream = rk.datasets.generate("criteo_stream", path=Path(scratch) / "stream",
                                      rows_per_day=args.rows_per_day, days=args.days,
                                      seed=args.seed, vocabulary=args.vocabulary)
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
        saver = SaveEachDay(Path(scratch) / "checkpoints", days, args.history_days)
        print(f"criteo_stream ({args.vocabulary} vocabulary): {args.days} days of "
              f"{args.rows_per_day:,} rows, {args.history_days} of history; dlrm bottom "
              f"{args.bottom + [args.dim]} top {args.top + [1]} dim {args.dim}")
        print("| day | table rows | rows changed | changed share | full MB | full s | "
              "delta MB | delta s | delta/full | tables delta/full | encoding overhead | "
              "progressive AUC | Bayes AUC |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        model.fit_windows(days, batch_size=4096, verbose=0, seed=args.seed,
                          callbacks=[saver])
        dense = saver.results[-1]["full"][0]
        print(f"dense.safetensors (weights and Adam state, in every save): "
              f"{dense / 1e6:.2f} MB")
        measured = [r for r in saver.results if "delta" in r]
        tables = statistics.median(r["delta"][1] / r["full"][1] for r in measured)
        overhead = statistics.median(r["delta"][1] / r["essential"] for r in measured)
        print(f"medians over the {len(measured)} days after the history: tables "
              f"delta/full {tables:.4f}, encoding overhead {overhead:.3f}")
        print(f"delta_to_full_bytes="
              f"{statistics.median(r['delta'][2] / r['full'][2] for r in measured):.4f}")


if __name__ == "__main__":
    main()
