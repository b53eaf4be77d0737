"""Two-tower training examples/s, reckeras against plain PyTorch, and exact
top-K latency.

Training: the model of `examples/retrieval.py` (query tower over the user's
id and segment embeddings, candidate tower over the item's, both one linear
layer to 32 dims, L2-normalized, in-batch softmax at temperature 0.1 with a
logQ correction) on the same `retrieval_synth` train batches (the first
`(warmup + steps) * batch` rows, in order), written twice:

- `reckeras`: `rk.models.two_tower` and `fit`, as the example writes it
  (Adam on the towers, RowWiseAdagrad on the tables, the streaming
  frequency estimate for logQ);
- `torch`: as its users write it: `nn.Embedding` tables, `nn.Linear`
  towers, `F.normalize`, `q @ c.T / t - log q` with `log q` from the train
  split's item counts and `F.cross_entropy` against the diagonal, one Adam
  over every parameter; `torch_sparse` the same with sparse embedding
  gradients and `torch.optim.SparseAdam` on the tables.

The systems take turns (repeat 1 of each, then repeat 2, ...) in this
process; `reckeras`'s `fit` tunes glibc's malloc for the whole process on
its first call, which the baselines then get too (a bias against reckeras).
Prints per system `retrieval <system> examples_per_s=<median>` (and `#`
lines with every run), then `retrieval reckeras_over_<baseline>
median=.. min=.. max=.. pairs=..`: the median of the per-repeat ratios.

Top-K: `rk.retrieval.exact_top_k` (chunked, with each query's seen items
excluded) against a plain `torch.topk` of the full score matrix with the
seen items masked, for `retrieval_synth`'s 6,000 users x 2,000 items and for
a random corpus of `--corpus` rows: `topk <queries>x<candidates>
exact_top_k_ms=.. torch_topk_ms=..` (medians).

Serving: the searches a served retrieval artifact runs (`rk.serving.load`'s
exact `exact_top_k` and its faiss index, `--ann hnsw` or `ivf` at default
options), over two corpora side by side: the item embeddings of a two-tower
trained here on the same rows (retrieval_synth's 2,000 items, its users as
queries) and a random one of `--corpus` L2-normalized rows. For each:
per-call latency at batch 1 and batch 64 (`--serve-calls` calls each, p50
and p99), the index's build time, and the ANN's Recall@20 against the exact
top 20 (over 256 queries): `serve <corpus> exact_p50_ms=.. ann_p50_ms=..
ann_recall_at_20=.. ...`.

    python benchmarks/retrieval.py [--batch 1024] [--steps 40] [--warmup 5] [--repeats 5]
        [--corpus 1000000] [--ann hnsw] [--serve-calls 200]
"""

import argparse
import os
import statistics
import time

import reckeras as rk  # first: selects Keras's torch backend

import keras  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

DIM, TEMPERATURE = 32, 0.1
SYSTEMS = ("reckeras", "torch", "torch_sparse")


def train_rows(rows):
    """The first `rows` rows of retrieval_synth's train split, as a Table."""
    table = rk.datasets.load("retrieval_synth", split="train").to_table()
    if rows > table.num_rows:
        raise ValueError(f"--steps and --warmup ask for {rows} rows; the train split "
                         f"has {table.num_rows}")
    return table.slice(0, rows)


def example_model():
    """The example's two-tower, compiled, from seed 0."""
    keras.utils.set_random_seed(0)
    columns = rk.layers.FeatureColumns([
        rk.features.Categorical("user_id", dim=DIM),
        rk.features.Categorical("user_segment", dim=DIM),
        rk.features.Categorical("item_id", dim=DIM)])
    model = rk.models.two_tower(columns, ["user_id", "user_segment"], ["item_id"],
                                query_units=(DIM,), temperature=TEMPERATURE)
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.05))
    return model


def run_reckeras(table, batch, warmup):
    """Examples/s of `fit` over the rows after `warmup` batches."""
    model = example_model()
    model.fit(table.slice(0, warmup * batch), batch_size=batch, epochs=1, verbose=0)
    timed = table.slice(warmup * batch)
    start = time.perf_counter()
    model.fit(timed, batch_size=batch, epochs=1, verbose=0)
    return timed.num_rows / (time.perf_counter() - start)


