"""The sparse-dist stage: batch i+1's id exchange runs while step i computes.

With several ranks, a training step's embedding lookup first deduplicates the
batch's keys and sends them to the ranks that own them (`comm`), and only
then can the owners return rows. That key exchange depends on the data alone,
so this stage does it one batch ahead, on a thread of its own, while the main
thread runs the current step (TorchRec calls it the sparse-dist pipeline).

Every rank must exchange the same batches in the same order. So the stage is
driven from the main thread, which is in lockstep across ranks: before it
hands batch i to the step it submits batch i+1 to the stage's single worker
(`SparseDist.ahead`). The futures of a batch's routes travel in the batch
(`PreparedBatch.routes`, one per layer), and the step hands each layer its
own. Rows are still read and created by the owners inside the step, so the
result equals that of the lookup routing its own keys (DESIGN invariant 3).

Faults: the exchanges are collectives with the world's timeout, so a peer that
dies or hangs in one makes it raise `PeerFailureError` on this thread, and
the step waiting for that batch's routes raises it. After one, the stage runs
no further exchange (the world is broken; each would only wait out the timeout
again): the batches queued behind fail at once with the same error, and
closing after a `PeerFailureError` cancels those not started.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import time
from collections.abc import Iterable, Iterator

from reckeras.distributed import PeerFailureError


class SparseDist:
    """Plans the embedding routes of the next batch beside the running step.

    Args:
        layers: the ShardedEmbedding layers fed straight by the model's
            FeatureColumns, once per step.
        training: whether the batches are training batches.

    Example:

    ```python
    with SparseDist(layers, training=True) as stage:
        for batch in stage.ahead(batches):      # stream.PreparedBatch items
            routed = batch.routes[layers[0]].result()
    ```
    """

    name = "sparse_dist"

    def __init__(self, layers: list, training: bool):
        self.layers = layers
        self.training = training
        self.items = 0
        self.busy_s = 0.0
        # (the futures of one batch's layers, its packed sparse input); None: stop
        self._jobs: queue.Queue[tuple[list[concurrent.futures.Future], dict] | None] = \
            queue.Queue()
        self._pending: list[concurrent.futures.Future] = []
        self._peer_failure = None       # the first PeerFailureError of an exchange
        # A daemon thread: after a KeyboardInterrupt it may be left inside a
        # key exchange that the other ranks never join, and must not keep the
        # process alive until that exchange times out.
        self._worker = threading.Thread(target=self._work, daemon=True,
                                        name="reckeras-sparse-dist")
        self._worker.start()

    def __enter__(self) -> SparseDist:
        return self

    def __exit__(self, kind, error, traceback):
        if isinstance(error, PeerFailureError):
            self._cancel_unstarted()     # no peer will join them
        self.close(wait=not isinstance(error, KeyboardInterrupt))
        return False

    def ahead(self, items: Iterable) -> Iterator:
        """Yields the packed batches `items` in order, each after the routes
        of the one that follows it were submitted.

        Args:
            items: `stream.PreparedBatch` items, packed.

        Returns:
            The same items; each one's `routes` maps every layer to the future
            of its `RoutedBatch`.
        """
        iterator = iter(items)
        current = next(iterator, None)
        if current is None:
            return
        self._submit(current)
        for following in iterator:
            self._submit(following)
            yield current
            current = following
        yield current

    def _submit(self, batch):
        """Queues one batch: one future per layer, kept in the batch."""
        self._pending = [f for f in self._pending if not f.done()]
        futures = [concurrent.futures.Future() for _ in self.layers]
        batch.routes.update(zip(self.layers, futures, strict=True))
        self._jobs.put((futures, batch.packed[1]))
        self._pending.extend(futures)

    def _work(self):
        while True:
            job = self._jobs.get()
            if job is None:
                return
            futures, sparse = job
            for layer, future in zip(self.layers, futures, strict=True):
                if not future.set_running_or_notify_cancel():
                    continue
                if self._peer_failure is not None:
                    future.set_exception(self._peer_failure)
                    continue
                started = time.perf_counter()
                try:
                    # A frozen layer's lookup does not train (ShardedEmbedding.call).
                    future.set_result(layer.engine.route_ahead(
                        sparse["ids"], sparse["offsets"], self.training and layer.trainable))
                except BaseException as error:  # noqa: BLE001 -- re-raised by the step's lookup
                    if isinstance(error, PeerFailureError):
                        self._peer_failure = error
                    future.set_exception(error)
                self.busy_s += time.perf_counter() - started
                self.items += 1

    def close(self, wait: bool = True) -> None:
        """Stops the worker. With `wait` (every exit but a KeyboardInterrupt)
        it first lets the exchanges already submitted finish: every rank
        submitted the same ones, so they complete, and a later loop's
        exchanges then never run beside them; without, the ones not started
        are cancelled. (Leaving the `with` block on a `PeerFailureError`
        cancels those first: only the running one is waited for, and its
        collectives time out.)

        Args:
            wait: wait for the submitted exchanges.
        """
        if wait:
            concurrent.futures.wait(self._pending)
        else:
            self._cancel_unstarted()
        self._jobs.put(None)
        if wait:
            self._worker.join()

    def _cancel_unstarted(self):
        for future in self._pending:
            future.cancel()

    def stats(self) -> dict:
        """Batch-layer routes planned and the seconds spent on them."""
        return {"items": self.items, "busy_s": round(self.busy_s, 4)}
