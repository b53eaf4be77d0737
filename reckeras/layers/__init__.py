"""Keras layers of reckeras."""

from reckeras.layers.attention import TargetAttention
from reckeras.layers.crossnet import CrossNet
from reckeras.layers.feature_columns import FeatureColumns
from reckeras.layers.fm import FM
from reckeras.layers.interactions import DotInteraction
from reckeras.layers.mlp import MLP
from reckeras.layers.sharded_embedding import ShardedEmbedding
from reckeras.layers.transformer import TransformerBlock

__all__ = [
           "FM",
           "MLP",
           "CrossNet",
           "DotInteraction",
           "FeatureColumns",
           "ShardedEmbedding",
           "TargetAttention",
           "TransformerBlock",
]
