"""LION with a decay per value feature (paper C.7, Eq. 136) as Triton kernels, with its VJP.

    y_iv = sum_j (q_i . k_j) exp(-|A_iv - A_jv|) v_jv,     A = cumsum(log_decay) over L,

``log_decay [B, L, H, V]``: each value column decays on its own and all columns share the
scores ``q_i . k_j``. SCALE is the caller's: ``lion_jax.ops.lion_attention`` runs this on
``[v | 1]`` with the decays doubled, so every denominator has its column's decay.

Forward. ``y = F + B``: ``F`` the inclusive forward scan (``j <= i``), ``B`` the strict reverse
one (``j > i``). A scan takes three passes over chunks of 16 tokens: each chunk's own state
``k^T (v * exp(tail))`` (decaying column-wise) in parallel, ``per_feature.prefix_states``
walking the chunks for the state entering each, and the outputs of every chunk in parallel
(:func:`_forward_kernel`, one program per (batch, head, chunk, block of value columns)). The
reverse scan is the forward one on the flipped sequence with the log-decays shifted by one token
(the backward recurrence decays on leaving a token). Within a chunk every key column ``j`` gets
its mask ``exp(sum_{j < s <= i} a_s) [C, BV]`` from a cumulative sum of its own segment (never a
difference of cumulative sums, never a positive exponent), so any log-decay (e.g. -20 per
token) is exact to rounding.

Backward, with ``do = dL/dy`` and ``P_ij = sum_v do_iv M_ijv v_jv``:

    dq_i = sum_j P_ij k_j,   dk_j = sum_i P_ij q_i,   dv_jv = sum_i s_ij M_ijv do_iv,
    dA_t = do_t * (F_t - B_t) - v_t * (dvF_t - dvB_t),   d log_decay = reverse cumsum of dA,

where ``dvF`` sums the queries ``i >= t`` and ``dvB`` those ``i < t`` (the diagonal's terms
cancel in dA, whose query and key parts both hold it). Two scans (:func:`_backward_kernel`,
chunk-parallel like the forward's) compute everything but dA: forward with the ``j <= i``
pairs for dq and the ``i < j`` pairs for dk and dv, and reverse with the other halves; each
takes two entering states, ``k (x) v`` for dq and ``q (x) do`` for dk and dv. The residuals are the inputs and ``F``, ``B`` (``O(L d)``).
dq and dk come from each block of value columns separately and are summed in XLA.

Precision: ``q k^T`` takes the input dtype (tensor cores for 16-bit inputs, float32
accumulation); masks, states and every other product are exact float32 (a 16-bit copy of a
state lost the precision that SCALE's cancelling gradients need: bf16 dq 5.4e-3 relative RMS,
above the 5e-3 bound, in the interpreter). The cotangent stays float32.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.chunk_scan import _next_pow2, _pad_axis, reverse_cumsum
from pallas_kernels.per_feature import prefix_states

CHUNK = 16
_FLOATS = (jnp.float32, jnp.bfloat16, jnp.float16)
_EXACT = jax.lax.Precision.HIGHEST


def unsupported_reason(q, k, v, log_decay):
    """Why :func:`lion_value_decay` cannot take these inputs, or None when it can."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim != 4:
            return f"{name} must be [B, L, H, D]; got shape {x.shape}"
        if x.dtype not in _FLOATS:
            return f"{name} must be float32, bfloat16 or float16; got {x.dtype}"
    if not 1 <= q.shape[-1] <= 128:
        return f"q and k head dim must be in [1, 128]; got {q.shape[-1]}"
    if not 1 <= v.shape[-1] <= 256:
        return f"v head dim must be in [1, 256]; got {v.shape[-1]}"
    if k.shape != q.shape or v.shape[:3] != q.shape[:3]:
        return f"q, k must be [B, L, H, K] and v [B, L, H, V] alike; got {q.shape}, {k.shape}, {v.shape}"
    if log_decay is None or log_decay.shape != v.shape:
        got = None if log_decay is None else log_decay.shape
        return f"log_decay must be [B, L, H, V] = {v.shape} (a decay per value feature); got {got}"
    return None


def _dot(a, b, **kwargs):
    """An exact float32 product of float32 tiles (the states and their partners: a 16-bit
    state would lose the precision that SCALE's cancelling gradients need)."""
    return pltriton.dot(a, b, precision=_EXACT, **kwargs)


