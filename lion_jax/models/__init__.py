"""Task models built from :mod:`lion_jax.layers`."""

from lion_jax.models.classifier import DualEncoderClassifier, SequenceClassifier

__all__ = ["DualEncoderClassifier", "SequenceClassifier"]
