"""Deferred table updates (the non-finite guard's engine side).

Deferred-then-applied updates must equal updates applied inside backward, bit
for bit, on every optimizer, storage and backward path; a step whose
gradients are not finite, once discarded, must leave every row and every
optimizer state as it was.
"""

import copy

import numpy as np
import pytest
import torch

import reckeras as rk
from reckeras.embedding.engine import EmbeddingEngine
from reckeras.embedding.local_row_update import LocalRowUpdate
from reckeras.embedding.packing import PackingPlan
from reckeras.features.plan import TransformPlan

SPECS = [rk.features.Categorical("a", dim=3), rk.features.Categorical("b", dim=3),
         rk.features.Categorical("c", dim=2),
         rk.features.Sequence("h", dim=3, max_len=4, combiner="mean")]
OPTIMIZERS = {
    "sgd": lambda: rk.optimizers.SGD(0.3),
    "adagrad": lambda: rk.optimizers.Adagrad(0.2, initial_accumulator_value=0.1),
    "rowwise_adagrad": lambda: rk.optimizers.RowWiseAdagrad(0.2),
    "adam": lambda: rk.optimizers.Adam(0.05),
    "adamw": lambda: rk.optimizers.AdamW(0.05, weight_decay=0.01),
}


def cached(rows, **extra):
    return rk.embedding.TableOptions(storage="host_cached", cache_rows=rows, **extra)


STORAGES = {
    "device": {},
    # Small budgets: rows are evicted and written back every few steps.
    "host_cached": {"a": cached(16), "b": cached(14), "c": cached(16), "h": cached(22)},
}
# Ids seen once are not admitted: their lookups take the "missing row" path,
# and eviction compacts the table between steps.
LIFECYCLE = {"a": dict(admit_after=2, evict_idle_steps=2, evict_every=3),
             "c": dict(admit_after=2)}


def options_for(storage, lifecycle):
    options = dict(STORAGES[storage])
    if lifecycle:
        for name, fields in LIFECYCLE.items():
            base = options.get(name)
            options[name] = rk.embedding.TableOptions(
                **fields, **({} if base is None else {"storage": "host_cached",
                                                      "cache_rows": base.cache_rows}))
    return options


def make(options, optimizer):
    plan = TransformPlan(SPECS)
    engine = EmbeddingEngine(PackingPlan(plan.slots, plan.sparse_in_declaration_order,
                                         options))
    engine.set_optimizer(optimizer)
    return plan, engine


def batches(count, batch=16, seed=0, vocab=60):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        zipf = np.minimum(rng.zipf(1.2, size=(batch, 3)), vocab)
        history = rng.integers(-1, 20, size=(batch, 4))
        yield {"a": torch.tensor(zipf[:, 0]), "b": torch.tensor(zipf[:, 1]),
               "c": torch.tensor(zipf[:, 2]), "h": torch.tensor(history)}


def forward(plan, engine, raw):
    packed = plan.packed_sparse(raw)
    outputs = engine.lookup(packed["ids"], packed["offsets"], training=True)
    return torch.cat([out.reshape(-1) for out, _ in outputs])


def loss_of(flat, poison=None, value="nan"):
    """A fixed, position-dependent weighting (every row gets a distinct
    update); `poison` multiplies one output value by NaN (or inf) instead."""
    weights = torch.linspace(-1, 1, flat.numel())
    if poison is not None:
        weights[poison] = float(value)
    return (flat * weights).sum()


def train(options, optimizer, deferred, steps=12, seed=0):
    plan, engine = make(options, optimizer)
    outputs = []
    for raw in batches(steps, seed=seed):
        flat = forward(plan, engine, raw)
        outputs.append(flat.detach().clone())
        if deferred:
            with engine.deferred_updates() as updates:
                loss_of(flat).backward()
                finite = updates.finite()
                assert finite.dtype == torch.bool and finite.ndim == 0 and bool(finite)
                updates.apply()
        else:
            loss_of(flat).backward()
    return engine, outputs


