"""Learning quality: the zoo on every packaged dataset, test AUC and logloss
against the Bayes-optimal AUC, with the open CTR benchmarks' protocol.

The protocol (that of the open CTR leaderboards): embedding dim 10, deep
MLPs of (400, 400, 400), batch 4096, Adam(1e-3) on the dense weights and on
the tables (`rk.optimizers.Adam`), up to `--epochs` epochs with early
stopping on validation AUC (patience 2, best weights restored:
`keras.callbacks.EarlyStopping`). Every zoo model keeps its defaults for
what the protocol does not fix (dropout, norm, embedding_l2). Each packaged dataset gets
the zoo models that read its features, as benchmarks/zoo.py picks them:

* `longtail_synth` (ids mostly rare, overfits like real logs): `deepfm`,
  `dcn_v2`; validated on its `valid` split;
* `criteo_synth`: `dlrm`, `dcn_v2`, `deepfm`;
* `taobao_synth`: `dlrm`, `dcn_v2`, `deepfm` (histories pooled), `din`,
  `bst`;
* `aliccp_synth`: `esmm`, `mmoe`, tasks `ctr` and `ctcvr`, stopped on the
  `ctcvr` validation AUC.

Datasets without a `valid` split are validated on the last tenth of their
train split, which is then not trained on.

    python benchmarks/quality.py [--datasets longtail_synth] [--models deepfm]
    python benchmarks/quality.py --csv-dir DIR [--label label]
    python benchmarks/quality.py --sweep [--models deepfm dcn_v2]

`--csv-dir DIR` runs the protocol (`deepfm`, `dcn_v2`) on your own copy of
a public CTR dataset laid out as `DIR/train.csv`, `DIR/valid.csv` and
`DIR/test.csv` with a header line and a label column: every other column is
a categorical field. `--sweep` trains `deepfm` and `dcn_v2` on
`longtail_synth` over dropout {0, 0.2, 0.3} x norm {None, "batch"} x
embedding_l2 {0, 1e-4}: the sweep that chose the zoo's defaults
(docs/models.md). `--rows N` trains on
the first N train rows only (a smoke run).
"""

import argparse
import itertools
import os
import time

import reckeras as rk  # noqa: I001  (selects Keras's torch backend first)

import keras
import numpy as np
import pyarrow as pa
import torch

import zoo
from reckeras.datasets.longtail import CARDINALITIES

F = rk.features
DIM = 10
DEEP = (400, 400, 400)
BATCH_SIZE = 4096
LEARNING_RATE = 1e-3
PATIENCE = 2
SWEEP_DROPOUTS = (0.0, 0.2, 0.3)
SWEEP_NORMS = (None, "batch")
# 1e-4 from first runs (deepfm, dropout 0.2, 100,000 rows): 1e-3 pulled the
# rows to zero faster than the data moved them (test AUC 0.015 lower).
SWEEP_EMBEDDING_L2 = (0.0, 1e-4)
TASKS = zoo.TASKS


def longtail_columns():
    return rk.layers.FeatureColumns([F.Categorical(name, dim=DIM) for name in CARDINALITIES])


def criteo_columns():
    return rk.layers.FeatureColumns(
        [F.Numeric(f"I{i}", transform="log1p") for i in range(1, 14)]
        + [F.Categorical(f"C{i}", dim=DIM) for i in range(1, 27)])


def categorical_columns(schema, label):
    """Every column but the label as a categorical field (the --csv-dir protocol)."""
    specs = []
    for field in schema:
        if field.name == label:
            continue
        if pa.types.is_integer(field.type):
            specs.append(F.Categorical(field.name, dim=DIM))
        elif pa.types.is_string(field.type) or pa.types.is_large_string(field.type):
            specs.append(F.Categorical(field.name, dim=DIM, dtype="string"))
        else:
            raise ValueError(f"--csv-dir: column {field.name!r} is {field.type}; every "
                             f"column but the label must hold integer or string ids")
    return rk.layers.FeatureColumns(specs)


