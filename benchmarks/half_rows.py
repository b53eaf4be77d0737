"""Half-precision table rows on the README quickstart (issue 18, item 4).

Trains the quickstart model (DLRM on the packaged criteo_synth dataset, 26
tables of dim 16, RowWiseAdagrad) once per row dtype, with the same seed,
and prints per dtype the test AUC, its difference from float32, the bytes
per row of the rows and of the optimizer state (`embedding_stats`), and the
training time. Each dtype runs in a fresh process.

```bash
python benchmarks/half_rows.py                          # float32, float16, bfloat16
python benchmarks/half_rows.py --dtypes float32 bfloat16 --epochs 1
```
"""

import argparse
import json
import subprocess
import sys
import time

from workloads import quickstart_model


def run(dtype: str, epochs: int, seed: int) -> dict:
    """Trains and evaluates the quickstart with rows of `dtype` (this process).

    Args:
        dtype: a `TableOptions.dtype`.
        epochs: training epochs.
        seed: Keras's random seed (dense weights, shuffling).

    Returns:
        `{"dtype", "auc", "bayes_auc", "rows_bytes_per_row",
        "state_bytes_per_row", "rows", "fit_s"}`.
    """
    import reckeras as rk  # first: selects Keras's torch backend

    import keras

    keras.utils.set_random_seed(seed)
    train = rk.datasets.load("criteo_synth", split="train")
    test = rk.datasets.load("criteo_synth", split="test")
    options = {f"C{i}": rk.embedding.TableOptions(dtype=dtype) for i in range(1, 27)}
    model = quickstart_model(options, metrics=[rk.metrics.AUC()])
    start = time.perf_counter()
    model.fit(train, batch_size=4096, epochs=epochs, verbose=0)
    fit_s = time.perf_counter() - start
    auc = model.evaluate(test, batch_size=4096, verbose=0, return_dict=True)["auc"]
    table, = model.embedding_stats()[model.embedding_layers[0].name]["per_rank"][0]["tables"]
    rows = table["rows"]
    return {"dtype": dtype, "auc": round(float(auc), 5), "bayes_auc": round(test.bayes_auc(), 5),
            "rows": rows, "rows_bytes_per_row": round(table["bytes_by_part"]["rows"] / rows, 2),
            "state_bytes_per_row": round(table["bytes_by_part"]["optimizer_state"] / rows, 2),
            "fit_s": round(fit_s, 1)}


def main() -> None:
    """Runs every dtype asked for in a fresh process and prints the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float16", "bfloat16"])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--one", help=argparse.SUPPRESS)     # the child process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run(args.one, args.epochs, args.seed)))
        return
    results = []
    for dtype in args.dtypes:
        child = subprocess.run([sys.executable, __file__, "--one", dtype, "--epochs",
                                str(args.epochs), "--seed", str(args.seed)],
                               check=True, capture_output=True, text=True)
        results.append(json.loads(child.stdout.strip().splitlines()[-1]))
        print(json.dumps(results[-1]), flush=True)
    base = next((r["auc"] for r in results if r["dtype"] == "float32"), None)
    print("| rows | test AUC | vs float32 | bytes/row: rows | state | fit s |")
    print("|---|---|---|---|---|---|")
    for r in results:
        delta = "" if base is None else f"{r['auc'] - base:+.4f}"
        print(f"| {r['dtype']} | {r['auc']:.4f} | {delta} | {r['rows_bytes_per_row']} | "
              f"{r['state_bytes_per_row']} | {r['fit_s']} |")


if __name__ == "__main__":
    main()
