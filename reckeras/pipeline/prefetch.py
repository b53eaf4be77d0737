"""A multistage prefetch pipeline: host stages run ahead of the training step.

Each stage is a function applied, in order, to every item the previous stage
produced. With `threads=True` every stage runs in its own thread, joined to
the next by a bounded queue (`depth` items), so while the main thread runs
the step of batch i, the stages already prepare batches i+1, i+2, ... Items
keep their order (one thread per stage), so the result is the same as running
the stages one after another (`threads=False`), which is what training
exactness needs: only host-side preparation moves ahead, never a read of
embedding rows.

Shutdown is clean: an exception inside a stage stops every stage and is
re-raised in the consuming thread with its original traceback; an exception
or KeyboardInterrupt in the consumer (or leaving the `with` block early)
stops and joins every thread.

`stats()` reports, per stage, the items processed, the seconds spent
working, and the mean occupancy of its output queue (near `depth`: the
consumer is the bottleneck; near 0: this stage or one before it is), plus the
seconds the consumer waited for input.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

_END = object()


class _Failure:
    def __init__(self, stage, error):
        self.stage = stage
        self.error = error


class Stage:
    """One named step of the pipeline and what it has done so far.

    Args:
        name: the stage's name in `stats()`.
        fn: the function applied to every item.
    """

    def __init__(self, name: str, fn: Callable):
        self.name = name
        self.fn = fn
        self.items = 0
        self.busy_s = 0.0
        self.occupancy_sum = 0
        self.occupancy_samples = 0

    def run(self, item: Any) -> Any:
        """`fn(item)`, timed and counted.

        Args:
            item: the previous stage's output.

        Returns:
            This stage's output.
        """
        started = time.perf_counter()
        result = self.fn(item)
        self.busy_s += time.perf_counter() - started
        self.items += 1
        return result

    def stats(self) -> dict:
        """Items processed, busy seconds and mean output-queue occupancy."""
        samples = max(self.occupancy_samples, 1)
        return {"items": self.items, "busy_s": round(self.busy_s, 4),
                "mean_queue_occupancy": round(self.occupancy_sum / samples, 3)}


class Pipeline:
    """Runs `source` through `stages` ahead of the consumer.

    Args:
        source: an iterable of raw items (produced by the first thread).
        stages: list of `(name, fn)`.
        depth: capacity of each queue between stages.
        threads: run stages in background threads (else inline, in order).

    Example:

    ```python
    with Pipeline(range(10), [("square", lambda x: x * x)]) as items:
        total = sum(items)
    ```
    """

    def __init__(self, source: Iterable, stages: list, depth: int = 2, threads: bool = True):
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.source = source
        # "read" is the source itself: its busy time is spent in next(source).
        self.stages = [Stage("read", next)] + [Stage(name, fn) for name, fn in stages]
        self.depth = depth
        self.threads = threads
        self.wait_s = 0.0
        self._stop = threading.Event()
        self._workers: list[threading.Thread] = []

    # ---- context management ----------------------------------------------------

    def __enter__(self):
        return iter(self)

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self) -> None:
        """Stops every stage and joins its thread."""
        self._stop.set()
        for worker in self._workers:
            worker.join()
        self._workers = []

    # ---- running -----------------------------------------------------------------

    def __iter__(self):
        if not self.threads:
            yield from self._inline()
            return
        queues = [queue.Queue(self.depth) for _ in self.stages]
        read, *rest = self.stages
        self._start(self._read_loop, read, queues[0])
        for stage, inbox, outbox in zip(rest, queues[:-1], queues[1:], strict=True):
            self._start(self._stage_loop, stage, inbox, outbox)
        outbox = queues[-1]
        try:
            while True:
                started = time.perf_counter()
                item = outbox.get()
                self.wait_s += time.perf_counter() - started
                if item is _END:
                    return
                if isinstance(item, _Failure):
                    raise item.error
                yield item
        finally:
            self.close()

    def _inline(self):
        source = iter(self.source)
        read, *rest = self.stages
        while True:
            started = time.perf_counter()
            try:
                item = read.run(source)
            except StopIteration:
                return
            for stage in rest:
                item = stage.run(item)
            self.wait_s += time.perf_counter() - started
            yield item

    def _start(self, target, *args):
        worker = threading.Thread(target=target, args=args, daemon=True,
                                  name=f"reckeras-{args[0].name}")
        self._workers.append(worker)
        worker.start()

    def _put(self, box, item):
        """Puts unless the pipeline is stopping; returns False when it is."""
        while not self._stop.is_set():
            try:
                box.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _get(self, box):
        while not self._stop.is_set():
            try:
                return box.get(timeout=0.05)
            except queue.Empty:
                continue
        return _END

    def _read_loop(self, stage, outbox):
        try:
            source = iter(self.source)
            while True:
                try:
                    item = stage.run(source)
                except StopIteration:
                    break
                stage.occupancy_sum += outbox.qsize()
                stage.occupancy_samples += 1
                if not self._put(outbox, item):
                    return
            self._put(outbox, _END)
        except BaseException as error:  # noqa: BLE001 -- re-raised in the consumer
            self._put(outbox, _Failure(stage.name, error))

    def _stage_loop(self, stage, inbox, outbox):
        while True:
            item = self._get(inbox)
            if item is _END or isinstance(item, _Failure):
                self._put(outbox, item)
                return
            try:
                result = stage.run(item)
            except BaseException as error:  # noqa: BLE001 -- re-raised in the consumer
                self._put(outbox, _Failure(stage.name, error))
                return
            stage.occupancy_sum += outbox.qsize()
            stage.occupancy_samples += 1
            if not self._put(outbox, result):
                return

    def stats(self) -> dict:
        """Per-stage items, busy seconds and queue occupancy; consumer wait."""
        stats: dict[str, Any] = {stage.name: stage.stats() for stage in self.stages}
        stats["consumer_wait_s"] = round(self.wait_s, 4)
        return stats
