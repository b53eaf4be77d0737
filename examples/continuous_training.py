"""Continuous training against a model trained once and daily retraining.

Writes 7 days of the drifting `criteo_stream` click log (new ids appear, old
ones stop, the teacher's weights drift), then, for every day d, trains on
day d and evaluates on day d + 1 with three strategies:

* **continuous**: one model carried from day to day (`fit_windows`, which
  evaluates each day before training on it), with aging out on: embedding
  rows not trained for `--aging` days are dropped;
* **trained once**: a model trained on day 1 only;
* **from scratch**: a new model trained on day d alone.

The continuous model is also served as it trains: after each day it exports
a serving delta (the first day a full export) and a running predictor
(`rk.serving.load`) applies it, so the next day is scored by the served
model, through the serving code, with the rows of that day's training.

It prints a Markdown table of the AUC per day and strategy beside the day's
Bayes AUC (the ceiling), the served model's AUC and the seconds from the end
of a day's training to the predictor serving it, the embedding rows the
continuous model added, aged out and kept each day, and saves a PNG plot of
AUC per day.

    python examples/continuous_training.py [--days 7] [--rows-per-day 100000]
        [--aging 2] [--plot continuous_training.png] [--seed 0]

The plot needs matplotlib (`pip install "reckeras[plot]"`); without it the
script says so and prints the table only. About 3 minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import reckeras as rk  # noqa: I001  (selects Keras's torch backend first)

import keras

F = rk.features
BATCH = 2048
STRATEGIES = ("continuous", "trained once", "from scratch")


def build(dim: int, bottom: tuple[int, ...], top: tuple[int, ...], aging: int | None,
          seed: int) -> rk.Model:
    """A compiled DLRM over criteo_stream's 13 numeric and 26 categorical columns.

    Args:
        dim: the embedding dim.
        bottom: hidden widths of the bottom MLP (it ends in `dim`).
        top: hidden widths of the top MLP (it ends in 1).
        aging: drop rows not trained for this many days (None: keep all).
        seed: seed of the initial weights and rows.

    Returns:
        The compiled model.

    Example:

    ```python
    model = build(16, (64,), (64,), aging=2, seed=0)
    ```
    """
    keras.utils.set_random_seed(seed)
    columns = rk.layers.FeatureColumns(
        [F.Numeric(f"I{i}", transform="log1p") for i in range(1, 14)]
        + [F.Categorical(f"C{i}", dim=dim) for i in range(1, 27)])
    options = {f"C{i}": rk.embedding.TableOptions(evict_idle_windows=aging)
               for i in range(1, 27)} if aging else None
    model = rk.models.dlrm(columns, bottom_units=(*bottom, dim), top_units=(*top, 1),
                           table_options=options, dropout=0.0, embedding_l2=0.0)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.05),
                  metrics=[rk.metrics.AUC()])
    return model


class ServeEachDay(keras.callbacks.Callback):
    """After each day: a serving delta applied to a running predictor, which
    then scores the next day.

    Args:
        directory: where the exports go (one directory a day).
        days: the windows `fit_windows` trains on, then the day after them.

    Example:

    ```python
    serving = ServeEachDay(tmp, days)
    model.fit_windows(days[:-1], callbacks=[serving])
    serving.aucs, serving.seconds
    ```
    """

    def __init__(self, directory: Path, days: list):
        super().__init__()
        self.directory = directory
        self.days = days
        self.predictor = None
        self.aucs: list[float] = []
        self.seconds: list[float] = []
        self._last: Path | None = None

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        started = time.perf_counter()
        path = self.directory / f"day{epoch + 1}"
        self.model.export_serving(path, base=self._last)
        if self.predictor is None:
            self.predictor = rk.serving.load(path)
        else:
            self.predictor.apply_delta(path)
        self.seconds.append(time.perf_counter() - started)
        self._last = path
        following = self.days[epoch + 1].to_table()
        auc = rk.metrics.AUC()
        auc.update_state(following["label"].to_numpy(), self.predictor.predict(following))
        self.aucs.append(float(auc.result()))


def evaluated_auc(model: rk.Model, day: rk.datasets.Dataset) -> float:
    """The model's AUC on one day.

    Args:
        model: a compiled model.
        day: the day's window.

    Returns:
        The AUC.

    Example:

    ```python
    evaluated_auc(model, days[3])
    ```
    """
    return model.evaluate(day, batch_size=BATCH, verbose=0, return_dict=True)["auc"]


def compare(days: list, dim: int, bottom: tuple[int, ...], top: tuple[int, ...],
            aging: int, seed: int, directory: Path) -> dict:
    """Trains the three strategies; AUCs of days 2..n (trained up to the day before).

    Args:
        days: the windows, in order (at least 2).
        dim: the embedding dim.
        bottom: hidden widths of the bottom MLP.
        top: hidden widths of the top MLP.
        aging: the continuous model drops rows not trained for this many days.
        seed: seed of every model's weights and shuffling.
        directory: where the continuous model's serving exports go.

    Returns:
        `{"day": names of days 2..n, "bayes_auc": their Bayes AUCs, one AUC
        list per strategy name, "served": the served continuous model's
        AUCs, "serve_s": seconds from the end of each day's training to the
        predictor serving it, "rows_added", "rows_evicted", "rows_kept":
        the continuous model's rows after training on days 1..n-1}`.

    Example:

    ```python
    results = compare(stream.windows("dt"), 16, (64,), (64,), aging=2, seed=0,
                      directory=Path("/tmp/exports"))
    ```
    """
    results = {"day": [day.partition["dt"] for day in days[1:]],
               "bayes_auc": [day.metadata["bayes_auc"] for day in days[1:]]}
    continuous = build(dim, bottom, top, aging, seed)
    # fit_windows evaluates each day before training on it: day d+1's
    # progressive AUC is that of the model trained on days 1..d.
    serving = ServeEachDay(directory, days)
    history = continuous.fit_windows(days[:-1], batch_size=BATCH, verbose=0, seed=seed,
                                     callbacks=[serving])
    results["continuous"] = history.history["progressive_auc"][1:] + \
        [evaluated_auc(continuous, days[-1])]
    results["served"], results["serve_s"] = serving.aucs, serving.seconds
    for key in ("rows_added", "rows_evicted", "rows_kept"):
        results[key] = [int(value) for value in history.history[key]]    # Keras logs floats
    once = build(dim, bottom, top, None, seed)
    once.fit(days[0], batch_size=BATCH, epochs=1, verbose=0, seed=seed)
    results["trained once"] = [evaluated_auc(once, day) for day in days[1:]]
    results["from scratch"] = []
    for day, following in zip(days[:-1], days[1:]):
        fresh = build(dim, bottom, top, None, seed)
        fresh.fit(day, batch_size=BATCH, epochs=1, verbose=0, seed=seed)
        results["from scratch"].append(evaluated_auc(fresh, following))
    return results


def table(results: dict) -> str:
    """The results as a Markdown table, one row per evaluated day.

    Args:
        results: what `compare` returned.

    Returns:
        The table's lines.

    Example:

    ```python
    print(table(compare(days, 16, (64,), (64,), aging=2, seed=0)))
    ```
    """
    lines = ["| trained on | evaluated on | Bayes AUC | " + " | ".join(STRATEGIES)
             + " | served (deltas) | served after s | rows added | rows aged out "
               "| rows kept |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    trained_on = [f"day {d}" for d in range(1, len(results["day"]) + 1)]
    for i, (name, day) in enumerate(zip(trained_on, results["day"])):
        cells = [name, f"day {i + 2} ({day})", f"{results['bayes_auc'][i]:.4f}"]
        cells += [f"{results[strategy][i]:.4f}" for strategy in STRATEGIES]
        cells += [f"{results['served'][i]:.4f}", f"{results['serve_s'][i]:.2f}"]
        cells += [f"{results[key][i]:,}" for key in ("rows_added", "rows_evicted",
                                                      "rows_kept")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: dict, path: str | Path) -> bool:
    """Saves a PNG of AUC per day, one line per strategy and the Bayes AUC.

    Args:
        results: what `compare` returned.
        path: the PNG to write.

    Returns:
        False (and a message) when matplotlib is not installed.

    Example:

    ```python
    plot(results, "continuous_training.png")
    ```
    """
    try:
        import matplotlib
    except ImportError:
        print('The plot needs matplotlib: pip install "reckeras[plot]" '
              '(or pip install "matplotlib>=3.8").')
        return False
    matplotlib.use("Agg")            # a file, no display
    from matplotlib import pyplot

    days = list(range(2, len(results["day"]) + 2))
    figure, axes = pyplot.subplots(figsize=(6.4, 4.2), dpi=100)
    axes.plot(days, results["bayes_auc"], "k--", label="Bayes AUC")
    for strategy, marker in zip(STRATEGIES, "osd"):
        axes.plot(days, results[strategy], marker=marker, label=strategy)
    axes.set_xlabel("evaluated on day (trained up to the day before)")
    axes.set_ylabel("AUC")
    axes.set_xticks(days)
    axes.grid(alpha=0.3)
    axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=4, fontsize="small")
    axes.set_title("criteo_stream: AUC of the next day")
    figure.tight_layout()
    figure.savefig(path)
    pyplot.close(figure)
    return True


def main(days: int = 7, rows_per_day: int = 100_000, aging: int = 2, seed: int = 0,
         plot_path: str | Path | None = "continuous_training.png", dim: int = 16,
         bottom: tuple[int, ...] = (128,), top: tuple[int, ...] = (128,)) -> dict:
    """Writes the stream, compares the strategies, prints the table, plots.

    Args:
        days: days of the stream (at least 2).
        rows_per_day: rows of each day.
        aging: the continuous model drops rows not trained for this many days.
        seed: seed of the stream and of the models.
        plot_path: the PNG to write, or None for no plot.
        dim: the embedding dim.
        bottom: hidden widths of the bottom MLP.
        top: hidden widths of the top MLP.

    Returns:
        What `compare` returned.

    Raises:
        ValueError: fewer than 2 days.

    Example:

    ```python
    results = main(days=3, rows_per_day=2_000, plot_path=None)
    ```
    """
    if days < 2:
        raise ValueError(f"days must be at least 2 (train on one, evaluate on the next), "
                         f"got {days}")
    with tempfile.TemporaryDirectory(prefix="continuous_training_") as scratch:
        stream = rk.datasets.generate("criteo_stream", path=Path(scratch) / "stream",
                                      rows_per_day=rows_per_day, days=days, seed=seed)
        results = compare(stream.windows("dt"), dim, bottom, top, aging, seed,
                          Path(scratch) / "serving")
    print(f"criteo_stream: {days} days of {rows_per_day:,} rows (seed {seed}); DLRM "
          f"bottom {[*bottom, dim]} top {[*top, 1]}; continuous: aging out after "
          f"{aging} days")
    print(table(results))
    if plot_path is not None and plot(results, plot_path):
        print(f"plot: {plot_path}")
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--rows-per-day", type=int, default=100_000)
    parser.add_argument("--aging", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", default="continuous_training.png")
    arguments = parser.parse_args()
    main(arguments.days, arguments.rows_per_day, arguments.aging, arguments.seed,
         arguments.plot)
