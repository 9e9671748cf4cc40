"""The position-wise feed-forward block."""

from typing import Any

import flax.linen as nn
import jax.numpy as jnp


class Mlp(nn.Module):
    """``Dense(D -> mlp_dim) -> gelu -> Dropout -> Dense(mlp_dim -> D)``, ``[..., D] -> [..., D]``.

    Kernels are annotated ``("embed", "mlp")`` and ``("mlp", "embed")`` for logical sharding.

    Attributes:
      mlp_dim: hidden width.
      dropout: dropout rate after the activation (uses the ``'dropout'`` rng when active).
      dtype: compute dtype; param_dtype: parameter dtype.
    """

    mlp_dim: int
    dropout: float = 0.0
    dtype: Any = None
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jnp.ndarray, *, deterministic: bool = True) -> jnp.ndarray:
        features = x.shape[-1]
        init = nn.initializers.lecun_normal()
        h = nn.Dense(self.mlp_dim, dtype=self.dtype, param_dtype=self.param_dtype,
                     kernel_init=nn.with_logical_partitioning(init, ("embed", "mlp")),
                     bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("mlp",)),
                     name="fc1")(x)
        h = nn.gelu(h)
        h = nn.Dropout(self.dropout)(h, deterministic=deterministic)
        return nn.Dense(features, dtype=self.dtype, param_dtype=self.param_dtype,
                        kernel_init=nn.with_logical_partitioning(init, ("mlp", "embed")),
                        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
                        name="fc2")(h)
