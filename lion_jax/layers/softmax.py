"""Softmax attention token mixer (the Transformer baseline), on ``jax.nn.dot_product_attention``."""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

IMPLS = ("auto", "xla", "cudnn")


class SoftmaxAttention(nn.Module):
    """Multi-head softmax attention ``[B, L, D] -> [B, L, D]``.

    ``softmax(q k^T / sqrt(K)) v`` per head through ``jax.nn.dot_product_attention``, then
    ``Dense(H*V -> D)``. Same call signature as :class:`~lion_jax.layers.LionAttention`, so the
    residual block takes either.

    Padding: ``mask [B, L]`` (True = real token) must be a prefix per row (the classifiers pad
    at the end); it becomes ``key_value_seq_lengths``, which cuDNN's kernel takes. Outputs at
    padded positions are meaningless.

    Attributes:
      num_heads: ``H``. head_dim: ``K``, the query, key and value width per head.
      causal: causal mask.
      impl: ``"xla"`` or ``"cudnn"`` (``jax.nn.dot_product_attention``'s ``implementation``;
        its own default, None, is XLA in jax 0.11), or ``"auto"``: cuDNN's flash attention on
        a GPU for 16-bit inputs with a head dim that is a multiple of 8 up to 128 (what its
        kernel takes), XLA otherwise.
      dtype, param_dtype: compute and parameter dtypes.
    """

    num_heads: int
    head_dim: int
    causal: bool = False
    impl: str = "auto"
    dtype: Any = None
    param_dtype: Any = jnp.float32

    def __post_init__(self):
        if self.impl not in IMPLS:
            raise ValueError(f"unknown impl {self.impl!r} for softmax attention; valid: "
                             f"{list(IMPLS)}")
        for name in ("num_heads", "head_dim"):
            value = getattr(self, name)
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        super().__post_init__()

    def _dense(self, features, names, name):
        return nn.Dense(features, dtype=self.dtype, param_dtype=self.param_dtype,
                        kernel_init=nn.with_logical_partitioning(
                            nn.initializers.lecun_normal(), names),
                        bias_init=nn.with_logical_partitioning(nn.initializers.zeros,
                                                               (names[1],)),
                        name=name)

    @nn.compact
    def __call__(self, x: jnp.ndarray, mask: jnp.ndarray | None = None) -> jnp.ndarray:
        """``x [B, L, D]``, ``mask [B, L]`` bool (True = real token, a prefix) -> ``[B, L, D]``."""
        B, L, D = x.shape
        H, K = self.num_heads, self.head_dim
        q, k, v = (self._dense(H * K, ("embed", "heads"), name)(x).reshape(B, L, H, K)
                   for name in ("query", "key", "value"))
        lengths = None if mask is None else jnp.sum(mask, axis=1, dtype=jnp.int32)
        y = attend(q, k, v, causal=self.causal, impl=self.impl, lengths=lengths)
        return self._dense(D, ("heads", "embed"), "out")(y.reshape(B, L, H * K))


def implementation(impl, q):
    """The ``implementation`` for ``jax.nn.dot_product_attention`` of ``impl`` ("auto":
    cuDNN on a GPU for 16-bit ``q`` with a head dim that is a multiple of 8 up to 128)."""
    if impl != "auto":
        return impl
    cudnn_ok = (jax.default_backend() == "gpu" and q.dtype in (jnp.bfloat16, jnp.float16)
                and q.shape[-1] % 8 == 0 and q.shape[-1] <= 128)
    return "cudnn" if cudnn_ok else "xla"


def attend(q, k, v, *, causal, impl, lengths=None):
    """Softmax attention of ``q, k, v [B, L, H, K]`` -> ``[B, L, H, K]`` through
    ``jax.nn.dot_product_attention`` (``impl`` as :func:`implementation`; ``lengths [B]`` the
    real tokens of each row, a prefix, or None). An odd L on cuDNN runs with one padded,
    masked token (:func:`padded_to_even`)."""
    L = q.shape[1]
    how = implementation(impl, q)
    if how == "cudnn" and L % 2:
        q, k, v, lengths = padded_to_even(q, k, v, lengths)
    return jax.nn.dot_product_attention(
        q, k, v, is_causal=causal, query_seq_lengths=lengths, key_value_seq_lengths=lengths,
        implementation=how)[:, :L]


def padded_to_even(q, k, v, lengths):
    """``q, k, v [B, L, H, K]`` with one zero token appended and the sequence lengths that
    mask it (``lengths`` None: all L tokens). cuDNN's flash attention takes only even lengths
    when it is differentiated (jax 0.11.2 on an H100: "Unsupported sequence length Q 197, KV
    197" for ViT's 196 patches + CLS): the padded key is masked, the padded query's row
    dropped by the caller, so the result is the same."""
    B, L = q.shape[:2]
    q, k, v = (jnp.pad(t, ((0, 0), (0, 1), (0, 0), (0, 0))) for t in (q, k, v))
    return q, k, v, jnp.full((B,), L, jnp.int32) if lengths is None else lengths
