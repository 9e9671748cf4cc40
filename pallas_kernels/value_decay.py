"""LION with a decay per value feature (paper C.7, Eq. 136) as Triton kernels, with its VJP.

    y_iv = sum_j (q_i . k_j) exp(-|A_iv - A_jv|) v_jv,     A = cumsum(log_decay) over L,

``log_decay [B, L, H, V]``: each value column decays on its own and all columns share the
scores ``q_i . k_j``. SCALE is the caller's: ``lion_jax.ops.lion_attention`` runs this on
``[v | 1]`` with the decays doubled, so every denominator has its column's decay.

Forward. ``y = F + B``: ``F`` the inclusive forward scan (``j <= i``), ``B`` the strict reverse
one (``j > i``). Both are the paper's recurrence walked token by token (:func:`_forward_kernel`,
one program per (direction, batch, head, block of value columns), the two directions side by
side in one launch):

    S <- S * exp(a)[None, :]   (arriving at token t: a_t walking forward, a_{t+1} in reverse)
    F_t = q_t^T S + (q_t . k_t) v_t,   S <- S + k_t v_t^T     (forward, inclusive)
    B_t = q_t^T S,                     S <- S + k_t v_t^T     (reverse, strict)

with the state ``S [K, BV]`` in float32 registers. Each column's decay multiplies its state
column once per token, so every factor is in [0, 1] (any log-decay, e.g. -20 per token, is
exact to rounding, with no exponent of a difference of cumulative sums) and nothing per chunk
is stored. Why a token walk and not chunks: with a decay per value column the within-chunk
part is C^2 V masks and no matmul (the chunked kernels this replaced ran 4.5 ms forward and
13.4 ms forward + backward at ListOps' shape on an H100, where prefix walks of the per-chunk
states alone took a third of the training step), while a head's state is small (``K x V``,
16 x 32 in the LRA models), so one token costs a few hundred register operations per program.

Backward, with ``do = dL/dy`` and ``P_ij = sum_v do_iv M_ijv v_jv``:

    dq_i = sum_j P_ij k_j,   dk_j = sum_i P_ij q_i,   dv_jv = sum_i s_ij M_ijv do_iv,
    dA_t = do_t * (F_t - B_t) - v_t * (dvF_t - dvB_t),   d log_decay = reverse cumsum of dA,

where ``dvF`` sums the queries ``i >= t`` and ``dvB`` those ``i < t`` (the diagonal's terms
cancel in dA, whose query and key parts both hold it). One launch (:func:`_backward_kernel`)
walks both ways with two states each, ``k (x) v`` for dq and ``q (x) do`` for dk and dv: the
forward walk takes the ``j <= i`` pairs for dq and the ``i < j`` pairs for dk and dv, the
reverse walk the other halves. The residuals are the inputs and ``F``, ``B`` (``O(L d)``).
dq and dk come from each direction and block of value columns separately and are summed in
XLA. Everything is float32 (16-bit inputs are widened on load); the cotangent stays float32.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.chunk_scan import _next_pow2, _pad_axis, reverse_cumsum

_FLOATS = (jnp.float32, jnp.bfloat16, jnp.float16)
# Value columns per program: 16 gives ListOps' normalised heads ([v | 1], 32 columns) two
# programs per direction and head, so B * H * 4 programs walk at once.
BLOCK_V = 16
# Tokens a loop step of the walks: their loads are issued together (L is zero-padded to a
# multiple; the padding adds nothing to any state).
UNROLL = 4


def walk_inputs_reason(q, k, v, max_k):
    """Why the token walks (this module's and ``lion_walk.py``'s) cannot take q, k, v: ranks,
    dtypes, head dims (K up to ``max_k``, V up to 256) and matching shapes; or None."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim != 4:
            return f"{name} must be [B, L, H, D]; got shape {x.shape}"
        if x.dtype not in _FLOATS:
            return f"{name} must be float32, bfloat16 or float16; got {x.dtype}"
    if not 1 <= q.shape[-1] <= max_k:
        return f"q and k head dim must be in [1, {max_k}]; got {q.shape[-1]}"
    if not 1 <= v.shape[-1] <= 256:
        return f"v head dim must be in [1, 256]; got {v.shape[-1]}"
    if k.shape != q.shape or v.shape[:3] != q.shape[:3]:
        return f"q, k must be [B, L, H, K] and v [B, L, H, V] alike; got {q.shape}, {k.shape}, {v.shape}"
    return None


