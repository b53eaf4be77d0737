"""A watched directory of serving deltas, applied as they appear.

`DeltaWatcher(predictor, directory)` polls `directory` (every `interval`
seconds, in a daemon thread once `start`ed): each sub-directory holding a
delta manifest is a candidate, and the one whose base is the served version
is applied (`Predictor.apply_delta`), then the one based on it, and so on,
so deltas may arrive in any order and are applied in chain order. Staging
directories of a writer (`*.tmp`, `*.old`, see `export_serving`) are never
read. A delta that is refused (damaged, partial) leaves the served version
as it was; it is checked again at each poll (a delta is small), in case it
was rewritten, and its error is logged once. Nothing here imports Keras.
"""

from __future__ import annotations

import json
import logging
import os
import threading

from reckeras.serving import artifact
from reckeras.serving.predictor import Predictor

logger = logging.getLogger("reckeras.serving")


class DeltaWatcher:
    """Applies the deltas written into a directory to a running predictor.

    Args:
        predictor: the served model.
        directory: where `export_serving(..., base=...)` writes its deltas
            (one sub-directory each).
        interval: seconds between two polls of `start`'s thread (> 0).

    Raises:
        ValueError: `interval` is not positive, or `directory` is not a
            directory.

    Example:

    ```python
    watcher = DeltaWatcher(predictor, "exported/deltas", interval=1.0)
    watcher.poll()          # applies what is there now, returns the versions
    watcher.start()         # then polls every second in a daemon thread
    ```
    """

    def __init__(self, predictor: Predictor, directory: str | os.PathLike,
                 interval: float = 1.0):
        if not interval > 0:
            raise ValueError(f"the watch interval must be > 0 seconds, got {interval!r}")
        self.directory = os.fspath(directory)
        if not os.path.isdir(self.directory):
            raise ValueError(f"{self.directory}: the watched directory does not exist")
        self.predictor = predictor
        self.interval = interval
        self._refused: dict[str, str] = {}      # delta directory -> the error logged
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _candidates(self) -> dict[str, str]:
        """`{base version: delta directory}` of the deltas here now."""
        found: dict[str, str] = {}
        for name in sorted(os.listdir(self.directory)):
            if name.endswith((".tmp", ".old")):
                continue
            path = os.path.join(self.directory, name)
            try:
                with open(os.path.join(path, artifact.MANIFEST)) as f:
                    manifest = json.load(f)
            except (OSError, ValueError):      # not a delta, or not finished
                continue
            if isinstance(manifest, dict) and manifest.get("kind") == "delta" \
                    and isinstance(manifest.get("base"), str):
                found[manifest["base"]] = path
        return found

    def poll(self) -> list[str]:
        """Applies every delta that continues the served chain, in order.

        Returns:
            The versions applied, oldest first (empty when none was due).

        Example:

        ```python
        watcher.poll()      # ['3-…', '4-…']
        ```
        """
        applied: list[str] = []
        candidates = self._candidates()
        while (path := candidates.get(self.predictor.version)) is not None:
            try:
                applied.append(self.predictor.apply_delta(path))
            except artifact.DeltaError as error:
                if self._refused.get(path) != str(error):
                    self._refused[path] = str(error)
                    logger.error("delta refused, still serving %s: %s",
                                 self.predictor.version, error)
                break
            self._refused.pop(path, None)
            logger.info("applied delta %s from %s", applied[-1], path)
        return applied

    def start(self) -> None:
        """Polls every `interval` seconds in a daemon thread until `stop`."""
        def loop():
            while not self._stop.wait(self.interval):
                try:
                    self.poll()
                except Exception:         # the watcher outlives one bad poll
                    logger.exception("polling %s failed", self.directory)
        self._thread = threading.Thread(target=loop, name="reckeras-delta-watcher",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ends the polling thread (waits for a poll under way)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
