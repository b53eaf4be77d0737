"""The next index of a large CPU table, built on a thread while steps go on.

A table's `key_index.HashIndex` that nears its load limit starts an
`IndexBuild` of twice the size (see `HashIndex.reserve`) and installs
it when the limit comes, so the step that crosses it takes only the keys of
the last few milliseconds instead of rehashing every key.
"""

from __future__ import annotations

import atexit
import threading
import weakref

import torch

from reckeras.backend_kernels import hash_table

# How often the build takes the keys created meanwhile.
CATCH_UP_S = 0.05


class IndexBuild:
    """The next, twice as large index of a table, built on a thread.

    It first takes the keys of rows `[0, rows)` (those that exist when it
    starts; the table keeps growing its current index meanwhile, see
    `hash_table.rehash`'s `rows_below`), then, every `CATCH_UP_S`, the keys
    created since, read from the table's keys array, until the table installs
    it: the step that does is left the keys of the last interval only. The
    native passes and the fill of the fresh arrays run outside the GIL.

    Args:
        slot_keys: the current index's keys.
        slot_rows: its rows.
        capacity: the new index's slots.
        rows: the table's row count now.
        table: a weak reference to the table: a table dropped with a build
            under way ends it (the thread holds no reference that would keep
            the table, and itself, alive).
        name: the table's name (names the thread).
    """

    def __init__(self, slot_keys: torch.Tensor, slot_rows: torch.Tensor, capacity: int,
                 rows: int, table: weakref.ref, name: str):
        self.rows = rows
        self._outcome: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._install = threading.Event()
        self._thread = threading.Thread(
            target=self._build, args=(slot_keys, slot_rows, capacity, table),
            name=f"reckeras-index-{name}", daemon=True)
        _UNDER_WAY.add(self)
        self._thread.start()

    def _build(self, slot_keys, slot_rows, capacity, table):
        try:
            index = hash_table.rehash(slot_keys, slot_rows, capacity, rows_below=self.rows)
            del slot_keys, slot_rows          # the old index: freed with the table's
            while True:
                held = table()
                if held is None:
                    return
                # The count first: every key below it is in the array read after.
                count, keys = held.num_rows, held.keys
                del held
                if count > self.rows:
                    # Distinct and absent: numbered in row order, each gets its own row.
                    hash_table.find_or_insert(*index, keys[self.rows:count], self.rows)
                    self.rows = count
                del keys
                if self._install.wait(CATCH_UP_S):
                    break
            self._outcome["index"] = index
        except (RuntimeError, MemoryError):
            # Out of memory: the table rehashes in the step instead, where
            # the same failure raises and names the table.
            pass

    def result(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Ends the build (after a last catch-up) and waits for it.

        Returns:
            The new `(slot_keys, slot_rows)`, holding the keys of rows
            `[0, self.rows)`, or None when the build failed (the table then
            rehashes in the step).
        """
        self._install.set()
        self._thread.join()
        return self._outcome.get("index")


# The builds whose threads run (a thread holds its build). At exit each is
# ended and waited for before the interpreter finalizes: a daemon thread left
# inside a parallel torch op then (the rehash's fills) aborts the process
# ("terminate called without an active exception", exit code 134) after a
# training script has finished.
_UNDER_WAY: weakref.WeakSet[IndexBuild] = weakref.WeakSet()


@atexit.register
def _end_builds_under_way() -> None:
    for build in list(_UNDER_WAY):
        build.result()


