"""The materialized masked-attention forms (the paper's training form; the test oracle).

``y = (Q K^T * M) V`` with the ``L x L`` mask of :mod:`lion_jax.ops.masks`. Memory is
``O(L^2)`` per head (``O(L^2 K)`` with per-feature decay): use for short sequences and tests.
Inputs are in the compute dtype (float32 or float64); normalisation is applied by the caller.
"""

import jax.numpy as jnp

from lion_jax.ops import masks
from lion_jax.ops._utils import decay_factor, einsum


def _cumulative(log_decay, q):
    """``A = cumsum(log_decay)`` over L; zeros ``[B, L, H]`` when there is no decay."""
    if log_decay is None:
        return jnp.zeros(q.shape[:3], q.dtype)
    return jnp.cumsum(log_decay, axis=1)


def causal(q, k, v, log_decay=None, initial_state=None):
    """Causal masked linear attention, materialized.

    Args:
      q, k: ``[B, L, H, K]``; v: ``[B, L, H, V]``.
      log_decay: None, ``[B, L, H]`` (scalar per token and head) or ``[B, L, H, K]``
        (per key feature).
      initial_state: None or ``[B, H, K, V]``, the state before the first token.
    Returns:
      ``(y [B, L, H, V], final_state [B, H, K, V])``, where
      ``y_i = sum_{j<=i} q_i^T diag(exp(A_i - A_j)) k_j v_j^T + q_i^T diag(exp(A_i)) S_0``.
    """
    A = _cumulative(log_decay, q)
    if A.ndim == 3:  # scalar decay: one [L, L] mask per head
        mask = masks.causal_mask(jnp.transpose(A, (0, 2, 1)))  # [B, H, L, L]
        scores = einsum("bihk,bjhk->bhij", q, k) * mask
    else:  # per-feature decay: one [L, L] mask per key feature
        mask = masks.causal_mask(jnp.transpose(A, (0, 2, 3, 1)))  # [B, H, K, L, L]
        scores = einsum("bihk,bjhk,bhkij->bhij", q, k, mask)
    y = einsum("bhij,bjhv->bihv", scores, v)

    A_last = A[:, -1:]
    k_to_end = k * decay_factor(jnp.exp(A_last - A), k.ndim)
    final_state = einsum("bjhk,bjhv->bhkv", k_to_end, v)
    if initial_state is not None:
        y = y + einsum("bihk,bhkv->bihv", q * decay_factor(jnp.exp(A), q.ndim), initial_state)
        final_state = final_state + decay_factor(jnp.exp(A_last[:, 0]), 4) * initial_state
    return y, final_state


def bidirectional(q, k, v, log_decay=None):
    """LION's bidirectional masked attention ``(Q K^T * M) V``, ``M_ij = exp(-|A_i - A_j|)``.

    Args:
      q, k: ``[B, L, H, K]``; v: ``[B, L, H, V]``; log_decay: None or ``[B, L, H]``.
    Returns:
      ``[B, L, H, V]`` (not normalised).
    """
    A = _cumulative(log_decay, q)
    mask = masks.bidirectional_mask(jnp.transpose(A, (0, 2, 1)))  # [B, H, L, L]
    scores = einsum("bihk,bjhk->bhij", q, k) * mask
    return einsum("bhij,bjhv->bihv", scores, v)
