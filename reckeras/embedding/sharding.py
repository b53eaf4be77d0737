"""Which rank owns a key: `mix64(key ^ OWNER_SALT) mod world_size`.

The salt keeps ownership independent of the bits the hash index uses to place
a key in its slots, so each rank's index stays evenly loaded. The owner of a
key depends only on the key and the world size, which is what lets a
checkpoint saved on N ranks be re-sharded onto M.
"""

import torch

from reckeras.backend_kernels.hashing import mix64

OWNER_SALT = 0x5DEECE66D


def owner_of(keys: torch.Tensor, world: int) -> torch.Tensor:
    """The owning rank of every key.

    Args:
        keys: int64 table keys.
        world: the number of ranks.

    Returns:
        int64 ranks in `[0, world)`, one per key.
    """
    if world == 1:
        return torch.zeros_like(keys)
    return torch.remainder(mix64(keys ^ OWNER_SALT), world)


def imbalance(counts: list | torch.Tensor) -> float:
    """`max / mean` of per-rank counts (1.0 is perfectly even).

    Args:
        counts: one count per rank.

    Returns:
        The ratio; 1.0 when every count is 0.
    """
    counts = torch.as_tensor(counts, dtype=torch.float64)
    mean = counts.mean()
    return float(counts.max() / mean) if mean > 0 else 1.0
