"""Tiered storage: host tables behind a bounded device cache."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import reckeras as rk
from reckeras.embedding.cache import CacheBudgetError
from reckeras.embedding.engine import EmbeddingEngine
from reckeras.embedding.packing import PackingPlan
from reckeras.features.plan import TransformPlan

SPECS = [rk.features.Categorical("a", dim=3), rk.features.Categorical("b", dim=3),
         rk.features.Categorical("c", dim=2),
         rk.features.Sequence("h", dim=3, max_len=4, combiner="mean")]


def cached(rows, policy="lfu", **extra):
    return rk.embedding.TableOptions(storage="host_cached", cache_rows=rows,
                                     cache_policy=policy, **extra)


def make(options, optimizer=None):
    plan = TransformPlan(SPECS)
    engine = EmbeddingEngine(PackingPlan(plan.slots, plan.sparse_in_declaration_order,
                                         options))
    engine.set_optimizer(optimizer or rk.optimizers.Adam(0.05))
    return plan, engine


def batches(count, batch=16, seed=0, vocab=60):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        zipf = np.minimum(rng.zipf(1.2, size=(batch, 3)), vocab)
        history = rng.integers(0, 20, size=(batch, 4))
        yield {"a": torch.tensor(zipf[:, 0]), "b": torch.tensor(zipf[:, 1]),
               "c": torch.tensor(zipf[:, 2]), "h": torch.tensor(history)}


def step(plan, engine, raw, training=True, prefetch=None):
    packed = plan.packed_sparse(raw)
    if prefetch is not None:
        ahead = plan.packed_sparse(prefetch)
        engine.prefetch(ahead["ids"], ahead["offsets"])
    outputs = engine.lookup(packed["ids"], packed["offsets"], training=training)
    flat = torch.cat([out.reshape(-1) for out, _ in outputs])
    if training:
        # A fixed, position-dependent gradient: every row gets a distinct update.
        (flat * torch.linspace(-1, 1, flat.numel())).sum().backward()
    return flat.detach()


def train(options, steps=12, prefetch=False, optimizer=None, **data):
    plan, engine = make(options, optimizer)
    raws = list(batches(steps + 1, **data))
    outputs = [step(plan, engine, raw, prefetch=raws[i + 1] if prefetch else None)
               for i, raw in enumerate(raws[:-1])]
    return engine, outputs


def assert_same_tables(engine, reference):
    for table, ref in zip(engine.tables, reference.tables):
        mine, theirs = table.export(), ref.export()
        for name in ("keys", "weights", "state"):
            np.testing.assert_array_equal(mine[name], theirs[name], err_msg=name)


ALL_CACHED = {"a": cached(16), "b": cached(14), "c": cached(16), "h": cached(22)}


@pytest.mark.parametrize("policy", ["lfu", "lru"])
@pytest.mark.parametrize("prefetch", [False, True])
@pytest.mark.slow
def test_cached_training_equals_all_on_device(policy, prefetch):
    reference, expected = train({})
    options = {name: cached(o.cache_rows, policy) for name, o in ALL_CACHED.items()}
    engine, outputs = train(options, prefetch=prefetch)
    for mine, theirs in zip(outputs, expected):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=0)
    assert_same_tables(engine, reference)
    stats = engine.stats()["tables"]
    dim3 = next(t["cache"] for t in stats if t["dim"] == 3)
    assert dim3["cache_rows"] == 52 and dim3["tables"] == ["a", "b", "h"]
    # The budget is small: rows are evicted (and written back) every few steps.
    assert dim3["rows_out"] > 0 and dim3["rows_in"] > dim3["cache_rows"]
    assert 0 < dim3["hit_rate"] < 1
    if prefetch:
        assert dim3["rows_in_prefetched"] > 0 and dim3["prefetches"] == 12


def test_device_tier_never_exceeds_its_budget():
    plan, engine = make({"c": rk.embedding.TableOptions(storage="host_cached",
                                                        cache_bytes=100)})
    cache = engine.caches[0]
    # Adam keeps 2 * dim + 1 state floats per row: (2 + 5) * 4 = 28 bytes a row.
    assert cache.capacity == 3 and cache.budget_bytes() == 84
    peak = 0
    for raw in batches(20, batch=3, vocab=40):
        step(plan, engine, raw)
        peak = max(peak, cache.memory_bytes(), int((cache.slot_row >= 0).sum()) * 28)
        assert cache.weights.shape == (3, 2) and cache.state.shape == (3, 5)
    assert peak == 84
    assert engine.tables[0].num_rows > 3          # the host tier holds more rows


def test_budget_smaller_than_a_batch_is_a_clear_error_that_changes_nothing():
    plan, engine = make({"c": cached(4)})
    small = {"a": torch.tensor([1, 2]), "b": torch.tensor([1, 2]),
             "c": torch.tensor([1, 2]), "h": torch.zeros(2, 4, dtype=torch.int64)}
    step(plan, engine, small)
    before = [t.export() for t in engine.tables]
    slot_row = engine.caches[0].slot_row.clone()
    big = {k: (v.repeat(5) if v.ndim == 1 else v.repeat(5, 1)) for k, v in small.items()}
    big["c"] = torch.arange(10, 20)
    with pytest.raises(CacheBudgetError, match=r"\['c'\].*needs 10 distinct rows.*holds 4"):
        step(plan, engine, big)
    assert torch.equal(engine.caches[0].slot_row, slot_row)
    for table, old in zip(engine.tables, before):
        for name, array in table.export().items():
            np.testing.assert_array_equal(array, old[name])


def test_budget_error_of_one_table_creates_no_row_in_another():
    plan, engine = make({"a": cached(4), "b": cached(4), "h": cached(4)})
    raw = {"a": torch.arange(10, 20), "b": torch.arange(10) % 2,
           "c": torch.arange(50, 60), "h": torch.zeros(10, 4, dtype=torch.int64)}
    with pytest.raises(CacheBudgetError, match=r"\['a', 'b', 'h'\].*needs 13 distinct rows"
                                               r".*holds 12 rows"):
        step(plan, engine, raw)
    assert engine.tables[0].num_rows == engine.tables[1].num_rows == 0
    assert engine.step == 0


def test_lifecycle_with_cache_equals_lifecycle_alone():
    lifecycle = {"a": rk.embedding.TableOptions(admit_after=2, evict_idle_steps=2,
                                                evict_every=3)}
    reference, expected = train(lifecycle)
    options = dict(ALL_CACHED, a=cached(16, admit_after=2, evict_idle_steps=2,
                                        evict_every=3))
    engine, outputs = train(options, prefetch=True)
    for mine, theirs in zip(outputs, expected):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=0)
    assert_same_tables(engine, reference)
    assert engine.tables[1].evicted == reference.tables[1].evicted > 0


def test_export_writes_back_and_inference_reads_the_cache():
    reference, _ = train({}, steps=6)
    engine, _ = train(ALL_CACHED, steps=6)
    probe = next(batches(1, seed=9))
    plan = TransformPlan(SPECS)
    # Inference (no row creation) reads the newest values, cached or not.
    torch.testing.assert_close(step(plan, engine, probe, training=False),
                               step(plan, reference, probe, training=False),
                               rtol=0, atol=0)
    assert engine.caches[0].dirty.any()
    assert_same_tables(engine, reference)         # export writes dirty rows back
    assert not engine.caches[0].dirty.any()


def test_options_validation():
    with pytest.raises(ValueError, match="exactly one of cache_rows and cache_bytes"):
        rk.embedding.TableOptions(storage="host_cached")
    with pytest.raises(ValueError, match="exactly one"):
        rk.embedding.TableOptions(storage="host_cached", cache_rows=4, cache_bytes=64)
    with pytest.raises(ValueError, match="cache_rows needs storage='host_cached'"):
        rk.embedding.TableOptions(cache_rows=4)
    with pytest.raises(ValueError, match="storage must be one of"):
        rk.embedding.TableOptions(storage="disk")
    with pytest.raises(ValueError, match="cache_policy must be one of"):
        cached(4, policy="fifo")
    with pytest.raises(ValueError, match="cache_rows must be an int >= 1"):
        cached(0)
    with pytest.raises(ValueError, match="tables of dim 3 .* one storage"):
        make({"a": cached(4)})
    with pytest.raises(ValueError, match="one storage and cache policy"):
        make({"c": cached(4), "a": cached(4), "b": cached(4, "lru"), "h": cached(4)})
    with pytest.raises(CacheBudgetError, match="holds no row of 28 bytes"):
        make({"c": rk.embedding.TableOptions(storage="host_cached", cache_bytes=20)})


def test_cache_capacity_in_rows():
    rows = rk.embedding.TableOptions(storage="host_cached", cache_rows=7)
    by_bytes = rk.embedding.TableOptions(storage="host_cached", cache_bytes=100)
    assert rows.cache_capacity(28) == 7
    assert by_bytes.cache_capacity(28) == 3            # 100 // 28 rows fit
    with pytest.raises(ValueError, match="storage='device'.* no device cache"):
        rk.embedding.TableOptions().cache_capacity(28)


def test_host_allocation_failure_names_the_table(monkeypatch):
    plan, engine = make({"c": cached(64)})
    monkeypatch.setattr("reckeras.embedding.physical_table.available_host_bytes", lambda: 100)
    raw = {"a": torch.ones(40, dtype=torch.int64), "b": torch.ones(40, dtype=torch.int64),
           "c": torch.arange(100, 140), "h": torch.zeros(40, 4, dtype=torch.int64)}
    with pytest.raises(MemoryError, match=r"\['c'\] \(dim 2\): 40 rows .* need 320 bytes.* 100 bytes"):
        step(plan, engine, raw)


@pytest.mark.slow
def test_two_lookups_before_one_backward_keep_each_others_rows():
    """A layer called twice in a step (shared towers): the second lookup may
    not evict the rows the first one's backward will update."""
    results = []
    for options in ({}, {name: cached(2 * o.cache_rows) for name, o in ALL_CACHED.items()}):
        plan, engine = make(options)
        raws = list(batches(24, seed=4))
        for first, second in zip(raws[::2], raws[1::2]):
            flats = [torch.cat([out.reshape(-1) for out, _ in engine.lookup(
                packed["ids"], packed["offsets"], training=True)])
                for packed in (plan.packed_sparse(first), plan.packed_sparse(second))]
            flat = torch.cat(flats)
            (flat * torch.linspace(-1, 1, flat.numel())).sum().backward()
        results.append(engine)
        if options:
            assert all(int(c.pins.sum()) == 0 for c in engine.caches)
            assert engine.caches[1].counters["rows_out"] > 0
    assert_same_tables(*reversed(results))