class PlainTwoTower(torch.nn.Module):
    """The plain PyTorch two-tower."""

    def __init__(self, users, segments, items, sparse):
        super().__init__()
        self.user = torch.nn.Embedding(users, DIM, sparse=sparse)
        self.segment = torch.nn.Embedding(segments, DIM, sparse=sparse)
        self.item = torch.nn.Embedding(items, DIM, sparse=sparse)
        self.query_tower = torch.nn.Linear(2 * DIM, DIM)
        self.candidate_tower = torch.nn.Linear(DIM, DIM)

    def forward(self, user, segment, item):
        query = self.query_tower(torch.cat([self.user(user), self.segment(segment)], 1))
        candidate = self.candidate_tower(self.item(item))
        return F.normalize(query, dim=-1), F.normalize(candidate, dim=-1)


def run_torch(table, batch, warmup, sparse):
    """Examples/s of the plain PyTorch loop over the rows after `warmup` batches."""
    torch.manual_seed(0)
    user, segment, item = (torch.from_numpy(table[name].to_numpy().copy())
                           for name in ("user_id", "user_segment", "item_id"))
    counts = torch.bincount(item, minlength=int(item.max()) + 1).clamp(min=1)
    log_q = torch.log(counts / counts.sum())
    model = PlainTwoTower(int(user.max()) + 1, int(segment.max()) + 1, len(counts), sparse)
    tables = [model.user.weight, model.segment.weight, model.item.weight]
    if sparse:
        towers = [p for p in model.parameters() if all(p is not t for t in tables)]
        optimizers = [torch.optim.SparseAdam(tables, lr=0.01), torch.optim.Adam(towers, 0.01)]
    else:
        optimizers = [torch.optim.Adam(model.parameters(), lr=0.01)]

    def step(rows):
        query, candidate = model(user[rows], segment[rows], item[rows])
        logits = query @ candidate.T / TEMPERATURE - log_q[item[rows]]
        loss = F.cross_entropy(logits, torch.arange(logits.shape[0]))
        for optimizer in optimizers:
            optimizer.zero_grad()
        loss.backward()
        for optimizer in optimizers:
            optimizer.step()

    starts = range(0, table.num_rows, batch)
    for start in starts[:warmup]:
        step(slice(start, start + batch))
    begin = time.perf_counter()
    for start in starts[warmup:]:
        step(slice(start, start + batch))
    return (table.num_rows - warmup * batch) / (time.perf_counter() - begin)


def median_ms(call, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times)


def masked_topk(queries, candidates, k, exclude):
    """Plain torch: the full score matrix, seen items at -inf, `torch.topk`."""
    scores = queries @ candidates.T
    rows = torch.arange(queries.shape[0])[:, None].expand_as(exclude)
    valid = exclude >= 0
    scores[rows[valid], exclude[valid]] = float("-inf")
    return torch.topk(scores, k, dim=1)


def topk_latency(queries, candidates, exclude, repeats):
    """`(exact_top_k ms, plain torch ms)` for k = 20."""
    ours = median_ms(lambda: rk.retrieval.exact_top_k(queries, candidates, 20,
                                                      exclude=exclude), repeats)
    plain = median_ms(lambda: masked_topk(queries, candidates, 20, exclude), repeats)
    return ours, plain


def percentile_ms(call, calls):
    """`(p50, p99)` in ms of `calls` timed calls (after one untimed)."""
    call()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(1e3 * (time.perf_counter() - start))
    return float(np.percentile(times, 50)), float(np.percentile(times, 99))


def synth_vectors(table, batch):
    """Query vectors of retrieval_synth's users and its items' embeddings,
    from a two-tower trained one epoch on `table` (the example's model)."""
    model = example_model()
    model.fit(table, batch_size=batch, epochs=1, verbose=0)
    items = rk.datasets.load("retrieval_synth", split="items").to_table()["item_id"]
    # A user's segment is the same on all of its rows.
    users, first = np.unique(table["user_id"].to_numpy(), return_index=True)
    queries = model.query_model().predict(
        {"user_id": users, "user_segment": table["user_segment"].to_numpy()[first],
         "item_id": np.zeros_like(users)}, verbose=0)     # the item is not read
    return torch.from_numpy(queries), torch.from_numpy(
        model.candidate_embeddings(items.to_numpy()))


