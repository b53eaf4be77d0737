"""Seconds from the end of a training window to a running server answering
with its rows, on `criteo_stream`'s production-shaped vocabularies.

Writes `criteo_stream` (`--days` days of `--rows-per-day` rows,
`vocabulary="production"`: 5 fields of 2 to 10 million ids), trains a DLRM
(13 log1p numerics, 26 dim-16 categoricals, `--bottom`/`--top` MLPs,
Adam(1e-3), RowWiseAdagrad(0.05), batch 4096) on the first day and exports
it in full, then starts a real server on localhost
(`python -m reckeras.serving FULL --watch DELTAS --watch-interval 0.1
--torch-threads 1`) and a client thread that sends it a steady load: every
`1 / --rate` seconds one `POST /predict` of `--batch` fixed examples (at
most `--max-requests` in all). Each later day is trained on (`fit_windows`),
and at the end of the training a serving delta is exported into the watched
directory. Per day it prints:

* `freshness_s`: from the end of the day's training (the export included)
  to the first response that carries the delta's version;
* the apply's share: from the delta landing in the directory to that response;
* the p50/p99 latency of the requests sent during the switch (from the end
  of training to one second after the first new-version response) and
  outside it.

Every response is checked against the version it names: its outputs must
equal (atol 1e-4) `model.predict` of the same examples right after that
version's export, and versions never go backwards in the order responses
were received; any other answer counts as a mixed response. At the end: the
failed requests (non-200, or no answer), the mixed responses, and the
server's resident memory (VmRSS) after all deltas. The last line is

    freshness_s=<median> failed_requests=<n> mixed_responses=<n> p99_ratio=<during/outside>

    python benchmarks/serving_freshness.py [--rows-per-day 100000] [--days 4]
        [--rate 20] [--batch 16] [--bottom 256 128] [--top 256 128] [--seed 0]

About 8 minutes with the defaults on 2 shared CPU cores (generating the
stream takes a third of it).
"""

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import reckeras as rk  # noqa: I001  (selects Keras's torch backend first)

import keras
import numpy as np