# The zoo models of the protocol over a FeatureColumns, by name; `towers` are
# the zoo models' options (dropout, norm, embedding_l2) when a sweep sets them.
def _deepfm(columns, **towers):
    return rk.models.deepfm(columns, deep_units=DEEP, **towers)


def _dcn_v2(columns, **towers):
    return rk.models.dcn_v2(columns, deep_units=DEEP, **towers)


def _dlrm(columns, **towers):
    return rk.models.dlrm(columns, bottom_units=(64, DIM), top_units=(*DEEP, 1), **towers)


def _din(columns, **towers):
    return rk.models.din(columns, top_units=(*DEEP, 1), **towers)


def _bst(columns, **towers):
    return rk.models.bst(columns, num_heads=2, top_units=(*DEEP, 1), **towers)


def _esmm(columns, **towers):
    return rk.models.esmm(columns, tower_units=DEEP, **towers)


def _mmoe(columns, **towers):
    return rk.models.mmoe(columns, tasks=tuple(TASKS), expert_units=DEEP[:2],
                          tower_units=(64,), **towers)


# Dataset -> {model: (builder, columns)}; columns are built per run.
DATASETS = {
    "longtail_synth": {"deepfm": (_deepfm, longtail_columns),
                       "dcn_v2": (_dcn_v2, longtail_columns)},
    "criteo_synth": {"dlrm": (_dlrm, criteo_columns),
                     "dcn_v2": (_dcn_v2, criteo_columns),
                     "deepfm": (_deepfm, criteo_columns)},
    "taobao_synth": {"dlrm": (_dlrm, lambda: zoo.taobao_columns("sum", DIM)),
                     "dcn_v2": (_dcn_v2, lambda: zoo.taobao_columns("sum", DIM)),
                     "deepfm": (_deepfm, lambda: zoo.taobao_columns("mean", DIM)),
                     "din": (_din, lambda: zoo.taobao_columns(None, DIM)),
                     "bst": (_bst, lambda: zoo.taobao_columns(None, DIM))},
    "aliccp_synth": {"esmm": (_esmm, lambda: zoo.aliccp_columns(DIM)),
                     "mmoe": (_mmoe, lambda: zoo.aliccp_columns(DIM))},
}
MULTITASK = {"aliccp_synth"}
CSV_MODELS = {"deepfm": _deepfm, "dcn_v2": _dcn_v2}


def splits(name, rows):
    """`(train, valid, test)` of a packaged dataset; `rows` cuts train."""
    train = rk.datasets.load(name, split="train").to_table()
    if name == "longtail_synth":
        valid = rk.datasets.load(name, split="valid")
    else:
        held_out = train.num_rows // 10
        train, valid = (train.slice(0, train.num_rows - held_out),
                        train.slice(train.num_rows - held_out))
    train = train if rows is None else train.slice(0, rows)
    return train, valid, rk.datasets.load(name, split="test")


def bayes_of(name, test):
    """The test split's Bayes AUC, per task for a multi-task dataset."""
    if name in MULTITASK:
        return {task: test.metadata["bayes_auc"][label] for task, label in TASKS.items()}
    return test.bayes_auc()


