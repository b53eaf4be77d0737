"""The model zoo on `taobao_synth`: test AUC against the Bayes AUC, and speed.

Trains every zoo model on the packaged `taobao_synth` train split with one
recipe (one epoch, batch 128, Adam(2e-3) on the dense weights,
RowWiseAdagrad(0.05) on the tables, dim-16 embeddings, the same 200-80 top
MLP) and prints the markdown table of docs/models.md: test AUC, the
Bayes-optimal test AUC (the hidden teacher's), and training examples/s on one
CPU thread (`--threads`; one thread keeps the figure stable on a shared
machine). `dlrm`, `dcn_v2` and `deepfm` see the histories pooled
(`Sequence(combiner="sum")`, `"mean"` for deepfm, whose FM term the sums
blow up); `din` and `bst` see them unpooled.

    python benchmarks/zoo.py [--models dlrm din bst] [--seed 0] [--threads 1]

About 3 minutes for all five models.
"""

import argparse
import time

import reckeras as rk  # noqa: I001  (selects Keras's torch backend first)

import keras
import torch

F = rk.features
DIM = 16
MAX_LEN = 50
TOP_UNITS = (200, 80, 1)


def taobao_columns(combiner):
    """The features of `taobao_synth`; `combiner` pools the histories (None: not)."""
    return rk.layers.FeatureColumns([
        F.Numeric("hist_len", transform="log1p"),
        F.Categorical("user_gender", dim=DIM),
        F.Categorical("user_age", dim=DIM),
        F.Categorical("user_city", dim=DIM),
        F.Categorical("item", dim=DIM, table="item"),
        F.Categorical("category", dim=DIM, table="category"),
        F.Sequence("hist_items", dim=DIM, max_len=MAX_LEN, table="item",
                   combiner=combiner),
        F.Sequence("hist_cats", dim=DIM, max_len=MAX_LEN, table="category",
                   combiner=combiner),
    ])


MODELS = {
    "dlrm": lambda: rk.models.dlrm(taobao_columns("sum"),
                                   bottom_units=(64, DIM), top_units=TOP_UNITS),
    "dcn_v2": lambda: rk.models.dcn_v2(taobao_columns("sum"), cross_layers=2,
                                       deep_units=TOP_UNITS[:-1]),
    "deepfm": lambda: rk.models.deepfm(taobao_columns("mean"),
                                       deep_units=TOP_UNITS[:-1]),
    "din": lambda: rk.models.din(taobao_columns(None), top_units=TOP_UNITS),
    "bst": lambda: rk.models.bst(taobao_columns(None), num_blocks=2, num_heads=4,
                                 dropout=0.0, top_units=TOP_UNITS),
}


def run(name, train, test, epochs, batch_size, seed):
    keras.utils.set_random_seed(seed)
    model = MODELS[name]()
    model.compile(optimizer=keras.optimizers.Adam(2e-3), loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.05),
                  metrics=[rk.metrics.AUC()])
    started = time.perf_counter()
    model.fit(train, batch_size=batch_size, epochs=epochs, verbose=0, seed=seed)
    seconds = time.perf_counter() - started
    logs = model.evaluate(test, batch_size=4096, verbose=0, return_dict=True)
    return {"auc": logs["auc"], "examples_per_s": model.pipeline_stats["examples_per_s"],
            "seconds": seconds}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    train = rk.datasets.load("taobao_synth", split="train")
    test = rk.datasets.load("taobao_synth", split="test")
    bayes = test.bayes_auc()
    rows = []
    for name in args.models:
        result = run(name, train, test, args.epochs, args.batch_size, args.seed)
        rows.append((name, result))
        print(f"{name}: test_auc={result['auc']:.4f} bayes_auc={bayes:.4f} "
              f"examples_per_s={result['examples_per_s']:,.0f} "
              f"({result['seconds']:.0f} s)", flush=True)
    print()
    print(f"| model | dataset | test AUC | Bayes AUC | examples/s (train, "
          f"{args.threads} CPU thread{'s' * (args.threads > 1)}) |")
    print("|---|---|---|---|---|")
    for name, result in rows:
        print(f"| `{name}` | `taobao_synth` | {result['auc']:.4f} | {bayes:.4f} | "
              f"{result['examples_per_s']:,.0f} |")


if __name__ == "__main__":
    main()