def test_pins_of_a_lookup_without_backward_are_released():
    plan, engine = make(ALL_CACHED)
    raw = next(batches(1))
    packed = plan.packed_sparse(raw)
    engine.lookup(packed["ids"], packed["offsets"], training=True)   # no backward
    assert all(int(c.pins.sum()) > 0 for c in engine.caches)
    engine.release_pins()
    assert all(int(c.pins.sum()) == 0 for c in engine.caches)
    step(plan, engine, raw, training=False)      # inference unpins after its forward
    assert all(int(c.pins.sum()) == 0 for c in engine.caches)


@settings(max_examples=12, deadline=None)
@given(policy=st.sampled_from(["lfu", "lru"]), extra=st.integers(0, 30),
       seed=st.integers(0, 1000), plan_seed=st.integers(0, 1000))
@pytest.mark.slow
def test_any_interleaving_of_prefetches_and_inference_stays_exact(policy, extra, seed,
                                                                  plan_seed):
    """Prefetches of batches 1-3 ahead (as deep pipelines run them) and
    inference lookups between steps never change what training computes."""
    reference, expected = train({}, seed=seed)
    plan, engine = make({name: cached(o.cache_rows + extra, policy)
                         for name, o in ALL_CACHED.items()})
    raws = list(batches(15, seed=seed))
    rng = np.random.default_rng(plan_seed)
    for i, raw in enumerate(raws[:12]):
        for ahead in rng.integers(1, 4, size=rng.integers(0, 3)):
            packed = plan.packed_sparse(raws[i + ahead])
            engine.prefetch(packed["ids"], packed["offsets"])
        if rng.random() < 0.3:
            step(plan, engine, raws[i + 1], training=False)
        torch.testing.assert_close(step(plan, engine, raw), expected[i], rtol=0, atol=0)
    assert_same_tables(engine, reference)