def _segments_after(a):
    """``tail_j = sum_{s > j} a_s`` per column of ``a [C, BV]`` float32, as an exact product."""
    idx = jnp.arange(a.shape[0])
    after = (idx[None, :] > idx[:, None]).astype(jnp.float32)
    return pltriton.dot(after, a, precision=_EXACT)


def _column_mask(a, j, *, strict):
    """Key ``j``'s mask ``[C, BV]``: row i is ``exp(sum_{j < s <= i} a_s)`` for ``i >= j`` (``i > j``
    if strict), else 0; the segment summed on its own, so every exponent is ``<= 0``."""
    rows = jnp.arange(a.shape[0])[:, None]
    seg = jnp.cumsum(jnp.where(rows > j, a, 0.0), axis=0)
    return jnp.exp(jnp.where(rows > j if strict else rows >= j, seg, -jnp.inf))


def _column(x, j):
    """Column ``j`` of a ``[C, C]`` float32 tile, ``[C]``."""
    cols = jnp.arange(x.shape[1])[None, :]
    return jnp.sum(jnp.where(cols == j, x, 0.0), axis=1)


def _states_kernel(k_ref, v_ref, g_ref, u_ref):
    """One (b, h, chunk, V-block): the chunk's own state ``u = K^T (V * exp(tail))`` ``[Kp, BV]``,
    ``tail_j`` the chunk's log-decays after token j."""
    f32 = jnp.float32
    v_to_end = v_ref[...].astype(f32) * jnp.exp(_segments_after(g_ref[...].astype(f32)))
    u_ref[...] = _dot(k_ref[...].astype(f32), v_to_end, trans_a=True)


def _forward_kernel(q_ref, k_ref, v_ref, g_ref, s_ref, o_ref, *, strict, precision):
    """One (b, h, chunk, V-block): ``o_i = sum_{j <= i} (q_i . k_j) M_ij * v_j`` (``j < i`` if
    strict), ``M_ij = exp(A_i - A_j)`` per column, keys before the chunk through the entering
    state. Refs: q, k ``[C, Kp]``; v, g, o ``[C, BV]``; s ``[Kp, BV]``."""
    f32 = jnp.float32
    q = q_ref[...]
    a = g_ref[...].astype(f32)
    scores = pltriton.dot(q, k_ref[...], trans_b=True, precision=precision).astype(f32)
    out = _dot(q.astype(f32), s_ref[...]) * jnp.exp(jnp.cumsum(a, axis=0))

    def key(j, out):
        v_j = v_ref[pl.ds(j, 1), :].astype(f32)
        return out + _column(scores, j)[:, None] * _column_mask(a, j, strict=strict) * v_j

    o_ref[...] = jax.lax.fori_loop(0, CHUNK, key, out).astype(o_ref.dtype)


def _backward_kernel(q_ref, k_ref, v_ref, do_ref, g_ref, s_kv_ref, s_qo_ref, dq_ref, dk_ref,
                     dv_ref, *, strict_q, strict_kv, precision):
    """One (b, h, chunk, V-block) of a forward walk: ``dq_i`` from the keys ``j <= i`` (``j < i``
    if strict_q), ``dk_t, dv_t`` from the queries ``u <= t`` (``u < t`` if strict_kv), this
    V-block's share; earlier chunks through the entering states ``s_kv = sum k (x) v`` and
    ``s_qo = sum q (x) do``. Refs: q, k, dq, dk ``[C, Kp]``; v, do, g, dv ``[C, BV]``; states
    ``[Kp, BV]``."""
    f32 = jnp.float32
    q, k = q_ref[...], k_ref[...]
    a = g_ref[...].astype(f32)
    from_start = jnp.exp(jnp.cumsum(a, axis=0))
    v32, do32 = v_ref[...].astype(f32), do_ref[...].astype(f32)
    s_qo = s_qo_ref[...]
    dq = _dot(do32 * from_start, s_kv_ref[...], trans_b=True)
    dk = _dot(v32 * from_start, s_qo, trans_b=True)
    dv = _dot(k.astype(f32), s_qo) * from_start
    scores = pltriton.dot(k, q, trans_b=True, precision=precision).astype(f32)  # k_t . q_u
    rows = jnp.arange(CHUNK)[:, None]

    def partner(u, acc):
        dq, dk, dv = acc
        row = pl.ds(u, 1)
        mask = _column_mask(a, u, strict=False)
        diagonal_out = lambda m, strict: jnp.where(rows == u, 0.0, m) if strict else m  # noqa
        mask_q, mask_kv = diagonal_out(mask, strict_q), diagonal_out(mask, strict_kv)
        v_u, do_u = v_ref[row, :].astype(f32), do_ref[row, :].astype(f32)
        dq = dq + jnp.sum(do32 * mask_q * v_u, axis=1)[:, None] * k_ref[row, :].astype(f32)
        weights = mask_kv * do_u  # [t, v]: M_utv do_uv
        dk = dk + jnp.sum(v32 * weights, axis=1)[:, None] * q_ref[row, :].astype(f32)
        return dq, dk, dv + _column(scores, u)[:, None] * weights

    dq, dk, dv = jax.lax.fori_loop(0, CHUNK, partner, (dq, dk, dv))
    dq_ref[...] = dq
    dk_ref[...] = dk
    dv_ref[...] = dv


