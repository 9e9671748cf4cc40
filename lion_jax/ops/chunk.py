"""Chunked forms in plain XLA: ``O(L C d + L d^2 / C)`` memory, no ``L x L`` buffer.

The sequence is cut into chunks of C tokens (zero-padded at the end, which is exact: padded
tokens have ``k = v = 0`` and log-decay 0, so they neither add to nor decay the state). With
``b`` the cumulative log-decay *within* each chunk (chunk-local, so long sequences lose no
precision), chunk n computes

    intra:  y_i  = sum_{j<=i in chunk} (q_i . diag(exp(b_i - b_j)) k_j) v_j      (masked C x C)
    inter:  y_i += q_i^T diag(exp(b_i)) S_{n-1}
    state:  S_n  = diag(exp(b_C)) S_{n-1} + sum_j diag(exp(b_C - b_j)) k_j v_j^T

(a per-value-feature decay puts the same factors on the value side: ``y_iv`` takes
``exp(b_iv - b_jv)`` and the state decays column-wise).

Chunk-local states are computed for all chunks at once; an associative scan over the ``L / C``
chunks carries them into prefix states. Every exponent is ``<= 0``.
"""

import functools

import jax
import jax.numpy as jnp

from lion_jax.ops import masks
from lion_jax.ops._utils import bidirectional_from_causal, decay_factor, einsum, linear_scan


def causal(q, k, v, log_decay=None, initial_state=None, *, chunk_size=64, value_decay=False):
    """Causal linear attention, chunked.

    Args:
      q, k: ``[B, L, H, K]``; v: ``[B, L, H, V]``.
      log_decay: None, ``[B, L, H]``, ``[B, L, H, K]`` (per key feature), or with
        ``value_decay`` ``[B, L, H, V]`` (per value feature: the mask multiplies each value
        column, LION paper C.7; the state decays column-wise).
      initial_state: None or ``[B, H, K, V]``.
      chunk_size: tokens per chunk, C.
      value_decay: the last axis of a 4-D ``log_decay`` indexes value features.
    Returns:
      ``(y [B, L, H, V], final_state [B, H, K, V])``; the final state is that after the true
      last token.
    """
    B, L, H, K = q.shape
    V = v.shape[-1]
    C = chunk_size
    N = -(-L // C)
    if log_decay is None:
        log_decay = jnp.zeros((B, L, H), q.dtype)

    def to_chunks(x):  # [B, L, H, ...] -> [B, H, N, C, ...], zero-padded
        x = jnp.pad(x, [(0, 0), (0, N * C - L)] + [(0, 0)] * (x.ndim - 2))
        x = x.reshape((B, N, C) + x.shape[2:])
        return jnp.moveaxis(x, 3, 1)

    qc, kc, vc = to_chunks(q), to_chunks(k), to_chunks(v)
    b = jnp.cumsum(to_chunks(log_decay), axis=3)  # [B, H, N, C] or [B, H, N, C, K or V]
    per_value = value_decay and b.ndim == 5

    if per_value:
        y = _intra_value_decay(qc, kc, vc, b)
    else:
        if b.ndim == 4:  # scalar decay
            scores = einsum("bhnik,bhnjk->bhnij", qc, kc) * masks.causal_mask(b)
        else:  # per-key-feature decay: a C x C mask per key feature
            mask = masks.causal_mask(jnp.moveaxis(b, -1, -2))  # [B, H, N, K, C, C]
            scores = einsum("bhnik,bhnjk,bhnkij->bhnij", qc, kc, mask)
        y = einsum("bhnij,bhnjv->bhniv", scores, vc)

    b_last = b[:, :, :, -1:]
    to_end = decay_factor(jnp.exp(b_last - b), 5)  # [B, H, N, C, 1 or K or V]
    if per_value:
        chunk_states = einsum("bhnjk,bhnjv->bhnkv", kc, vc * to_end)  # [B, H, N, K, V]
    else:
        chunk_states = einsum("bhnjk,bhnjv->bhnkv", kc * to_end, vc)
    chunk_decay = decay_factor(jnp.exp(b_last[:, :, :, 0]), 5, value_decay=per_value)

    state0 = jnp.zeros((B, H, K, V), v.dtype) if initial_state is None else initial_state
    entering, final_state = _carry_states(chunk_decay, chunk_states, state0)
    from_start = decay_factor(jnp.exp(b), 5)
    if per_value:
        y = y + einsum("bhnik,bhnkv->bhniv", qc, entering) * from_start
    else:
        y = y + einsum("bhnik,bhnkv->bhniv", qc * from_start, entering)

    y = jnp.moveaxis(y, 1, 3).reshape(B, N * C, H, V)[:, :L]
    return y, final_state


def _carry_states(chunk_decay, chunk_states, state0):
    """States entering each chunk, and after the last: ``S_n = d_n S_{n-1} + local_n``.

    :func:`linear_scan` over the chunk axis (``log2 N`` steps of whole-array work instead of
    ``N`` sequential ones); the initial state then enters through the scanned decay products.

    Args:
      chunk_decay: ``[B, H, N, 1 or K, 1 or V]``; chunk_states: ``[B, H, N, K, V]``.
      state0: ``[B, H, K, V]``.
    Returns:
      ``(entering [B, H, N, K, V], final_state [B, H, K, V])``.
    """
    decays, states = linear_scan(chunk_decay, chunk_states, axis=2)
    states = states + decays * state0[:, :, None]
    entering = jnp.concatenate([state0[:, :, None], states[:, :, :-1]], axis=2)
    return entering, states[:, :, -1]


@functools.partial(jax.checkpoint, policy=jax.checkpoint_policies.nothing_saveable)
def _intra_value_decay(qc, kc, vc, b):
    """Within-chunk part with a per-value-feature decay: ``y_iv = sum_{j<=i} s_ij M_ijv v_jv``.

    Written as one broadcast product reduced over ``j``, with the mask built inside it, so that
    XLA fuses mask, product and sum and never stores the ``[..., C, C, V]`` mask; the backward
    pass rebuilds it (``jax.checkpoint``) rather than keeping it, so a layer's saved activations
    stay ``O(L d)``.

    Args:
      qc, kc: ``[B, H, N, C, K]``; vc: ``[B, H, N, C, V]``; b: chunk-local cumulative log-decays
        ``[B, H, N, C, V]``.
    Returns:
      ``[B, H, N, C, V]``.
    """
    C = b.shape[-2]
    scores = einsum("bhnik,bhnjk->bhnij", qc, kc)
    keep = jnp.tril(jnp.ones((C, C), dtype=bool))[:, :, None]  # [i, j, 1]
    diff = b[..., :, None, :] - b[..., None, :, :]  # [B, H, N, i, j, V]
    mask = jnp.exp(jnp.where(keep, diff, -jnp.inf))
    return jnp.sum(scores[..., None] * mask * vc[..., None, :, :], axis=-2)


def bidirectional(q, k, v, log_decay=None, *, chunk_size=64, value_decay=False):
    """LION, chunked: the forward causal pass plus the backward one on the reversed sequence.

    Args:
      q, k: ``[B, L, H, K]``; v: ``[B, L, H, V]``; log_decay: None, ``[B, L, H]`` or with
        ``value_decay`` ``[B, L, H, V]``.
      chunk_size: tokens per chunk.
      value_decay: ``log_decay`` is per value feature.
    Returns:
      ``[B, L, H, V]`` numerator (not normalised).
    """
    causal_fn = functools.partial(causal, chunk_size=chunk_size, value_decay=value_decay)
    return bidirectional_from_causal(causal_fn, q, k, v, log_decay)
