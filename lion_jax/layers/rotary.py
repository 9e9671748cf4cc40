"""Rotary position embedding (RoPE; Su et al., RoFormer): LLaMA's positions, and LION's
optional rotated scores (:class:`lion_jax.layers.lion.LionAttention`, ``rope_base``)."""

import jax.numpy as jnp


def rope(x, positions, *, base=10000.0):
    """Rotary position embedding of ``x [B, L, H, K]`` (``K`` even) at integer ``positions``,
    ``[L]`` (every sequence alike) or ``[B, L]``: each pair of features ``(j, j + K/2)``
    ("rotate half") rotated by ``positions * base**(-2j/K)``, so ``rope(q)_i . rope(k)_j``
    depends on the positions through ``i - j`` alone. Computed in float32, returned in
    ``x.dtype``."""
    K = x.shape[-1]
    freqs = base ** (-jnp.arange(0, K // 2, dtype=jnp.float32) * 2.0 / K)
    angles = positions.astype(jnp.float32)[..., None] * freqs  # [(B,) L, K/2]
    cos, sin = jnp.cos(angles)[..., None, :], jnp.sin(angles)[..., None, :]  # [(B,) L, 1, K/2]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)