def serve_report(name, queries, corpus, kind, calls, k=20):
    """Exact against ANN search of one corpus: latency, build time, recall."""
    from reckeras.serving.ann import AnnIndex

    start = time.perf_counter()
    index = AnnIndex(kind, corpus.numpy(), None)
    build_s = time.perf_counter() - start
    queries = queries[:256].repeat((256 + len(queries) - 1) // len(queries), 1)[:256]
    figures = {}
    for batch in (1, 64):
        rows = queries[:batch]
        figures[f"exact_b{batch}"] = percentile_ms(
            lambda rows=rows: rk.retrieval.exact_top_k(rows, corpus, k), calls)
        figures[f"ann_b{batch}"] = percentile_ms(lambda rows=rows: index.search(rows, k),
                                                 max(1, calls // 4) if batch > 1 else calls)
    _, exact = rk.retrieval.exact_top_k(queries, corpus, k)
    _, found = index.search(queries, k)
    recall = np.mean([len(set(a.tolist()) & set(b.tolist())) / k
                      for a, b in zip(found, exact, strict=True)])
    (exact_p50, exact_p99), (ann_p50, ann_p99) = figures["exact_b1"], figures["ann_b1"]
    print(f"serve {name} exact_p50_ms={exact_p50:.2f} ann_p50_ms={ann_p50:.2f} "
          f"ann_recall_at_{k}={recall:.4f} exact_p99_ms={exact_p99:.2f} "
          f"ann_p99_ms={ann_p99:.2f} exact_b64_p50_ms={figures['exact_b64'][0]:.2f} "
          f"exact_b64_p99_ms={figures['exact_b64'][1]:.2f} "
          f"ann_b64_p50_ms={figures['ann_b64'][0]:.2f} "
          f"ann_b64_p99_ms={figures['ann_b64'][1]:.2f} ann={kind} "
          f"items={len(corpus)} ann_build_s={build_s:.1f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=40, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per run")
    parser.add_argument("--repeats", type=int, default=5, help="runs per system")
    parser.add_argument("--corpus", type=int, default=1_000_000,
                        help="rows of the random corpus of the top-K latency")
    parser.add_argument("--ann", default="hnsw", choices=["hnsw", "ivf"],
                        help="the faiss index the serving figures compare with exact")
    parser.add_argument("--serve-calls", type=int, default=200,
                        help="timed search calls per serving latency figure")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    table = train_rows((args.warmup + args.steps) * args.batch)
    runners = {"reckeras": lambda: run_reckeras(table, args.batch, args.warmup),
               "torch": lambda: run_torch(table, args.batch, args.warmup, False),
               "torch_sparse": lambda: run_torch(table, args.batch, args.warmup, True)}
    runs = {system: [] for system in SYSTEMS}
    for _ in range(args.repeats):               # the systems take turns
        for system in SYSTEMS:
            runs[system].append(runners[system]())
    for system, rates in runs.items():
        print(f"# retrieval {system} runs: " + " ".join(f"{r:.0f}" for r in rates))
        print(f"retrieval {system} examples_per_s={statistics.median(rates):.0f}")
    for baseline in SYSTEMS[1:]:
        ratios = [a / b for a, b in zip(runs["reckeras"], runs[baseline], strict=True)]
        print(f"retrieval reckeras_over_{baseline} median={statistics.median(ratios):.2f} "
              f"min={min(ratios):.2f} max={max(ratios):.2f} pairs={len(ratios)}")

    train = rk.datasets.load("retrieval_synth", split="train")
    users = np.arange(6_000)
    seen = torch.from_numpy(rk.datasets.user_items(train, users))
    generator = torch.Generator().manual_seed(0)
    queries = F.normalize(torch.randn(len(users), DIM, generator=generator), dim=-1)
    items = F.normalize(torch.randn(2_000, DIM, generator=generator), dim=-1)
    ours, plain = topk_latency(queries, items, seen, args.repeats)
    print(f"topk {len(users)}x{len(items)} exact_top_k_ms={ours:.1f} "
          f"torch_topk_ms={plain:.1f}")
    corpus = F.normalize(torch.randn(args.corpus, DIM, generator=generator), dim=-1)
    ours, plain = topk_latency(queries[:256], corpus, seen[:256].clamp(max=args.corpus - 1),
                               args.repeats)
    print(f"topk 256x{args.corpus} exact_top_k_ms={ours:.1f} torch_topk_ms={plain:.1f}")
    serve_report("retrieval_synth", *synth_vectors(table, args.batch), args.ann,
                 args.serve_calls)
    serve_report(f"random_{args.corpus}x{DIM}", queries, corpus, args.ann, args.serve_calls)
    print(f"# load average at start {load:.1f}, at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
