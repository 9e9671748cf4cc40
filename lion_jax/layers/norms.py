"""Normalisation layers by name, with logical-axis annotations for sharding.

Flax's ``LayerNorm`` and ``RMSNorm`` are used as they are; this module only picks one by name
and annotates its parameters (``("embed",)``) so that ``nn.get_partition_spec`` covers them.
:class:`SequenceBatchNorm` is S5's BatchNorm for the LRA classifier: it keeps running
statistics in the ``batch_stats`` collection, which the trainer carries as model state.
"""

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

NORMS = ("layernorm", "rmsnorm")


# The norms of models whose blocks get the padding mask and the train flag (the LRA classifier)
SEQUENCE_NORMS = (*NORMS, "batchnorm")


def check_norm(kind: str, valid: tuple[str, ...] = NORMS) -> None:
    """Raises ``ValueError`` unless ``kind`` is one of ``valid`` (:data:`NORMS`, or
    :data:`SEQUENCE_NORMS` where :func:`sequence_norm` applies it)."""
    if kind not in valid:
        raise ValueError(f"unknown norm {kind!r}; valid names: {list(valid)}")


def make_norm(kind: str, *, dtype: Any = None, param_dtype: Any = jnp.float32,
              epsilon: float = 1e-6, name: str | None = None) -> nn.Module:
    """A norm over the last axis (``[..., D] -> [..., D]``): ``"layernorm"`` or ``"rmsnorm"``."""
    check_norm(kind)
    scale_init = nn.with_logical_partitioning(nn.initializers.ones, ("embed",))
    if kind == "rmsnorm":
        return nn.RMSNorm(epsilon=epsilon, dtype=dtype, param_dtype=param_dtype,
                          scale_init=scale_init, name=name)
    bias_init = nn.with_logical_partitioning(nn.initializers.zeros, ("embed",))
    return nn.LayerNorm(epsilon=epsilon, dtype=dtype, param_dtype=param_dtype,
                        scale_init=scale_init, bias_init=bias_init, name=name)


class SequenceBatchNorm(nn.Module):
    """BatchNorm of ``[B, L, D]`` per feature over the batch and the sequence, as S5's LRA
    layers use it (Smith et al. 2023, ``batchnorm=True``; the LION paper's LRA runs take S5's
    settings, App. D.2).

    In training (``deterministic=False``) it normalises by the mean and variance of the batch's
    real tokens (``mask [B, L]``, True = real; None: all) and moves the running averages in the
    ``batch_stats`` collection towards them, ``avg = momentum * avg + (1 - momentum) * batch``
    (the caller applies with ``mutable=["batch_stats"]``); in evaluation it normalises by the
    running averages, so an example's output does not depend on its batch. Statistics in
    float32; the learned scale and offset are ``("embed",)`` parameters.
    """

    momentum: float = 0.9
    epsilon: float = 1e-5
    dtype: Any = None
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jnp.ndarray, mask: jnp.ndarray | None = None, *,
                 deterministic: bool) -> jnp.ndarray:
        bn = nn.BatchNorm(
            use_running_average=deterministic, momentum=self.momentum, epsilon=self.epsilon,
            dtype=jnp.float32, param_dtype=self.param_dtype,
            scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
            name="bn")
        return bn(x.astype(jnp.float32), mask=None if mask is None else mask[..., None]).astype(
            self.dtype or x.dtype)


def sequence_norm(kind: str, x: jnp.ndarray, mask: jnp.ndarray | None, *, deterministic: bool,
                  bn_momentum: float = 0.9, dtype: Any = None,
                  param_dtype: Any = jnp.float32, name: str) -> jnp.ndarray:
    """``kind``'s norm of ``x [B, L, D]``, called from a compact module: ``"batchnorm"``
    (:class:`SequenceBatchNorm`, which needs ``mask`` and ``deterministic``) or one of
    :data:`NORMS` (:func:`make_norm`, per token)."""
    if kind == "batchnorm":
        return SequenceBatchNorm(momentum=bn_momentum, dtype=dtype, param_dtype=param_dtype,
                                 name=name)(x, mask, deterministic=deterministic)
    return make_norm(kind, dtype=dtype, param_dtype=param_dtype, name=name)(x)
