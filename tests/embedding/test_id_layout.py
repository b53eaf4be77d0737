"""Where each id of a packed batch goes, with and without missing values."""

import numpy as np
import pyarrow as pa
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import reckeras as rk
from reckeras.backend_kernels.hashing import mix64
from reckeras.embedding.engine import EmbeddingEngine
from reckeras.embedding.id_layout import IdLayout
from reckeras.embedding.packing import PackingPlan, table_salt
from reckeras.features.encode import as_tensors, encode
from reckeras.features.plan import TransformPlan


def _layout_and_batch(dims, rows, null_rate, seed, with_tags):
    specs = [rk.features.Categorical(f"c{j}", dim=dim) for j, dim in enumerate(dims)]
    plan = TransformPlan(specs)
    layout = IdLayout(PackingPlan(plan.slots, plan.sparse_in_declaration_order), with_tags)
    rng = np.random.default_rng(seed)
    raw = {spec.name: pa.array(rng.integers(0, 100, rows), pa.int64(),
                               mask=rng.random(rows) < null_rate) for spec in specs}
    packed = plan.packed_sparse(as_tensors(encode(specs, raw)))
    return layout, packed["ids"], packed["offsets"]


@settings(max_examples=30, deadline=None)
@given(dims=st.lists(st.sampled_from([2, 3, 5]), min_size=1, max_size=6),
       rows=st.integers(1, 17), null_rate=st.sampled_from([0.0, 0.3, 1.0]),
       seed=st.integers(0, 2**16))
def test_a_lookup_with_missing_ids_against_numpy(dims, rows, null_rate, seed):
    # Without sequences a batch with missing values takes its layout from the
    # every-bag layout (a gather), over several distinct dims: each example's
    # slot reads its id's row, or zeros where the id is missing.
    specs = [rk.features.Categorical(f"c{j}", dim=dim) for j, dim in enumerate(dims)]
    plan = TransformPlan(specs)
    engine = EmbeddingEngine(PackingPlan(plan.slots, plan.sparse_in_declaration_order))
    engine.set_optimizer(rk.optimizers.SGD(1.0))
    rng = np.random.default_rng(seed)
    raw = {spec.name: pa.array(rng.integers(0, 100, rows), pa.int64(),
                               mask=rng.random(rows) < null_rate) for spec in specs}
    for _ in range(2):       # the second batch finds its every-bag layout made
        packed = plan.packed_sparse(as_tensors(encode(specs, raw)))
        outputs = engine.lookup(packed["ids"], packed["offsets"], training=True)
    for group, dim in enumerate(sorted(set(dims))):     # one physical table per dim
        pooled = outputs[group][0].detach().numpy()
        names = [spec.name for spec in specs if spec.dim == dim]
        assert pooled.shape == (rows, len(names), dim)
        for slot, name in enumerate(names):
            for example, value in enumerate(raw[name].to_pylist()):
                expected = np.zeros(dim, np.float32)
                if value is not None:
                    key = mix64(torch.tensor([value])) ^ table_salt(name)
                    row = engine.tables[group].find(key)[0]
                    expected = engine.tables[group].weights[row].numpy()
                np.testing.assert_array_equal(pooled[example, slot], expected)


def test_missing_ids_leave_their_bag_out_by_hand():
    # Two dim-2 features, 3 examples; c0 missing in example 1, c1 in 0 and 2.
    # Pooled output rows are example-major: example e, slot s -> e * 2 + s.
    layout, ids, offsets = _layout_and_batch([2, 2], 3, 0.0, 0, False)
    offsets = torch.tensor([0, 1, 1, 2, 2, 3, 3])       # bags: c0 x3, then c1 x3
    ids = ids[:3]
    batch, _, per_id = layout.slots_of(ids, offsets)
    [(chosen, tags, weight, destination)] = layout.groups(offsets, batch, per_id, ids)
    assert chosen is None and tags is None
    assert destination.tolist() == [0, 4, 3]
    assert weight.tolist() == [1.0, 1.0, 1.0]