def train_and_test(model, train, valid, test, epochs, seed, labels=None):
    """Trains `model` with the protocol; test AUC and logloss (per task for
    dict `labels`), the epochs trained and the best epoch."""
    multitask = isinstance(labels, dict)
    # One AUC object per task: a shared one would pool every task's predictions.
    model.compile(optimizer=keras.optimizers.Adam(LEARNING_RATE),
                  embedding_optimizer=rk.optimizers.Adam(LEARNING_RATE),
                  loss={task: "binary_crossentropy" for task in labels} if multitask
                  else "binary_crossentropy",
                  metrics={task: [rk.metrics.AUC()] for task in labels} if multitask
                  else [rk.metrics.AUC()])
    monitor = "val_ctcvr_auc" if multitask else "val_auc"
    stopper = keras.callbacks.EarlyStopping(monitor=monitor, mode="max",
                                            patience=PATIENCE, restore_best_weights=True)
    label_arg = {} if labels is None else {"labels": labels}
    history = model.fit(train, batch_size=BATCH_SIZE, epochs=epochs, verbose=0, seed=seed,
                        validation_data=valid, callbacks=[stopper], **label_arg)
    logs = model.evaluate(test, batch_size=BATCH_SIZE, verbose=0, return_dict=True,
                          **label_arg)
    predictions = model.predict(test, batch_size=BATCH_SIZE, verbose=0)
    test_table = test if isinstance(test, pa.Table) else test.to_table()
    trained = len(history.history[monitor])
    best = 1 + max(range(trained), key=lambda epoch: history.history[monitor][epoch])
    if multitask:
        result = {task: (logs[f"{task}_auc"],
                         logloss(test_table[label].to_numpy(), predictions[task]))
                  for task, label in labels.items()}
    else:
        result = (logs["auc"], logloss(test_table[test.label].to_numpy(), predictions))
    return result, trained, best


def logloss(labels, predictions):
    """Mean binary cross-entropy of probabilities, clipped as Keras clips them."""
    p = np.clip(predictions.reshape(-1).astype(np.float64), 1e-7, 1 - 1e-7)
    y = labels.astype(np.float64)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def run_dataset(name, models, rows, epochs, seed):
    train, valid, test = splits(name, rows)
    bayes = bayes_of(name, test)
    table = []
    for model_name in models:
        builder, columns = DATASETS[name][model_name]
        keras.utils.set_random_seed(seed)
        started = time.perf_counter()
        result, trained, best = train_and_test(
            builder(columns()), train, valid, test, epochs, seed,
            labels=TASKS if name in MULTITASK else None)
        seconds = time.perf_counter() - started
        table.append((model_name, result, best))
        print(f"{name} {model_name}: {result} best epoch {best} of {trained} "
              f"({seconds:.0f} s)", flush=True)
    return bayes, table


def print_table(name, bayes, table):
    if isinstance(bayes, dict):
        print("| model | dataset | task | test AUC | logloss | Bayes AUC | gap | "
              "best epoch |")
        print("|---|---|---|---|---|---|---|---|")
        for model_name, result, best in table:
            for task, (auc, logloss) in result.items():
                print(f"| `{model_name}` | `{name}` | `{task}` | {auc:.4f} | "
                      f"{logloss:.4f} | {bayes[task]:.4f} | {auc - bayes[task]:+.4f} | "
                      f"{best} |")
    else:
        print("| model | dataset | test AUC | logloss | Bayes AUC | gap | best epoch |")
        print("|---|---|---|---|---|---|---|")
        for model_name, (auc, logloss), best in table:
            print(f"| `{model_name}` | `{name}` | {auc:.4f} | {logloss:.4f} | "
                  f"{bayes:.4f} | {auc - bayes:+.4f} | {best} |")
    print(flush=True)


def run_csv(directory, label, models, rows, epochs, seed):
    """The protocol on `directory/{train,valid,test}.csv`."""
    paths = {split: os.path.join(directory, f"{split}.csv")
             for split in ("train", "valid", "test")}
    missing = [path for path in paths.values() if not os.path.isfile(path)]
    if missing:
        raise SystemExit(f"--csv-dir needs train.csv, valid.csv and test.csv; "
                         f"missing: {missing}")
    data = {split: rk.datasets.from_csv(path, label=label) for split, path in paths.items()}
    if label not in data["train"].schema.names:
        raise SystemExit(f"--csv-dir: {paths['train']} has no label column {label!r}; "
                         f"name it with --label")
    # Every file is read with the train file's types.
    types = {field.name: field.type for field in data["train"].schema}
    data = {split: rk.datasets.from_csv(path, label=label, column_types=types)
            for split, path in paths.items()}
    train = data["train"] if rows is None else data["train"].to_table().slice(0, rows)
    table = []
    for model_name in models:
        keras.utils.set_random_seed(seed)
        model = CSV_MODELS[model_name](categorical_columns(data["train"].schema, label))
        result, trained, best = train_and_test(model, train, data["valid"], data["test"],
                                               epochs, seed)
        table.append((model_name, result, best))
        print(f"{directory} {model_name}: {result} best epoch {best} of {trained}",
              flush=True)
    print("| model | data | test AUC | logloss | best epoch |")
    print("|---|---|---|---|---|")
    for model_name, (auc, logloss), best in table:
        print(f"| `{model_name}` | `{directory}` | {auc:.4f} | {logloss:.4f} | {best} |")


