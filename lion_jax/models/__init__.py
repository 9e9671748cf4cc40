"""Task models built from :mod:`lion_jax.layers`."""

from lion_jax.models.classifier import DualEncoderClassifier, SequenceClassifier
from lion_jax.models.vit import VisionTransformer

__all__ = ["DualEncoderClassifier", "SequenceClassifier", "VisionTransformer"]
