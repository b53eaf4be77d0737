"""Engine lookups and sparse updates against plain numpy."""

import numpy as np
import pyarrow as pa
import pytest
import torch

import reckeras as rk
from reckeras.backend_kernels.hashing import mix64
from reckeras.embedding.engine import EmbeddingEngine
from reckeras.embedding.packing import PackingPlan, table_salt
from reckeras.features.encode import as_tensors, encode
from reckeras.features.plan import TransformPlan


def make_engine(specs, optimizer=None):
    plan = TransformPlan(specs)
    engine = EmbeddingEngine(PackingPlan(plan.slots, plan.sparse_in_declaration_order))
    engine.set_optimizer(optimizer or rk.optimizers.SGD(1.0))
    return plan, engine


def packed_of(plan, raw):
    """The packed batch of a raw batch, encoded as fit encodes it."""
    return plan.packed_sparse(as_tensors(encode(plan.specs, raw)))


def row_of(engine, table, raw_id):
    key = mix64(torch.tensor([raw_id])) ^ table_salt(table)
    row = engine.tables[0].find(key)
    return engine.tables[0].weights[row[0]].clone()


def test_pooling_combiners_and_layout():
    specs = [rk.features.Categorical("c", dim=3),
             rk.features.Sequence("s", dim=3, max_len=4, combiner="mean", table="t"),
             rk.features.Sequence("q", dim=3, max_len=4, combiner="sqrtn", table="t")]
    plan, engine = make_engine(specs)
    packed = packed_of(plan, {"c": [1, 2], "s": pa.array([[5, 6, 5], []]),
                              "q": pa.array([[6], [5, 6, 7, 8]])})
    out = engine.lookup(packed["ids"], packed["offsets"], training=True)[0][0]
    assert out.shape == (2, 3, 3)
    w = {(t, i): row_of(engine, t, i) for t, i in
         [("c", 1), ("c", 2), ("t", 5), ("t", 6), ("t", 7), ("t", 8)]}
    expected = torch.stack([
        torch.stack([w["c", 1], (2 * w["t", 5] + w["t", 6]) / 3, w["t", 6]]),
        torch.stack([w["c", 2], torch.zeros(3),
                     (w["t", 5] + w["t", 6] + w["t", 7] + w["t", 8]) / 2])])
    torch.testing.assert_close(out, expected)
    # Tables sharing rows: "s" and "q" both read table "t"; "c" is its own.
    assert engine.tables[0].num_rows == 6


def test_backward_updates_touched_rows_only():
    specs = [rk.features.Categorical("a", dim=2), rk.features.Categorical("b", dim=2)]
    plan, engine = make_engine(specs, rk.optimizers.SGD(0.5))
    warm = plan.packed_sparse({"a": torch.tensor([1, 2, 3]), "b": torch.tensor([1, 1, 1])})
    engine.lookup(warm["ids"], warm["offsets"], training=True)
    before = engine.tables[0].weights[:engine.tables[0].num_rows].clone()
    packed = plan.packed_sparse({"a": torch.tensor([1, 1]), "b": torch.tensor([1, 1])})
    out = engine.lookup(packed["ids"], packed["offsets"], training=True)[0][0]
    grad = torch.tensor([[[1.0, 2.0], [3.0, 4.0]], [[10.0, 20.0], [30.0, 40.0]]])
    (out * grad).sum().backward()
    after = engine.tables[0].weights[:engine.tables[0].num_rows]
    row_a1 = engine.tables[0].find(mix64(torch.tensor([1])) ^ table_salt("a"))[0]
    row_b1 = engine.tables[0].find(mix64(torch.tensor([1])) ^ table_salt("b"))[0]
    torch.testing.assert_close(after[row_a1], before[row_a1] - 0.5 * torch.tensor([11.0, 22.0]))
    torch.testing.assert_close(after[row_b1], before[row_b1] - 0.5 * torch.tensor([33.0, 44.0]))
    untouched = [r for r in range(len(before)) if r not in (row_a1, row_b1)]
    torch.testing.assert_close(after[untouched], before[untouched])


