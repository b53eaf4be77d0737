"""Serving latency and throughput: the exported predictor against model.predict.

Trains the `dlrm` workload's model (benchmarks/workloads.py, as a user writes
it: FeatureColumns, ShardedEmbedding, keras.layers.Dense) for a few steps,
exports it at every row precision and, in one run, side by side on the same
inputs, measures per call: `model.predict` on a dict of numpy columns, the
in-process predictor (`rk.serving.load(path).predict`) on the same dict, and
the HTTP server (`python -m reckeras.serving PATH`, POST /predict with the
columnar `{"inputs": ...}` body) when its extra is installed. It prints p50
and p99 latency at batch 1, 16 and 256, examples/s, and per row precision
the dlrm artifact's size and the test AUC of the README quickstart model
(criteo_synth) through the predictor, against float32's.

Beside them it times the dense network alone: the model's bottom MLP, dot
interaction and top MLP as plain eager torch modules (`baselines.FloorModel`,
the throughput benchmark's floor) on constant embeddings, under
`torch.inference_mode`: what a hand-written torch server spends on the network
before any encoding or lookup. (The predictor runs the same float32 network
on prepacked oneDNN weights, `reckeras.serving.packed_linear`, so it can take
less.)

    python benchmarks/serving.py [--calls 200] [--threads 1] [--auc-epochs 1]
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np
import torch

import baselines
import throughput
from workloads import WORKLOADS, make_batches, quickstart_model, to_arrow

BATCHES = (1, 16, 256)


def timed(fn, calls):
    """Per-call seconds of `calls` calls of `fn` after 5 warm-up calls."""
    for _ in range(5):
        fn()
    seconds = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - start)
    return np.array(seconds)


def auc(scores, labels):
    """The ROC AUC (ties count 1/2), from average ranks."""
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    ranks = ((ends - counts + 1 + ends) / 2)[inverse]
    positive = labels > 0.5
    count = positive.sum()
    return (ranks[positive].sum() - count * (count + 1) / 2) / (count * (~positive).sum())


def quickstart_aucs(root, epochs):
    """Test AUC of the README quickstart model (criteo_synth) through the
    predictor, per row precision."""
    import reckeras as rk
    train = rk.datasets.load("criteo_synth", split="train")
    test = rk.datasets.load("criteo_synth", split="test").to_table()
    model = quickstart_model()
    model.fit(train, batch_size=4096, epochs=epochs, verbose=0)
    labels = test.column("label").to_numpy()
    aucs = {}
    for rows in ("float32", "float16", "int8"):
        path = model.export_serving(os.path.join(root, "quickstart-" + rows), rows=rows)
        scores = rk.serving.load(path).predict(test)[:, 0]
        aucs[rows] = auc(scores, labels)
    return aucs


def columns_of(table, rows):
    """The first `rows` rows of every input column, as numpy."""
    return {name: table.column(name).to_numpy()[:rows]
            for name in table.column_names if name != "label"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(path, torch_threads):
    """The HTTP server on a free port, or None without its extra."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "reckeras.serving", path,
                                "--port", str(port), "--host", "127.0.0.1",
                                "--torch-threads", str(torch_threads)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        if process.poll() is not None:
            print(f"(no HTTP rows: the server did not start: "
                  f"{process.stderr.read().decode()[-300:]})")
            return None, None
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            return process, url
        except OSError:
            time.sleep(0.1)
    process.kill()
    return None, None


def post(url, body):
    request = urllib.request.Request(url + "/predict", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.read()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: one intra-op thread a call, as a server runs)")
    parser.add_argument("--train-batches", type=int, default=40,
                        help="training batches of 1024 of the dlrm workload")
    parser.add_argument("--auc-epochs", type=int, default=1,
                        help="epochs of the quickstart model whose AUC is compared")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import reckeras as rk
    import reckeras.serving

    workload = WORKLOADS["dlrm"]
    table = to_arrow(make_batches(workload, 1024, args.train_batches), workload)
    model = throughput.reckeras_model(workload)
    model.fit(table, batch_size=1024, verbose=0)
    root = tempfile.mkdtemp(prefix="reckeras-serving-")
    sizes = {}
    for rows in ("float32", "float16", "int8"):
        path = model.export_serving(os.path.join(root, rows), rows=rows)
        sizes[rows] = sum(os.path.getsize(os.path.join(d, f))
                          for d, _, files in os.walk(path) for f in files)
    aucs = quickstart_aucs(root, args.auc_epochs)
    path = os.path.join(root, "float32")
    predictor = rk.serving.load(path)
    server, url = start_server(path, args.threads)
    floor = baselines.FloorModel(workload).eval()
    print(f"dlrm model, {workload.num_fields} fields, dim {workload.dim}; torch threads "
          f"{args.threads}; {args.calls} calls per cell\n")
    print("| batch | system | p50 ms | p99 ms | examples/s |")
    print("|---|---|---|---|---|")
    for batch in BATCHES:
        inputs = columns_of(table, batch)
        body = json.dumps({"inputs": {k: v.tolist() for k, v in inputs.items()}}).encode()
        np.testing.assert_allclose(predictor.predict(inputs),
                                   model.predict(inputs, batch_size=batch, verbose=0),
                                   atol=1e-5)
        dense = torch.randn(batch, baselines.NUM_DENSE)

        def dense_network_alone():
            with torch.inference_mode():
                floor(dense)

        systems = {"model.predict": lambda: model.predict(inputs, batch_size=batch,
                                                          verbose=0),
                   "predictor": lambda: predictor.predict(inputs),
                   "dense network alone": dense_network_alone}
        if url:
            systems["HTTP"] = lambda: post(url, body)
        for name, fn in systems.items():
            seconds = timed(fn, args.calls)
            p50, p99 = np.percentile(seconds, [50, 99]) * 1e3
            print(f"| {batch} | {name} | {p50:.2f} | {p99:.2f} | "
                  f"{batch / seconds.mean():,.0f} |")
    if server:
        server.kill()
    print("\n| rows | dlrm artifact MB | quickstart test AUC | AUC - float32's |")
    print("|---|---|---|---|")
    for rows, size in sizes.items():
        print(f"| {rows} | {size / 2**20:.2f} | {aucs[rows]:.4f} | "
              f"{aucs[rows] - aucs['float32']:+.4f} |")


if __name__ == "__main__":
    main()
