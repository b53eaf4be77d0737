"""The model zoo on `taobao_synth` and `aliccp_synth`: test AUC against the
Bayes AUC, and speed.

Trains every single-task zoo model on the packaged `taobao_synth` train split
with one recipe (one epoch, batch 128, Adam(2e-3) on the dense weights,
RowWiseAdagrad(0.05) on the tables, dim-16 embeddings, the same 200-80 top
MLP) and the multi-task ones (`esmm`, `mmoe`) on `aliccp_synth`, tasks
`ctr` (the click label) and `ctcvr` (click and conversion), with the
recipe of `MULTITASK_RECIPE`. Prints the markdown tables of docs/models.md:
test AUC per task, the Bayes-optimal test AUC (the hidden teacher's), and
training examples/s on one CPU thread (`--threads`; one thread keeps the
figure stable on a shared machine). `dlrm`, `dcn_v2` and `deepfm` see the
histories pooled (`Sequence(combiner="sum")`, `"mean"` for deepfm, whose FM
term the sums blow up); `din` and `bst` see them unpooled.

    python benchmarks/zoo.py [--models dlrm din bst esmm] [--seed 0] [--threads 1]

`--rows N` trains on the first N train rows only (a smoke run). About 3
minutes for the five taobao models and 1.5 more for `esmm` and `mmoe`.
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
TASKS = {"ctr": "click", "ctcvr": "conversion"}   # output -> label column of aliccp_synth


def taobao_columns(combiner, dim=DIM):
    """The features of `taobao_synth`; `combiner` pools the histories (None: not)."""
    return rk.layers.FeatureColumns([
        F.Numeric("hist_len", transform="log1p"),
        F.Categorical("user_gender", dim=dim),
        F.Categorical("user_age", dim=dim),
        F.Categorical("user_city", dim=dim),
        F.Categorical("item", dim=dim, table="item"),
        F.Categorical("category", dim=dim, table="category"),
        F.Sequence("hist_items", dim=dim, max_len=MAX_LEN, table="item",
                   combiner=combiner),
        F.Sequence("hist_cats", dim=dim, max_len=MAX_LEN, table="category",
                   combiner=combiner),
    ])


def aliccp_columns(dim=DIM):
    """The features of `aliccp_synth`: every id column, the two numerics."""
    return rk.layers.FeatureColumns(
        [F.Numeric("user_clicks_30d", transform="log1p"),
         F.Numeric("item_price", transform="log1p")]
        + [F.Categorical(name, dim=dim) for name in (
            "user_id", "user_gender", "user_age", "user_city_level", "user_occupation",
            "item_id", "item_category", "item_shop", "item_brand", "position", "hour")])


# The recipe of docs/models.md's figures here: towers without dropout, tables
# without a penalty (the zoo's defaults before its sweep chose others).
NO_REGULARIZATION = {"dropout": 0.0, "embedding_l2": 0.0}

MODELS = {
    "dlrm": lambda: rk.models.dlrm(taobao_columns("sum"),
                                   bottom_units=(64, DIM), top_units=TOP_UNITS,
                                   **NO_REGULARIZATION),
    "dcn_v2": lambda: rk.models.dcn_v2(taobao_columns("sum"), cross_layers=2,
                                       deep_units=TOP_UNITS[:-1], **NO_REGULARIZATION),
    "deepfm": lambda: rk.models.deepfm(taobao_columns("mean"),
                                       deep_units=TOP_UNITS[:-1], **NO_REGULARIZATION),
    "din": lambda: rk.models.din(taobao_columns(None), top_units=TOP_UNITS,
                                 **NO_REGULARIZATION),
    "bst": lambda: rk.models.bst(taobao_columns(None), num_blocks=2, num_heads=4,
                                 top_units=TOP_UNITS, **NO_REGULARIZATION),
}

MULTITASK_MODELS = {
    "esmm": lambda: rk.models.esmm(aliccp_columns(), tower_units=(64, 32), **NO_REGULARIZATION),
    "mmoe": lambda: rk.models.mmoe(aliccp_columns(), tasks=tuple(TASKS), num_experts=4,
                                   expert_units=(128, 64), tower_units=(32,),
                                   **NO_REGULARIZATION),
}

# The multi-task models' recipe: Adam(learning_rate) on the dense weights and
# RowWiseAdagrad(table_learning_rate, initial_accumulator_value) on the
# tables. From an empty accumulator, Adagrad's first steps on a row are about
# the learning rate whatever the gradient, so the rows of ids seen a few
# times memorize their labels' noise (test AUC falls from the second epoch
# on); a starting accumulator keeps their steps proportional to the gradient.
# Three epochs were best (ESMM, seed 0: the fourth loses 0.004 of ctcvr
# AUC; docs/models.md has the measurements).
MULTITASK_RECIPE = {"epochs": 3, "batch_size": 512, "learning_rate": 1e-3,
                    "table_learning_rate": 0.2, "initial_accumulator_value": 1e-3}


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


def run_multitask(name, train, test, seed):
    """Trains `name` on `train` (tasks `TASKS`, `MULTITASK_RECIPE`); test AUC
    per task, speed."""
    recipe = MULTITASK_RECIPE
    keras.utils.set_random_seed(seed)
    model = MULTITASK_MODELS[name]()
    model.compile(optimizer=keras.optimizers.Adam(recipe["learning_rate"]),
                  loss={task: "binary_crossentropy" for task in TASKS},
                  metrics={task: [rk.metrics.AUC()] for task in TASKS},
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(
                      recipe["table_learning_rate"],
                      initial_accumulator_value=recipe["initial_accumulator_value"]))
    started = time.perf_counter()
    model.fit(train, labels=TASKS, batch_size=recipe["batch_size"],
              epochs=recipe["epochs"], verbose=0, seed=seed)
    seconds = time.perf_counter() - started
    logs = model.evaluate(test, labels=TASKS, batch_size=4096, verbose=0,
                          return_dict=True)
    return {"auc": {task: logs[f"{task}_auc"] for task in TASKS},
            "examples_per_s": model.pipeline_stats["examples_per_s"],
            "seconds": seconds}


def first_rows(dataset, rows):
    """The dataset, or a table of its first `rows` rows when `rows` is set."""
    return dataset if rows is None else dataset.to_table().slice(0, rows)


def speed_header(threads):
    return f"examples/s (train, {threads} CPU thread{'s' * (threads > 1)})"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    choices = [*MODELS, *MULTITASK_MODELS]
    parser.add_argument("--models", nargs="+", default=choices, choices=choices)
    parser.add_argument("--epochs", type=int, default=1,
                        help="epochs of the taobao_synth models")
    parser.add_argument("--batch-size", type=int, default=128,
                        help="batch size of the taobao_synth models")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", type=int, default=None,
                        help="train on the first ROWS train rows only")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    single = [name for name in args.models if name in MODELS]
    multi = [name for name in args.models if name in MULTITASK_MODELS]
    if single:
        train = first_rows(rk.datasets.load("taobao_synth", split="train"), args.rows)
        test = rk.datasets.load("taobao_synth", split="test")
        bayes = test.bayes_auc()
        rows = []
        for name in single:
            result = run(name, train, test, args.epochs, args.batch_size, args.seed)
            rows.append((name, result))
            print(f"{name}: test_auc={result['auc']:.4f} bayes_auc={bayes:.4f} "
                  f"examples_per_s={result['examples_per_s']:,.0f} "
                  f"({result['seconds']:.0f} s)", flush=True)
        print()
        print(f"| model | dataset | test AUC | Bayes AUC | {speed_header(args.threads)} |")
        print("|---|---|---|---|---|")
        for name, result in rows:
            print(f"| `{name}` | `taobao_synth` | {result['auc']:.4f} | {bayes:.4f} | "
                  f"{result['examples_per_s']:,.0f} |")
        print()
    if multi:
        train = first_rows(rk.datasets.load("aliccp_synth", split="train"), args.rows)
        test = rk.datasets.load("aliccp_synth", split="test")
        bayes = {task: test.metadata["bayes_auc"][label] for task, label in TASKS.items()}
        rows = []
        for name in multi:
            result = run_multitask(name, train, test, args.seed)
            rows.append((name, result))
            print(f"{name}: " + " ".join(
                f"{task}_auc={result['auc'][task]:.4f} (bayes {bayes[task]:.4f})"
                for task in TASKS)
                + f" examples_per_s={result['examples_per_s']:,.0f} "
                  f"({result['seconds']:.0f} s)", flush=True)
        print()
        print("| model | dataset | `ctr` AUC | Bayes | gap | `ctcvr` AUC | Bayes | gap | "
              f"{speed_header(args.threads)} |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name, result in rows:
            cells = " | ".join(f"{result['auc'][task]:.4f} | {bayes[task]:.4f} | "
                               f"{result['auc'][task] - bayes[task]:+.4f}" for task in TASKS)
            print(f"| `{name}` | `aliccp_synth` | {cells} | "
                  f"{result['examples_per_s']:,.0f} |")


if __name__ == "__main__":
    main()
