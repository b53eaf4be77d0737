"""Matrix factorization on a matching benchmark, against popularity and SVD.

The open graph/matching benchmarks (Gowalla, Yelp2018, Amazon-book as
LightGCN ships them) are two files of `user item item ...` lines,
`train.txt` and `test.txt`. Their protocol: rank every item for each user
with a test item, the user's train items left out, and average Recall@20
and NDCG@20. The published figures for matrix-factorization-style models
(MF with the cosine contrastive loss, SimpleX, 2021) are Recall@20 0.1837
on Gowalla, 0.0698 on Yelp2018 and 0.0559 on Amazon-book.

`--data DIR` runs on such a directory. Without it, a Gowalla-shaped
synthetic is generated (`--users` x `--items`, each user's count of items
log-normal, items drawn from a 32-dimensional latent-factor teacher with a
popularity bias, 20% of each user's items held out), and the teacher's own
Recall@20 is printed as the optimum.

The model is what a user writes for these leaderboards: `rk.models.two_tower`
with no tower on either side (`query_units=()`, `candidate_units=()`: each
side is its L2-normalized `--dim` embedding; `--units` gives both sides a
tower, `--loss` another loss), the cosine contrastive loss
(`--margin`, `--negative-weight`) over `--negatives` uniform negatives from
the item corpus and no in-batch ones (`in_batch_negatives=False`, as SimpleX;
`--in-batch-negatives` adds them), RowWiseAdagrad at 0.1 on the tables (`--embedding-optimizer`,
`--learning-rate`: on the Gowalla-shaped synthetic Adam at 0.01 levelled
off lower, 0.061 against 0.064 at epochs 20-24, though on a 6,000-user one
it ended higher, 0.055 against 0.049).

The protocol keeps the test items out of every choice. First the learning
rate schedule and the number of epochs are selected on the train rows
alone: a per-user random share (`--validation`) is held out, and `fit` runs
with Keras's `ReduceLROnPlateau` (the rates drop 10x after `--patience`
epochs without a better validation Recall@20; the tables' rate follows the
dense optimizer's) and `EarlyStopping`, lines `matching select epoch=<e>
val_recall_at_20=.. rate=..`. Then a fresh model trains on all the train
rows with that schedule (`LearningRateScheduler`) for the best epoch's count,
printing test figures every `--eval-every` epochs as progress
(`matching epoch=<e> recall_at_20=.. ndcg_at_20=..`); `--schedule` gives the
rates and skips the selection. The baselines, evaluated the same way with
plain torch: `matching baseline=popularity ...` (every user gets the most
frequent train items) and `matching baseline=svd<dim> ...` (a rank-`--dim`
truncated SVD of the user-item train matrix, `torch.svd_lowrank`). The last
line is the final model's, `matching recall_at_20=<x> ndcg_at_20=<y>
epochs=<e> schedule=<rates>` (`rk.retrieval.evaluate`, exact).

    python benchmarks/matching.py
    python benchmarks/matching.py --data /path/to/gowalla
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras
import torch

import reckeras as rk

K = 20
EMBEDDING_OPTIMIZERS = {"adam": rk.optimizers.Adam, "adagrad": rk.optimizers.Adagrad,
                        "rowwise_adagrad": rk.optimizers.RowWiseAdagrad,
                        "sgd": rk.optimizers.SGD}


def generate(directory: Path, users: int, items: int, seed: int = 0) -> float:
    """Writes a Gowalla-shaped `train.txt`/`test.txt`; returns the teacher's
    Recall@20 under the benchmark's protocol."""
    rng = np.random.default_rng(seed)
    latent = 32
    user = rng.normal(size=(users, latent)).astype(np.float32) * (6 / np.sqrt(latent))
    item = rng.normal(size=(items, latent)).astype(np.float32) * (3 / np.sqrt(latent))
    popularity = (-0.55 * np.log(np.arange(1, items + 1)))[rng.permutation(items)]
    counts = np.clip(rng.lognormal(3.2, 0.8, users).astype(int), 10, min(800, items // 2))
    directory.mkdir(parents=True, exist_ok=True)
    recalls = []
    with open(directory / "train.txt", "w") as train, open(directory / "test.txt", "w") as test:
        for start in range(0, users, 1000):
            logits = user[start:start + 1000] @ item.T + popularity.astype(np.float32)
            noisy = logits + rng.gumbel(size=logits.shape).astype(np.float32)
            for row in range(len(logits)):
                n = counts[start + row]
                chosen = np.argpartition(-noisy[row], n)[:n]
                rng.shuffle(chosen)
                held = max(1, round(0.2 * n))
                train.write(f"{start + row} " + " ".join(map(str, chosen[held:])) + "\n")
                test.write(f"{start + row} " + " ".join(map(str, chosen[:held])) + "\n")
                scores = logits[row].copy()
                scores[chosen[held:]] = -np.inf
                top = np.argpartition(-scores, K)[:K]
                recalls.append(len(np.intersect1d(top, chosen[:held])) / held)
    return float(np.mean(recalls))


def recall_and_ndcg(top: torch.Tensor, relevant: torch.Tensor) -> tuple[float, float]:
    """Mean Recall@K and NDCG@K of ranked positions `[U, K]` against -1
    padded relevant positions `[U, R]` (the protocol's definitions)."""
    hit = (top[:, :, None] == relevant[:, None, :]).any(2).float()
    count = (relevant >= 0).sum(1).float()
    discount = 1.0 / torch.log2(torch.arange(2, top.shape[1] + 2, dtype=torch.float32))
    ideal = torch.cumsum(discount, 0)[(count.clamp(max=top.shape[1]) - 1).long()]
    return float((hit.sum(1) / count).mean()), float(((hit * discount).sum(1) / ideal).mean())


def masked_rank(scores_of, queries: int, exclude: torch.Tensor, chunk: int = 2048) -> torch.Tensor:
    """Plain torch: each chunk of queries' full score rows, train items at
    -inf, `torch.topk`."""
    parts = []
    for start in range(0, queries, chunk):
        stop = min(start + chunk, queries)
        scores = scores_of(start, stop).clone()
        rows = exclude[start:stop]
        r, c = torch.nonzero(rows >= 0, as_tuple=True)
        scores[r, rows[r, c]] = -torch.inf
        parts.append(torch.topk(scores, K, dim=1).indices)
    return torch.cat(parts)


def baselines(train_users: np.ndarray, train_items: np.ndarray, tested: np.ndarray,
              shape: tuple[int, int], exclude: torch.Tensor, relevant: torch.Tensor,
              dim: int) -> list[tuple[str, float, float]]:
    """Popularity and rank-`dim` SVD for the `tested` users, each
    `(name, recall, ndcg)`."""
    items = shape[1]
    counts = torch.bincount(torch.from_numpy(train_items), minlength=items).float()
    popular = masked_rank(lambda a, b: counts.expand(b - a, -1), len(tested), exclude)
    matrix = torch.sparse_coo_tensor(
        torch.from_numpy(np.stack([train_users, train_items])),
        torch.ones(len(train_users)), shape, check_invariants=True).coalesce()
    torch.manual_seed(0)
    left, singular, right = torch.svd_lowrank(matrix, q=dim, niter=4)
    factors = (left * singular)[torch.from_numpy(tested)]
    svd = masked_rank(lambda a, b: factors[a:b] @ right.T, len(tested), exclude)
    return [("popularity", *recall_and_ndcg(popular, relevant)),
            (f"svd{dim}", *recall_and_ndcg(svd, relevant))]


def build_model(args, items: int):
    columns = rk.layers.FeatureColumns([rk.features.Categorical("user_id", dim=args.dim),
                                        rk.features.Categorical("item_id", dim=args.dim)])
    negatives = rk.retrieval.NegativeSampler(np.arange(items), num_negatives=args.negatives)
    model = rk.models.two_tower(columns, ["user_id"], ["item_id"],
                                query_units=tuple(args.units), candidate_units=tuple(args.units),
                                loss=args.loss, margin=args.margin,
                                negative_weight=args.negative_weight, negatives=negatives,
                                in_batch_negatives=args.in_batch_negatives)
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  embedding_optimizer=EMBEDDING_OPTIMIZERS[args.embedding_optimizer](
                      args.learning_rate))
    return model


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="a directory with LightGCN-format train.txt and "
                        "test.txt (default: a generated Gowalla-shaped synthetic)")
    parser.add_argument("--users", type=int, default=29_858)
    parser.add_argument("--items", type=int, default=40_981)
    parser.add_argument("--epochs", type=int, default=60,
                        help="the most epochs the schedule's selection trains")
    parser.add_argument("--validation", type=float, default=0.1,
                        help="each user's share of train rows the selection holds out")
    parser.add_argument("--patience", type=int, default=2,
                        help="epochs without a better validation Recall@20 before "
                        "the rates drop 10x")
    parser.add_argument("--schedule", help="the dense rate of each epoch, comma "
                        "separated: skips the selection (the tables' rate follows)")
    parser.add_argument("--eval-every", type=int, default=5,
                        help="test figures every this many epochs of the final fit "
                        "(progress: the result is the last epoch's)")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--negatives", type=int, default=1000)
    parser.add_argument("--margin", type=float, default=0.9)
    parser.add_argument("--negative-weight", type=float, default=150.0)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--in-batch-negatives", action="store_true",
                        help="the batch's other items are negatives too (default: the "
                        "sampled ones only, as SimpleX)")
    parser.add_argument("--units", type=int, nargs="*", default=[],
                        help="tower widths of both sides (default: none, MF)")
    parser.add_argument("--loss", default="cosine_contrastive",
                        choices=("softmax", "bpr", "cosine_contrastive"))
    parser.add_argument("--embedding-optimizer", default="rowwise_adagrad",
                        choices=sorted(EMBEDDING_OPTIMIZERS))
    parser.add_argument("--learning-rate", type=float, default=0.1,
                        help="the tables' optimizer's")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(args.data) if args.data else Path(scratch)
        if not args.data:
            teacher = generate(directory, args.users, args.items)
            print(f"matching data=synthetic users={args.users} items={args.items} "
                  f"teacher_recall_at_20={teacher:.4f}", flush=True)
        run(args, directory)


