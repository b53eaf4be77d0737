"""The embedding engine: dynamic hash tables, packing, sharding, communication,
sparse optimizers' state, row lifecycle and checkpoints."""

from reckeras.embedding.cache import CacheBudgetError
from reckeras.embedding.options import TableOptions

__all__ = ["CacheBudgetError", "TableOptions"]
