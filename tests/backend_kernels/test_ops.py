"""The kernel families' entry points are torch ops: registered for CPU,
CUDA and Meta, checked by `torch.library.opcheck`, traced by torch.compile."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from reckeras.backend_kernels import (aggregation, bucket_index, cpu_native, dispatch,
                                      hash_table, hashing, pooling, ragged_layout,
                                      sparse_optimizers, transforms)
# Registers the jagged attention ops that samples() calls (no other import here does).
from reckeras.backend_kernels import jagged_attention  # noqa: F401

so = sparse_optimizers


def a_map():
    slot_keys, slot_rows = hash_table.new_slots(16)
    hash_table.find_or_insert(slot_keys, slot_rows, torch.tensor([9, 4, -3]), 0)
    return slot_keys, slot_rows


def an_index():
    """An index (arrays for 4 buckets, a directory of 8) of keys 9, 4 and -3
    (rows 0-2), and its arena of 8 rows."""
    index = bucket_index.new_index(8, 4)
    arena = torch.zeros(8, dtype=torch.int64)
    bucket_index.find_or_insert(*index, arena, torch.tensor([9, 4, -3]), 0)
    return (*index, arena)


def forward_index():
    # 4 ids of 3 unique rows (table rows 5, 1, 7) pooled into 3 slots.
    return (torch.tensor([5, 1, 7]), torch.tensor([0, 1, 0, 2]), torch.tensor([0, 0, 2, 1]),
            torch.tensor([1.0, 0.5, 2.0, 1.0]))


def attention_inputs(requires_grad=False):
    # Sequences of 3, 0 and 2 tokens; 2 heads of 4 dims; causal, scale 0.5.
    q, k, v = (torch.randn(5, 2, 4, requires_grad=requires_grad) for _ in range(3))
    return q, k, v, torch.tensor([0, 3, 3, 5]), 3, True, 0.5


def samples():
    """op name -> sample arguments on CPU (fresh tensors on every call)."""
    unique, index, destination, weight = forward_index()
    hyper = (0.1, 1e-8, 0.9, 0.99, 0.01, 7)
    return {
        "mix64": (torch.tensor([0, 1, -5, 2**62]),),
        "table_keys": (torch.tensor([5, 6, 5]), torch.tensor([0, 99]), torch.tensor([2, 1])),
        "initial_rows": (torch.tensor([7, 8, 7]), 4, 0.25, 3),
        "hash_into_buckets": (torch.tensor([[5, -1, 3], [5, -1, 3]]), torch.tensor([0, 10])),
        "bucketize": (torch.tensor([[-3.0, 1.0, float("nan")], [0.5, 7.0, float("inf")]]),
                      torch.tensor([[0.0, 1.0], [5.0, float("inf")]])),
        "cross": (torch.tensor([[1, 2], [3, 4], [5, 6]]),
                  torch.tensor([[0, 2, -1], [2, 1, 0]])),
        "pack_sequences": (torch.tensor([4, 5, 0, 0, 7, 0, 0, 8, 9, -6]),
                           torch.tensor([2, 0, 1, 3]), torch.tensor([0, 2, 5]),
                           torch.tensor([0, 10]), 2, torch.arange(10.0)),
        "pooled_lookup": (torch.randn(8, 3), unique, index, destination, weight, 3),
        "aggregate_row_grads": (torch.randn(3, 3), index, destination, weight, 3),
        "unique_rows": (torch.tensor([5, 2, 5, 7]), 8),
        "compact_present": (torch.tensor([5, 2, 5, 7]), torch.tensor([True, False, False, True])),
        "bag_of_ids": (torch.tensor([0, 2, 2, 3]), 3),
        "update": (so.ROWWISE_ADAGRAD, torch.randn(8, 3), torch.rand(8, 1), unique,
                   torch.randn(3, 3), *hyper),
        "aggregate_and_update": (so.ADAM, torch.randn(8, 3), torch.rand(8, 7), unique,
                                 torch.randn(3, 3), index, destination, weight, *hyper),
        "find_or_insert": (*a_map(), torch.tensor([4, 11, 11, -3]), 3),
        "find": (*a_map(), torch.tensor([4, 11, -3])),
        "rehash": (*a_map(), 64, None),
        "bucket_find_or_insert": (*an_index(), torch.tensor([4, 11, 11, -3]), 3),
        "bucket_find": (*an_index(), torch.tensor([4, 11, -3])),
        "jagged_attention_forward": attention_inputs(),
        "jagged_attention_backward": (*attention_inputs(),
                                      *torch.ops.reckeras.jagged_attention_forward(
                                          *attention_inputs()), torch.randn(5, 2, 4)),
    }


OPS = sorted(samples())


def test_every_entry_point_is_a_registered_op():
    assert sorted(name.split("::")[1] for name in torch._C._dispatch_get_all_op_names()
                  if name.startswith(f"{dispatch.NAMESPACE}::")) == OPS


@pytest.mark.parametrize("name", OPS)
def test_the_op_has_cpu_cuda_and_meta_kernels(name):
    qualified = f"{dispatch.NAMESPACE}::{name}"
    for key in ("CPU", "CUDA", "Meta"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(qualified, key), key


@pytest.mark.parametrize("native", [True, False], ids=["native", "reference"])
@pytest.mark.parametrize("name", OPS)
def test_opcheck(name, native, monkeypatch):
    if not native:
        monkeypatch.setattr(cpu_native, "usable", lambda *tensors, table=None: False)
    elif not cpu_native.available():
        pytest.skip("no native kernels here")
    op = getattr(torch.ops.reckeras, name).default
    result = torch.library.opcheck(op, samples()[name])
    assert set(result.values()) == {"SUCCESS"}, result


def test_opcheck_of_the_jagged_attention_gradient():
    # The one op with a registered backward: opcheck differentiates it too.
    op = torch.ops.reckeras.jagged_attention_forward.default
    result = torch.library.opcheck(op, attention_inputs(requires_grad=True))
    assert set(result.values()) == {"SUCCESS"}, result


def test_mutated_arguments_are_declared():
    mutated = {name: [a.name for a in getattr(torch.ops.reckeras, name).default._schema
                      .arguments if a.alias_info is not None and a.alias_info.is_write]
               for name in OPS}
    assert {name: args for name, args in mutated.items() if args} == {
        "update": ["weights", "state"], "aggregate_and_update": ["weights", "state"],
        "find_or_insert": ["slot_keys", "slot_rows"],
        "bucket_find_or_insert": ["buckets", "directory", "shape", "arena"]}


def test_fake_tensors_get_the_shapes_and_dtypes_of_the_outputs():
    real = samples()
    with FakeTensorMode(shape_env=ShapeEnv()) as mode:
        fake = {name: [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a
                       for a in args] for name, args in real.items()}
        pooled = pooling.pooled_lookup(*fake["pooled_lookup"])
        grads = aggregation.aggregate_row_grads(*fake["aggregate_row_grads"])
        unique, unique_index = torch.ops.reckeras.unique_rows(*fake["unique_rows"])
        initial = hashing.initial_rows(*fake["initial_rows"])
        values, offsets, weights = torch.ops.reckeras.pack_sequences(*fake["pack_sequences"])
        new_keys, new_rows = hash_table.rehash(*fake["rehash"])
        rows, count = torch.ops.reckeras.bucket_find_or_insert(*fake["bucket_find_or_insert"])
        found = bucket_index.find(*fake["bucket_find"])
        crossed = transforms.cross(*fake["cross"])
        buckets = transforms.bucketize(*fake["bucketize"])
        compacted, compacted_offsets = ragged_layout.compact_present(*fake["compact_present"])
        bags = ragged_layout.bag_of_ids(*fake["bag_of_ids"])
    assert (pooled.shape, pooled.dtype) == ((3, 3), torch.float32)
    assert (grads.shape, grads.dtype) == ((3, 3), torch.float32)
    assert unique_index.shape == (4,) and not isinstance(unique.shape[0], int)  # data-dependent
    assert (initial.shape, initial.dtype) == ((3, 4), torch.float32)
    assert offsets.shape == (5,) and weights.shape == values.shape
    assert new_keys.shape == new_rows.shape == (64,)
    assert (rows.shape, rows.dtype, count.shape, count.dtype) == ((4,), torch.int64, (),
                                                                  torch.int64)
    assert (found.shape, found.dtype) == ((3,), torch.int64)
    assert (crossed.shape, crossed.dtype) == ((2, 2), torch.int64)
    assert (buckets.shape, buckets.dtype) == ((2, 3), torch.int64)
    assert compacted_offsets.shape == (5,) and not isinstance(compacted.shape[0], int)
    assert (bags.shape, bags.dtype) == ((3,), torch.int64)


def test_meta_tensors_run_the_fake_implementation():
    weights = torch.empty(1000, 16, device="meta", dtype=torch.bfloat16)
    ids = torch.empty(50, dtype=torch.int64, device="meta")
    pooled = pooling.pooled_lookup(weights, ids[:10], ids, ids, torch.empty(50, device="meta"),
                                   64)
    assert (pooled.device.type, pooled.shape, pooled.dtype) == ("meta", (64, 16),
                                                                torch.float32)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_compile_traces_the_lookup_without_a_graph_break(backend):
    def pooled_and_scaled(weights, unique_rows, unique_index, destination, id_weight):
        pooled = pooling.pooled_lookup(weights, unique_rows, unique_index, destination,
                                       id_weight, 3)
        return torch.relu(pooled) * 2 + hashing.mix64(unique_rows).float().sum()

    args = samples()["pooled_lookup"][:5]
    torch._dynamo.reset()
    explained = torch._dynamo.explain(pooled_and_scaled)(*args)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    compiled = torch.compile(pooled_and_scaled, backend=backend, fullgraph=True)
    torch.testing.assert_close(compiled(*args), pooled_and_scaled(*args))
