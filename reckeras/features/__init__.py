"""Declarative feature specs and the transform plan compiled from them."""

from reckeras.features.encode import FeatureInputError
from reckeras.features.plan import TablePlanError
from reckeras.features.specs import LENGTHS, Categorical, Cross, Numeric, Sequence

__all__ = ["LENGTHS", "Categorical", "Cross", "FeatureInputError", "Numeric", "Sequence",
           "TablePlanError"]
