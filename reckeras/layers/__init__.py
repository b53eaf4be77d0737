"""Keras layers of reckeras."""

from reckeras.layers.feature_columns import FeatureColumns
from reckeras.layers.interactions import DotInteraction
from reckeras.layers.mlp import MLP
from reckeras.layers.sharded_embedding import ShardedEmbedding

__all__ = ["DotInteraction", "FeatureColumns", "MLP", "ShardedEmbedding"]
