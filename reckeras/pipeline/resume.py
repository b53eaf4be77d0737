"""Where a resumed `fit` starts: `rk.Model.resume_at`'s position.

`rk.callbacks.BackupAndRestore` restores a backup in `on_train_begin` and
calls `resume_at(epoch, step, ...)`; the `fit` under way then starts at that
epoch, leaving out the batches of it already trained on. The position
records the global batch and the number of ranks of the run that reached it,
so that a `fit` whose steps would hold other examples refuses to resume
(`ResumePosition.start`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from reckeras import distributed


@dataclasses.dataclass(frozen=True)
class ResumePosition:
    """A position to resume training at, checked as it is made.

    Args:
        epoch: the epoch to start at (0-based).
        step: the batches of that epoch already trained on.
        global_batch_size: examples per step over all ranks in the run that
            reached it, or None (not checked).
        world_size: the number of ranks of that run, or None (not checked).

    Raises:
        ValueError: `epoch` or `step` is not an int >= 0, or
            `global_batch_size` / `world_size` not a positive int.

    Example:

    ```python
    position = ResumePosition(2, 150, global_batch_size=8192, world_size=2)
    epoch, skip = position.start(data, batch_size=4096, steps=400)
    ```
    """

    epoch: int
    step: int = 0
    global_batch_size: int | None = None
    world_size: int | None = None

    def __post_init__(self):
        for name, value, low in (("epoch", self.epoch, 0), ("step", self.step, 0),
                                 ("global_batch_size", self.global_batch_size, 1),
                                 ("world_size", self.world_size, 1)):
            if value is None and name in ("global_batch_size", "world_size"):
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"resume_at: {name} must be an int >= {low}, got {value!r}")

    def start(self, data: Any, batch_size: int, steps: int) -> tuple[int, int]:
        """Where a `fit` over `data` starts, checked against it.

        Args:
            data: the fit's data (`batches.as_data`).
            batch_size: the fit's examples per step on each rank.
            steps: the fit's steps per epoch.

        Returns:
            `(epoch, batches of it to leave out)`.

        Raises:
            ValueError: the fit's global batch differs, the position lies
                beyond its epochs, or the data cannot resume mid-epoch on
                another number of ranks.
        """
        epoch, step, global_batch = self.epoch, self.step, self.global_batch_size
        world = distributed.world()
        position = f"the position to resume at (epoch {epoch + 1}, after step {step})"
        if global_batch is not None and global_batch != batch_size * world.size:
            hint = f": pass batch_size={global_batch // world.size}" \
                if global_batch % world.size == 0 else \
                f", which {world.size} ranks cannot split evenly"
            raise ValueError(f"{position} was reached with {global_batch} examples per step "
                             f"over all ranks, this fit takes {batch_size} x {world.size} "
                             f"rank(s) = {batch_size * world.size}: its steps hold other "
                             f"examples{hint}")
        if step > steps:
            raise ValueError(f"{position} lies beyond this fit's epochs of {steps} steps: "
                             f"the data is not the one that was trained on")
        if step and self.world_size not in (None, world.size) and \
                not getattr(data, "global_batches_independent_of_shards", False):
            raise ValueError(
                f"{position} was reached on {self.world_size} rank(s); this data gives "
                f"each rank a contiguous range of rows, so the examples of the first {step} "
                f"steps on {self.world_size} rank(s) are not those on {world.size}: resume "
                f"on {self.world_size} rank(s), or back up at epoch ends "
                f"(save_freq='epoch'), which resume on any number of ranks")
        return epoch, step
