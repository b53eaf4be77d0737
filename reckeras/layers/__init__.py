"""Keras layers of reckeras."""

from reckeras.layers.feature_columns import FeatureColumns
from reckeras.layers.sharded_embedding import ShardedEmbedding

__all__ = ["FeatureColumns", "ShardedEmbedding"]
