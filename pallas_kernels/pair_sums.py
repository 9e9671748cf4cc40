"""d log_decay from pair sums, in XLA, for the backward paths without fused kernels.

The fused backward kernels (``causal_backward.py``, ``bidirectional.py``) sum each pair's
term over the tokens its decay spans instead of taking the reverse cumsum of
``q_t . dq_t - k_t . dk_t``, whose O(1) terms cancel over L. The scan backwards (head dims
above the fused kernels' tiles, ``algorithm="sequential"``) get the same sums here, in float32
from the inputs as given (exact products; float32 einsums at HIGHEST precision):

    dlog_decay_t = sum_{j < t <= i} P_ij,   P_ij = (q_i . k_j)(do_i . v_j) exp(A_i - A_j)

with ``S0`` counted as keys before the first token and ``dS_T`` as queries after the last.
Per chunk (``chunk_scan.crossing_sums``): the pairs inside it from ``pair_balance`` of their
terms, those with the key before it from the state entering it, ``h[n]``, those with the query
after it from the queries' state leaving it, ``dh[n]``, and the pairs spanning the whole chunk
as ``exp(sum a) <h[n], dh[n]>``. Two ``lax.scan`` walks over the chunks carry the float32
states (forward, keeping ``h``; then in reverse), so memory is one ``[B, H, N, K, V]`` array.
LION's pairs are those of the causal sums plus those of the reversed sequence
(:func:`lion_pair_sums`). Per-feature decay (``[B, L, H, K]``, GLA / HGRN2 / LightNet) takes
the same sums with every term resolved by key feature, ``P_ijk = q_ik k_jk exp(A_ik - A_jk)
(do_i . v_j)``, for each ``dlog_decay_tk``.
"""

import functools

import jax
import jax.numpy as jnp

from pallas_kernels.chunk_scan import chunk_decays, chunk_ends, crossing_sums, pair_balance

_EXACT = jax.lax.Precision.HIGHEST
_einsum = functools.partial(jnp.einsum, precision=_EXACT)


def _per_chunk(f):
    """``f`` of one chunk's arrays mapped over the leading ``[N, B, H]`` axes."""
    return jax.vmap(jax.vmap(jax.vmap(f)))


