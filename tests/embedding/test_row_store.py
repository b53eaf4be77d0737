"""The row-store protocol: every store the engine can hold passes the same suite.

Each test runs on `PhysicalTable` (with each key index), `HostCachedTable`
and `RowLifecycle` over each of them, through `RowStore` members only. The reference is a plain dict
`{key: (row, state)}` updated with numpy; a new row's value is
`initial_rows(key)` (the table's documented initial value).
"""

import contextlib

import numpy as np
import pytest
import torch

import reckeras as rk
from reckeras.backend_kernels.hashing import initial_rows
from reckeras.embedding.cache import CacheBudgetError, HostCachedTable
from reckeras.embedding.lifecycle import RowLifecycle
from reckeras.embedding.physical_table import PhysicalTable
from reckeras.embedding.row_store import DelegatingStore, RowStore, protocol_members

DIM, WIDTH, SCALE, SEED = 3, 2, 0.1, 5
CACHE_ROWS = 4
KINDS = ["device", "host_cached", "device+lifecycle", "host_cached+lifecycle",
         "device/compact", "host_cached/compact", "device+lifecycle/compact"]


def make_store(kind, cache_rows=CACHE_ROWS):
    kind, _, index = kind.partition("/")
    table = PhysicalTable(DIM, SCALE, SEED, name="t", index=index or "hash")
    store = table
    if kind.startswith("host_cached"):
        options = rk.embedding.TableOptions(storage="host_cached", cache_rows=cache_rows)
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


def release(pin):
    if pin is not None:
        pin.release()


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


def train(store, keys, step, delta=1.0):
    """One training lookup of `keys` whose update adds `delta` to its rows
    (after marking them written, as the engine does)."""
    store.begin_step(step)
    rows, pin = resolve(store, keys, training=True)
    unique = torch.unique(rows)
    store.mark_written(unique)
    store.weights[unique] += delta
    release(pin)


@pytest.fixture(params=KINDS)
def store(request):
    return make_store(request.param)


@pytest.mark.parametrize("kind", KINDS)
def test_members_and_their_defaults(kind):
    store = make_store(kind)
    assert isinstance(store, RowStore)
    for member in protocol_members():
        assert hasattr(store, member), member
    assert store.dim == DIM and store.name == "t" and store.num_rows == 0
    assert isinstance(store.index, PhysicalTable)
    assert (store.cache is not None) == kind.startswith("host_cached")
    assert store.needs_tags == kind.partition("/")[0].endswith("+lifecycle")
    assert store.index.key_index.kind == (kind.partition("/")[2] or "hash")
    assert store.evicted == 0 and store.ages_by_windows is False
    assert store.end_window() == 0


def test_resolve_creates_rows_while_training_only(store):
    keys = torch.tensor([5, 9, 5, -(2**63), 2**63 - 1])
    rows, pin = resolve(store, keys, training=False)
    assert rows.tolist() == [-1] * 5 and store.num_rows == 0
    release(pin)
    rows, pin = resolve(store, keys, training=True)
    assert store.num_rows == 4 and rows[0] == rows[2]
    assert len(set(rows.tolist())) == 4 and int(rows.max()) < store.row_bound
    for key, row in zip(keys.tolist(), rows):
        np.testing.assert_array_equal(store.weights[row].numpy(), initial(key))
        np.testing.assert_array_equal(store.state[row].numpy(), [0.5, 0.5])
    release(pin)
    rows, pin = resolve(store, torch.tensor([9, 77]), training=False)
    assert int(rows[1]) == -1 and store.num_rows == 4
    np.testing.assert_array_equal(store.weights[rows[0]].numpy(), initial(9))


def test_place_inside_locked_resolves_the_index_rows(store):
    keys = torch.tensor([11, 12, 13])
    train(store, keys, step=1)
    with store.locked():
        index_rows = store.index.find(torch.tensor([13, 99, 11]))
        rows, pin = store.place(index_rows, training=False)
    assert int(rows[1]) == -1
    np.testing.assert_array_equal(store.weights[rows[[0, 2]]].numpy(),
                                  np.stack([initial(13), initial(11)]) + 1.0)
    release(pin)


