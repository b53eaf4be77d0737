"""Retrieval: a two-tower model on the packaged retrieval_synth dataset,
evaluated over the whole item corpus against the hidden teacher.

The query tower reads the user's id and segment, the candidate tower the
item's id; each item's position in the corpus is its id. The valid split's
Recall@20 is reported after every epoch (each user's train items left out),
the test split's at the end (train and valid items left out), beside the
teacher's own: the best a model that sees only the train split can expect.

Then it serves the model as a user would: `export_serving` writes the query
tower and the corpus's embeddings, `python -m reckeras.serving` serves them
(a real server process on a free port), and a few users' top 20 asked over
HTTP (`POST /retrieve`, their train and valid items left out) must equal the
in-process model's.
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import reckeras as rk  # first: selects Keras's torch backend

import keras  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

train = rk.datasets.load("retrieval_synth", split="train")
valid = rk.datasets.load("retrieval_synth", split="valid")
test = rk.datasets.load("retrieval_synth", split="test")
item_ids = rk.datasets.load("retrieval_synth", split="items").to_table()["item_id"].to_numpy()

# One query per user: its id and segment (the segment is the same on all of
# a user's rows; the last one read wins).
rows = train.to_table()
users = np.unique(rows["user_id"].to_numpy())
segments = np.zeros(len(users), dtype=np.int64)
segments[np.searchsorted(users, rows["user_id"].to_numpy())] = rows["user_segment"].to_numpy()
queries = {"user_id": users, "user_segment": segments}

keras.utils.set_random_seed(0)
columns = rk.layers.FeatureColumns([
    rk.features.Categorical("user_id", dim=32),
    rk.features.Categorical("user_segment", dim=32),
    rk.features.Categorical("item_id", dim=32)])
model = rk.models.two_tower(columns, ["user_id", "user_segment"], ["item_id"],
                            query_units=(32,), temperature=0.1)
model.compile(optimizer=keras.optimizers.Adam(0.01),
              embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.05))

train_items = rk.datasets.user_items(train, users)       # [users, E], -1 padded
validation = rk.retrieval.RetrievalEvaluation(
    queries, item_ids, relevant=rk.datasets.user_items(valid, users), exclude=train_items,
    metrics=[rk.metrics.RecallAtK(20)])
start = time.perf_counter()
history = model.fit(train, batch_size=1024, epochs=2, callbacks=[validation])
print("valid recall_at_20 by epoch:",
      " ".join(f"{value:.4f}" for value in history.history["val_recall_at_20"]))

seen = np.concatenate([train_items, rk.datasets.user_items(valid, users)], axis=1)
results = rk.retrieval.evaluate(
    model, queries, item_ids, relevant=rk.datasets.user_items(test, users), exclude=seen,
    metrics=[rk.metrics.RecallAtK(20), rk.metrics.NDCGAtK(20)])
print(f"seconds={time.perf_counter() - start:.0f} ndcg_at_20={results['ndcg_at_20']:.4f}")


def served_top_k(path, users, exclude):
    """The top 20 of `users` asked over HTTP of a server process of `path`."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "reckeras.serving", path,
                               "--port", str(port), "--log-level", "warning"])
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):                   # ready once /health answers
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2)
                break
            except OSError:
                assert server.poll() is None, "the server exited"
                time.sleep(0.1)
        body = {"inputs": {name: values.tolist() for name, values in users.items()},
                "k": 20, "exclude": exclude}
        request = urllib.request.Request(f"{url}/retrieve", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            return np.array(json.load(answer)["outputs"]["item_ids"])
    finally:
        server.terminate()
        server.wait()


some = np.arange(0, len(users), len(users) // 8)[:8]
asked = {name: values[some] for name, values in queries.items()}
left_out = [[int(i) for i in row if i >= 0] for row in seen[some]]
with tempfile.TemporaryDirectory() as folder:
    path = model.export_serving(os.path.join(folder, "retrieval"), item_ids=item_ids)
    served = served_top_k(path, asked, left_out)
query_vectors = model.query_model().predict(
    {**asked, "item_id": np.zeros(len(some), np.int64)}, verbose=0)  # unread
_, positions = rk.retrieval.exact_top_k(
    torch.from_numpy(query_vectors), torch.from_numpy(model.candidate_embeddings(item_ids)),
    20, exclude=torch.from_numpy(seen[some]))
expected = item_ids[positions.numpy()]
assert np.array_equal(served, expected), (served, expected)
print(f"served top-20 of {len(some)} users over HTTP equals the model's")
print(f"recall_at_20={results['recall_at_20']:.4f} "
      f"teacher_recall_at_20={test.teacher_recall(20):.4f}")
