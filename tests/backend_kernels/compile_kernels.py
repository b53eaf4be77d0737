"""Compiles every Triton kernel of reckeras for a CUDA target, without a GPU.

The interpreter (what CI runs) executes kernels as numpy code and misses what
only the compiler checks: types, constexpr rules, globals. This script
compiles each kernel ahead of time for an NVIDIA target (sm_90 by default)
with Triton's own toolchain; it needs no device. Run by
``test_kernel_compile.py`` in a fresh process (TRITON_INTERPRET unset), or
by hand: ``python tests/backend_kernels/compile_kernels.py [capability]``.
"""

import os
import sys
import time

os.environ.pop("TRITON_INTERPRET", None)
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from reckeras.backend_kernels import (aggregation, bucket_index, hash_table,  # noqa: E402
                                      hashing, sparse_optimizers, transforms)

P64, P32, PBF, P8 = "*i64", "*fp32", "*bf16", "*i8"
PU8, PI32 = "*u8", "*i32"
P16 = "*fp16"
# The dropped bits of the stochastic rounding of each row type (0: none).
ROUNDED = {P32: 0, PBF: 16, P16: 13}


def segment_sum(source):
    return ({"source_ptr": source, "source_row_ptr": P64, "scale_ptr": P32,
             "order_ptr": P64, "starts_ptr": P64, "ends_ptr": P64, "out_ptr": P32,
             "num_groups": "i32", "dim": "i32"},
            {"INDIRECT": True, "BLOCK_N": 4, "GROUPS": 64, "BLOCK_D": 8})


def update(weights, kind, indirect):
    return ({"weights_ptr": weights, "state_ptr": P32, "rows_ptr": P64, "source_ptr": P32,
             "source_row_ptr": P64, "scale_ptr": P32, "order_ptr": P64,
             "starts_ptr": P64, "ends_ptr": P64, "num_rows": "i32", "dim": "i32",
             "state_width": "i32", "lr": "fp32", "eps": "fp32", "beta1": "fp32",
             "beta2": "fp32", "log2_beta1": "fp32", "log2_beta2": "fp32",
             "weight_decay": "fp32", "round_seed": "i32"},
            {"KIND": kind, "INDIRECT": indirect, "BLOCK_N": 4, "GROUPS": 16,
             "BLOCK_D": 16, "ROUNDED": ROUNDED[weights]})


CASES = [
    (hashing, "_mix64_kernel", {"ids_ptr": P64, "out_ptr": P64, "n": "i64"},
     {"BLOCK": hashing.BLOCK}),
    (hash_table, "_insert_kernel", {"slot_keys_ptr": P64, "keys_ptr": P64,
                                    "slots_ptr": P64, "claimed_ptr": P8, "n": "i64",
                                    "mask": "i64", "shift": "i32"},
     {"BLOCK": hash_table.BLOCK}),
    (hash_table, "_find_kernel", {"slot_keys_ptr": P64, "slot_rows_ptr": P64,
                                  "keys_ptr": P64, "rows_ptr": P64, "n": "i64",
                                  "mask": "i64", "shift": "i32"},
     {"BLOCK": hash_table.BLOCK}),
    (bucket_index, "_find_kernel", {"bytes_ptr": PU8, "words_ptr": PI32,
                                    "directory_ptr": PI32, "arena_ptr": P64,
                                    "keys_ptr": P64, "rows_ptr": P64, "n": "i64",
                                    "depth": "i32"}, bucket_index._layout()),
    (bucket_index, "_place_kernel", {"bytes_ptr": PU8, "words_ptr": PI32,
                                     "directory_ptr": PI32, "arena_ptr": P64,
                                     "counter_ptr": P64, "keys_ptr": P64, "rows_ptr": P64,
                                     "n": "i64", "depth": "i32"}, bucket_index._layout()),
    (transforms, "_hash_into_buckets_kernel", {"ids_ptr": P64, "buckets_ptr": P64,
                                               "out_ptr": P64, "per_feature": "i64",
                                               "total": "i64"},
     {"BLOCK": transforms.BLOCK}),
    (transforms, "_bucketize_kernel", {"values_ptr": P32, "boundaries_ptr": P32,
                                       "out_ptr": P64, "per_feature": "i64",
                                       "total": "i64", "width": "i32"},
     {"BLOCK_ROWS": transforms.BLOCK_ROWS,
      "BLOCK_BOUNDARIES": transforms.BLOCK_BOUNDARIES}),
    (transforms, "_cross_kernel", {"columns_ptr": P64, "members_ptr": P64,
                                   "out_ptr": P64, "n": "i64", "total": "i64"},
     {"BLOCK": transforms.BLOCK}),
    *[(transforms, "_pack_sequences_kernel",
       {"flat_ptr": P64, "lengths_ptr": P64, "width_offsets_ptr": P64,
        "buckets_ptr": P64, "offsets_ptr": P64, "out_ptr": P64,
        # Unweighted, the weight pointers are the id buffers (never read).
        "weights_ptr": P32 if weighted else P64,
        "weights_out_ptr": P32 if weighted else P64, "batch": "i64"},
       {"HAS_WEIGHTS": weighted, "BLOCK_L": transforms.BLOCK_L})
      for weighted in (False, True)],
    (aggregation, "_segment_sum_kernel", *segment_sum(P32)),
    (aggregation, "_segment_sum_kernel", *segment_sum(PBF)),
    (aggregation, "_segment_sum_kernel", *segment_sum(P16)),
    (sparse_optimizers, "_update_kernel", *update(P32, sparse_optimizers.SGD, False)),
    (sparse_optimizers, "_update_kernel", *update(P32, sparse_optimizers.ADAGRAD, True)),
    (sparse_optimizers, "_update_kernel",
     *update(PBF, sparse_optimizers.ROWWISE_ADAGRAD, True)),
    (sparse_optimizers, "_update_kernel", *update(P32, sparse_optimizers.ADAM, False)),
    # What `update` launches on CUDA (direct rows, a wide batch's shape): Triton
    # 3.6 fails on it with BLOCK_N=1 (see `sparse_optimizers.direct_block_n`).
    (sparse_optimizers, "_update_kernel",
     update(P32, sparse_optimizers.ROWWISE_ADAGRAD, False)[0],
     {**update(P32, sparse_optimizers.ROWWISE_ADAGRAD, False)[1],
      "BLOCK_N": sparse_optimizers.direct_block_n(), "GROUPS": 128, "BLOCK_D": 8}),
    (sparse_optimizers, "_update_kernel", *update(PBF, sparse_optimizers.ADAMW, True)),
    (sparse_optimizers, "_update_kernel", *update(P16, sparse_optimizers.SGD, False)),
    (sparse_optimizers, "_update_kernel", *update(P16, sparse_optimizers.ADAGRAD, True)),
]


def main(capability=90):
    target = GPUTarget("cuda", capability, 32)
    failures = 0
    for module, name, signature, constexprs in CASES:
        kernel = getattr(module, name).jit()
        start = time.perf_counter()
        try:
            compiled = triton.compile(ASTSource(kernel, signature, constexprs), target=target)
            status = f"ok ({len(compiled.asm['cubin'])} bytes of cubin)"
        except Exception as error:          # report every kernel, then fail
            failures += 1
            status = f"FAILED: {type(error).__name__}: {error}"
        print(f"{module.__name__.split('.')[-1]}.{name} {constexprs}: {status} "
              f"[{time.perf_counter() - start:.1f}s]", flush=True)
    return failures


if __name__ == "__main__":
    sys.exit(1 if main(int(sys.argv[1]) if len(sys.argv) > 1 else 90) else 0)
