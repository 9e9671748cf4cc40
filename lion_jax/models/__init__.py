"""Task models built from :mod:`lion_jax.layers`."""

from lion_jax.models.bert import (BertEncoder, BertForMaskedLM, BertForSequenceClassification,
                                  bert_size)
from lion_jax.models.classifier import DualEncoderClassifier, SequenceClassifier
from lion_jax.models.lm import CausalLM, lm_size
from lion_jax.models.vit import VisionTransformer

__all__ = ["BertEncoder", "BertForMaskedLM", "BertForSequenceClassification", "CausalLM",
           "DualEncoderClassifier", "SequenceClassifier", "VisionTransformer", "bert_size",
           "lm_size"]
