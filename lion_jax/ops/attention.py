"""The materialized masked-attention forms (the paper's training form; the test oracle).

``y = (Q K^T * M) V`` with the ``L x L`` mask of :mod:`lion_jax.ops.masks`. Memory is
``O(L^2)`` per head (``O(L^2 d)`` with per-feature decay): use for short sequences and tests.
Inputs are in the compute dtype (float32 or float64); normalisation is applied by the caller.
"""

import jax.numpy as jnp

from lion_jax.ops import masks
from lion_jax.ops import orders as orders_lib
from lion_jax.ops._utils import decay_factor, einsum


def _cumulative(log_decay, q):
    """``A = cumsum(log_decay)`` over L; zeros ``[B, L, H]`` when there is no decay."""
    if log_decay is None:
        return jnp.zeros(q.shape[:3], q.dtype)
    return jnp.cumsum(log_decay, axis=1)


def causal(q, k, v, log_decay=None, initial_state=None, *, value_decay=False):
    """Causal masked linear attention, materialized.

    Args:
      q, k: ``[B, L, H, K]``; v: ``[B, L, H, V]``.
      log_decay: None, ``[B, L, H]`` (scalar per token and head), ``[B, L, H, K]`` (per key
        feature), or with ``value_decay`` ``[B, L, H, V]`` (per value feature, paper C.7).
      initial_state: None or ``[B, H, K, V]``, the state before the first token.
      value_decay: the last axis of a 4-D ``log_decay`` indexes value features.
    Returns:
      ``(y [B, L, H, V], final_state [B, H, K, V])``, where
      ``y_i = sum_{j<=i} q_i^T diag(exp(A_i - A_j)) k_j v_j^T + q_i^T diag(exp(A_i)) S_0``
      (per value feature: ``y_iv = sum_{j<=i} s_ij exp(A_iv - A_jv) v_jv + ...``).
    """
    A = _cumulative(log_decay, q)
    per_value = value_decay and A.ndim == 4
    if per_value:
        y = _masked_per_value(q, k, v, masks.causal_mask(jnp.transpose(A, (0, 2, 3, 1))))
    else:
        y = einsum("bhij,bjhv->bihv", causal_scores(q, k, A), v)

    A_last = A[:, -1:]
    to_end = decay_factor(jnp.exp(A_last - A), 4)
    if per_value:
        final_state = einsum("bjhk,bjhv->bhkv", k, v * to_end)
    else:
        final_state = einsum("bjhk,bjhv->bhkv", k * to_end, v)
    if initial_state is not None:
        from_start = decay_factor(jnp.exp(A), 4)
        if per_value:
            y = y + einsum("bihk,bhkv->bihv", q, initial_state) * from_start
        else:
            y = y + einsum("bihk,bhkv->bihv", q * from_start, initial_state)
        final_state = final_state + decay_factor(
            jnp.exp(A_last[:, 0]), 4, value_decay=per_value) * initial_state
    return y, final_state


def causal_scores(q, k, A, *, keys_A=None, offset=0):
    """The masked scores ``s_ij M_ij`` of the causal form, ``[B, H, L, C]``.

    Args:
      q: ``[B, L, H, K]``; k: ``[B, C, H, K]`` (``C = L``: the same tokens, or a KV cache).
      A: the queries' cumulative log-decays, ``[B, L, H]`` (scalar: one ``[L, C]`` mask per
        head) or ``[B, L, H, K]`` (per key feature: one mask per feature).
      keys_A: the keys' ``[B, C, H(, K)]`` on the same basis, or None (the keys are the
        queries).
      offset: position of query 0 among the keys (:func:`lion_jax.ops.masks.causal_mask`).
    """
    order = (0, 2, 1) if A.ndim == 3 else (0, 2, 3, 1)
    mask = masks.causal_mask(jnp.transpose(A, order), offset=offset,
                             keys=None if keys_A is None else jnp.transpose(keys_A, order))
    if A.ndim == 3:
        return einsum("bihk,bjhk->bhij", q, k) * mask
    return einsum("bihk,bjhk,bhkij->bhij", q, k, mask)


def bidirectional(q, k, v, log_decay=None, *, value_decay=False, orders=None):
    """LION's bidirectional masked attention ``(Q K^T * M) V``, ``M_ij = exp(-|A_i - A_j|)``.

    Args:
      q, k: ``[B, L, H, K]``; v: ``[B, L, H, V]``; log_decay: None, ``[B, L, H]`` or with
        ``value_decay`` ``[B, L, H, V]``: then ``M`` is ``L x L x V`` and multiplies each value
        column (paper Eq. 136).
      value_decay: ``log_decay`` is per value feature.
      orders: None, or token permutations (numpy ``[L]``): ``M`` is the average of the masks
        of the decays accumulated along each order (:mod:`lion_jax.ops.orders`).
    Returns:
      ``[B, L, H, V]`` (not normalised).
    """
    per_value = value_decay and log_decay is not None and log_decay.ndim == 4
    if orders is None or log_decay is None:
        A = _cumulative(log_decay, q)
        mask = masks.bidirectional_mask(jnp.moveaxis(A, 1, -1))  # [B, H(, V), L, L]
    else:
        mask = sum(orders_lib.mask_in_order(masks.bidirectional_mask, log_decay, p)
                   for p in orders) / len(orders)
    if per_value:
        return _masked_per_value(q, k, v, mask)
    scores = einsum("bihk,bjhk->bhij", q, k) * mask
    return einsum("bhij,bjhv->bihv", scores, v)


def _masked_per_value(q, k, v, mask):
    """``y_iv = sum_j s_ij M_ijv v_jv`` with ``mask [B, H, V, L, L]`` (paper Eq. 136)."""
    scores = einsum("bihk,bjhk->bhij", q, k)
    return einsum("bhij,bhvij,bjhv->bihv", scores, mask, v)
