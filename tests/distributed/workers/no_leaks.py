"""Many short fits and evaluations in one process, sampling what it holds.

Usage: no_leaks.py <iterations> <out.json>

Iteration i, on every rank alike: a new model when i % 10 == 0 (its own
layers, engines and routers); a fit of 256 rows, 4 steps of 64 examples over
all ranks, with the pipeline's threads on (on 2 ranks the sparse-dist stage
too), which fails at its 4th batch when i % 10 == 5 (NaN labels, found by the
encode stage's thread) and stops after its first step when i % 10 == 7; an
evaluation of 128 rows; a predict when i % 25 == 12. After iterations 0, 25,
50, ... and the last, it collects garbage, waits up to 2 s for threads that
are already ending (a failed fit's Keras callback executor ends when it is
collected), and records: VmRSS and Threads (which counts native threads too)
from /proc/self/status, `threading.active_count()`, open file descriptors,
torch.distributed process groups, objects the garbage collector tracks, and
live instances of the loop's own classes. Rank 0 writes the samples to
<out.json>.
"""

import collections
import concurrent.futures
import gc
import json
import os
import sys
import threading
import time

import common

import keras
import numpy as np
import pyarrow as pa
import torch.distributed as dist

from reckeras import distributed
from reckeras.features.encode import FeatureInputError
from reckeras.pipeline.prefetch import Pipeline
from reckeras.pipeline.sparse_dist import SparseDist
from reckeras.pipeline.stream import EpochStream, PreparedBatch

LOOP_CLASSES = (EpochStream, Pipeline, SparseDist, PreparedBatch,
                keras.callbacks.CallbackList, concurrent.futures.ThreadPoolExecutor)

iterations, out_path = int(sys.argv[1]), sys.argv[2]
world = distributed.init(timeout_s=30)
batch = common.GLOBAL_BATCH // world.size
train, test = common.data(rows=256), common.data(rows=128, seed=1)
labels = train.column("label").to_numpy().copy()
labels[192:] = np.nan                 # the 4th global batch of 64
bad = train.set_column(train.schema.get_field_index("label"), "label", pa.array(labels))


def process_status():
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["Threads"])


def sample(iteration, started, baseline_threads):
    gc.collect()
    deadline = time.monotonic() + 2.0
    while threading.active_count() > baseline_threads and time.monotonic() < deadline:
        time.sleep(0.05)
    rss_mb, native_threads = process_status()
    objects = gc.get_objects()
    return {"iteration": iteration, "seconds": round(time.time() - started, 2),
            "rss_mb": round(rss_mb, 1), "native_threads": native_threads,
            "python_threads": threading.active_count(),
            "thread_names": sorted(t.name for t in threading.enumerate()),
            "fds": len(os.listdir("/proc/self/fd")),
            # torch keeps no public registry of the groups it created.
            "process_groups": len(dist.distributed_c10d._world.pg_map)
            if dist.is_initialized() else 0,
            "gc_objects": len(objects),
            # type(), not isinstance: some torch objects warn on __class__.
            "loop_objects": dict(collections.Counter(
                type(o).__name__ for o in objects if type(o) in LOOP_CLASSES))}


samples, failures, started = [], 0, time.time()
baseline_threads = threading.active_count()
for i in range(iterations):
    if i % 10 == 0:
        model = common.model()
    if i % 10 == 5:
        try:
            model.fit(bad, batch_size=batch, verbose=0, pipeline=True, shuffle=False)
        except FeatureInputError:
            failures += 1
    elif i % 10 == 7:
        # Left after 1 of 4 steps: the stages still hold batches, blocked on
        # full queues, until the loop stops them.
        model.fit(train, batch_size=batch, verbose=0, pipeline=True, steps_per_epoch=1)
    else:
        model.fit(train, batch_size=batch, verbose=0, pipeline=True, seed=i)
    model.evaluate(test, batch_size=batch, verbose=0, pipeline=True)
    if i % 25 == 12:
        model.predict(test, batch_size=batch, verbose=0, pipeline=True)
    if i % 25 == 0 or i == iterations - 1:
        samples.append(sample(i, started, baseline_threads))
        if i == 0:   # tqdm's monitor and the like start once
            baseline_threads = samples[0]["python_threads"]
if world.is_main:
    with open(out_path, "w") as f:
        json.dump({"samples": samples, "failed_fits": failures, "world": world.size}, f,
                  indent=1)
if world.size > 1:
    dist.barrier()
