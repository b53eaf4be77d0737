"""The prefetch pipeline: order, stats, errors and clean shutdown."""

import threading
import time
import traceback

import pytest

from reckeras.pipeline.prefetch import Pipeline


def reckeras_threads():
    return [t for t in threading.enumerate() if t.name.startswith("reckeras-")]


@pytest.mark.parametrize("threads", [True, False])
def test_order_and_stats(threads):
    pipeline = Pipeline(range(50), [("double", lambda x: 2 * x), ("inc", lambda x: x + 1)],
                        depth=3, threads=threads)
    with pipeline as items:
        assert list(items) == [2 * i + 1 for i in range(50)]
    stats = pipeline.stats()
    assert [stats[name]["items"] for name in ("read", "double", "inc")] == [50, 50, 50]
    assert set(stats["inc"]) == {"items", "busy_s", "mean_queue_occupancy"}
    assert 0 <= stats["inc"]["mean_queue_occupancy"] <= 3
    assert not reckeras_threads()


def failing_stage(x):
    if x == 7:
        raise ValueError("bad item 7")
    return x


def test_stage_error_reraised_with_traceback_and_threads_stopped():
    pipeline = Pipeline(range(100), [("check", failing_stage)], depth=2)
    seen = []
    with pytest.raises(ValueError, match="bad item 7") as info:
        with pipeline as items:
            for item in items:
                seen.append(item)
    assert seen == list(range(7))
    frames = "".join(traceback.format_tb(info.value.__traceback__))
    assert "failing_stage" in frames
    assert not reckeras_threads()


def test_source_error_reraised():
    def source():
        yield 1
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        with Pipeline(source(), [("id", lambda x: x)]) as items:
            list(items)
    assert not reckeras_threads()


def slow(x):
    time.sleep(0.01)
    return x


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, RuntimeError])
def test_consumer_interrupt_joins_threads(interrupt):
    with pytest.raises(interrupt):
        with Pipeline(iter(range(10**6)), [("slow", slow)], depth=2) as items:
            for item in items:
                if item == 3:
                    raise interrupt()
    assert not reckeras_threads()


def test_leaving_early_joins_threads():
    with Pipeline(iter(range(10**6)), [("slow", slow)], depth=2) as items:
        for item in items:
            if item == 2:
                break
    assert not reckeras_threads()