def assert_same_tables(mine, theirs):
    assert len(mine) == len(theirs)
    for a, b in zip(mine, theirs):
        for name in ("keys", "weights", "state"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


@pytest.fixture(params=["fused", "reference"])
def backward_path(request, monkeypatch):
    """`fused`: the native CPU kernels (the forward keeps no index, so the
    backward hands the pooled gradient to `apply_pooled`); `reference`: the
    torch references (row gradients to the hook)."""
    if request.param == "reference":
        monkeypatch.setattr("reckeras.backend_kernels.cpu_native.usable",
                            lambda *tensors, table=None: False)
    return request.param


@pytest.mark.parametrize("lifecycle", [False, True], ids=["plain", "lifecycle"])
@pytest.mark.parametrize("storage", sorted(STORAGES))
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.slow
def test_deferred_then_applied_equals_immediate(optimizer, storage, lifecycle,
                                                backward_path):
    options = options_for(storage, lifecycle)
    immediate, expected = train(options, OPTIMIZERS[optimizer](), deferred=False)
    deferred, outputs = train(options, OPTIMIZERS[optimizer](), deferred=True)
    for mine, theirs in zip(outputs, expected):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=0)
    assert_same_tables(deferred.table_states(), immediate.table_states())
    if lifecycle:
        assert deferred.tables[1].evicted == immediate.tables[1].evicted > 0


@pytest.mark.parametrize("storage", sorted(STORAGES))
def test_each_backward_path_is_deferred_and_checked(storage, backward_path, monkeypatch):
    """Which hook runs depends on the kernels and on missing rows; each one
    queues its update with the finiteness of what it would apply."""
    seen = []
    for name in ("_update_dropping_last", "_update"):
        original = getattr(EmbeddingEngine, name)

        def spy(self, *args, _original=original, _name=name):
            seen.append(_name)
            return _original(self, *args)

        monkeypatch.setattr(EmbeddingEngine, name, spy)
    pooled = LocalRowUpdate.apply_pooled

    def pooled_spy(self, *args):
        seen.append("apply_pooled")
        return pooled(self, *args)

    monkeypatch.setattr(LocalRowUpdate, "apply_pooled", pooled_spy)
    plan, engine = make(options_for(storage, lifecycle=True), rk.optimizers.Adam(0.05))
    raws = list(batches(3, seed=1))
    for raw in raws[:2]:                               # "b" and "h" get their rows
        loss_of(forward(plan, engine, raw)).backward()
    flat = forward(plan, engine, raws[2])
    before = engine.table_states()          # with the rows this forward created
    seen.clear()
    with engine.deferred_updates() as updates:
        loss_of(flat).backward()
        assert bool(updates.finite())
        assert_same_tables(engine.table_states(), before)      # nothing applied yet
        # One update per physical table, dims 3 and 2: ids of "a" and "c"
        # not admitted yet take the missing-row path, with row gradients.
        assert seen.count("_update") == 2 and seen.count("_update_dropping_last") == 2
        assert "apply_pooled" not in seen
        updates.apply()
    assert not all(np.array_equal(a.weights, b.weights)
                   for a, b in zip(engine.table_states(), before))


def test_fused_pooled_path_checks_the_pooled_gradient(monkeypatch):
    """Without missing rows and with the native kernels the update is the
    fused `apply_pooled`, whose flag covers the pooled output gradient."""
    calls = []
    pooled = LocalRowUpdate.apply_pooled

    def pooled_spy(self, rows, grad_out, *args):
        calls.append(grad_out.shape)
        return pooled(self, rows, grad_out, *args)

    monkeypatch.setattr(LocalRowUpdate, "apply_pooled", pooled_spy)
    plan, engine = make({}, rk.optimizers.SGD(0.1))
    raw = next(batches(1))
    flat = forward(plan, engine, raw)
    with engine.deferred_updates() as updates:
        loss_of(flat, poison=0).backward()     # the first output value only
        assert calls and not bool(updates.finite())


