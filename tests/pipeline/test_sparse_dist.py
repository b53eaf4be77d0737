"""SparseDist's schedule: batch i+1 is submitted before batch i is handed to
the step, nothing beyond the last batch is submitted, errors reach the step,
and close() forgets routes that no step will take. (Exactness on real ranks:
tests/distributed/test_sparse_dist_on_ranks.py.)"""

import threading

import pytest

from reckeras.pipeline.sparse_dist import SparseDist


class RecordingEngine:
    """Stands in for an EmbeddingEngine: records what the stage asks of it."""

    def __init__(self, fail_on=None):
        self.events, self.expected, self.fail_on = [], [], fail_on
        self.lock = threading.Lock()

    def route_ahead(self, ids, offsets, training):
        if ids == self.fail_on:
            raise ValueError(f"exchange of batch {ids} failed")
        return ("routed", ids, training)

    def expect_routed(self, future):
        self.expected.append(future)

    def take(self):
        return self.expected.pop(0).result()

    def clear_routed(self):
        self.events.append("cleared")
        self.expected.clear()


def items(count):
    return [(1, ({"x": i}, None, None)) for i in range(count)]


def pack(inputs):
    return {"ids": inputs["x"], "offsets": None}


def test_next_batch_submitted_before_the_step_and_taken_in_order():
    engine = RecordingEngine()
    with SparseDist([engine], pack, training=True) as stage:
        for index, (_, (inputs, _, _)) in enumerate(stage.ahead(items(4))):
            # Batch i+1 (if any) is already submitted when step i starts.
            assert len(engine.expected) == (2 if index < 3 else 1)
            assert engine.take() == ("routed", inputs["x"], True)
    assert stage.stats()["items"] == 4
    assert engine.events == ["cleared"]


def test_leaving_early_waits_and_forgets_the_submitted_next_batch():
    engine = RecordingEngine()
    with SparseDist([engine], pack, training=False) as stage:
        for _, (inputs, _, _) in stage.ahead(items(5)):
            engine.take()
            if inputs["x"] == 1:
                break
    # Batches 0 and 1 were taken, 2 was submitted (every rank submits it),
    # 3 and 4 never were.
    assert stage.stats()["items"] == 3
    assert engine.expected == [] and engine.events == ["cleared"]


def test_an_exchange_error_is_raised_in_the_step():
    engine = RecordingEngine(fail_on=2)
    with pytest.raises(ValueError, match="exchange of batch 2 failed"):
        with SparseDist([engine], pack, training=True) as stage:
            for _ in stage.ahead(items(4)):
                engine.take()


def test_no_batches():
    engine = RecordingEngine()
    with SparseDist([engine], pack, training=True) as stage:
        assert list(stage.ahead([])) == []
    assert stage.stats()["items"] == 0


def test_interrupt_does_not_wait_for_an_exchange_that_never_ends():
    # After a KeyboardInterrupt the other ranks may never join the exchange
    # already submitted: closing must not wait for it, and the stage's thread
    # must not keep the process alive.
    import threading as _threading
    release = _threading.Event()

    class StuckEngine(RecordingEngine):
        def route_ahead(self, ids, offsets, training):
            release.wait()                      # an exchange no peer joins
            return ("routed", ids, training)

    engine = StuckEngine()
    with pytest.raises(KeyboardInterrupt):
        with SparseDist([engine], pack, training=True) as stage:
            for _ in stage.ahead(items(3)):
                raise KeyboardInterrupt
    assert engine.events == ["cleared"]
    assert stage._worker.daemon and stage._worker.is_alive()
    release.set()
    stage._worker.join(timeout=5)
    assert not stage._worker.is_alive()
