"""The embedding engine: dynamic hash tables, packing, sharding, communication,
sparse optimizers' state, row lifecycle and checkpoints."""

from reckeras.embedding.cache import CacheBudgetError
from reckeras.embedding.checkpoint import CheckpointError
from reckeras.embedding.options import TableOptions

__all__ = ["CacheBudgetError", "CheckpointError", "TableOptions"]