@pytest.mark.parametrize("storage", sorted(STORAGES))
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_nonfinite_step_discarded_changes_no_row_and_no_state(storage, value,
                                                              backward_path):
    def warm():
        plan, engine = make(options_for(storage, lifecycle=False),
                            rk.optimizers.Adam(0.05))
        for raw in raws:                       # every id of the last batch is known
            loss_of(forward(plan, engine, raw)).backward()
        return plan, engine

    raws = list(batches(6, seed=2))
    plan, engine = warm()
    before = engine.table_states()
    flat = forward(plan, engine, raws[-1])
    with engine.deferred_updates() as updates:
        loss_of(flat, poison=5, value=value).backward()   # one example's value
        assert not bool(updates.finite())
        updates.discard()
        assert not bool(updates.finite())      # still says why it was discarded
        updates.apply()                        # nothing left to apply
    assert_same_tables(engine.table_states(), before)
    assert all(cache is None or int(cache.pins.sum()) == 0 for cache in engine.caches)
    # The next step trains as if the refused one had not happened.
    _, reference = warm()
    for current in (engine, reference):
        loss_of(forward(plan, current, raws[0])).backward()
    assert_same_tables(engine.table_states(), reference.table_states())


@pytest.mark.parametrize("storage", sorted(STORAGES))
def test_only_an_applied_update_marks_its_rows_and_counts_each_once(storage,
                                                                     backward_path):
    # Rows are marked written and counted seen by the update, on its
    # distinct rows (the batches repeat ids): a discarded step marks and
    # counts nothing, and an applied one exactly the rows it changed.
    plan, engine = make(options_for(storage, lifecycle=False), rk.optimizers.Adam(0.05))
    raws = list(batches(4, seed=4))
    for raw in raws[:3]:
        loss_of(forward(plan, engine, raw)).backward()
    for store in engine.tables:
        store.index.next_generation()

    def marks():
        tables = engine.table_states()        # host-cached rows written back
        return [(t.weights.astype(np.float64), t.seen_steps.copy(),
                 s.index.written_generations().numpy())
                for t, s in zip(tables, engine.tables)]

    before = marks()
    flat = forward(plan, engine, raws[3])
    with engine.deferred_updates() as updates:
        loss_of(flat, poison=2).backward()
        updates.discard()
    discarded = marks()
    for (_, seen, written), (_, seen_now, written_now), store in zip(
            before, discarded, engine.tables):
        old = len(seen)                        # rows the step created come after
        np.testing.assert_array_equal(seen_now[:old], seen)
        np.testing.assert_array_equal(written_now[:old], written)
        assert not seen_now[old:].any()        # created: marked, never counted
        assert (written_now[old:] == store.index.generation).all()
    loss_of(forward(plan, engine, raws[3])).backward()
    touched = 0
    for (weights, seen, _), (weights_now, seen_now, written_now), store in zip(
            discarded, marks(), engine.tables):
        changed = (weights_now != weights).any(axis=1)
        counted = seen_now - seen
        assert set(np.unique(counted)) <= {0, 1}
        np.testing.assert_array_equal(counted.astype(bool), changed)
        np.testing.assert_array_equal(written_now == store.index.generation, changed)
        touched += int(changed.sum())
    assert touched > 0


def test_leaving_the_block_without_apply_discards_and_unpins():
    plan, engine = make(STORAGES["host_cached"], rk.optimizers.RowWiseAdagrad(0.2))
    raws = list(batches(4, seed=3))
    for raw in raws:
        loss_of(forward(plan, engine, raw)).backward()
    before = engine.table_states()
    with engine.deferred_updates() as updates:
        loss_of(forward(plan, engine, raws[0])).backward()
        assert bool(updates.finite())
        assert all(int(cache.pins.sum()) > 0 for cache in engine.caches)
    assert all(int(cache.pins.sum()) == 0 for cache in engine.caches)
    assert_same_tables(engine.table_states(), before)
    with pytest.raises(ZeroDivisionError):         # an error inside the block: same
        with engine.deferred_updates():
            loss_of(forward(plan, engine, raws[1])).backward()
            raise ZeroDivisionError
    assert all(int(cache.pins.sum()) == 0 for cache in engine.caches)
    assert_same_tables(engine.table_states(), before)
    loss_of(forward(plan, engine, raws[1])).backward()     # outside: applied at once
    assert not all(np.array_equal(a.weights, b.weights)
                   for a, b in zip(engine.table_states(), before))


