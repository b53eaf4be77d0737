"""The embedding engine: dynamic hash tables, packing, sharding, communication,
sparse optimizers' state, row lifecycle, and the table states that
checkpoints, `model.save` and the serving export read."""

from reckeras.embedding.cache import CacheBudgetError
from reckeras.embedding.options import TableOptions
from reckeras.embedding.table_state import TableLayout, TableState

__all__ = ["CacheBudgetError", "TableLayout", "TableOptions", "TableState"]
