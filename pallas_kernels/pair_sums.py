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
(:func:`lion_pair_sums`). Per-feature decay takes its d log_decay from its float32 scans
(``linear_attention._per_feature_bwd``).
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


def causal_pair_sums(q, k, v, do, log_decay, *, chunk, initial_state=None, d_state=None):
    """d log_decay ``[B, L, H]`` float32 of causal linear attention with one decay per token
    and head. The pairs inside a chunk take a ``[B, H, C, C]`` float32 tile per step of the
    forward walk.

    Args:
      q, k: ``[B, L, H, K]``; v, do: ``[B, L, H, V]`` (do: the output's cotangent); L a
        multiple of ``chunk``.
      log_decay: ``[B, L, H]``.
      initial_state: None or ``S0 [B, H, K, V]``; d_state: None or ``dS_T [B, H, K, V]``, the
        final state's cotangent.
    """
    B, L, H, K = q.shape
    V = v.shape[-1]
    Q, Kc, Vc, DO = (_chunks(x, chunk) for x in (q, k, v, do))  # [N, B, H, C, D]
    a = _chunks(log_decay, chunk)  # [N, B, H, C]
    head, tail = _per_chunk(chunk_ends)(a)
    eh, et, whole = jnp.exp(head), jnp.exp(tail), jnp.exp(jnp.sum(a, axis=-1))
    segments = jax.vmap(jax.vmap(functools.partial(chunk_decays, reverse=False)))
    idx = jnp.arange(chunk)
    below = idx[:, None] > idx[None, :]
    balance = jax.vmap(jax.vmap(pair_balance))  # [B, H, C, C] -> [B, H, C]

    def forward(h, xs):  # h: the state entering the chunk
        q_, k_, v_, do_, a_, eh_, et_, whole_ = xs
        decay = jnp.exp(jnp.where(below, segments(a_)[0], -jnp.inf))  # [B, H, C, C]
        inside = (_einsum("bhik,bhjk->bhij", q_, k_) * decay
                  * _einsum("bhiv,bhjv->bhij", do_, v_))
        from_before = jnp.sum(q_ * _einsum("bhiv,bhkv->bhik", do_, h), axis=-1) * eh_
        h_next = whole_[..., None, None] * h + _einsum("bhjk,bhjv->bhkv",
                                                       k_ * et_[..., None], v_)
        return h_next, (h, balance(inside) + from_before)

    zero = jnp.zeros((B, H, K, V), jnp.float32)
    s0 = zero if initial_state is None else initial_state.astype(jnp.float32)
    _, (h, after) = jax.lax.scan(forward, s0, (Q, Kc, Vc, DO, a, eh, et, whole))

    def backward(dh, xs):  # dh: the queries' state leaving the chunk
        q_, k_, v_, do_, eh_, et_, whole_, h_ = xs
        to_after = jnp.sum(k_ * _einsum("bhjv,bhkv->bhjk", v_, dh), axis=-1) * et_
        # chunk_scan.through_terms' sum, taken here so that dh is never kept whole
        through = whole_ * jnp.sum(h_ * dh, axis=(-2, -1))
        dh_prev = whole_[..., None, None] * dh + _einsum("bhik,bhiv->bhkv",
                                                         q_ * eh_[..., None], do_)
        return dh_prev, (to_after, through)

    ds = zero if d_state is None else d_state.astype(jnp.float32)
    _, (before, through) = jax.lax.scan(backward, ds, (Q, Kc, Vc, DO, eh, et, whole, h),
                                        reverse=True)
    sums = _per_chunk(crossing_sums)(before, after) + through[..., None]  # [N, B, H, C]
    return jnp.moveaxis(sums, 0, 1).transpose(0, 1, 3, 2).reshape(B, L, H)


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
