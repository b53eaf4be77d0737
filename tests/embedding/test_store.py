"""The row-store protocol: every store the engine can hold passes the same suite.

The reference is a plain dict `{key: (row, state)}` updated with numpy; a
new row's value is `initial_rows(key)` (the table's documented initial value).
"""

import numpy as np
import pytest
import torch

import reckeras as rk
from reckeras.backend_kernels.hashing import initial_rows
from reckeras.embedding.cache import CacheBudgetError, HostCachedTable
from reckeras.embedding.lifecycle import RowLifecycle
from reckeras.embedding.physical_table import PhysicalTable, RowStore

DIM, WIDTH, SCALE, SEED = 3, 2, 0.1, 5
CACHE_ROWS = 4
KINDS = ["device", "host_cached", "device+lifecycle", "host_cached+lifecycle"]


def make_store(kind):
    table = PhysicalTable(DIM, SCALE, SEED, name="t")
    store = table
    if kind.startswith("host_cached"):
        options = rk.embedding.TableOptions(storage="host_cached", cache_rows=CACHE_ROWS)
        store = HostCachedTable(table, ["t"], [options], "cpu")
    if kind.endswith("+lifecycle"):
        # A lifecycle that admits at first sight and never finds a row idle:
        # it must change nothing the protocol promises.
        store = RowLifecycle(store, [rk.embedding.TableOptions(evict_idle_steps=10**9,
                                                               evict_every=1)])
    store.configure_state(WIDTH, 0.5)
    return store


def resolve(store, keys, training):
    tags = torch.zeros_like(keys) if store.needs_tags else None
    return store.resolve(keys, training, tags)


def by_key(exported):
    return {int(k): (w, s) for k, w, s in zip(exported["keys"], exported["weights"],
                                              exported["state"])}


def assert_matches(store, reference):
    mine = by_key(store.export())
    assert sorted(mine) == sorted(reference)
    for key, (row, state) in reference.items():
        np.testing.assert_array_equal(mine[key][0], row, err_msg=str(key))
        np.testing.assert_array_equal(mine[key][1], state, err_msg=str(key))


def initial(key):
    return initial_rows(torch.tensor([key]), DIM, SCALE, SEED)[0].numpy()


def batches(count, seed=0, keys=12):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        # At most CACHE_ROWS distinct keys: one lookup always fits the cache.
        distinct = rng.choice(keys, size=CACHE_ROWS, replace=False) * 7919 - 50
        yield torch.tensor(rng.choice(distinct, size=6))


@pytest.fixture(params=KINDS)
def store(request):
    return make_store(request.param)


def test_is_a_row_store(store):
    assert isinstance(store, RowStore)
    assert store.dim == DIM and store.name == "t"
    assert store.storage in ("device", "host_cached")


def test_resolve_creates_rows_while_training_only(store):
    keys = torch.tensor([5, 9, 5, -(2**63), 2**63 - 1])
    rows, pin = resolve(store, keys, training=False)
    assert rows.tolist() == [-1] * 5 and store.num_rows == 0
    if pin is not None:
        pin.release()
    rows, pin = resolve(store, keys, training=True)
    assert store.num_rows == 4 and rows[0] == rows[2]
    assert len(set(rows.tolist())) == 4 and int(rows.max()) < store.row_bound
    for key, row in zip(keys.tolist(), rows):
        np.testing.assert_array_equal(store.weights[row].numpy(), initial(key))
        np.testing.assert_array_equal(store.state[row].numpy(), [0.5, 0.5])
    if pin is not None:
        pin.release()
    rows, pin = resolve(store, torch.tensor([9, 77]), training=False)
    assert int(rows[1]) == -1 and store.num_rows == 4
    np.testing.assert_array_equal(store.weights[rows[0]].numpy(), initial(9))


def test_updates_through_weights_and_state_equal_the_reference(store):
    """A fake optimizer writes `weights[rows]` and `state[rows]` the way the
    sparse optimizers do; the store must keep every value across evictions."""
    reference = {}
    for step, keys in enumerate(batches(30), start=1):
        store.begin_step(step)
        rows, pin = resolve(store, keys, training=True)
        unique = torch.unique(rows)
        grads = torch.arange(unique.numel() * DIM, dtype=torch.float32).view(-1, DIM) / 7
        store.weights[unique] -= 0.1 * grads
        store.state[unique] += grads[:, :WIDTH] ** 2
        if pin is not None:
            pin.release()
        for key in torch.unique(keys).tolist():
            reference.setdefault(key, (initial(key), np.full(WIDTH, 0.5, np.float32)))
        for row, grad in zip(unique, grads):
            key = int(keys[rows == row][0])
            weights, state = reference[key]
            reference[key] = (weights - np.float32(0.1) * grad.numpy(),
                              state + grad.numpy()[:WIDTH] ** 2)
    assert store.num_rows == len(reference) > CACHE_ROWS
    assert_matches(store, reference)
    store.sync()
    index = store.index
    for key, (row, _) in reference.items():
        found = index.find(torch.tensor([key]))
        np.testing.assert_array_equal(index.weights[found[0]].numpy(), row)


