"""Gated linear units, the channel mixers of the linear LMs (``[..., D] -> [..., D]``).

- :class:`Sglu`, TNL's "simple GLU" (digest ``lightning-attention-tnl.md`` 2.3, Eq. 12/38;
  ``scaling-laws-linear-lms.md`` 1.2): ``W3((W1 x) * (W2 x))``, **no activation**, no biases.
- :class:`SwiGlu`, LLaMA's (``scaling-laws-linear-lms.md`` 1.1): ``W3(silu(W1 x) * (W2 x))``,
  no biases. It is also the "Swish" row of TNL's GLU-activation ablation (Table 8).

Both have ``3 D g`` parameters (``g = hidden_dim``). Kernels start ``N(0, 0.02^2)`` as in the
official TNL code (``init_std``; None = lecun normal) and are annotated ``("embed", "mlp")``
and ``("mlp", "embed")`` for logical sharding, like :class:`~lion_jax.layers.mlp.Mlp`.
:func:`glu_hidden_dim` gives the usual width ``256 * ceil(8D/3 / 256)`` (TNL-385M: 1024 ->
2816; TNL-1B: 2048 -> 5632; scaling-laws 1.6).
"""

import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp


def glu_hidden_dim(d_model: int, multiple_of: int = 256) -> int:
    """``multiple_of * ceil((8/3) d_model / multiple_of)``, the LLaMA/TNL GLU width."""
    if d_model <= 0 or multiple_of <= 0:
        raise ValueError(f"d_model and multiple_of must be positive, got {d_model}, {multiple_of}")
    return multiple_of * math.ceil(8 * d_model / 3 / multiple_of)


class _Glu(nn.Module):
    """``W3(act(W1 x) * (W2 x))`` without biases; subclasses fix ``act``."""

    hidden_dim: int
    init_std: float | None = 0.02
    dtype: Any = None
    param_dtype: Any = jnp.float32

    def __post_init__(self):
        if not isinstance(self.hidden_dim, int) or self.hidden_dim <= 0:
            raise ValueError(f"hidden_dim must be a positive int, got {self.hidden_dim!r}")
        if self.init_std is not None and not self.init_std > 0:
            raise ValueError(f"init_std must be positive or None, got {self.init_std!r}")
        super().__post_init__()

    def _activation(self) -> Callable[[jnp.ndarray], jnp.ndarray]:
        raise NotImplementedError

    def _dense(self, features, names, name):
        init = (nn.initializers.normal(self.init_std) if self.init_std is not None
                else nn.initializers.lecun_normal())
        return nn.Dense(features, use_bias=False, dtype=self.dtype, param_dtype=self.param_dtype,
                        kernel_init=nn.with_logical_partitioning(init, names), name=name)

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        """``x [..., D] -> [..., D]``."""
        features = x.shape[-1]
        h1 = self._dense(self.hidden_dim, ("embed", "mlp"), "w1")(x)
        h2 = self._dense(self.hidden_dim, ("embed", "mlp"), "w2")(x)
        return self._dense(features, ("mlp", "embed"), "w3")(self._activation()(h1) * h2)


class Sglu(_Glu):
    """TNL's simple GLU ``W3((W1 x) * (W2 x))``, ``[B, L, D] -> [B, L, D]``, no activation.

    Attributes:
      hidden_dim: ``g``, the width of ``W1 x`` and ``W2 x`` (e.g. :func:`glu_hidden_dim`).
      init_std: std of the Gaussian kernel init (None = lecun normal).
      dtype: compute dtype; param_dtype: parameter dtype.
    """

    def _activation(self):
        return lambda h: h


class SwiGlu(_Glu):
    """LLaMA's SwiGLU ``W3(silu(W1 x) * (W2 x))``, ``[B, L, D] -> [B, L, D]``.

    Attributes: as :class:`Sglu`.
    """

    def _activation(self):
        return jax.nn.silu
