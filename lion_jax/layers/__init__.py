"""Flax linen layers: token mixers (LION, softmax, LightNet), the residual block, MLPs, norms,
feature maps."""

from lion_jax.layers.block import MIXERS, ResidualBlock, make_mixer
from lion_jax.layers.feature_maps import get_feature_map
from lion_jax.layers.lightnet import LightNetAttention
from lion_jax.layers.lion import LionAttention
from lion_jax.layers.mlp import Mlp
from lion_jax.layers.softmax import SoftmaxAttention

__all__ = ["MIXERS", "LightNetAttention", "LionAttention", "Mlp", "ResidualBlock",
           "SoftmaxAttention", "get_feature_map", "make_mixer"]