def run(args, directory: Path) -> None:
    keras.utils.set_random_seed(0)
    train = rk.datasets.from_user_lines(directory / "train.txt")
    test = rk.datasets.from_user_lines(directory / "test.txt")
    train_rows, test_rows = train.to_table(), test.to_table()
    train_users = train_rows["user_id"].to_numpy().astype(np.int64)  # writable, for torch
    train_items = train_rows["item_id"].to_numpy().astype(np.int64)
    users = int(max(train_users.max(), test_rows["user_id"].to_numpy().max())) + 1
    items = int(max(train_items.max(), test_rows["item_id"].to_numpy().max())) + 1
    # The protocol's users are those with a test item.
    tested = np.unique(test_rows["user_id"].to_numpy())
    exclude = rk.datasets.user_items(train, tested)
    relevant = rk.datasets.user_items(test, tested)
    print(f"matching train_rows={len(train_users)} test_rows={test_rows.num_rows} "
          f"users={len(tested)} items={items}", flush=True)

    for name, recall, ndcg in baselines(train_users, train_items, tested, (users, items),
                                        torch.from_numpy(exclude), torch.from_numpy(relevant),
                                        args.dim):
        print(f"matching baseline={name} recall_at_20={recall:.4f} ndcg_at_20={ndcg:.4f}",
              flush=True)

    if args.schedule:
        rates = [float(rate) for rate in args.schedule.split(",")]
    else:
        rates = select_schedule(args, train_rows, items)
    # The final model: all the train rows, the selected rates, the test
    # items seen once, at the end (the lines before it are progress).
    model = build_model(args, items)
    metrics = [rk.metrics.RecallAtK(K), rk.metrics.NDCGAtK(K)]
    replay = keras.callbacks.LearningRateScheduler(lambda epoch, rate: rates[epoch])
    progress = rk.retrieval.RetrievalEvaluation(
        {"user_id": tested}, np.arange(items), relevant=relevant, exclude=exclude,
        metrics=metrics, every=args.eval_every, prefix="test_")
    report = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: print(
        f"matching epoch={epoch + 1} recall_at_20={logs[f'test_recall_at_{K}']:.4f} "
        f"ndcg_at_20={logs[f'test_ndcg_at_{K}']:.4f} rate={rates[epoch]:g}", flush=True)
        if f"test_recall_at_{K}" in logs else None)
    start = time.perf_counter()
    model.fit(train, batch_size=args.batch_size, epochs=len(rates), verbose=0,
              callbacks=[replay, progress, report])
    fit_s = time.perf_counter() - start
    result = rk.retrieval.evaluate(model, {"user_id": tested}, np.arange(items),
                                   relevant=relevant, exclude=exclude, metrics=metrics)
    print(f"matching recall_at_20={result[f'recall_at_{K}']:.4f} "
          f"ndcg_at_20={result[f'ndcg_at_{K}']:.4f} epochs={len(rates)} "
          f"schedule={','.join(f'{rate:g}' for rate in rates)} fit_s={fit_s:.0f}")


