"""The packed sparse batch: one ids buffer plus offsets for all features.

A batch of ``B`` examples over ``S`` sparse features (slots) is

* ``ids``: int64 ``[N]``, every id of every bag, bag after bag;
* ``offsets``: int64 ``[S * B + 1]``, bag ``s * B + b`` (slot ``s``, example
  ``b``) holds ``ids[offsets[s * B + b]:offsets[s * B + b + 1]]``.

Slot-major order keeps each feature's ids contiguous, which is what per-slot
parameters (tables, combiners) index by. This module is the only piece of
reckeras that ``backend_kernels`` may import.
"""

import torch


def lengths_to_offsets(lengths: torch.Tensor) -> torch.Tensor:
    """``[n]`` bag lengths -> ``[n + 1]`` offsets starting at 0."""
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
    torch.cumsum(lengths, dim=0, out=offsets[1:])
    return offsets


def bag_of_ids(offsets: torch.Tensor, num_ids: int) -> torch.Tensor:
    """The bag index of every id: ``[N]`` int64."""
    lengths = offsets[1:] - offsets[:-1]
    bags = torch.arange(lengths.numel(), device=offsets.device)
    return torch.repeat_interleave(bags, lengths, output_size=num_ids)


def batch_size(offsets: torch.Tensor, num_slots: int) -> int:
    """Examples in a packed batch of ``num_slots`` slots."""
    return (offsets.numel() - 1) // num_slots
