"""Small helpers shared by the forms in lion_jax.ops (not public API)."""

import functools

import jax
import jax.numpy as jnp

# float32 inputs must not silently drop to TF32/bf16 passes on GPU: the three forms are compared
# to 1e-5 (float32) and 1e-10 (float64).
einsum = functools.partial(jnp.einsum, precision=jax.lax.Precision.HIGHEST)


def decay_factor(x: jnp.ndarray, ndim: int, *, value_decay: bool = False) -> jnp.ndarray:
    """Adds unit axes to a decay tensor so it broadcasts against a state of rank ``ndim``.

    A scalar decay ``[B, H]`` scales a state ``[B, H, K, V]`` as ``[B, H, 1, 1]``; a per-key-feature
    decay ``[B, H, K]`` scales it row-wise as ``[B, H, K, 1]``; with ``value_decay`` a
    per-value-feature decay ``[B, H, V]`` scales it column-wise as ``[B, H, 1, V]``.
    """
    if value_decay:
        return jnp.expand_dims(x, -2)
    return x.reshape(x.shape + (1,) * (ndim - x.ndim))


def linear_scan(decays, inputs, axis, reverse=False):
    """Every state of the diagonal linear recurrence ``x_t = d_t x_{t-1} + u_t`` along ``axis``
    from ``x = 0`` (``reverse``: from the end), as an associative scan (``log2 n`` steps of
    whole-array work) with ``(d1, s1) . (d2, s2) = (d1 d2, d2 s1 + s2)``.

    Args:
      decays, inputs: arrays of one length along ``axis``; the decays broadcast against the
        inputs elementwise (any dtype the product takes, complex included).
    Returns:
      ``(products, states)``: the decays' running products ``d_1 ... d_t`` (how an initial
      state enters step t) and the states ``x_t``, in the inputs' layout.
    """
    def combine(first, second):
        (d1, s1), (d2, s2) = first, second
        return d1 * d2, d2 * s1 + s2

    return jax.lax.associative_scan(combine, (decays, inputs), axis=axis, reverse=reverse)


def reverse_sequence(x):
    """Flips the sequence axis (axis 1 of ``[B, L, ...]``); ``None`` passes through."""
    return None if x is None else jnp.flip(x, axis=1)


def backward_log_decay(log_decay):
    """Log-decays of LION's backward recurrence, in reversed token order.

    The backward recurrence is ``S^B_t = exp(a_{t+1}) S^B_{t+1} + k_t v_t^T``: the decay on entering
    token t from the right is token t+1's. Reversing the sequence turns it into the causal
    recurrence with log-decays ``flip([a_1, ..., a_{L-1}, 0])``.
    """
    if log_decay is None:
        return None
    shifted = jnp.concatenate([log_decay[:, 1:], jnp.zeros_like(log_decay[:, :1])], axis=1)
    return reverse_sequence(shifted)


def bidirectional_from_causal(causal_fn, q, k, v, log_decay):
    """LION's numerator from two inclusive causal passes (Theorem 3.3, Eqs. 20-23).

    The forward pass runs ``causal_fn`` as is; the backward pass runs it on the reversed
    sequence with :func:`backward_log_decay`. Each direction counts the diagonal
    ``(q_i . k_i) v_i``; LION subtracts half of it from each
    (``y^F_i = q_i^T S^F_i - 1/2 q_i^T k_i v_i``, same for B), so the sum counts it once.

    Args:
      causal_fn: ``(q, k, v, log_decay) -> (y, final_state)``, an inclusive causal form.
      q, k: ``[B, L, H, K]``; v: ``[B, L, H, V]``; log_decay: None, ``[B, L, H]`` or whatever
        per-feature shape ``causal_fn`` takes (the backward decays shift the same way).
    Returns:
      ``[B, L, H, V]``, ``y^F + y^B`` (not normalised).
    """
    y_forward, _ = causal_fn(q, k, v, log_decay)
    y_backward, _ = causal_fn(*map(reverse_sequence, (q, k, v)), backward_log_decay(log_decay))
    half_diagonal = 0.5 * jnp.sum(q * k, axis=-1, keepdims=True) * v
    return (y_forward - half_diagonal) + (reverse_sequence(y_backward) - half_diagonal)
