"""The packed sparse batch: one ids buffer plus offsets for all features.

A batch of `B` examples over `S` sparse features (slots) is

* `ids`: int64 `[N]`, every id of every bag, bag after bag;
* `offsets`: int64 `[S * B + 1]`, bag `s * B + b` (slot `s`, example
  `b`) holds `ids[offsets[s * B + b]:offsets[s * B + b + 1]]`.

Slot-major order keeps each feature's ids contiguous, which is what per-slot
parameters (tables, combiners) index by. This module is the only piece of
reckeras that `backend_kernels` may import.
"""

import torch


def lengths_to_offsets(lengths: torch.Tensor) -> torch.Tensor:
    """The offsets of bags of the given lengths.

    Args:
        lengths: int `[n]`, the length of every bag.

    Returns:
        int64 `[n + 1]` offsets, starting at 0: bag `i` is
        `offsets[i]:offsets[i + 1]`.

    Example:

    ```python
    from reckeras.ragged import lengths_to_offsets

    lengths_to_offsets(torch.tensor([2, 0, 3]))   # tensor([0, 2, 2, 5])
    ```
    """
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
    torch.cumsum(lengths, dim=0, out=offsets[1:])
    return offsets


def batch_size(offsets: torch.Tensor, num_slots: int) -> int:
    """The number of examples in a packed batch.

    Args:
        offsets: int64 `[S * B + 1]` offsets of the packed batch.
        num_slots: the number of slots `S`.

    Returns:
        `B`.

    Example:

    ```python
    from reckeras.ragged import batch_size

    batch_size(torch.tensor([0, 1, 2, 4, 5]), num_slots=2)   # 2
    ```
    """
    return (offsets.numel() - 1) // num_slots