def run_sweep(models, rows, epochs, seed):
    """Every setting of the sweep on `longtail_synth`; returns the rows."""
    train, valid, test = splits("longtail_synth", rows)
    bayes = test.bayes_auc()
    results = []
    for model_name, norm, embedding_l2, dropout in itertools.product(
            models, SWEEP_NORMS, SWEEP_EMBEDDING_L2, SWEEP_DROPOUTS):
        builder, columns = DATASETS["longtail_synth"][model_name]
        keras.utils.set_random_seed(seed)
        started = time.perf_counter()
        (auc, logloss), trained, best = train_and_test(
            builder(columns(), dropout=dropout, norm=norm, embedding_l2=embedding_l2),
            train, valid, test, epochs, seed)
        results.append((model_name, dropout, norm, embedding_l2, auc, logloss, best))
        print(f"sweep {model_name} dropout={dropout} norm={norm} "
              f"embedding_l2={embedding_l2}: auc={auc:.4f} logloss={logloss:.4f} "
              f"best epoch {best} of {trained} ({time.perf_counter() - started:.0f} s)",
              flush=True)
    print("| model | dropout | norm | embedding_l2 | test AUC | logloss | gap to Bayes | "
          "best epoch |")
    print("|---|---|---|---|---|---|---|---|")
    for model_name, dropout, norm, embedding_l2, auc, logloss, best in results:
        norm_cell = "None" if norm is None else f'`"{norm}"`'
        print(f"| `{model_name}` | {dropout} | {norm_cell} | {embedding_l2:g} | {auc:.4f} | "
              f"{logloss:.4f} | {auc - bayes:+.4f} | {best} |")
    print(f"\nBayes AUC of the test split: {bayes:.4f}", flush=True)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS),
                        choices=list(DATASETS))
    parser.add_argument("--models", nargs="+", default=None,
                        help="the zoo models to run (default: all that fit each dataset)")
    parser.add_argument("--csv-dir", default=None,
                        help="run the protocol on DIR/{train,valid,test}.csv instead")
    parser.add_argument("--label", default="label", help="the label column of --csv-dir")
    parser.add_argument("--sweep", action="store_true",
                        help="the dropout x norm x embedding_l2 sweep on longtail_synth")
    parser.add_argument("--epochs", type=int, default=30,
                        help="the most epochs; early stopping ends most runs sooner")
    parser.add_argument("--rows", type=int, default=None,
                        help="train on the first ROWS train rows only")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.csv_dir is not None or args.sweep:
        models = args.models or list(CSV_MODELS)
        unknown = sorted(set(models) - set(CSV_MODELS))
        if unknown:
            parser.error(f"--csv-dir and --sweep run {list(CSV_MODELS)}, not {unknown}")
        if args.sweep:
            run_sweep(models, args.rows, args.epochs, args.seed)
        else:
            run_csv(args.csv_dir, args.label, models, args.rows, args.epochs, args.seed)
        return
    for name in args.datasets:
        models = [model for model in DATASETS[name]
                  if args.models is None or model in args.models]
        if not models:
            continue
        bayes, table = run_dataset(name, models, args.rows, args.epochs, args.seed)
        print_table(name, bayes, table)


if __name__ == "__main__":
    main()