def _chunks(x, chunk):
    """``[B, L, H, ...]`` as float32 ``[N, B, H, C, ...]``."""
    B, L, H = x.shape[:3]
    x = x.astype(jnp.float32).reshape((B, L // chunk, chunk, H) + x.shape[3:])
    return jnp.moveaxis(jnp.moveaxis(x, 3, 2), 1, 0)


# Per-feature decay sums its pairs in chunks of at most this many tokens, whatever the caller's
# chunk: each step holds a [B, H, C, C, K] tile, and at C = 64 XLA's GPU compile of a fwd+bwd
# program ran for over 5 minutes (`bench_kernels`, pallas_causal_per_feature, D = 64, L = 4096,
# one H100, 2026-11-26), as it did for HGRN2's XLA chunked form, whose steps compiled in
# 26-41 s at C = 16 (lion_jax.ops.api.AUTO_PER_KEY_CHUNK). The sums do not depend on the chunk.
PER_FEATURE_CHUNK = 16


def causal_pair_sums(q, k, v, do, log_decay, *, chunk, initial_state=None, d_state=None):
    """d log_decay of causal linear attention, ``[B, L, H]`` (scalar decay) or ``[B, L, H, K]``
    (per key feature) float32, as ``log_decay``.

    Per feature, every term is resolved by key feature: ``P_ijk = q_ik k_jk exp(A_ik - A_jk)
    (do_i . v_j)``, summed over the pairs ``j < t <= i`` for ``dlog_decay_tk``. The pairs inside
    a chunk then take a ``[B, H, C, C, K]`` float32 tile per step of the forward walk (scalar
    decay: ``[B, H, C, C]``, from ``(q_i . k_j)``), with C at most :data:`PER_FEATURE_CHUNK`.

    Args:
      q, k: ``[B, L, H, K]``; v, do: ``[B, L, H, V]`` (do: the output's cotangent); L a
        multiple of ``chunk``.
      log_decay: ``[B, L, H]`` or ``[B, L, H, K]``.
      initial_state: None or ``S0 [B, H, K, V]``; d_state: None or ``dS_T [B, H, K, V]``, the
        final state's cotangent.
    """
    B, L, H, K = q.shape
    V = v.shape[-1]
    per_feature = log_decay.ndim == 4
    if per_feature:
        chunk = min(chunk, PER_FEATURE_CHUNK)
    Q, Kc, Vc, DO = (_chunks(x, chunk) for x in (q, k, v, do))  # [N, B, H, C, D]
    a = _chunks(log_decay, chunk)  # [N, B, H, C, F]: F = K per feature, else 1
    a = a if per_feature else a[..., None]
    per_decay = functools.partial(jax.vmap, in_axes=-1, out_axes=-1)  # over F
    head, tail = per_decay(_per_chunk(chunk_ends))(a)
    eh, et, whole = jnp.exp(head), jnp.exp(tail), jnp.exp(jnp.sum(a, axis=-2))

    def by_decay(x):
        """``[..., K]`` terms summed to the decay's ``[..., F]``."""
        return x if per_feature else jnp.sum(x, axis=-1, keepdims=True)

    segments = per_decay(jax.vmap(jax.vmap(functools.partial(chunk_decays, reverse=False))))
    idx = jnp.arange(chunk)
    below = (idx[:, None] > idx[None, :])[:, :, None]
    balance = jax.vmap(jax.vmap(per_decay(pair_balance)))  # [B, H, C, C, F] -> [B, H, C, F]

    def forward(h, xs):  # h: the state entering the chunk
        q_, k_, v_, do_, a_, eh_, et_, whole_ = xs
        decay = jnp.exp(jnp.where(below, segments(a_)[0], -jnp.inf))  # [B, H, C, C, F]
        if per_feature:
            inside = _einsum("bhik,bhjk->bhijk", q_, k_) * decay
        else:
            inside = _einsum("bhik,bhjk->bhij", q_, k_)[..., None] * decay
        inside = inside * _einsum("bhiv,bhjv->bhij", do_, v_)[..., None]
        after = balance(inside)
        from_before = by_decay(q_ * _einsum("bhiv,bhkv->bhik", do_, h)) * eh_
        h_next = whole_[..., None] * h + _einsum("bhjk,bhjv->bhkv", k_ * et_, v_)
        return h_next, (h, after + from_before)

    zero = jnp.zeros((B, H, K, V), jnp.float32)
    s0 = zero if initial_state is None else initial_state.astype(jnp.float32)
    _, (h, after) = jax.lax.scan(forward, s0, (Q, Kc, Vc, DO, a, eh, et, whole))

    def backward(dh, xs):  # dh: the queries' state leaving the chunk
        q_, k_, v_, do_, eh_, et_, whole_, h_ = xs
        to_after = by_decay(k_ * _einsum("bhjv,bhkv->bhjk", v_, dh)) * et_
        # chunk_scan.through_terms' sum, taken here so that dh is never kept whole
        through = whole_ * by_decay(jnp.sum(h_ * dh, axis=-1))
        dh_prev = whole_[..., None] * dh + _einsum("bhik,bhiv->bhkv", q_ * eh_, do_)
        return dh_prev, (to_after, through)

    ds = zero if d_state is None else d_state.astype(jnp.float32)
    _, (before, through) = jax.lax.scan(backward, ds, (Q, Kc, Vc, DO, eh, et, whole, h),
                                        reverse=True)
    sums = per_decay(_per_chunk(crossing_sums))(before, after)
    sums = sums + through[..., None, :]  # [N, B, H, C, F]
    sums = jnp.moveaxis(sums, 0, 1).transpose(0, 1, 3, 2, 4).reshape(B, L, H, -1)
    return sums if per_feature else sums[..., 0]


def lion_pair_sums(q, k, v, do, log_decay, *, chunk):
    """d log_decay ``[B, L, H]`` float32 of LION's numerator ``sum_j (q_i . k_j)
    exp(-|A_i - A_j|) v_j`` with cotangent do (normalised: ``do = [dnum | dden]`` against
    ``v = [v | 1]``, the weights' cotangent ``G_ij = do_i . v_j``): the causal pairs' sums plus
    the anti-causal pairs' as causal sums of the reversed sequence, whose decay between tokens
    ``L-1-i`` and ``L-1-j`` spans the log-decays of tokens ``i+1 .. j``: token t's own log-decay
    sits at reversed position ``L - t``."""
    causal = causal_pair_sums(q, k, v, do, log_decay, chunk=chunk)
    flip = functools.partial(jnp.flip, axis=1)
    shifted = jnp.concatenate([log_decay[:, 1:], jnp.zeros_like(log_decay[:, :1])], axis=1)
    anti = flip(causal_pair_sums(flip(q), flip(k), flip(v), flip(do), flip(shifted),
                                 chunk=chunk))  # anti[t] belongs to log-decay t + 1
    return causal + jnp.concatenate([jnp.zeros_like(anti[:, :1]), anti[:, :-1]], axis=1)
