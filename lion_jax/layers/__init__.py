"""Flax linen layers: LION token mixers, MLPs, norms and feature maps."""

from lion_jax.layers.feature_maps import get_feature_map
from lion_jax.layers.lion import LionAttention, LionBlock
from lion_jax.layers.mlp import Mlp

__all__ = ["LionAttention", "LionBlock", "Mlp", "get_feature_map"]