def test_rowwise_adagrad_math():
    specs = [rk.features.Categorical("a", dim=2)]
    optimizer = rk.optimizers.RowWiseAdagrad(0.1, epsilon=1e-8, initial_accumulator_value=0.5)
    plan, engine = make_engine(specs, optimizer)
    packed = plan.packed_sparse({"a": torch.tensor([4, 4, 9])})
    out = engine.lookup(packed["ids"], packed["offsets"], training=True)[0][0]
    start = engine.tables[0].weights[:2].clone()
    out[:, 0, :].backward(torch.tensor([[1.0, 3.0], [1.0, 1.0], [0.0, 2.0]]))
    row4 = engine.tables[0].find(mix64(torch.tensor([4])) ^ table_salt("a"))[0]
    g = np.array([2.0, 4.0])
    s = 0.5 + np.mean(g * g)
    expected = start[row4].numpy() - 0.1 * g / (np.sqrt(s) + 1e-8)
    np.testing.assert_allclose(engine.tables[0].weights[row4].numpy(), expected, rtol=1e-6)
    np.testing.assert_allclose(engine.tables[0].state[row4, 0].item(), s, rtol=1e-6)


def test_eval_reads_zeros_for_unseen_and_creates_nothing():
    specs = [rk.features.Categorical("a", dim=2)]
    plan, engine = make_engine(specs)
    seen = plan.packed_sparse({"a": torch.tensor([1])})
    engine.lookup(seen["ids"], seen["offsets"], training=True)
    packed = plan.packed_sparse({"a": torch.tensor([1, 77])})
    out = engine.lookup(packed["ids"], packed["offsets"], training=False)[0][0]
    assert engine.tables[0].num_rows == 1
    torch.testing.assert_close(out[1, 0], torch.zeros(2))
    torch.testing.assert_close(out[0, 0], row_of(engine, "a", 1))


def test_tables_of_different_dims_are_separate_physical_tables():
    specs = [rk.features.Categorical("a", dim=2), rk.features.Categorical("b", dim=5),
             rk.features.Categorical("c", dim=2)]
    plan, engine = make_engine(specs)
    assert [t.dim for t in engine.tables] == [2, 5]
    packed = plan.packed_sparse({k: torch.tensor([1, 2, 3]) for k in "abc"})
    (small, _), (large, _) = engine.lookup(packed["ids"], packed["offsets"], training=True)
    assert small.shape == (3, 2, 2) and large.shape == (3, 1, 5)
    assert engine.tables[0].num_rows == 6 and engine.tables[1].num_rows == 3


def test_unpooled_sequences_land_in_their_own_region():
    specs = [rk.features.Categorical("item", dim=2),
             rk.features.Sequence("hist", dim=2, max_len=3, combiner=None, table="item"),
             rk.features.Sequence("pooled", dim=2, max_len=2, combiner="sum", table="item")]
    plan, engine = make_engine(specs, rk.optimizers.SGD(1.0))
    packed = packed_of(plan, {"item": [1, 2], "hist": pa.array([[2, 3], []]),
                              "pooled": pa.array([[1, 3], [2]])})
    (pooled, sequences), = engine.lookup(packed["ids"], packed["offsets"], training=True)
    w = {i: row_of(engine, "item", i) for i in (1, 2, 3)}
    zero = torch.zeros(2)
    torch.testing.assert_close(pooled, torch.stack([
        torch.stack([w[1], w[1] + w[3]]), torch.stack([w[2], w[2]])]))
    torch.testing.assert_close(sequences["hist"], torch.stack([
        torch.stack([w[2], w[3], zero]), torch.stack([zero, zero, zero])]))
    before = {i: w[i].clone() for i in w}
    sequences["hist"].backward(torch.ones(2, 3, 2))
    torch.testing.assert_close(row_of(engine, "item", 2), before[2] - 1.0)
    torch.testing.assert_close(row_of(engine, "item", 1), before[1])


def test_routes_planned_for_another_batch_are_refused():
    from reckeras.embedding.comm import RoutedBatch
    specs = [rk.features.Categorical("a", dim=2)]
    plan, engine = make_engine(specs)
    _, other_engine = make_engine(specs)
    planned = plan.packed_sparse({"a": torch.tensor([1, 2])})
    same_values = {k: v.clone() for k, v in planned.items()}
    another = plan.packed_sparse({"a": torch.tensor([1, 3])})
    routed = RoutedBatch(engine, planned["ids"], planned["offsets"], True,
                         planned["ids"], [])
    for looked_up, training, planner in ((another, True, engine),
                                         (same_values, True, engine),  # equal, not it
                                         (planned, False, engine),
                                         (planned, True, other_engine)):
        routed.engine = planner
        with pytest.raises(RuntimeError, match="planned for another batch"):
            engine.lookup(looked_up["ids"], looked_up["offsets"], training, routed=routed)
    assert engine.tables[0].num_rows == 0 and engine.step == 0   # refused first
    # route_ahead plans exchanges between ranks: one process has none to plan.
    with pytest.raises(RuntimeError, match="several ranks"):
        engine.route_ahead(planned["ids"], planned["offsets"], True)