def test_updates_through_weights_and_state_equal_the_reference(store):
    """A fake optimizer writes `weights[rows]` and `state[rows]` the way the
    sparse optimizers do; the store must keep every value across evictions."""
    reference = {}
    for step, keys in enumerate(batches(30), start=1):
        store.begin_step(step)
        rows, pin = resolve(store, keys, training=True)
        unique = torch.unique(rows)
        grads = torch.arange(unique.numel() * DIM, dtype=torch.float32).view(-1, DIM) / 7
        store.mark_written(unique)
        store.weights[unique] -= 0.1 * grads
        store.state[unique] += grads[:, :WIDTH] ** 2
        release(pin)
        for key in torch.unique(keys).tolist():
            reference.setdefault(key, (initial(key), np.full(WIDTH, 0.5, np.float32)))
        for row, grad in zip(unique, grads):
            key = int(keys[rows == row][0])
            weights, state = reference[key]
            reference[key] = (weights - np.float32(0.1) * grad.numpy(),
                              state + grad.numpy()[:WIDTH] ** 2)
    assert store.num_rows == len(reference) > CACHE_ROWS
    assert_matches(store, reference)
    # The export wrote a cache back: the index holds every newest value.
    index = store.index
    for key, (row, _) in reference.items():
        found = index.find(torch.tensor([key]))
        np.testing.assert_array_equal(index.weights[found[0]].numpy(), row)


@pytest.mark.parametrize("kind", KINDS)
def test_growth_rehashes_and_keeps_every_row(kind):
    # 3000 keys: the index (16 slots at first) rehashes 8 times, the row
    # arrays double 12 times; lookups of 250 distinct keys fit a 256-row cache.
    store = make_store(kind, cache_rows=256)
    keys = torch.randperm(3000, generator=torch.Generator().manual_seed(0)) * 104729 - 7
    reference = {}
    for step, chunk in enumerate(keys.split(250), start=1):
        train(store, chunk, step, delta=float(step))
        reference.update({int(k): (initial(int(k)) + step, np.full(WIDTH, 0.5, np.float32))
                          for k in chunk})
    key_index = store.index.key_index
    assert store.num_rows == 3000
    if key_index.kind == "hash":
        assert key_index.slot_keys.numel() >= 6000
    else:   # at most 25 keys a bucket
        assert int(key_index.arrays[2][0]) >= 3000 // 25
    assert_matches(store, reference)
    rows, pin = resolve(store, keys[:200], training=False)
    assert bool((rows >= 0).all())
    release(pin)


def test_mark_written_is_what_export_changes_returns(store):
    train(store, torch.tensor([1, 2, 3]), step=1)
    since = store.index.next_generation()
    # A new key (created: a change), an update of key 2 twice (counted in
    # seen_steps once per update), key 1 and 3 read only.
    train(store, torch.tensor([2, 4, 2]), step=2)
    rows, pin = resolve(store, torch.tensor([1, 3]), training=False)
    store.mark_written(torch.tensor([-1]))         # no row: marks nothing
    release(pin)
    changes = store.export_changes(since)
    assert sorted(changes["keys"].tolist()) == [2, 4]
    assert changes["deleted"].tolist() == []
    exported = by_key(store.export())
    for key, weights, seen in zip(changes["keys"], changes["weights"], changes["seen_steps"]):
        np.testing.assert_array_equal(weights, exported[int(key)][0])
        assert seen == 2 if key == 2 else seen == 1
    full = store.export()
    assert dict(zip(full["keys"].tolist(), full["seen_steps"].tolist())) == \
        {1: 1, 2: 2, 3: 1, 4: 1}