def _layout(q, v):
    """``(Kp, BV, Vp)``: K padded to a power of two >= 16, V to a multiple of the V-block."""
    kp = _next_pow2(max(q.shape[-1], 16))
    bv = 32 if v.shape[-1] % 32 == 0 else 16
    return kp, bv, -(-v.shape[-1] // bv) * bv


def _params(q):
    precision = _EXACT if q.dtype == jnp.float32 else None
    return precision, pltriton.CompilerParams(num_warps=4, num_stages=1)


def _specs(kp, bv):
    """Per-chunk block specs of a (b, h, chunk n, V-block j) grid: ``[C, Kp]`` rows, ``[C, BV]``
    columns, ``[C, Kp]`` rows of a V-block's own partial sum, ``[Kp, BV]`` states."""
    keys = pl.BlockSpec((None, CHUNK, None, kp), lambda b, h, n, j: (b, n, h, 0))
    cols = pl.BlockSpec((None, CHUNK, None, bv), lambda b, h, n, j: (b, n, h, j))
    per_block = pl.BlockSpec((None, CHUNK, None, kp), lambda b, h, n, j: (b, n, h, j))
    states = pl.BlockSpec((None, None, None, kp, bv), lambda b, h, n, j: (b, h, n, 0, j))
    return keys, cols, per_block, states


def _entering_states(k, v, g, *, interpret):
    """The forward walk's state entering each chunk, ``sum_{j < chunk} k_j (v_j * exp(A - A_j))``,
    ``[B, H, N, Kp, Vp]`` float32: each chunk's own state in parallel, then
    ``per_feature.prefix_states`` walks the chunks."""
    B, L, H, kp = k.shape
    _, bv, vp = _layout(k, v)
    N = L // CHUNK
    keys, cols, _, states = _specs(kp, bv)
    own = pl.pallas_call(
        _states_kernel, grid=(B, H, N, vp // bv), in_specs=[keys, cols, cols], out_specs=states,
        out_shape=jax.ShapeDtypeStruct((B, H, N, kp, vp), jnp.float32),
        compiler_params=_params(k)[1], interpret=interpret, name="lion_value_decay_states",
    )(k, v, g)
    decay = jnp.exp(jnp.sum(g.reshape(B, N, CHUNK, H, vp), axis=2))  # [B, N, H, Vp]
    decay = jnp.transpose(decay, (0, 2, 1, 3))[:, :, :, None, :]
    entering, _ = prefix_states(own, decay, None, reverse=False, block_v=bv,
                                interpret=interpret)
    return entering


def _forward_scan(q, k, v, g, *, strict, interpret):
    """Padded inputs (L a multiple of 16, K = Kp, V a multiple of BV) -> ``[B, L, H, V]`` float32."""
    B, L, H, kp = q.shape
    _, bv, vp = _layout(q, v)
    keys, cols, _, states = _specs(kp, bv)
    precision, params = _params(q)
    return pl.pallas_call(
        functools.partial(_forward_kernel, strict=strict, precision=precision),
        grid=(B, H, L // CHUNK, vp // bv), in_specs=[keys, keys, cols, cols, states],
        out_specs=cols, out_shape=jax.ShapeDtypeStruct((B, L, H, vp), jnp.float32),
        compiler_params=params, interpret=interpret, name="lion_value_decay_scan",
    )(q, k, v, g, _entering_states(k, v, g, interpret=interpret))


def _backward_scan(q, k, v, do, g, *, strict_q, strict_kv, interpret):
    """Padded inputs -> ``(dq, dk [B, L, H, Kp], dv [B, L, H, Vp])`` float32 of one walk."""
    B, L, H, kp = q.shape
    _, bv, vp = _layout(q, v)
    keys, cols, per_block, states = _specs(kp, bv)
    blocks = vp // bv
    precision, params = _params(q)
    kernel = functools.partial(_backward_kernel, strict_q=strict_q, strict_kv=strict_kv,
                               precision=precision)
    dq, dk, dv = pl.pallas_call(
        kernel, grid=(B, H, L // CHUNK, blocks),
        in_specs=[keys, keys, cols, cols, cols, states, states],
        out_specs=[per_block, per_block, cols],
        out_shape=[jax.ShapeDtypeStruct((B, L, H, blocks * kp), jnp.float32)] * 2
        + [jax.ShapeDtypeStruct((B, L, H, vp), jnp.float32)],
        compiler_params=params, interpret=interpret, name="lion_value_decay_grads",
    )(q, k, v, do, g, _entering_states(k, v, g, interpret=interpret),
      _entering_states(q, do, g, interpret=interpret))
    fold = lambda x: x.reshape(B, L, H, blocks, kp).sum(axis=3)  # noqa: E731
    return fold(dq), fold(dk), dv


def _flip(x):
    return jnp.flip(x, axis=1)


def _reverse_decays(g):
    """Log-decays of the reverse walk, flipped: ``flip([a_1, ..., a_{L-1}, 0])``."""
    return _flip(jnp.concatenate([g[:, 1:], jnp.zeros_like(g[:, :1])], axis=1))


def _directions(q, k, v, g, interpret):
    """``(F, B)``: the inclusive forward scan and the strict reverse one, float32."""
    forward = _forward_scan(q, k, v, g, strict=False, interpret=interpret)
    backward = _flip(_forward_scan(_flip(q), _flip(k), _flip(v), _reverse_decays(g),
                                   strict=True, interpret=interpret))
    return forward, backward


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _lion(q, k, v, g, interpret):
    forward, backward = _directions(q, k, v, g, interpret)
    return forward + backward


def _lion_fwd(q, k, v, g, interpret):
    forward, backward = _directions(q, k, v, g, interpret)
    return forward + backward, (q, k, v, g, forward, backward)


def _lion_bwd(interpret, residuals, dy):
    q, k, v, g, forward, backward = residuals
    do = dy  # float32
    dq1, dk1, dv_b = _backward_scan(q, k, v, do, g, strict_q=False, strict_kv=True,
                                    interpret=interpret)
    dq2, dk2, dv_f = (_flip(x) for x in _backward_scan(
        _flip(q), _flip(k), _flip(v), _flip(do), _reverse_decays(g), strict_q=True,
        strict_kv=False, interpret=interpret))
    dA = dy * (forward - backward) - v.astype(jnp.float32) * (dv_f - dv_b)
    return ((dq1 + dq2).astype(q.dtype), (dk1 + dk2).astype(k.dtype),
            (dv_b + dv_f).astype(v.dtype), reverse_cumsum(dA).astype(g.dtype))


_lion.defvjp(_lion_fwd, _lion_bwd)


def lion_value_decay(q, k, v, log_decay, *, interpret=None):
    """LION's numerator with a decay per value feature (see the module docstring), not SCALE-d.

    Args:
      q, k: ``[B, L, H, K]``; v: ``[B, L, H, V]``, one dtype (float32, bfloat16 or float16).
      log_decay: ``[B, L, H, V]``, entries ``<= 0`` (used in float32).
      interpret: run the Pallas interpreter; None means "when the default backend is CPU".
    Returns:
      ``[B, L, H, V]`` float32; differentiable in all four inputs.
    """
    reason = unsupported_reason(q, k, v, log_decay)
    if reason is not None:
        raise ValueError(f"lion_value_decay: {reason}")
    if interpret is None:
        interpret = jax.default_backend() == "cpu"
    B, L, H, K = q.shape
    V = v.shape[-1]
    kp, _, vp = _layout(q, v)
    lp = -(-L // CHUNK) * CHUNK
    pad = lambda x, d: _pad_axis(_pad_axis(x, 1, lp), 3, d)  # noqa: E731  exact: zeros
    y = _lion(pad(q, kp), pad(k, kp), pad(v, vp), pad(log_decay.astype(jnp.float32), vp),
              bool(interpret))
    return y[:, :L, :, :V]
