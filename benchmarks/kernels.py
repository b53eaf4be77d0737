"""Sparse front end, fused (reckeras) against a per-feature loop of torch ops.

One training step of the sparse front end -- transform (hash + mod), lookup,
backward aggregation, row-wise Adagrad update -- for the ``dlrm`` (26 fields)
and ``wide`` (300 fields) shapes of DESIGN.md, at batch 2048, Zipf ids:

* ``fused`` on CPU: the library path. ``features.plan.TransformPlan`` packs
  and transforms all fields at once, ``embedding.engine.EmbeddingEngine``
  resolves the ids in its packed dynamic table and runs ``PooledLookup``,
  whose backward aggregates per unique row and applies ``RowWiseAdagrad``.
  On CUDA the same kernels run in the engine's order on CUDA tensors, the
  backward aggregation fused into the update.
* ``per-feature``: for every field its own hash and mod, its own
  ``embedding`` lookup on its own table, its own backward ``index_add_`` over
  ``torch.unique`` rows and its own row-wise Adagrad update.

The two paths alternate step by step (the machine may be shared) and the
median step times, wall clock and CPU, are printed side by side. The last
line is ``wide_fused_speedup=<ratio>`` (wall clock).

CPU runs use one torch thread by default: on a 2-core machine shared with
other jobs, a second OpenMP thread waits for a core at every parallel op and
times swing by 10x. glibc's malloc is tuned here as ``rk.Model.fit`` tunes it
(see ``reckeras/_allocator.py``; ``RECKERAS_MALLOC_TUNING=0`` turns it off), so
that freed blocks up to 32 MiB stay mapped for the next step instead of being
unmapped and faulted in again, as jemalloc/tcmalloc do; it applies to both
paths.

``--bandwidth`` (default on CUDA) adds the achieved bandwidth of the lookup,
aggregation, update and key-index kernels, at the ``wide`` and ``huge``
shapes (``huge``: 1000 fields), against the device's peak (nominal, and a
measured device-to-device copy), for tables of each of ``--row-dtypes``
(float32 rows by default; float16 and bfloat16 rows read half the bytes and
are updated with stochastic rounding).

Each bandwidth figure is also printed as ``name=value`` lines:
``kernel_<shape>_<row dtype>_<kernel>_{us,gbps}`` and, on CUDA,
``..._of_peak`` (a fraction of the H200's 4.8 TB/s); ``<kernel>`` is
``lookup``, ``aggregation``, ``update``, ``aggregation_update``, ``find``,
``find_or_insert`` (the open-addressing hash map, ``hash_table``: the
default key index; into an empty map, its initialisation counted),
``compact_find`` or ``compact_find_or_insert`` (the same keys in the compact
bucket index, ``bucket_index``, the opt-in index of a table; into an empty
index, its arrays sized by ``room_needed``: their initialisation counted).

Usage: ``python benchmarks/kernels.py [--shapes dlrm,wide] [--steps 15]
[--bandwidth-shapes wide,huge] [--row-dtypes float32,float16,bfloat16]
[--no-compare]``
"""

import argparse
import statistics
import time

import torch

import reckeras  # noqa: F401  (selects the torch backend before keras loads)
from reckeras._allocator import tune_malloc
from reckeras.backend_kernels import bucket_index, hash_table, pooling, sparse_optimizers
from reckeras.backend_kernels.aggregation import aggregate_row_grads, unique_rows
from reckeras.backend_kernels.hashing import mix64
from reckeras.embedding.engine import EmbeddingEngine
from reckeras.embedding.packing import PackingPlan
from reckeras.features.plan import TransformPlan
from reckeras.features.specs import Categorical
from reckeras.optimizers import RowWiseAdagrad

SHAPES = {
    "dlrm": {"vocabs": [100_000] * 8 + [10_000] * 10 + [100] * 8, "dim": 16},
    "wide": {"vocabs": [50_000] * 50 + [5_000] * 100 + [100] * 150, "dim": 8},
    "huge": {"vocabs": [50_000] * 150 + [5_000] * 350 + [100] * 500, "dim": 8},
}
ZIPF_EXPONENT = 1.05
LEARNING_RATE, EPSILON = 0.05, 1e-8
H200_PEAK_GBPS = 4800.0


def zipf_ids(vocab, n, generator):
    """``n`` ids of a Zipf law over ``vocab`` values, spread over int64."""
    weights = torch.arange(1, vocab + 1, dtype=torch.float64) ** -ZIPF_EXPONENT
    cdf = torch.cumsum(weights, 0)
    rank = torch.searchsorted(cdf / cdf[-1], torch.rand(n, dtype=torch.float64,
                                                        generator=generator))
    return rank.clamp(max=vocab - 1) * 7919 + 13