def test_every_int64_is_an_id_and_a_missing_value_reads_zeros():
    specs = [rk.features.Categorical("a", dim=2), rk.features.Categorical("b", dim=2)]
    plan, engine = make_engine(specs, rk.optimizers.SGD(1.0))
    packed = packed_of(plan, {"a": pa.array([-1, None, 2**63 - 1, -2**63], pa.int64()),
                              "b": pa.array([0, 0, None, -1], pa.int64())})
    out = engine.lookup(packed["ids"], packed["offsets"], training=True)[0][0]
    # Rows for a: -1, 2**63-1, -2**63; for b: 0, -1. None for the nulls.
    assert engine.tables[0].num_rows == 5
    expected = torch.stack([
        torch.stack([row_of(engine, "a", -1), row_of(engine, "b", 0)]),
        torch.stack([torch.zeros(2), row_of(engine, "b", 0)]),
        torch.stack([row_of(engine, "a", 2**63 - 1), torch.zeros(2)]),
        torch.stack([row_of(engine, "a", -2**63), row_of(engine, "b", -1)])])
    torch.testing.assert_close(out, expected)
    before = engine.tables[0].weights[:5].clone()
    out.sum().backward()
    # Every row read got its gradient (b's 0 twice); a missing value has none.
    counts = {("a", -1): 1, ("a", 2**63 - 1): 1, ("a", -2**63): 1, ("b", 0): 2, ("b", -1): 1}
    for (table, raw), count in counts.items():
        row = engine.tables[0].find(mix64(torch.tensor([raw])) ^ table_salt(table))[0]
        torch.testing.assert_close(engine.tables[0].weights[row], before[row] - count)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn", None])
def test_weighted_pooling_and_its_gradient_against_numpy(combiner):
    specs = [rk.features.Categorical("c", dim=3),
             rk.features.Sequence("s", dim=3, max_len=4, combiner=combiner,
                                  weights="w", table="t")]
    plan, engine = make_engine(specs, rk.optimizers.SGD(1.0))
    ids = [[5, 6, 5], [], [7, 8], [9]]
    weights = [[0.5, 2.0, -1.5], [], [1.0, -1.0], [0.0]]
    packed = packed_of(plan, {"c": [1, 2, 3, 4], "s": pa.array(ids), "w": pa.array(weights)})
    (pooled, sequences), = engine.lookup(packed["ids"], packed["offsets"], training=True,
                                         weights=packed["weights"])
    rows = {i: row_of(engine, "t", i).numpy() for i in (5, 6, 7, 8, 9)}

    def scale(w):           # TensorFlow's embedding_lookup_sparse rules
        w = np.array(w)
        denominator = {"mean": w.sum(), "sqrtn": np.sqrt((w * w).sum())}.get(combiner, 1.0)
        return np.zeros_like(w) if denominator == 0 else w / denominator

    if combiner is None:
        expected = np.zeros((4, 4, 3))
        for b, (row, w) in enumerate(zip(ids, weights)):
            for position, (i, weight) in enumerate(zip(row, w)):
                expected[b, position] = weight * rows[i]
        np.testing.assert_allclose(sequences["s"].detach().numpy(), expected, rtol=1e-6,
                                   atol=1e-7)
        out = sequences["s"]
    else:
        expected = np.stack([sum((k * rows[i] for i, k in zip(row, scale(w))),
                                 np.zeros(3)) for row, w in zip(ids, weights)])
        np.testing.assert_allclose(pooled[:, 1].detach().numpy(), expected, rtol=1e-6,
                                   atol=1e-7)
        out = pooled[:, 1]
    before = {i: rows[i].copy() for i in rows}
    out.sum().backward()
    # Each id's gradient is its scale (the same scale it pooled with).
    grads = {i: 0.0 for i in rows}
    for row, w in zip(ids, weights):
        for i, k in zip(row, w if combiner is None else scale(w)):
            grads[i] += k
    for i in rows:
        np.testing.assert_allclose(row_of(engine, "t", i).numpy(), before[i] - grads[i],
                                   rtol=1e-6, atol=1e-7)