def test_compact_deletes_and_keeps_the_chosen_rows_unchanged(store):
    for step, keys in enumerate(batches(8, seed=2), start=1):
        train(store, keys, step, delta=2.0)           # newest values only in a cache
    before = by_key(store.export())
    since = store.index.next_generation()
    index_keys = store.index.keys[:store.index.num_rows].clone()
    keep = torch.arange(0, store.index.num_rows, 2)
    rows = store.compact(keep)
    kept = index_keys[keep]
    assert torch.equal(store.index.find(kept), rows)
    assert store.num_rows == keep.numel()
    assert_matches(store, {int(k): before[int(k)] for k in kept})
    freed = set(before) - set(kept.tolist())
    changes = store.export_changes(since)
    assert set(changes["deleted"].tolist()) == freed and changes["keys"].size == 0
    # A freed key that comes back holds a row again: it is a change, not a deletion.
    back = min(freed)
    train(store, torch.tensor([back]), step=9)
    changes = store.export_changes(since)
    assert changes["keys"].tolist() == [back]
    assert set(changes["deleted"].tolist()) == freed - {back}


def test_export_load_round_trip(store):
    for step, keys in enumerate(batches(10, seed=1), start=1):
        train(store, keys, step)
    exported = store.export()
    for kind in KINDS:
        other = make_store(kind)
        other.load(exported)
        assert other.num_rows == store.num_rows
        assert_matches(other, by_key(exported))
        np.testing.assert_array_equal(other.export()["seen_steps"], exported["seen_steps"])
        keys = torch.as_tensor(exported["keys"][:CACHE_ROWS])
        rows, pin = resolve(other, keys, training=False)
        np.testing.assert_array_equal(other.weights[rows].numpy(),
                                      exported["weights"][:CACHE_ROWS])
        np.testing.assert_array_equal(other.state[rows].numpy(),
                                      exported["state"][:CACHE_ROWS])
        release(pin)
    with pytest.raises(ValueError, match="dim 3 cannot load"):
        store.load({"keys": np.arange(2), "weights": np.zeros((2, 4), np.float32),
                    "state": np.zeros((2, WIDTH), np.float32)})


def test_load_deletes_the_keys_it_replaces(store):
    train(store, torch.tensor([1, 2, 3]), step=1)
    since = store.index.next_generation()
    store.load({"keys": np.array([3, 4]), "weights": np.ones((2, DIM), np.float32),
                "state": np.zeros((2, WIDTH), np.float32)})
    changes = store.export_changes(since)
    assert sorted(changes["keys"].tolist()) == [3, 4]       # every loaded row is new
    assert sorted(changes["deleted"].tolist()) == [1, 2]
    assert_matches(store, {3: (np.ones(DIM), np.zeros(WIDTH)),
                           4: (np.ones(DIM), np.zeros(WIDTH))})


def test_configure_state_keeps_loaded_state_of_the_same_width(store):
    store.load({"keys": np.array([3, 4]), "weights": np.ones((2, DIM), np.float32),
                "state": np.full((2, WIDTH), 7.0, np.float32)})
    store.configure_state(WIDTH, 0.0)
    np.testing.assert_array_equal(store.export()["state"], np.full((2, WIDTH), 7.0))
    store.configure_state(1, 0.25)
    exported = store.export()
    np.testing.assert_array_equal(exported["state"], np.full((2, 1), 0.25))
    np.testing.assert_array_equal(exported["weights"], np.ones((2, DIM)))


def test_prefetch_and_check_fits_change_nothing(store):
    for step, keys in enumerate(batches(6, seed=3), start=1):
        train(store, keys, step, delta=0.5)
    before = by_key(store.export())
    store.prefetch(torch.tensor([5, 6, 7]) * 7919 - 50)      # existing and new keys
    store.check_fits(torch.tensor([1, 2]), training=True)
    assert store.num_rows == len(before)
    assert_matches(store, before)
    too_many = torch.arange(100, 100 + CACHE_ROWS + 1)
    if store.cache is not None:
        with pytest.raises(CacheBudgetError, match="needs 5 distinct rows"):
            store.check_fits(too_many, training=True)
    else:
        store.check_fits(too_many, training=True)
    assert store.num_rows == len(before)