def make_batches(shape, batch, count, device, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [{f"C{f}": zipf_ids(v, batch, generator).to(device)
             for f, v in enumerate(shape["vocabs"])} for _ in range(count)]


def specs_of(shape):
    return [Categorical(f"C{f}", dim=shape["dim"], hash_buckets=v)
            for f, v in enumerate(shape["vocabs"])]


class PerFeatureLoop:
    """One table, one lookup, one backward and one update per field."""

    def __init__(self, shape, device):
        self.vocabs, self.dim = shape["vocabs"], shape["dim"]
        generator = torch.Generator().manual_seed(1)
        self.tables = [(torch.rand(v, self.dim, generator=generator) * 0.1 - 0.05)
                       .to(device) for v in self.vocabs]
        self.accumulators = [torch.zeros(v, device=device) for v in self.vocabs]

    def step(self, raw, grad):
        ids = [torch.remainder(mix64(raw[f"C{f}"]), v) for f, v in enumerate(self.vocabs)]
        pooled = torch.stack([torch.nn.functional.embedding(i, table)
                              for i, table in zip(ids, self.tables)], dim=1)
        for f, (i, table, acc) in enumerate(zip(ids, self.tables, self.accumulators)):
            rows, inverse = torch.unique(i, return_inverse=True)
            row_grads = torch.zeros(rows.numel(), self.dim, device=i.device)
            row_grads.index_add_(0, inverse, grad[:, f])
            state = acc[rows] + row_grads.pow(2).mean(dim=1)
            acc[rows] = state
            table[rows] -= LEARNING_RATE * row_grads / (state.sqrt() + EPSILON).unsqueeze(1)
        return pooled


class FusedEngine:
    """The library path: TransformPlan + EmbeddingEngine (+ RowWiseAdagrad)."""

    def __init__(self, shape, device):
        self.plan = TransformPlan(specs_of(shape))
        packing = PackingPlan(self.plan.slots, self.plan.sparse_in_declaration_order)
        self.engine = EmbeddingEngine(packing)
        self.engine.set_optimizer(RowWiseAdagrad(LEARNING_RATE, epsilon=EPSILON))

    def step(self, raw, grad):
        sparse = self.plan.packed_sparse(raw)
        output = self.engine.lookup(sparse["ids"], sparse["offsets"], training=True)[0]
        pooled = output[0] if isinstance(output, tuple) else output
        pooled.backward(grad)
        return pooled


def empty_index(new_keys, device):
    """An empty bucket index with room for ``new_keys`` keys, and an arena of as
    many rows."""
    return (bucket_index.with_room(bucket_index.new_index(device=device), new_keys),
            torch.empty(new_keys, dtype=torch.int64, device=device))


class FusedKernels:
    """The engine's kernels in the engine's order, on the tensors' device."""

    def __init__(self, shape, device):
        self.plan = TransformPlan(specs_of(shape))
        packing = PackingPlan(self.plan.slots, self.plan.sparse_in_declaration_order)
        self.salt = packing.slot_salt.to(device)
        self.fields, self.dim = len(shape["vocabs"]), shape["dim"]
        capacity = sum(shape["vocabs"])
        self.slot_keys, self.slot_rows = hash_table.new_slots(
            hash_table.capacity_for(capacity), device)
        self.num_rows = 0
        self.weights = torch.rand(capacity, self.dim, device=device) * 0.1 - 0.05
        self.state = torch.zeros(capacity, 1, device=device)

    def step(self, raw, grad):
        sparse = self.plan.packed_sparse(raw)
        ids = sparse["ids"]
        batch = ids.numel() // self.fields
        keys = mix64(ids) ^ self.salt.repeat_interleave(batch)
        rows, self.num_rows = hash_table.find_or_insert(self.slot_keys, self.slot_rows,
                                                        keys, self.num_rows)
        unique, unique_index = unique_rows(rows, self.num_rows)
        example = torch.arange(batch, device=ids.device).repeat(self.fields)
        slot = torch.arange(self.fields, device=ids.device).repeat_interleave(batch)
        destination = example * self.fields + slot
        id_weight = torch.ones(ids.numel(), device=ids.device)
        pooled = pooling.pooled_lookup(self.weights, unique, unique_index, destination,
                                       id_weight, ids.numel())
        sparse_optimizers.aggregate_and_update(
            sparse_optimizers.ROWWISE_ADAGRAD, self.weights, self.state, unique,
            grad.view(-1, self.dim), unique_index, destination, id_weight,
            LEARNING_RATE, EPSILON)
        return pooled.view(batch, self.fields, self.dim)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device):
    """``(wall seconds, CPU seconds)`` of ``fn()``."""
    sync(device)
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    sync(device)
    return time.perf_counter() - wall, time.process_time() - cpu


