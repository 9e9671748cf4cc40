"""Rotary position embedding (RoPE; Su et al., RoFormer): LLaMA's positions, and LION's
optional rotated scores and the phases of its complex decays
(:class:`lion_jax.layers.lion.LionAttention`, ``rope_base`` and ``decay_init="hippo_complex"``)."""

import jax.numpy as jnp
import numpy as np


def rope_frequencies(head_dim, base=10000.0):
    """RoPE's frequencies ``base**(-2j/K)`` of the feature pairs ``j < K/2``, ``[K/2]`` float32
    (numpy: a constant under ``jit``, and an initial value)."""
    return (float(base) ** (-np.arange(0, head_dim // 2) * 2.0 / head_dim)).astype(np.float32)


def rope(x, positions, *, base=10000.0, freqs=None):
    """Rotary position embedding of ``x [B, L, H, K]`` (``K`` even) at integer ``positions``,
    ``[L]`` (every sequence alike) or ``[B, L]``: each pair of features ``(j, j + K/2)``
    ("rotate half") rotated by ``positions * freqs[j]``, so ``rope(q)_i . rope(k)_j`` depends
    on the positions through ``i - j`` alone. ``freqs``: ``[K/2]``, or ``[H, K/2]`` per head;
    None = :func:`rope_frequencies` of ``base``. Computed in float32, returned in
    ``x.dtype``."""
    if freqs is None:
        freqs = rope_frequencies(x.shape[-1], base)
    freqs = jnp.asarray(freqs, jnp.float32).reshape((-1, x.shape[-1] // 2))  # [1 or H, K/2]
    angles = positions.astype(jnp.float32)[..., None, None] * freqs  # [(B,) L, 1 or H, K/2]
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)