def select_schedule(args, train_rows, items: int) -> list[float]:
    """The dense rate of each epoch, chosen on a per-user random share of the
    train rows (`--validation`): `ReduceLROnPlateau` divides the rates by 10
    after `--patience` epochs without a better validation Recall@20 (the
    tables' rate follows), `EarlyStopping` ends after `2 * --patience + 1`,
    and the schedule ends at the best epoch."""
    fitted, held = rk.datasets.split_per_user(train_rows, by="random",
                                              fraction=args.validation, seed=0)
    queries = np.unique(held["user_id"].to_numpy())
    model = build_model(args, items)
    rates: list[float] = []
    monitor = f"val_recall_at_{K}"
    callbacks = [
        keras.callbacks.LambdaCallback(on_epoch_begin=lambda epoch, logs: rates.append(
            float(keras.ops.convert_to_numpy(model.optimizer.learning_rate)))),
        rk.retrieval.RetrievalEvaluation(
            {"user_id": queries}, np.arange(items),
            relevant=rk.datasets.user_items(held, queries),
            exclude=rk.datasets.user_items(fitted, queries), metrics=[rk.metrics.RecallAtK(K)]),
        keras.callbacks.ReduceLROnPlateau(monitor=monitor, mode="max", factor=0.1,
                                          patience=args.patience, min_lr=0.0),
        keras.callbacks.EarlyStopping(monitor=monitor, mode="max",
                                      patience=2 * args.patience + 1),
        keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: print(
            f"matching select epoch={epoch + 1} val_recall_at_20={logs[monitor]:.4f} "
            f"rate={rates[epoch]:g}", flush=True))]
    history = model.fit(fitted, batch_size=args.batch_size, epochs=args.epochs, verbose=0,
                        callbacks=callbacks).history
    best = int(np.argmax(history[monitor])) + 1
    print(f"matching select best_epoch={best} "
          f"val_recall_at_20={history[monitor][best - 1]:.4f}", flush=True)
    return rates[:best]


if __name__ == "__main__":
    main()