def compare(name, args, device):
    shape = SHAPES[name]
    batches = make_batches(shape, args.batch, 4, device)
    grad = torch.full((args.batch, len(shape["vocabs"]), shape["dim"]), 1e-3,
                      device=device)
    fused = (FusedKernels if device.type == "cuda" else FusedEngine)(shape, device)
    paths = {"fused": fused, "per-feature": PerFeatureLoop(shape, device)}
    for step in range(args.warmup):         # every batch once: the tables fill up
        for path in paths.values():
            path.step(batches[step % len(batches)], grad)
    times = {key: [] for key in paths}
    for step in range(args.steps):
        for key, path in paths.items():
            raw = batches[step % len(batches)]
            times[key].append(timed(lambda: path.step(raw, grad), device))
    (fused_wall, fused_cpu), (loop_wall, loop_cpu) = (
        [statistics.median(t[i] for t in times[key]) * 1e3 for i in (0, 1)]
        for key in ("fused", "per-feature"))
    print(f"{name:5s} {len(shape['vocabs']):4d} fields  B={args.batch}  "
          f"fused {fused_wall:8.2f} ms   per-feature {loop_wall:8.2f} ms   "
          f"speedup {loop_wall / fused_wall:5.2f}x   "
          f"(CPU time: {fused_cpu:.2f} vs {loop_cpu:.2f} ms, {loop_cpu / fused_cpu:.2f}x)",
          flush=True)
    return loop_wall / fused_wall


# ---- kernel bandwidth -------------------------------------------------------------------

