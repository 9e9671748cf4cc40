"""Flax linen layers: token mixers (LION, softmax, LightNet), the residual block, MLPs, norms,
feature maps, multi-dimensional positional encodings (MD-TPE, MD-LRPE)."""

from lion_jax.layers.block import MIXERS, ResidualBlock, make_mixer
from lion_jax.layers.feature_maps import get_feature_map
from lion_jax.layers.lightnet import LightNetAttention
from lion_jax.layers.lion import LionAttention
from lion_jax.layers.md_pe import MdLrpe, MdTpe, md_lrpe
from lion_jax.layers.mlp import Mlp
from lion_jax.layers.softmax import SoftmaxAttention

__all__ = ["MIXERS", "LightNetAttention", "LionAttention", "MdLrpe", "MdTpe", "Mlp",
           "ResidualBlock", "SoftmaxAttention", "get_feature_map", "make_mixer", "md_lrpe"]
