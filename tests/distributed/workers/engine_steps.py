"""The embedding engine on several ranks, without a model around it.

Usage: engine_steps.py device|host_cached|lifecycle

Checks, on every rank (a failed check exits non-zero):

* routed: a lookup given the RoutedBatch that route_ahead planned for its
  batch equals a lookup that routes its own keys, step after step, and a
  RoutedBatch of another batch is refused;
* deferred: deferred-then-applied updates (with the gradient exchange to the
  owners inside apply) equal updates applied inside backward, bit for bit;
  a NaN gradient on one rank makes every rank discard, and leaves every
  rank's rows and optimizer state as they were.
"""

import sys

import common  # noqa: F401  (first: selects Keras's torch backend)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import reckeras as rk  # noqa: E402
from reckeras import distributed  # noqa: E402
from reckeras.embedding.engine import EmbeddingEngine  # noqa: E402
from reckeras.embedding.packing import PackingPlan  # noqa: E402
from reckeras.features.plan import TransformPlan  # noqa: E402
from reckeras.features.specs import LENGTHS  # noqa: E402

mode = sys.argv[1]
world = distributed.init(timeout_s=60)
SPECS = [rk.features.Categorical("a", dim=4), rk.features.Categorical("b", dim=4),
         rk.features.Sequence("h", dim=3, max_len=4, combiner="mean")]
OPTIONS = {
    "device": {},
    # Each rank caches the rows it owns: budgets above what one step sends it.
    "host_cached": {name: rk.embedding.TableOptions(storage="host_cached", cache_rows=48)
                    for name in ("a", "b", "h")},
    "lifecycle": {"a": rk.embedding.TableOptions(admit_after=2, evict_idle_steps=3,
                                                 evict_every=4)},
}[mode]
plan = TransformPlan(SPECS)


def engine():
    made = EmbeddingEngine(PackingPlan(plan.slots, plan.sparse_in_declaration_order,
                                       OPTIONS))
    made.set_optimizer(rk.optimizers.Adam(0.05))
    return made


def batch(step, rows=12):
    # Every rank its own examples; ids overlap across ranks, so rows are
    # requested by several ranks and owned by one.
    rng = np.random.default_rng(1000 * step + world.rank)
    zipf = np.minimum(rng.zipf(1.3, size=(rows, 2)), 40)
    # Some a's are missing and the histories have every length (LENGTHS
    # columns: a, b, h); -1 is an id like any other.
    present = rng.random(rows) < 0.8
    present[0] = True                  # check_deferred poisons example 0's "a"
    lengths = np.stack([present, np.ones(rows), rng.integers(0, 5, rows)], axis=1)
    return plan.packed_sparse({"a": torch.tensor(zipf[:, 0]),
                               "b": torch.tensor(zipf[:, 1]),
                               "h": torch.tensor(rng.integers(-1, 15, size=(rows, 4))),
                               LENGTHS: torch.tensor(lengths, dtype=torch.int32)})


def flat(outputs):
    return torch.cat([out.reshape(-1) for out, _ in outputs])


def loss_of(values, poison=None):
    weights = torch.linspace(-1, 1, values.numel())
    if poison is not None:
        weights[poison] = float("nan")
    return (values * weights).sum()


def agreed(flag):
    """The flag every rank agrees on (False if any rank's is False)."""
    value = flag.to(torch.int32)
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return bool(value)


def assert_same(mine, theirs, what):
    assert len(mine) == len(theirs), what
    for a, b in zip(mine, theirs):
        for name in ("keys", "weights", "state"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name),
                                          err_msg=f"{what}: {name}")


def check_routed():
    plain, routed = engine(), engine()
    for step in range(8):
        sparse = batch(step)
        ids, offsets = sparse["ids"], sparse["offsets"]
        planned = routed.route_ahead(ids, offsets, True)
        mine = flat(routed.lookup(ids, offsets, True, routed=planned))
        theirs = flat(plain.lookup(ids, offsets, True))
        torch.testing.assert_close(mine, theirs, rtol=0, atol=0)
        loss_of(mine).backward()
        loss_of(theirs).backward()
    sparse = batch(99)
    ids, offsets = sparse["ids"], sparse["offsets"]
    planned = routed.route_ahead(ids, offsets, False)
    torch.testing.assert_close(flat(routed.lookup(ids, offsets, False, routed=planned)),
                               flat(plain.lookup(ids, offsets, False)), rtol=0, atol=0)
    assert_same(routed.table_states(), plain.table_states(), "routed")
    # Routes of another batch are refused on every rank, before any exchange.
    other = batch(100)
    planned = routed.route_ahead(other["ids"], other["offsets"], True)
    try:
        routed.lookup(ids, offsets, True, routed=planned)
    except RuntimeError as error:
        assert "planned for another batch" in str(error)
    else:
        raise AssertionError("routes of another batch were used")
    assert_same(routed.table_states(), plain.table_states(), "after the refusal")


def check_deferred():
    immediate, deferred = engine(), engine()
    for step in range(8):
        sparse = batch(step)
        theirs = flat(immediate.lookup(sparse["ids"], sparse["offsets"], True))
        mine = flat(deferred.lookup(sparse["ids"], sparse["offsets"], True))
        torch.testing.assert_close(mine, theirs, rtol=0, atol=0)
        loss_of(theirs).backward()
        with deferred.deferred_updates() as updates:
            loss_of(mine).backward()
            # Nothing moved yet: no exchange ran, no row changed.
            assert agreed(updates.finite())
            updates.apply()
    assert_same(deferred.table_states(), immediate.table_states(), "deferred")

    # One rank's NaN: every rank discards, no rank's rows change.
    sparse = batch(3)
    values = flat(deferred.lookup(sparse["ids"], sparse["offsets"], True))
    flat(immediate.lookup(sparse["ids"], sparse["offsets"], True))   # same forward
    immediate.release_pins()
    # After the forward: ids admitted by it have their rows, at initial values.
    before = deferred.table_states()
    # Past the dim-3 block ([B, 1, 3] of "h"): the gradient of example 0's "a".
    poison = 12 * 3 + 1 if world.rank == 1 else None
    with deferred.deferred_updates() as updates:
        loss_of(values, poison).backward()
        local = bool(updates.finite())
        assert local is (world.rank != 1)
        assert not agreed(updates.finite())
        updates.discard()
    assert_same(deferred.table_states(), before, "discarded")
    # And training goes on in step on every rank, as if the step had not been.
    for step in (4, 5):
        sparse = batch(step)
        loss_of(flat(immediate.lookup(sparse["ids"], sparse["offsets"], True))).backward()
        with deferred.deferred_updates() as updates:
            loss_of(flat(deferred.lookup(sparse["ids"], sparse["offsets"],
                                         True))).backward()
            assert agreed(updates.finite())
            updates.apply()
    assert_same(deferred.table_states(), immediate.table_states(), "after the discard")
    if mode == "host_cached":
        assert all(int(c.pins.sum()) == 0 for c in deferred.caches if c is not None)


check_routed()
check_deferred()
dist.barrier()
print(f"rank {world.rank}: ok", flush=True)