def test_export_load_round_trip(store):
    for step, keys in enumerate(batches(10, seed=1), start=1):
        store.begin_step(step)
        rows, pin = resolve(store, keys, training=True)
        store.weights[torch.unique(rows)] += 1.0
        if pin is not None:
            pin.release()
    exported = store.export()
    for kind in KINDS:
        other = make_store(kind)
        other.load(exported)
        assert other.num_rows == store.num_rows
        assert_matches(other, by_key(exported))
        keys = torch.as_tensor(exported["keys"][:CACHE_ROWS])
        rows, _ = resolve(other, keys, training=False)
        np.testing.assert_array_equal(other.weights[rows].numpy(),
                                      exported["weights"][:CACHE_ROWS])
        np.testing.assert_array_equal(other.state[rows].numpy(),
                                      exported["state"][:CACHE_ROWS])
    with pytest.raises(ValueError, match="dim 3 cannot load"):
        store.load({"keys": np.arange(2), "weights": np.zeros((2, 4), np.float32),
                    "state": np.zeros((2, WIDTH), np.float32)})


def test_configure_state_keeps_loaded_state_of_the_same_width(store):
    store.load({"keys": np.array([3, 4]), "weights": np.ones((2, DIM), np.float32),
                "state": np.full((2, WIDTH), 7.0, np.float32)})
    store.configure_state(WIDTH, 0.0)
    np.testing.assert_array_equal(store.export()["state"], np.full((2, WIDTH), 7.0))
    store.configure_state(1, 0.25)
    exported = store.export()
    np.testing.assert_array_equal(exported["state"], np.full((2, 1), 0.25))
    np.testing.assert_array_equal(exported["weights"], np.ones((2, DIM)))


def test_compact_keeps_the_chosen_rows_unchanged(store):
    for step, keys in enumerate(batches(8, seed=2), start=1):
        store.begin_step(step)
        rows, pin = resolve(store, keys, training=True)
        store.weights[torch.unique(rows)] *= 2.0     # newest values only in a cache
        if pin is not None:
            pin.release()
    before = by_key(store.export())
    index_keys = store.index.keys[:store.index.num_rows].clone()
    keep = torch.arange(0, store.index.num_rows, 2)
    rows = store.compact(keep)
    kept = index_keys[keep]
    assert torch.equal(store.index.find(kept), rows)
    assert store.num_rows == keep.numel()
    assert_matches(store, {int(k): before[int(k)] for k in kept})


def test_prefetch_and_check_fits_change_nothing(store):
    for step, keys in enumerate(batches(6, seed=3), start=1):
        store.begin_step(step)
        rows, pin = resolve(store, keys, training=True)
        store.weights[torch.unique(rows)] += 0.5
        if pin is not None:
            pin.release()
    before = by_key(store.export())
    store.prefetch(torch.tensor([5, 6, 7]) * 7919 - 50)      # existing and new keys
    store.check_fits(torch.tensor([1, 2]), training=True)
    assert store.num_rows == len(before)
    assert_matches(store, before)
    too_many = torch.arange(100, 100 + CACHE_ROWS + 1)
    if store.storage == "host_cached":
        with pytest.raises(CacheBudgetError, match="needs 5 distinct rows"):
            store.check_fits(too_many, training=True)
    else:
        store.check_fits(too_many, training=True)
    assert store.num_rows == len(before)


def test_pins_and_stats(store):
    rows, pin = resolve(store, torch.tensor([1, 2, 3]), training=True)
    stats = store.stats()
    assert stats["dim"] == DIM and stats["rows"] == 3 == store.num_rows
    assert stats["bytes"] == store.index.memory_bytes() > 0
    if store.storage == "host_cached":
        assert pin is not None and stats["cache"]["cache_rows"] == CACHE_ROWS
        cache = (store.store if isinstance(store, RowLifecycle) else store).cache
        assert int(cache.pins.sum()) == 3
        store.release_pins()
        assert int(cache.pins.sum()) == 0
        pin.release()                                  # idempotent after release_pins
        assert int(cache.pins.sum()) == 0
    else:
        assert pin is None and "cache" not in stats
        store.release_pins()


def test_lifecycle_wrapper_moves_its_counts_with_compaction():
    options = rk.embedding.TableOptions(evict_idle_steps=2, evict_every=1)
    store = RowLifecycle(PhysicalTable(DIM), [options, options])
    store.configure_state(0, 0.0)
    keys, tags = torch.tensor([10, 20, 30]), torch.tensor([0, 0, 1])
    for step, chosen in enumerate(([0, 1, 2], [2], [2]), start=1):
        store.begin_step(step)
        store.resolve(keys[chosen], True, tags[chosen])
    assert store.index.find(torch.tensor([30])).tolist() == [2]
    store.begin_step(4)              # 10 and 20 idle since step 1: freed, 30 moves
    assert store.evicted == 2 and store.num_rows == 1
    (row,) = store.index.find(torch.tensor([30])).tolist()
    assert row == 0 and store.last_step[row] == 3 and store.index.tags[row] == 1