def unsupported_reason(q, k, v, log_decay):
    """Why :func:`lion_value_decay` cannot take these inputs, or None when it can."""
    reason = walk_inputs_reason(q, k, v, max_k=128)
    if reason is not None:
        return reason
    if log_decay is None or log_decay.shape != v.shape:
        got = None if log_decay is None else log_decay.shape
        return f"log_decay must be [B, L, H, V] = {v.shape} (a decay per value feature); got {got}"
    return None


def _layout(q, v):
    """``(Kp, BV, Vp)``: K padded to a power of two, V to a multiple of the V-block."""
    kp = _next_pow2(max(q.shape[-1], 4))
    bv = min(BLOCK_V, _next_pow2(max(v.shape[-1], 4)))
    return kp, bv, -(-v.shape[-1] // bv) * bv


def _params(kp, bv):
    """One warp per 256 state entries (one state), at most 4."""
    return pltriton.CompilerParams(num_warps=max(1, min(4, kp * bv // 256)), num_stages=2)


def _walk(length):
    """``(forward, token(step), decay_token(t))`` of this program's direction (grid axis 0:
    0 forward, 1 reverse): ``forward`` 1.0 or 0.0, the token at ``step``, and the token whose
    log-decay the state takes on arriving at ``t`` (``t`` walking forward; ``t + 1`` in
    reverse, clamped at the end, where the state is still zero). Integer arithmetic, no
    selects: Triton takes no boolean operands in these products."""
    rev = pl.program_id(0)

    def token(step):
        return step + rev * (length - 1 - 2 * step)

    def decay_token(t):
        return t + rev * (jnp.minimum(t + 1, length - 1) - t)
    return (1 - rev).astype(jnp.float32), token, decay_token


def _forward_kernel(q_ref, k_ref, v_ref, g_ref, o_ref, *, length):
    """One (direction, b, h, V-block): q, k ``[L, Kp]``; v, g, o ``[L, BV]``. Forward: o = F
    (inclusive), reverse: o = B (strict). ``UNROLL`` tokens a loop step, their loads first."""
    f32 = jnp.float32
    forward, token, decay_token = _walk(length)
    kp, bv = k_ref.shape[-1], v_ref.shape[-1]

    def step(i, state):
        ts = [token(i * UNROLL + u) for u in range(UNROLL)]
        loaded = [(q_ref[t, :].astype(f32), k_ref[t, :].astype(f32), v_ref[t, :].astype(f32),
                   jnp.exp(g_ref[decay_token(t), :])[None, :]) for t in ts]
        for t, (q, k, v, decay) in zip(ts, loaded):
            state = state * decay
            o_ref[t, :] = jnp.sum(q[:, None] * state, axis=0) + forward * jnp.sum(q * k) * v
            state = state + k[:, None] * v[None, :]
        return state

    jax.lax.fori_loop(0, length // UNROLL, step, jnp.zeros((kp, bv), f32))


def _backward_kernel(q_ref, k_ref, v_ref, do_ref, g_ref, dq_ref, dk_ref, dv_ref, *, length):
    """One (direction, b, h, V-block): q, k, dq, dk ``[L, Kp]`` (this V-block's share of dq,
    dk); v, do, g, dv ``[L, BV]``. Forward walk: dq from the keys ``j <= t``, dk and dv from
    the queries ``i < t``; reverse walk: dq from ``j > t``, dk and dv from ``i >= t``."""
    f32 = jnp.float32
    forward, token, decay_token = _walk(length)
    kp, bv = k_ref.shape[-1], v_ref.shape[-1]

    def step(i, states):
        s_kv, s_qo = states
        ts = [token(i * UNROLL + u) for u in range(UNROLL)]
        loaded = [(q_ref[t, :].astype(f32), k_ref[t, :].astype(f32), v_ref[t, :].astype(f32),
                   do_ref[t, :].astype(f32), jnp.exp(g_ref[decay_token(t), :])[None, :])
                  for t in ts]
        for t, (q, k, v, do, decay) in zip(ts, loaded):
            s_kv, s_qo = s_kv * decay, s_qo * decay
            do_v = jnp.sum(do * v)  # the diagonal: dq's walking forward, dk's, dv's in reverse
            dq_ref[t, :] = jnp.sum(s_kv * do[None, :], axis=1) + forward * do_v * k
            dk_ref[t, :] = jnp.sum(s_qo * v[None, :], axis=1) + (1.0 - forward) * do_v * q
            dv_ref[t, :] = (jnp.sum(k[:, None] * s_qo, axis=0)
                            + (1.0 - forward) * jnp.sum(q * k) * do)
            s_kv, s_qo = s_kv + k[:, None] * v[None, :], s_qo + q[:, None] * do[None, :]
        return s_kv, s_qo

    zeros = jnp.zeros((kp, bv), f32)
    jax.lax.fori_loop(0, length // UNROLL, step, (zeros, zeros))


def _specs(L, kp, bv):
    """Block specs of a (direction, b, h, V-block j) grid over ``[B, L, H, D]`` arrays: whole
    rows of q, k; V-block columns; per-direction results ``[2, B, L, H, .]`` (dq and dk with
    one ``Kp`` block per V-block)."""
    rows = pl.BlockSpec((None, L, None, kp), lambda e, b, h, j: (b, 0, h, 0))
    cols = pl.BlockSpec((None, L, None, bv), lambda e, b, h, j: (b, 0, h, j))
    out_rows = pl.BlockSpec((None, None, L, None, kp), lambda e, b, h, j: (e, b, 0, h, j))
    out_cols = pl.BlockSpec((None, None, L, None, bv), lambda e, b, h, j: (e, b, 0, h, j))
    return rows, cols, out_rows, out_cols


def _directions(q, k, v, g, interpret):
    """Padded inputs (K = Kp, V = Vp) -> ``[2, B, L, H, Vp]`` float32: ``F`` and ``B``."""
    B, L, H, kp = q.shape
    _, bv, vp = _layout(q, v)
    rows, cols, _, out_cols = _specs(L, kp, bv)
    return pl.pallas_call(
        functools.partial(_forward_kernel, length=L), grid=(2, B, H, vp // bv),
        in_specs=[rows, rows, cols, cols], out_specs=out_cols,
        out_shape=jax.ShapeDtypeStruct((2, B, L, H, vp), jnp.float32),
        compiler_params=_params(kp, bv), interpret=interpret, name="lion_value_decay_scan",
    )(q, k, v, g)


def _gradients(q, k, v, do, g, interpret):
    """Padded inputs -> ``(dq, dk [B, L, H, Kp], dvB, dvF [B, L, H, Vp])`` float32."""
    B, L, H, kp = q.shape
    _, bv, vp = _layout(q, v)
    blocks = vp // bv
    rows, cols, out_rows, out_cols = _specs(L, kp, bv)
    dq, dk, dv = pl.pallas_call(
        functools.partial(_backward_kernel, length=L), grid=(2, B, H, blocks),
        in_specs=[rows, rows, cols, cols, cols], out_specs=[out_rows, out_rows, out_cols],
        out_shape=[jax.ShapeDtypeStruct((2, B, L, H, blocks * kp), jnp.float32)] * 2
        + [jax.ShapeDtypeStruct((2, B, L, H, vp), jnp.float32)],
        compiler_params=_params(kp, bv), interpret=interpret, name="lion_value_decay_grads",
    )(q, k, v, do, g)
    fold = lambda x: x.reshape(2, B, L, H, blocks, kp).sum(axis=(0, 4))  # noqa: E731
    return fold(dq), fold(dk), dv[0], dv[1]


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _lion(q, k, v, g, interpret):
    return jnp.sum(_directions(q, k, v, g, interpret), axis=0)


def _lion_fwd(q, k, v, g, interpret):
    both = _directions(q, k, v, g, interpret)
    return both[0] + both[1], (q, k, v, g, both)


def _lion_bwd(interpret, residuals, dy):
    q, k, v, g, (forward, backward) = residuals
    dq, dk, dv_b, dv_f = _gradients(q, k, v, dy, g, interpret)
    dA = dy * (forward - backward) - v.astype(jnp.float32) * (dv_f - dv_b)
    return (dq.astype(q.dtype), dk.astype(k.dtype), (dv_b + dv_f).astype(v.dtype),
            reverse_cumsum(dA).astype(g.dtype))


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
    L, V = v.shape[1], v.shape[-1]
    kp, _, vp = _layout(q, v)
    lp = -(-L // UNROLL) * UNROLL
    pad = lambda x, d: _pad_axis(_pad_axis(x, 1, lp), 3, d)  # noqa: E731  exact: zeros
    y = _lion(pad(q, kp), pad(k, kp), pad(v, vp), pad(log_decay.astype(jnp.float32), vp),
              bool(interpret))
    return y[:, :L, :, :V]