F = rk.features
VERSION_HEADER = "X-Model-Version"


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_ready(port, server, timeout=300):
    """Waits until `GET /health` answers (the artifact is loaded then)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with status {server.returncode}")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            connection.request("GET", "/health")
            if connection.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the server did not answer /health within {timeout} s")


class Client(threading.Thread):
    """Sends one request every `interval` seconds; keeps every answer:
    `(sent, received, status, version, outputs)`."""

    def __init__(self, port, body, interval, max_requests):
        super().__init__(daemon=True)
        self.port, self.body, self.interval = port, body, interval
        self.max_requests = max_requests
        self.answers = []
        self.stop = threading.Event()

    def run(self):
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        next_send = time.time()
        while not self.stop.is_set() and len(self.answers) < self.max_requests:
            time.sleep(max(0.0, next_send - time.time()))
            next_send += self.interval
            sent = time.time()
            try:
                connection.request("POST", "/predict", body=self.body,
                                   headers={"Content-Type": "application/json"})
                response = connection.getresponse()
                payload = response.read()
                outputs = np.asarray(json.loads(payload)["outputs"], np.float32) \
                    if response.status == 200 else None
                self.answers.append((sent, time.time(), response.status,
                                     response.getheader(VERSION_HEADER), outputs))
            except (OSError, http.client.HTTPException, ValueError):
                self.answers.append((sent, time.time(), None, None, None))
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", self.port,
                                                        timeout=30)


def resident_mb(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def percentile(values, q):
    return float(np.percentile(values, q)) * 1000 if values else float("nan")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows-per-day", type=int, default=100_000)
    parser.add_argument("--days", type=int, default=4,
                        help="the first is exported in full, each later one as a delta")
    parser.add_argument("--rate", type=float, default=20.0, help="requests per second")
    parser.add_argument("--batch", type=int, default=16, help="examples per request")
    parser.add_argument("--max-requests", type=int, default=20_000)
    parser.add_argument("--bottom", type=int, nargs="+", default=[256, 128])
    parser.add_argument("--top", type=int, nargs="+", default=[256, 128])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--settle", type=float, default=3.0,
                        help="seconds of requests before the first day trains and "
                             "after the last delta is served")
    args = parser.parse_args()
    if args.days < 2:
        parser.error("--days must be at least 2: a full export, then deltas")
    with tempfile.TemporaryDirectory(prefix="serving_freshness_") as scratch:
        scratch = Path(scratch)
        stream = rk.datasets.generate("criteo_stream", path=scratch / "stream",
                                      rows_per_day=args.rows_per_day, days=args.days,
                                      seed=args.seed, vocabulary="production")
        days = stream.windows("dt")
        keras.utils.set_random_seed(args.seed)
        columns = rk.layers.FeatureColumns(
            [F.Numeric(f"I{i}", transform="log1p") for i in range(1, 14)]
            + [F.Categorical(f"C{i}", dim=16) for i in range(1, 27)])
        model = rk.models.dlrm(columns, bottom_units=(*args.bottom, 16),
                               top_units=(*args.top, 1))
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="binary_crossentropy",
                      embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.05))
        # The requests: the last day's first examples (ids the model sees
        # only on that day read zeros until its delta lands).
        query = days[-1].to_table().slice(0, args.batch)
        inputs = {name: query.column(name).to_pylist() for name in query.column_names
                  if name != "label"}
        body = json.dumps({"inputs": inputs}).encode()
        expected = {}

        def export(path, base=None):
            model.export_serving(path, base=base)
            version = json.loads((Path(path) / "manifest.json").read_text())["version"]
            expected[version] = model.predict(query, verbose=0)
            return version

        model.fit_windows([days[0]], batch_size=4096, verbose=0, seed=args.seed)
        full = scratch / "full"
        versions = [export(full)]
        deltas = scratch / "deltas"
        deltas.mkdir()
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "reckeras.serving", str(full), "--port", str(port),
             "--watch", str(deltas), "--watch-interval", "0.1", "--torch-threads", "1",
             "--log-level", "warning"], env=dict(os.environ))
        try:
            wait_ready(port, server)
            client = Client(port, body, 1 / args.rate, args.max_requests)
            client.start()
            time.sleep(args.settle)   # latency outside any switch, before training
            print(f"criteo_stream (production vocabulary): {args.days} days of "
                  f"{args.rows_per_day:,} rows; dlrm bottom {args.bottom + [16]} top "
                  f"{args.top + [1]}; {args.rate:g} requests/s of {args.batch} examples")
            print("| day | table rows | delta rows | trained s | export s | freshness s | "
                  "landed to served s |")
            print("|---|---|---|---|---|---|---|")
            switches = []
            base = full
            for day in days[1:]:
                started = time.time()
                model.fit_windows([day], batch_size=4096, verbose=0, seed=args.seed)
                trained = time.time()
                path = deltas / f"delta-{day.partition['dt']}"
                versions.append(export(path, base=base))
                landed = time.time()
                base = path
                while not any(answer[3] == versions[-1] for answer in client.answers):
                    if time.time() - landed > 120:
                        raise RuntimeError(f"{path}: not served after 120 s")
                    time.sleep(0.01)
                served = min(answer[1] for answer in client.answers
                             if answer[3] == versions[-1])
                switches.append((trained, served))
                manifest = json.loads((path / "manifest.json").read_text())
                rows = sum(table["num_rows"] for layer in manifest["embedding_layers"]
                           for table in layer["tables"])
                total = sum(table["rows"] for stats in model.embedding_stats().values()
                            for rank in stats["per_rank"] for table in rank["tables"])
                print(f"| {day.partition['dt']} | {total:,} | {rows:,} | "
                      f"{trained - started:.1f} | {landed - trained:.2f} | "
                      f"{served - trained:.2f} | {served - landed:.2f} |", flush=True)
            time.sleep(args.settle)
            client.stop.set()
            client.join()
            memory = resident_mb(server.pid)
        finally:
            server.terminate()
            server.wait(timeout=30)
        answers = client.answers
        failed = sum(1 for answer in answers if answer[2] != 200)
        mixed, newest = 0, 0
        for _, _, status, version, outputs in sorted(answers, key=lambda a: a[1]):
            if status != 200:
                continue
            if version not in expected or outputs is None or \
                    outputs.shape != expected[version].shape or \
                    not np.allclose(outputs, expected[version], atol=1e-4, rtol=0) or \
                    versions.index(version) < newest:
                mixed += 1
                continue
            newest = versions.index(version)
        during = [received - sent for sent, received, status, _, _ in answers
                  if status == 200 and any(start <= sent <= end + 1
                                           for start, end in switches)]
        outside = [received - sent for sent, received, status, _, _ in answers
                   if status == 200 and not any(start <= sent <= end + 1
                                                for start, end in switches)]
        freshness = statistics.median(end - start for start, end in switches)
        p99_ratio = percentile(during, 99) / percentile(outside, 99)
        print(f"{len(answers)} requests; latency ms during switches p50 "
              f"{percentile(during, 50):.1f} p99 {percentile(during, 99):.1f} "
              f"({len(during)} requests), outside p50 {percentile(outside, 50):.1f} "
              f"p99 {percentile(outside, 99):.1f} ({len(outside)} requests)")
        print(f"server resident memory after {len(switches)} deltas: {memory:.0f} MB")
        print(f"freshness_s={freshness:.2f} failed_requests={failed} "
              f"mixed_responses={mixed} p99_ratio={p99_ratio:.2f}")


if __name__ == "__main__":
    main()
