"""Normalisation layers by name, with logical-axis annotations for sharding.

Flax's ``LayerNorm`` and ``RMSNorm`` are used as they are; this module only picks one by name
and annotates its parameters (``("embed",)``) so that ``nn.get_partition_spec`` covers them.
"""

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

NORMS = ("layernorm", "rmsnorm")


def check_norm(kind: str) -> None:
    """Raises ``ValueError`` unless ``kind`` is one of :data:`NORMS`."""
    if kind not in NORMS:
        raise ValueError(f"unknown norm {kind!r}; valid names: {list(NORMS)}")


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