def test_pins_and_stats(store):
    rows, pin = resolve(store, torch.tensor([1, 2, 3]), training=True)
    stats = store.stats()
    assert stats["dim"] == DIM and stats["rows"] == 3 == store.num_rows
    assert stats["bytes"] == sum(stats["bytes_by_part"].values()) == \
        store.index.memory_bytes() > 0
    cache = store.cache
    if cache is not None:
        assert pin is not None and stats["cache"]["cache_rows"] == CACHE_ROWS
        assert int(cache.pins.sum()) == 3
        store.release_pins()
        assert int(cache.pins.sum()) == 0
        pin.release()                                  # idempotent after release_pins
        assert int(cache.pins.sum()) == 0
    else:
        assert pin is None and "cache" not in stats
        store.release_pins()


@pytest.mark.parametrize("inner", ["device", "host_cached"])
def test_a_lifecycle_ageing_by_windows_exports_and_loads_its_windows(inner):
    store = make_store(inner)
    store = RowLifecycle(store, [rk.embedding.TableOptions(evict_idle_windows=2)])
    assert store.ages_by_windows
    train(store, torch.tensor([1, 2]), step=1)
    assert store.end_window() == 0                   # window 0 ends
    train(store, torch.tensor([2]), step=2)          # window 1
    exported = store.export()
    last = dict(zip(exported["keys"].tolist(), exported["last_window"].tolist()))
    assert last == {1: 0, 2: 1} and exported["window"] == 1
    other = RowLifecycle(make_store(inner),
                         [rk.embedding.TableOptions(evict_idle_windows=2)])
    other.load(exported)
    assert other.end_window() == 0                   # window 1 ends: 1 and 2 recent
    assert other.end_window() == 1 and other.evicted == 1     # key 1: windows 1, 2 idle
    assert other.export()["keys"].tolist() == [2] and other.export()["window"] == 3


def test_the_lifecycle_moves_its_counts_with_compaction():
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


class _Recording(RowStore):
    """A store whose every member records that it was used."""

    def __init__(self):
        self.used = []

    def __getattribute__(self, name):
        if name in protocol_members():
            object.__getattribute__(self, "used").append(name)
        return object.__getattribute__(self, name)

    dim = name = needs_tags = index = weights = state = row_bound = num_rows = "inner"
    cache = evicted = ages_by_windows = "inner"

    def resolve(self, keys, training, tags=None):
        return "inner"

    def mark_written(self, rows):
        return "inner"

    def configure_state(self, width, initial_value):
        return "inner"

    def export(self):
        return "inner"

    def export_changes(self, since):
        return "inner"

    def load(self, arrays):
        return "inner"

    def stats(self):
        return "inner"

    def locked(self):
        return contextlib.nullcontext("inner")

    def place(self, index_rows, training):
        return "inner"

    def compact(self, keep):
        return "inner"

    def check_fits(self, keys, training):
        return "inner"

    def begin_step(self, step):
        return "inner"

    def end_window(self):
        return "inner"

    def prefetch(self, keys):
        return "inner"

    def release_pins(self):
        return "inner"


def test_a_delegating_store_forwards_every_protocol_member():
    inner = _Recording()
    wrapper = DelegatingStore(inner)
    for member in protocol_members():
        value = getattr(wrapper, member)
        if callable(value):
            arguments = {"resolve": 2, "mark_written": 1, "configure_state": 2,
                         "export_changes": 1, "load": 1, "place": 2, "compact": 1,
                         "check_fits": 2, "begin_step": 1, "prefetch": 1}.get(member, 0)
            value = value(*[None] * arguments)
            if member == "locked":
                with value as value:
                    pass
        assert value == "inner", member
    assert inner.used == list(protocol_members())
    # A wrapper's own attribute takes precedence over the inner store's.
    wrapper.evicted = 3
    assert wrapper.evicted == 3 and inner.evicted == "inner"