def measured_copy_gbps(device):
    x = torch.empty(1 << 28, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    y.copy_(x)
    seconds = min(timed(lambda: y.copy_(x), device)[0] for _ in range(5))
    return 2 * x.numel() / seconds / 1e9


def kernel_bandwidth(name, args, device, row_dtype=torch.float32):
    """GB/s of the sparse kernels on one batch of shape ``name`` with table
    rows of ``row_dtype``: bytes that a kernel must move at least, over its
    best time of 10."""
    shape = SHAPES[name]
    dim, fields = shape["dim"], len(shape["vocabs"])
    generator = torch.Generator().manual_seed(3)
    keys = torch.cat([mix64(zipf_ids(v, args.batch, generator)) ^ f
                      for f, v in enumerate(shape["vocabs"])]).to(device)
    n = keys.numel()
    slot_keys, slot_rows = hash_table.new_slots(hash_table.capacity_for(2 * n), device)
    rows, num_rows = hash_table.find_or_insert(slot_keys, slot_rows, keys, 0)
    # The same keys in the compact bucket index (the opt-in index of a table).
    index, arena = empty_index(n, device)
    bucket_index.find_or_insert(*index, arena, keys, 0)
    weights = torch.rand(num_rows, dim, device=device).to(row_dtype)
    value = weights.element_size()      # bytes of one row value
    state = torch.zeros(num_rows, 1, device=device)
    unique, unique_index = unique_rows(rows, num_rows)
    u = unique.numel()
    batch = n // fields                 # slot-major ids -> [B, F] outputs, as the engine
    destination = torch.arange(batch, device=device).repeat(fields) * fields \
        + torch.arange(fields, device=device).repeat_interleave(batch)
    id_weight = torch.ones(n, device=device)
    grad_out = torch.rand(n, dim, device=device)
    row_grads = torch.rand(u, dim, device=device)
    per_id = n * (8 + 8 + 4)                       # an id's index, order and weight
    capacity = slot_keys.numel()
    # The bytes of an empty index sized for the batch: what its creation writes.
    index_bytes = sum(t.numel() * t.element_size() for t in empty_index(n, device)[0][:2])
    # A lookup reads its key, a directory entry, its bucket's first line
    # (the digests) and the arena's key, and writes the row; an insert
    # writes a digest byte, a slot and the arena's key.
    per_key, per_row = 8 + 4 + 64 + 8 + 8, 1 + 4 + 8

    def insert_into_empty():
        fresh, fresh_arena = empty_index(n, device)
        return bucket_index.find_or_insert(*fresh, fresh_arena, keys, 0)

    # name: (label, kernel, bytes it must move at least)
    figures = {
        "lookup": ("lookup (gather + pool)",
            lambda: pooling.pooled_lookup(weights, unique, unique_index, destination,
                                          id_weight, n),
            per_id + n * dim * (value + 4)),
        "aggregation": ("backward aggregation",
            lambda: aggregate_row_grads(grad_out, unique_index, destination, id_weight, u),
            per_id + n * dim * 4 + u * dim * 4),
        "update": ("row-wise adagrad update",
            lambda: sparse_optimizers.update(sparse_optimizers.ROWWISE_ADAGRAD, weights,
                                             state, unique, row_grads, LEARNING_RATE,
                                             EPSILON),
            u * (8 + dim * (2 * value + 4) + 4 * 2)),
        "aggregation_update": ("aggregation + update, fused",
            lambda: sparse_optimizers.aggregate_and_update(
                sparse_optimizers.ROWWISE_ADAGRAD, weights, state, unique, grad_out,
                unique_index, destination, id_weight, LEARNING_RATE, EPSILON),
            per_id + n * dim * 4 + u * (8 + dim * value * 2 + 4 * 2)),
        "find": ("hash find (present keys)",
                 lambda: hash_table.find(slot_keys, slot_rows, keys), n * 8 * 4),
        # Into an empty map each time: its slots are written once (the
        # initialisation), every key read and probed, every row written.
        "find_or_insert": ("hash find-or-insert (new keys)",
                           lambda: hash_table.find_or_insert(
                               *hash_table.new_slots(capacity, device), keys, 0),
                           capacity * 16 + n * 8 * 3),
        "compact_find": ("compact find (present keys)",
                         lambda: bucket_index.find(*index, arena, keys), n * per_key),
        # Into an empty index each time: its arrays are written once (the
        # initialisation), every key looked up, every new key's slot written.
        "compact_find_or_insert": ("compact find-or-insert (new)", insert_into_empty,
                                   index_bytes + n * per_key + num_rows * per_row),
    }
    peak = measured_copy_gbps(device)
    dtype_name = str(row_dtype).removeprefix("torch.")
    print(f"{name}: {n} ids, {u} unique rows, dim {dim}, {row_dtype} rows; "
          f"device copy {peak:.0f} GB/s"
          + (f", nominal peak {H200_PEAK_GBPS:.0f} GB/s" if device.type == "cuda" else ""))
    print(f"kernel_{name}_{dtype_name}_copy_gbps={peak:.0f}")
    for key, (label, fn, nbytes) in figures.items():
        prefix = f"kernel_{name}_{dtype_name}_{key}"
        try:
            fn()
        except Exception as error:     # noqa: BLE001 - reported, the other kernels go on
            message = str(error).splitlines()[0][:200] if str(error) else ""
            print(f"{prefix}_error={type(error).__name__}: {message}", flush=True)
            continue
        seconds = min(timed(fn, device)[0] for _ in range(10))
        gbps = nbytes / seconds / 1e9
        nominal = (f"{100 * gbps / H200_PEAK_GBPS:5.1f}% of nominal, "
                   if device.type == "cuda" else "")
        print(f"  {label:30s} {seconds * 1e6:10.1f} us {gbps:8.1f} GB/s  {nominal}"
              f"{100 * gbps / peak:5.1f}% of copy", flush=True)
        print(f"{prefix}_us={seconds * 1e6:.1f}\n{prefix}_gbps={gbps:.1f}")
        if device.type == "cuda":
            print(f"{prefix}_of_peak={gbps / H200_PEAK_GBPS:.4f}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1, see the module doc)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--shapes", default="dlrm,wide")
    parser.add_argument("--bandwidth-shapes", default="wide,huge",
                        help="shapes of the bandwidth figures")
    parser.add_argument("--no-compare", action="store_true",
                        help="bandwidth figures only, no fused-against-loop steps")
    parser.add_argument("--bandwidth", action="store_true",
                        help="kernel bandwidth figures (always on CUDA)")
    parser.add_argument("--row-dtypes", default="float32",
                        help="table row dtypes of the bandwidth figures, comma-separated")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    tuned = tune_malloc()       # as fit does (unless RECKERAS_MALLOC_TUNING=0)
    print(f"torch {torch.__version__}, device {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
          + f", {torch.get_num_threads()} CPU thread(s), glibc malloc "
          + ("tuned (freed blocks stay mapped)" if tuned else "default"), flush=True)
    if args.bandwidth or device.type == "cuda":
        for name in args.bandwidth_shapes.split(","):
            for row_dtype in args.row_dtypes.split(","):
                kernel_bandwidth(name, args, device, getattr(torch, row_dtype))
    if args.no_compare:
        return
    speedups = {name: compare(name, args, device) for name in args.shapes.split(",")}
    if "wide" in speedups:
        print(f"wide_fused_speedup={speedups['wide']:.2f}")


if __name__ == "__main__":
    main()
