"""LLaMA's token mixer: causal multi-head softmax attention with rotary positions (RoPE), and a
KV cache for generation (scaling-laws paper Sec. 1.1 of the digest: the LLaMA baseline).

Shapes: ``x [B, L, D]``; heads ``H`` of width ``K`` (``D = H * K`` in the paper's sizes, head
width 128). Projections have no biases (LLaMA). RoPE rotates the two halves of each query and
key head ("rotate half": feature ``j`` pairs with ``j + K/2``, frequency
``base ** (-2 j / K)``), in float32, at positions ``offset + arange(L)``; the scores are scaled
by ``1 / sqrt(K)``.

Decoding state (the interface every causal LM mixer of :mod:`lion_jax.models.lm` shares:
``__call__(x, *, state=None, offset=0, return_state=False)``): a KV cache
``{"k": [B, C, H, K], "v": [B, C, H, K]}`` of capacity ``C = max_len`` in the compute dtype,
holding the rotated keys and the values of positions ``0 .. offset + L - 1`` (the rest zeros,
masked). A call with ``state`` writes its keys and values at ``offset`` and attends to the
cache with the causal mask ``j <= offset + i`` (XLA); without ``state`` it attends within
``x`` causally (``layers.softmax.attend``: cuDNN's flash attention on a GPU for 16-bit inputs)
and, with ``return_state``, returns a cache holding ``x``'s keys and values at ``offset``.
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from lion_jax.layers.rotary import rope
from lion_jax.layers.softmax import attend


class LlamaAttention(nn.Module):
    """Causal softmax attention with RoPE ``[B, L, D] -> [B, L, D]`` (module docstring).

    Attributes:
      num_heads: ``H``. head_dim: ``K`` (even).
      max_len: the KV cache's capacity ``C`` (the model's context): a call may not reach past
        it.
      rope_base: RoPE's frequency base.
      impl: ``"auto"``, ``"xla"`` or ``"cudnn"`` for the cache-free forward
        (``SoftmaxAttention``'s choices); calls with a cache use XLA.
      dtype, param_dtype: compute and parameter dtypes.
    """

    num_heads: int
    head_dim: int
    max_len: int = 2048
    rope_base: float = 10000.0
    impl: str = "auto"
    dtype: Any = None
    param_dtype: Any = jnp.float32

    def __post_init__(self):
        if self.head_dim % 2:
            raise ValueError(f"LlamaAttention: head_dim must be even for RoPE; got "
                             f"{self.head_dim}")
        for name in ("num_heads", "head_dim", "max_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"LlamaAttention: {name} must be positive; got "
                                 f"{getattr(self, name)}")
        super().__post_init__()

    def _dense(self, features, names, name):
        return nn.DenseGeneral(features, use_bias=False, dtype=self.dtype,
                               param_dtype=self.param_dtype, name=name,
                               kernel_init=nn.with_logical_partitioning(
                                   nn.initializers.lecun_normal(), names))

    @nn.compact
    def __call__(self, x, *, state=None, offset=0, return_state=False):
        """``x [B, L, D]``; ``state`` None or a KV cache; ``offset`` the position of ``x[:, 0]``
        -> ``y [B, L, D]``, or ``(y, cache)`` with ``return_state``."""
        B, L, D = x.shape
        H, K = self.num_heads, self.head_dim
        q, k, v = (self._dense(H * K, ("embed", "heads"), name)(x).reshape(B, L, H, K)
                   for name in ("query", "key", "value"))
        positions = offset + jnp.arange(L)
        q, k = rope(q, positions, base=self.rope_base), rope(k, positions, base=self.rope_base)
        if (return_state or state is not None) and isinstance(offset, int) \
                and offset + L > self.max_len:
            raise ValueError(f"LlamaAttention: positions {offset}..{offset + L - 1} pass the KV "
                             f"cache's capacity max_len={self.max_len}")
        if state is None:  # attention within x; the cache (if asked for) holds x's keys
            y = attend(q, k, v, causal=True, impl=self.impl)
            if return_state:
                pad = ((0, 0), (offset, self.max_len - offset - L), (0, 0), (0, 0))
                state = {"k": jnp.pad(k, pad), "v": jnp.pad(v, pad)}
        else:
            start = (0, offset, 0, 0)
            state = {name: jax.lax.dynamic_update_slice(state[name], new.astype(
                state[name].dtype), start) for name, new in (("k", k), ("v", v))}
            visible = jnp.arange(self.max_len)[None, :] <= positions[:, None]  # [L, C]
            y = jax.nn.dot_product_attention(q, state["k"].astype(q.dtype),
                                             state["v"].astype(q.dtype),
                                             mask=visible[None, None], implementation="xla")
        y = self._dense(D, ("heads", "embed"), "out")(y.reshape(B, L, H * K))
        return (y, state) if return_state else y
