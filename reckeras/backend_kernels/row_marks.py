"""Change tracking of a training lookup's rows: written in this generation,
seen in one more step.

Every training lookup marks the rows it resolved: `written_at[row] =
generation` (what delta checkpoints save) and `seen_steps[row] += 1` once
per step, however often the row occurs in the batch (what
`export_serving(min_count=...)` filters on). The rows are not deduplicated
at that point: a `wide` step marks 614k rows, 180k of them distinct, spread
over a table of 3M.

* torch reference (CUDA tensors, and CPU without the native kernels): an
  `index_fill_` and a gather-then-scatter increment (the gather reads every
  count before any is written, so a repeated row counts once).
* native CPU kernel (`cpu_native.mark_written`): both marks in one parallel
  pass that flags each counted row, and a second that clears the flags.

Both keep the tables' layout: arrays of `capacity + 1` entries whose last
entry takes row -1 (an id without a row).
"""

import torch

from reckeras.backend_kernels.dispatch import use_native

INT32_MAX = 2**31 - 1


def mark_written(written_at: torch.Tensor, seen_steps: torch.Tensor, rows: torch.Tensor,
                 generation: int) -> None:
    """Marks `rows` written in `generation` and seen in one more step, in place.

    Args:
        written_at: int32 `[length]`, each row's generation; the last entry
            counts row -1.
        seen_steps: int32 `[length]`, each row's step count (saturating at
            2^31 - 1), laid out alike.
        rows: int64 `[n]` rows in `[-1, length - 1)`, repeats allowed.
        generation: the generation to write.

    Example:

    ```python
    written, seen = torch.zeros(4, dtype=torch.int32), torch.zeros(4, dtype=torch.int32)
    mark_written(written, seen, torch.tensor([2, 0, 2]), 5)
    written, seen   # (tensor([5, 0, 5, 0]), tensor([1, 0, 1, 0]))
    ```
    """
    if use_native(rows) and written_at.is_cpu and seen_steps.is_cpu:
        from reckeras.backend_kernels import cpu_native
        cpu_native.mark_written(written_at, seen_steps, rows, generation)
    else:
        mark_written_reference(written_at, seen_steps, rows, generation)


def mark_written_reference(written_at: torch.Tensor, seen_steps: torch.Tensor,
                           rows: torch.Tensor, generation: int) -> None:
    """`mark_written` in torch ops (the semantics).

    Args:
        written_at: as for `mark_written`.
        seen_steps: as for `mark_written`.
        rows: as for `mark_written`.
        generation: as for `mark_written`.

    Example:

    ```python
    mark_written_reference(written, seen, torch.tensor([1, -1]), 2)
    ```
    """
    written_at.index_fill_(0, rows, generation)       # -1 wraps to the last entry
    seen_steps[rows] = seen_steps[rows].clamp_max(INT32_MAX - 1) + 1
