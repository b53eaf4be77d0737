"""Time windows: a dataset's units grouped by partition value, in order.

`Dataset.windows(by)` cuts a dataset read with hive partitions
(`logs/dt=.../hour=.../*.parquet`) into one dataset per value of the
partition keys `by`, ordered by that value. Each window reads through a
`WindowSource`: the parent source restricted to the units (row groups, or
whole ORC/CSV files) of that value, so reading, shuffling and sharding a
window is what they are for any dataset.

A source supports windows when it has `partition_keys` (the partition
columns, in schema order), `unit_file(unit)`, `unit_partition(unit)` (the
unit's `{key: value}`) and `unit_description(unit)` (its footer's
description, or {}).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa


class WindowSource:
    """A dataset source restricted to some of its units, in their order.

    Args:
        parent: the source of the whole dataset (its `unit_rows()` already
            counted, so that its unit indices are final).
        units: the parent's unit indices this window reads, in storage
            order.

    Example:

    ```python
    from reckeras.datasets._windows import WindowSource

    day = WindowSource(source, [0, 1, 2])   # the first three row groups
    day.unit_rows()                          # [65536, 65536, 1000]
    ```
    """

    def __init__(self, parent: Any, units: Sequence[int]):
        self._parent = parent
        self._units = list(units)
        self.files = list(dict.fromkeys(parent.unit_file(u) for u in self._units))
        self.partition_keys = parent.partition_keys

    @property
    def schema(self) -> pa.Schema:
        """The parent's schema."""
        return self._parent.schema

    @property
    def bad_files(self) -> Any:
        """The parent's `BadFiles` (one policy and record for all windows)."""
        return self._parent.bad_files

    def unit_rows(self) -> list[int]:
        """Rows per unit of this window, in storage order.

        Returns:
            The parent's counts of this window's units.
        """
        rows = self._parent.unit_rows()
        return [rows[unit] for unit in self._units]

    def read_unit(self, unit: int, start: int, stop: int,
                  columns: list[str] | None) -> Iterator[pa.Table]:
        """Rows [start, stop) of this window's `unit`-th unit.

        Args:
            unit: the unit's index within the window.
            start: its first row wanted.
            stop: one past its last row wanted.
            columns: the columns to read; all when None.

        Returns:
            The parent's iterator of tables.
        """
        return self._parent.read_unit(self._units[unit], start, stop, columns)

    def unit_file(self, unit: int) -> str:
        """The file of this window's `unit`-th unit.

        Args:
            unit: the unit's index within the window.

        Returns:
            Its path.
        """
        return self._parent.unit_file(self._units[unit])

    def unit_partition(self, unit: int) -> dict[str, Any]:
        """The partition values of this window's `unit`-th unit.

        Args:
            unit: the unit's index within the window.

        Returns:
            `{key: value}`.
        """
        return self._parent.unit_partition(self._units[unit])

    def unit_description(self, unit: int) -> dict[str, Any]:
        """The footer description of this window's `unit`-th unit.

        Args:
            unit: the unit's index within the window.

        Returns:
            The description, or {}.
        """
        return self._parent.unit_description(self._units[unit])


def window_units(source: Any, by: list[str],
                 name: str) -> list[tuple[dict[str, Any], list[int]]]:
    """A source's units grouped by the values of the keys `by`, in order.

    Args:
        source: a source that supports windows (see the module docstring).
        by: partition keys, most significant first.
        name: the dataset's name, for messages.

    Returns:
        `[(partition, units)]`: `partition` is `{key: value}` over `by`,
        ascending by the tuple of values (strings lexicographically, numbers
        numerically); `units` are the unit indices of that value, in storage
        order. A window has at least one unit.

    Raises:
        ValueError: when the source has no partition columns, a key of `by`
            is not one of them (listing those there are), `by` is empty or
            repeats a key, or a file has no (or a null) value of a key
            (naming it).

    Example:

    ```python
    from reckeras.datasets._windows import window_units

    window_units(source, ["dt"], "logs")
    # [({"dt": "2026-12-01"}, [0, 1]), ({"dt": "2026-12-02"}, [2, 3])]
    ```
    """
    keys = list(getattr(source, "partition_keys", ()))
    if not keys:
        raise ValueError(
            f"{name}: windows need partition columns (key=value directories "
            f"read with partitioning='hive' by from_parquet, from_orc or "
            f"from_csv), and this dataset has none")
    if not by or len(set(by)) != len(by):
        raise ValueError(f"{name}: windows need one or more distinct partition "
                         f"keys, got by={by!r}")
    unknown = [key for key in by if key not in keys]
    if unknown:
        raise ValueError(f"{name}: {unknown[0]!r} is not a partition column; the "
                         f"partition columns are {keys}")
    groups: dict[tuple, list[int]] = {}
    for unit in range(len(source.unit_rows())):
        values = source.unit_partition(unit)
        missing = [key for key in by if values.get(key) is None]
        if missing:
            raise ValueError(
                f"{name}: {source.unit_file(unit)} has no value of partition key "
                f"{missing[0]!r} (no {missing[0]}=... directory above it, or a "
                f"null one), so it belongs to no window")
        groups.setdefault(tuple(values[key] for key in by), []).append(unit)
    return [(dict(zip(by, value, strict=True)), groups[value]) for value in sorted(groups)]
