"""Decay masks built from cumulative log-decays (LION paper Appendix C.6).

Conventions (ARCHITECTURE.md section 3): ``A = cumsum(log_decay)`` along the sequence, all
``log_decay <= 0``. Masks are always formed as ``exp`` of a *difference* of cumulative sums that
is ``<= 0`` where it is kept, so nothing overflows: ``exp(where(i >= j, A_i - A_j, -inf))``.

All functions take ``A`` with the sequence on the last axis, ``[..., L]``, and return
``[..., L, L]`` indexed ``[..., i, j]`` (query i, key j); :func:`causal_mask` also takes the
keys of a KV cache, ``[..., C]``, giving ``[..., L, C]``.
"""

import jax.numpy as jnp


def causal_mask(A: jnp.ndarray, *, strict: bool = False, keys: jnp.ndarray | None = None,
                offset=0) -> jnp.ndarray:
    """Causal decay mask ``M_ij = exp(A_i - A_j)`` for ``j <= i`` (``j < i`` if strict), else 0.

    Args:
      A: cumulative log-decays ``[..., L]`` of the queries.
      strict: exclude the diagonal.
      keys: None (the keys are the queries), or the keys' cumulative log-decays ``[..., C]``
        (on the same basis as ``A``), key ``j`` at position ``j`` and query ``i`` at position
        ``offset + i``: kept where ``j <= offset + i`` (the KV-cache form).
      offset: position of the first query among the keys (an int or a traced int32 scalar).
    Returns:
      ``[..., L, C]`` (``C = L`` without ``keys``) in ``A.dtype``.
    """
    keys = A if keys is None else keys
    L, C = A.shape[-1], keys.shape[-1]
    keep = jnp.arange(C)[None, :] <= jnp.arange(L)[:, None] + (offset - int(strict))
    diff = A[..., :, None] - keys[..., None, :]
    return jnp.exp(jnp.where(keep, diff, -jnp.inf))


def bidirectional_mask(A: jnp.ndarray) -> jnp.ndarray:
    """LION's mask ``M_ij = exp(-|A_i - A_j|)`` (paper Eq. 28/88), ``[..., L] -> [..., L, L]``.

    Written as ``exp(A_i - A_j)`` below and ``exp(A_j - A_i)`` above the diagonal rather than
    with ``abs``, so that the gradient with respect to the log-decays is right also where two
    cumulative sums are equal (zero decay), where ``abs`` has no derivative.
    """
    L = A.shape[-1]
    lower = jnp.tril(jnp.ones((L, L), dtype=bool))
    diff = A[..., :, None] - A[..., None, :]
    return jnp.exp(jnp.where(lower, diff, -diff))