@pytest.mark.slow
def test_two_lookups_before_one_deferred_backward_equal_immediate():
    """A layer called twice in a step (shared towers): both updates queue, in
    backward order, and the second lookup's rows stay pinned until apply."""
    results = []
    for deferred in (False, True):
        plan, engine = make({name: cached(2 * o.cache_rows)
                             for name, o in STORAGES["host_cached"].items()},
                            rk.optimizers.Adagrad(0.2))
        raws = list(batches(16, seed=4))
        for first, second in zip(raws[::2], raws[1::2]):
            flat = torch.cat([forward(plan, engine, first), forward(plan, engine, second)])
            if deferred:
                with engine.deferred_updates() as updates:
                    loss_of(flat).backward()
                    updates.apply()
            else:
                loss_of(flat).backward()
        results.append(engine.table_states())
    assert_same_tables(*results)


def test_finite_is_a_tensor_and_reads_nothing_back(monkeypatch):
    plan, engine = make({}, rk.optimizers.SGD(0.1))
    with engine.deferred_updates() as updates:
        empty = updates.finite()
        assert isinstance(empty, torch.Tensor) and empty.ndim == 0 and bool(empty)
        loss_of(forward(plan, engine, next(batches(1)))).backward()

        def no_sync(*args):
            raise AssertionError("finite() read a value back to the host")

        for name in ("__bool__", "item", "tolist", "__int__", "__float__"):
            monkeypatch.setattr(torch.Tensor, name, no_sync)
        flag = updates.finite()
        monkeypatch.undo()
        assert flag.dtype == torch.bool and flag.ndim == 0 and bool(flag)
        updates.discard()


def test_one_deferral_at_a_time():
    _, engine = make({}, rk.optimizers.SGD(0.1))
    with engine.deferred_updates():
        with pytest.raises(RuntimeError, match="already open"):
            with engine.deferred_updates():
                pass
    with engine.deferred_updates():               # closed: a new one may open
        pass


def test_table_states_are_a_copy_and_load_table_states_their_inverse():
    plan, engine = make(STORAGES["host_cached"], rk.optimizers.Adam(0.05))
    raws = list(batches(5, seed=5))
    for raw in raws[:3]:
        loss_of(forward(plan, engine, raw)).backward()
    snapshot = engine.table_states()
    frozen = copy.deepcopy(snapshot)
    for raw in raws[3:]:
        loss_of(forward(plan, engine, raw)).backward()
    assert_same_tables(snapshot, frozen)              # training changed no snapshot
    engine.load_table_states(snapshot)
    assert_same_tables(engine.table_states(), frozen)
    with pytest.raises(ValueError, match="3 tables given, the embedding layer has 2"):
        engine.load_table_states(snapshot + snapshot[:1])
    with pytest.raises(ValueError, match=r"\(dim 3\) cannot load weights of shape \(\d+, 2\)"):
        engine.load_table_states([snapshot[0], snapshot[0]])
    assert_same_tables(engine.table_states(), frozen)   # a refused load changes nothing


@pytest.mark.parametrize("poisoned, finite", [(1, True), (0, False)])
def test_missing_row_path_checks_only_the_gradients_it_applies(poisoned, finite,
                                                               backward_path):
    """Ids without a row (not admitted yet) read a shared zero row whose
    gradient is dropped: a NaN there alone changes nothing and is no reason
    to refuse the step."""
    plan = TransformPlan([rk.features.Categorical("a", dim=2)])
    engine = EmbeddingEngine(PackingPlan(
        plan.slots, plan.sparse_in_declaration_order,
        {"a": rk.embedding.TableOptions(admit_after=2)}))
    engine.set_optimizer(rk.optimizers.SGD(1.0))
    for ids in ([1], [1, 3]):       # 1: admitted at its second step; 3: not yet
        packed = plan.packed_sparse({"a": torch.tensor(ids)})
        (out, _), = engine.lookup(packed["ids"], packed["offsets"], training=True)
    before = engine.table_states()
    weights = torch.ones(2, 1, 2)
    weights[poisoned] = float("nan")
    with engine.deferred_updates() as updates:
        (out * weights).sum().backward()
        assert bool(updates.finite()) is finite
        if finite:
            updates.apply()
    (after,) = engine.table_states()
    assert after.keys.tolist() == before[0].keys.tolist()    # id 1's row only
    expected = before[0].weights - (1.0 if finite else 0.0)
    np.testing.assert_array_equal(after.weights, expected)
