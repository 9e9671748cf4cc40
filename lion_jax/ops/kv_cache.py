"""The KV-cache form of causal linear attention (LION paper Appendix A, Figure 5).

A causal linear model can decode three ways that give the same outputs: recompute the whole
sequence, run the recurrence from the state ``S`` (fixed size), or attend to a cache of every
key and value seen, as a softmax Transformer does. This is the third:

    y_i = sum_{j <= i} q_i^T diag(exp(A_i - A_j)) k_j v_j^T

over the cached and the ``L`` new tokens, ``O(L C)`` per call for a cache of capacity ``C``
(memory grows with the context: the point of comparing it with the recurrence). The mask is
the reference form's (:func:`lion_jax.ops.attention.causal_scores`), on a rectangle: new token
``i`` sits at position ``length + i`` among the ``C`` slots, slots past it are masked.

Numerics: only differences of ``A`` ever enter, so the cache keeps ``A`` less that of its newest
token (``<= 0``, 0 for the newest): the differences between recent tokens, which the mask
needs, keep their float32 precision at any context length (the rule that keeps ``A``
chunk-local in the chunked form). The differences are formed, masked to ``j <= i``, then
exponentiated, so nothing overflows.

Use it through :func:`lion_jax.ops.causal_linear_attention` with
``initial_state=empty_kv_cache(...)`` (or a cache a previous call returned): the ``impl`` is
then this form.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from lion_jax.ops.attention import causal_scores
from lion_jax.ops._utils import einsum

DECAYS = (None, "scalar", "per_key")


class KVCache(NamedTuple):
    """The keys, values and decays of every token seen, in ``C`` slots (a pytree).

    Attributes:
      k: ``[B, C, H, K]`` keys (after any feature map or positional transform), slots
        ``0 .. length - 1`` filled, the rest zeros.
      v: ``[B, C, H, V]`` values.
      log_decay_cum: None without decay, else ``[B, C, H]`` (scalar decay) or ``[B, C, H, K]``
        (per key feature): the cumulative log-decay ``A_j`` of each cached token less that of
        the newest one (module docstring), in float32 or wider.
      length: int32 scalar, the number of tokens cached.
    """

    k: jax.Array
    v: jax.Array
    log_decay_cum: jax.Array | None
    length: jax.Array

    @property
    def capacity(self) -> int:
        return self.k.shape[1]


def empty_kv_cache(batch: int, capacity: int, heads: int, key_dim: int, value_dim: int, *,
                   decay: str | None = None, dtype=jnp.float32) -> KVCache:
    """A cache holding no token, of ``capacity`` slots (:class:`KVCache`).

    Args:
      batch, capacity, heads, key_dim, value_dim: ``B, C, H, K, V``.
      decay: None (no decay), ``"scalar"`` (``log_decay [B, L, H]``) or ``"per_key"``
        (``[B, L, H, K]``): what the calls will pass.
      dtype: of ``k`` and ``v``; give that of the op's inputs (storing them is then exact).
        ``log_decay_cum`` is in ``promote_types(dtype, float32)``.
    """
    if decay not in DECAYS:
        raise ValueError(f"empty_kv_cache: unknown decay {decay!r}; valid: {list(DECAYS)}")
    for name, n in (("batch", batch), ("capacity", capacity), ("heads", heads),
                    ("key_dim", key_dim), ("value_dim", value_dim)):
        if n < 1:
            raise ValueError(f"empty_kv_cache: {name} must be positive, got {n}")
    A = None
    if decay is not None:
        shape = (batch, capacity, heads) + ((key_dim,) if decay == "per_key" else ())
        A = jnp.zeros(shape, jnp.promote_types(dtype, jnp.float32))
    return KVCache(k=jnp.zeros((batch, capacity, heads, key_dim), dtype),
                   v=jnp.zeros((batch, capacity, heads, value_dim), dtype),
                   log_decay_cum=A, length=jnp.zeros((), jnp.int32))


def causal(q, k, v, log_decay, cache: KVCache, *, row_sums: bool = False):
    """The ``L`` new tokens by attention against the cached and new tokens (checked by the
    caller: ``cache.length + L <= C``; past the capacity a traced length gives NaN outputs).

    Args:
      q, k: ``[B, L, H, K]``; v: ``[B, L, H, V]``; log_decay: None, ``[B, L, H]`` or
        ``[B, L, H, K]``; all in the compute dtype.
      cache: a :class:`KVCache` whose shapes match these.
      row_sums: append ``sum_j s_ij M_ij`` (SCALE's denominator) as a last column of ``y``.
    Returns:
      ``(y [B, L, H, V (+1)] in the compute dtype, the cache with the new tokens appended)``.
    """
    B, L, H, _ = q.shape
    n, C, dtype = cache.length, cache.capacity, q.dtype

    def append(store, new):  # writes new [B, L, ...] at slot n of store [B, C, ...]
        zero = jnp.zeros_like(n)  # the start indices share n's integer type
        start = (zero, n) + (zero,) * (store.ndim - 2)
        return jax.lax.dynamic_update_slice(store, new.astype(store.dtype), start)

    keys, values = append(cache.k, k), append(cache.v, v)
    if log_decay is None:
        A_new, A_keys, new_A = jnp.zeros((B, L, H), dtype), jnp.zeros((B, C, H), dtype), None
    else:
        A_new = jnp.cumsum(log_decay, axis=1)  # relative to the newest cached token
        A_keys = append(cache.log_decay_cum.astype(dtype), A_new)
        new_A = (A_keys - A_new[:, -1:]).astype(cache.log_decay_cum.dtype)
    scores = causal_scores(q, keys.astype(dtype), A_new, keys_A=A_keys, offset=n)
    y = einsum("bhij,bjhv->bihv", scores, values.astype(dtype))
    if row_sums:
        y = jnp.concatenate([y, jnp.transpose(jnp.sum(scores, -1), (0, 2, 1))[..., None]], -1)
    y = jnp.where(n + L <= C, y, jnp.nan)
    return y, KVCache(keys, values, new_A, n + L)
