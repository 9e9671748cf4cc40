"""Recurrent forms: ``lax.scan`` over tokens (the paper's inference form).

The causal recurrence (decay applied on entering token t; FLA's ``g``, Mamba-2's convention)::

    S_t = diag(exp(a_t)) S_{t-1} + k_t v_t^T,      y_t = q_t^T S_t

LION (Theorem 3.3 / Appendix C.3) runs it forwards and, on the reversed sequence, backwards,
and each direction subtracts half of the diagonal term:
``y^{F/B}_i = q_i^T S^{F/B}_i - 1/2 (q_i . k_i) v_i``. The scalars ``c^{F/B}_i`` and states
``z^{F/B}`` of the paper are the same recurrence applied to a value column of ones: the caller
(:mod:`lion_jax.ops.api`) appends that column when normalising, so ``z`` is the last column of
``S`` here and ``c`` the last entry of ``y``.

Only the ``d x d`` state is carried; the scan stacks just the per-token outputs, so memory is
``O(L d)`` per sequence, never ``O(L d^2)`` (paper Appendix B.5).
"""

import functools

import jax
import jax.numpy as jnp

from lion_jax.ops._utils import bidirectional_from_causal, decay_factor, einsum


def step(state, q_t, k_t, v_t, log_decay_t=None, *, value_decay=False):
    """One token of the causal recurrence.

    Args:
      state: ``[B, H, K, V]``.
      q_t, k_t: ``[B, H, K]``; v_t: ``[B, H, V]``.
      log_decay_t: None, ``[B, H]``, ``[B, H, K]``, or with ``value_decay`` ``[B, H, V]``
        (decays the state's columns).
      value_decay: the last axis of a 3-D ``log_decay_t`` indexes value features.
    Returns:
      ``(new_state [B, H, K, V], y_t [B, H, V])``.
    """
    if log_decay_t is not None:
        per_value = value_decay and log_decay_t.ndim == 3
        state = state * decay_factor(jnp.exp(log_decay_t), state.ndim, value_decay=per_value)
    state = state + k_t[..., :, None] * v_t[..., None, :]
    return state, einsum("bhk,bhkv->bhv", q_t, state)


def causal(q, k, v, log_decay=None, initial_state=None, *, value_decay=False):
    """Causal linear attention by scanning :func:`step` over the sequence.

    Args:
      q, k: ``[B, L, H, K]``; v: ``[B, L, H, V]``.
      log_decay: None, ``[B, L, H]``, ``[B, L, H, K]``, or with ``value_decay``
        ``[B, L, H, V]``.
      initial_state: None or ``[B, H, K, V]``.
      value_decay: the last axis of a 4-D ``log_decay`` indexes value features.
    Returns:
      ``(y [B, L, H, V], final_state [B, H, K, V])``.
    """
    B, _, H, K = q.shape
    state = jnp.zeros((B, H, K, v.shape[-1]), v.dtype) if initial_state is None else initial_state
    inputs = (q, k, v) if log_decay is None else (q, k, v, log_decay)
    xs = tuple(jnp.moveaxis(x, 1, 0) for x in inputs)  # time-major
    final_state, ys = jax.lax.scan(lambda s, x: step(s, *x, value_decay=value_decay), state, xs)
    return jnp.moveaxis(ys, 0, 1), final_state


def bidirectional(q, k, v, log_decay=None, *, value_decay=False):
    """LION by two scans (Theorem 3.3): forward, and backward over the reversed sequence.

    Args:
      q, k: ``[B, L, H, K]``; v: ``[B, L, H, V]``; log_decay: None, ``[B, L, H]`` or with
        ``value_decay`` ``[B, L, H, V]`` (per value feature, paper C.7).
      value_decay: ``log_decay`` is per value feature.
    Returns:
      ``[B, L, H, V]``, the numerator ``y^F + y^B`` (not normalised).
    """
    causal_fn = functools.partial(causal, value_decay=value_decay)
    return bidirectional_from_causal(causal_fn, q, k, v, log_decay)
