"""SparseDist's schedule: batch i+1 is submitted before batch i is handed to
the step, nothing beyond the last batch is submitted, each batch carries the
routes of its own ids for every layer, errors reach the step, after a peer
failure no further exchange starts, and closing waits only when it should.
(Exactness on real ranks: tests/distributed/test_sparse_dist_on_ranks.py;
dead and hung peers: tests/distributed/test_sparse_dist_faults.py.)"""

import concurrent.futures
import threading

import pytest

from reckeras.distributed import PeerFailureError
from reckeras.pipeline.sparse_dist import SparseDist
from reckeras.pipeline.stream import PreparedBatch


class RecordingEngine:
    """Stands in for an EmbeddingEngine: records the routes it planned."""

    def __init__(self, fail_on=None):
        self.planned, self.fail_on = [], fail_on

    def route_ahead(self, ids, offsets, training):
        if ids == self.fail_on:
            raise ValueError(f"exchange of batch {ids} failed")
        self.planned.append(ids)
        return ("routed", ids, training)


class Layer:
    def __init__(self, engine, trainable=True):
        self.engine = engine
        self.trainable = trainable


def items(count):
    return [PreparedBatch(1, {"x": i}, None, None, packed=(None, {"ids": i, "offsets": None}))
            for i in range(count)]


def test_next_batch_submitted_before_the_step_and_each_batch_keeps_its_routes():
    first, second = Layer(RecordingEngine()), Layer(RecordingEngine())
    with SparseDist([first, second], training=True) as stage:
        for index, batch in enumerate(stage.ahead(items(4))):
            assert set(batch.routes) == {first, second}
            for layer in (first, second):
                assert batch.routes[layer].result() == ("routed", index, True)
            # Batch i+1 (if any) is already submitted when step i starts.
            if index < 3:
                stage._pending[-1].result()
                assert first.engine.planned[-1] == index + 1
    assert stage.stats()["items"] == 8          # 4 batches x 2 layers
    assert first.engine.planned == second.engine.planned == [0, 1, 2, 3]


def test_a_frozen_layer_is_routed_as_at_inference():
    frozen, trained = Layer(RecordingEngine(), trainable=False), Layer(RecordingEngine())
    with SparseDist([frozen, trained], training=True) as stage:
        for index, batch in enumerate(stage.ahead(items(2))):
            assert batch.routes[frozen].result() == ("routed", index, False)
            assert batch.routes[trained].result() == ("routed", index, True)


def test_leaving_early_waits_for_the_submitted_next_batch_only():
    layer = Layer(RecordingEngine())
    with SparseDist([layer], training=False) as stage:
        for batch in stage.ahead(items(5)):
            batch.routes[layer].result()
            if batch.inputs["x"] == 1:
                break
    # Batches 0 and 1 were taken, 2 was submitted (every rank submits it),
    # 3 and 4 never were.
    assert layer.engine.planned == [0, 1, 2]
    assert stage.stats()["items"] == 3


def test_an_exchange_error_is_raised_in_the_step():
    layer = Layer(RecordingEngine(fail_on=2))
    with pytest.raises(ValueError, match="exchange of batch 2 failed"):
        with SparseDist([layer], training=True) as stage:
            for batch in stage.ahead(items(4)):
                batch.routes[layer].result()


def test_no_batches():
    layer = Layer(RecordingEngine())
    with SparseDist([layer], training=True) as stage:
        assert list(stage.ahead([])) == []
    assert stage.stats()["items"] == 0


def test_interrupt_does_not_wait_for_an_exchange_that_never_ends():
    # After a KeyboardInterrupt the other ranks may never join the exchange
    # already submitted: closing must not wait for it, and the stage's thread
    # must not keep the process alive.
    release = threading.Event()

    class StuckEngine(RecordingEngine):
        def route_ahead(self, ids, offsets, training):
            release.wait()                      # an exchange no peer joins
            return ("routed", ids, training)

    layer = Layer(StuckEngine())
    with pytest.raises(KeyboardInterrupt):
        with SparseDist([layer], training=True) as stage:
            for _ in stage.ahead(items(3)):
                raise KeyboardInterrupt
    assert stage._worker.daemon and stage._worker.is_alive()
    release.set()
    stage._worker.join(timeout=5)
    assert not stage._worker.is_alive()


class PeerFailingEngine(RecordingEngine):
    """A peer dies in batch `fail_on`'s exchange: route_ahead raises what
    comm's collectives raise then."""

    def route_ahead(self, ids, offsets, training):
        if ids == self.fail_on:
            raise PeerFailureError(f"the sparse-dist stage's exchange of batch {ids}")
        return super().route_ahead(ids, offsets, training)


def test_after_a_peer_failure_no_exchange_runs_and_queued_batches_fail_with_it():
    layer = Layer(PeerFailingEngine(fail_on=2))
    with pytest.raises(PeerFailureError, match="exchange of batch 2") as raised:
        with SparseDist([layer], training=True) as stage:
            for batch in stage.ahead(items(5)):
                if batch.inputs["x"] == 2:
                    # Batch 3 was queued behind 2: it must not start an
                    # exchange (it would wait out the timeout again).
                    following = stage._pending[-1]
                    concurrent.futures.wait([following], timeout=5)
                    assert following.exception() is not None
                batch.routes[layer].result()
    assert following.exception() is raised.value
    assert layer.engine.planned == [0, 1]


def test_leaving_on_a_peer_failure_cancels_the_exchanges_not_started():
    # The step's own collective failed while the stage is inside batch 2's
    # exchange (which times out soon after) and batch 3 waits behind it.
    started, release = threading.Event(), threading.Event()

    class SlowEngine(RecordingEngine):
        def route_ahead(self, ids, offsets, training):
            if ids == 2:
                started.set()
                release.wait()
            return super().route_ahead(ids, offsets, training)

    layer = Layer(SlowEngine())
    with pytest.raises(PeerFailureError):
        with SparseDist([layer], training=True) as stage:
            for batch in stage.ahead(items(5)):
                if batch.inputs["x"] == 2:
                    # The step is handed batch 2 once it is submitted; the
                    # worker may not have begun its exchange yet.
                    assert started.wait(timeout=5)
                    threading.Timer(0.2, release.set).start()
                    raise PeerFailureError("the training step's exchange of embedding rows")
                batch.routes[layer].result()
    assert layer.engine.planned == [0, 1, 2]
    assert not stage._worker.is_alive()
