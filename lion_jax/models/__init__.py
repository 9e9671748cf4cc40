"""Task models built from :mod:`lion_jax.layers`."""

from lion_jax.models.classifier import SequenceClassifier

__all__ = ["SequenceClassifier"]
