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

Segments. A walk is sequential over its L tokens, one program per (direction, batch, head,
V-block). With ``segment > 0`` each direction's walk is cut into segments of at most that
many tokens (:func:`segment_layout`), walked side by side: a first launch walks every segment
from a zero state and keeps only its end state and the sum of the log-decays it applied
(``E_s``, ``a_s``: :func:`_segment_ends_kernel`); XLA chains them by an associative scan over
the segments, ``S_0 = 0``, ``S_{s+1} = S_s * exp(a_s) + E_s`` (the state entering segment
s + 1, exact to rounding: the walk is linear in its state and the decays scale it column by
column); the output walks then start each segment from its ``S_s``. The sequential depth
drops from L tokens to about ``2 * segment`` for about 1.5x the work, which pays where the
walks are bound by their length rather than by the GPU's throughput (``SEGMENT``).

Backward, with ``do = dL/dy`` and ``P_ij = sum_v do_iv M_ijv v_jv``:

    dq_i = sum_j P_ij k_j,   dk_j = sum_i P_ij q_i,   dv_jv = sum_i s_ij M_ijv do_iv,
    dA_t = do_t * (F_t - B_t) - v_t * (dvF_t - dvB_t),   d log_decay = reverse cumsum of dA,

where ``dvF`` sums the queries ``i >= t`` and ``dvB`` those ``i < t`` (the diagonal's terms
cancel in dA, whose query and key parts both hold it). One launch (:func:`_backward_kernel`)
walks both ways with two states each, ``k (x) v`` for dq and ``q (x) do`` for dk and dv: the
forward walk takes the ``j <= i`` pairs for dq and the ``i < j`` pairs for dk and dv, the
reverse walk the other halves (with segments, both states enter each segment from the same
chain). The residuals are the inputs and ``F``, ``B`` (``O(L d)``).
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
# Tokens a walk takes at most before the next segment's walk takes over (module docstring);
# 0: one walk over all L. At ListOps' shape (800 walks a direction) one walk is fastest: segments
# of 64-512 took forward 1.37-1.40 ms against 1.04, forward + backward 3.97-4.08 against 3.99
# (one H200, 2026-11-29, ``experiments.bench_value_decay --segments 0,64,128,256,512``).
# Segments are for few long walks (small B x H, long L).
SEGMENT = 0


def segment_layout(length, segment):
    """``(segments, tokens per segment)`` for a walk over ``length`` tokens with at most
    ``segment`` tokens per segment (``segment`` <= 0: one segment); the tokens per segment are
    a multiple of ``UNROLL`` and their product (>= length) is the padded length."""
    count = 1 if segment <= 0 else max(1, -(-length // segment))
    per = -(-length // (count * UNROLL)) * UNROLL
    return count, per


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
        return (f"q, k must be [B, L, H, K] and v [B, L, H, V] alike; got {q.shape}, {k.shape}, "
                f"{v.shape}")
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


def _walk(length, per):
    """``(forward, tokens(i), decay_token(t))`` of this program's direction (grid axis 0:
    0 forward, 1 reverse) and segment (grid axis 4, ``per`` walk steps each): ``forward`` 1.0
    or 0.0; the ``UNROLL`` tokens of the segment's loop step ``i``; the token whose log-decay
    the state takes on arriving at ``t`` (``t`` walking forward; ``t + 1`` in reverse, clamped
    at the end, where the state is still zero). Integer arithmetic, no selects: Triton takes no
    boolean operands in these products."""
    rev = pl.program_id(0)
    first = pl.program_id(4) * per

    def tokens(i):
        steps = [first + i * UNROLL + u for u in range(UNROLL)]
        return [step + rev * (length - 1 - 2 * step) for step in steps]

    def decay_token(t):
        return t + rev * (jnp.minimum(t + 1, length - 1) - t)
    return (1 - rev).astype(jnp.float32), tokens, decay_token


def _start(s0_ref, shape):
    """The state entering this program's segment: ``s0_ref`` ``[Kp, BV]``, or zero (None)."""
    return jnp.zeros(shape, jnp.float32) if s0_ref is None else s0_ref[...]


def _segment_ends_kernel(*refs, length, per, states):
    """One (direction, b, h, V-block, segment), walking from zero: ``states`` pairs of refs
    ``(left [L, Kp], right [L, BV])`` whose end states ``sum_t decay * left_t right_t^T`` go to
    the first ``states`` output refs ``[Kp, BV]``; g ``[L, BV]``; the last output ``[BV]`` the
    log-decays the walk applied, summed."""
    f32 = jnp.float32
    pairs = [refs[2 * n: 2 * n + 2] for n in range(states)]
    g_ref, out_refs = refs[2 * states], refs[2 * states + 1:]
    _, tokens, decay_token = _walk(length, per)
    kp, bv = out_refs[0].shape

    def step(i, carry):
        ends, total = carry
        loaded = [([(left[t, :].astype(f32), right[t, :].astype(f32)) for left, right in pairs],
                   g_ref[decay_token(t), :]) for t in tokens(i)]
        for rows, a in loaded:
            decay = jnp.exp(a)[None, :]
            ends = tuple(e * decay + l[:, None] * r[None, :] for e, (l, r) in zip(ends, rows))
            total = total + a
        return ends, total

    zeros = jnp.zeros((kp, bv), f32)
    ends, total = jax.lax.fori_loop(0, per // UNROLL, step,
                                    ((zeros,) * states, jnp.zeros((bv,), f32)))
    for ref, end in zip(out_refs, ends + (total,)):
        ref[...] = end


def _forward_kernel(q_ref, k_ref, v_ref, g_ref, s0_ref, o_ref, *, length, per):
    """One (direction, b, h, V-block, segment): q, k ``[L, Kp]``; v, g, o ``[L, BV]``; s0
    ``[Kp, BV]`` the state entering the segment (None: zero). Forward: o = F (inclusive),
    reverse: o = B (strict). ``UNROLL`` tokens a loop step, their loads first."""
    f32 = jnp.float32
    forward, tokens, decay_token = _walk(length, per)
    kp, bv = k_ref.shape[-1], v_ref.shape[-1]

    def step(i, state):
        ts = tokens(i)
        loaded = [(q_ref[t, :].astype(f32), k_ref[t, :].astype(f32), v_ref[t, :].astype(f32),
                   jnp.exp(g_ref[decay_token(t), :])[None, :]) for t in ts]
        for t, (q, k, v, decay) in zip(ts, loaded):
            state = state * decay
            o_ref[t, :] = jnp.sum(q[:, None] * state, axis=0) + forward * jnp.sum(q * k) * v
            state = state + k[:, None] * v[None, :]
        return state

    jax.lax.fori_loop(0, per // UNROLL, step, _start(s0_ref, (kp, bv)))


def _backward_kernel(q_ref, k_ref, v_ref, do_ref, g_ref, s0_kv_ref, s0_qo_ref, dq_ref, dk_ref,
                     dv_ref, *, length, per):
    """One (direction, b, h, V-block, segment): q, k, dq, dk ``[L, Kp]`` (this V-block's share
    of dq, dk); v, do, g, dv ``[L, BV]``; s0_kv, s0_qo ``[Kp, BV]`` the two states entering the
    segment (None: zero). Forward walk: dq from the keys ``j <= t``, dk and dv from the
    queries ``i < t``; reverse walk: dq from ``j > t``, dk and dv from ``i >= t``."""
    f32 = jnp.float32
    forward, tokens, decay_token = _walk(length, per)
    kp, bv = k_ref.shape[-1], v_ref.shape[-1]

    def step(i, states):
        s_kv, s_qo = states
        ts = tokens(i)
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

    jax.lax.fori_loop(0, per // UNROLL, step,
                      (_start(s0_kv_ref, (kp, bv)), _start(s0_qo_ref, (kp, bv))))


def _specs(L, kp, bv):
    """Block specs of a (direction, b, h, V-block j, segment) grid over ``[B, L, H, D]``
    arrays: whole rows of q, k; V-block columns; per-direction results ``[2, B, L, H, .]``
    (dq and dk with one ``Kp`` block per V-block); the segments' states
    ``[2, B, H, segments, Kp, Vp]`` and log-decay sums ``[2, B, H, segments, Vp]``."""
    rows = pl.BlockSpec((None, L, None, kp), lambda e, b, h, j, s: (b, 0, h, 0))
    cols = pl.BlockSpec((None, L, None, bv), lambda e, b, h, j, s: (b, 0, h, j))
    out_rows = pl.BlockSpec((None, None, L, None, kp), lambda e, b, h, j, s: (e, b, 0, h, j))
    out_cols = pl.BlockSpec((None, None, L, None, bv), lambda e, b, h, j, s: (e, b, 0, h, j))
    state = pl.BlockSpec((None, None, None, None, kp, bv),
                         lambda e, b, h, j, s: (e, b, h, s, 0, j))
    total = pl.BlockSpec((None, None, None, None, bv), lambda e, b, h, j, s: (e, b, h, s, j))
    return rows, cols, out_rows, out_cols, state, total


def _grid(q, v, segments):
    B, L, H, _ = q.shape
    _, bv, vp = _layout(q, v)
    return (2, B, H, vp // bv, segments)


def _segment_starts(pairs, g, segments, interpret):
    """The states entering each segment (module docstring), one ``[2, B, H, segments, Kp,
    Vp]`` float32 per pair ``(left [B, L, H, Kp], right [B, L, H, Vp])`` of padded inputs
    (``sum left_t right_t^T`` walked with the decays of g); None each with one segment."""
    if segments == 1:
        return [None] * len(pairs)
    left, right = pairs[0]
    B, L, H, kp = left.shape
    vp = right.shape[-1]
    rows, cols, _, _, state, total = _specs(L, kp, _layout(left, right)[1])
    outs = pl.pallas_call(
        functools.partial(_segment_ends_kernel, length=L, per=L // segments, states=len(pairs)),
        grid=_grid(left, right, segments),
        in_specs=[rows, cols] * len(pairs) + [cols], out_specs=[state] * len(pairs) + [total],
        out_shape=[jax.ShapeDtypeStruct((2, B, H, segments, kp, vp), jnp.float32)] * len(pairs)
        + [jax.ShapeDtypeStruct((2, B, H, segments, vp), jnp.float32)],
        compiler_params=_params(kp, _layout(left, right)[1]), interpret=interpret,
        name="lion_value_decay_segment_ends",
    )(*[x for pair in pairs for x in pair], g)
    decay = jnp.exp(outs[-1])[..., None, :]  # [2, B, H, segments, 1, Vp]

    def chain(earlier, later):  # two runs of segments as one: (decay, end states...)
        return (earlier[0] * later[0],) + tuple(e * later[0] + x
                                                for e, x in zip(earlier[1:], later[1:]))
    ends = jax.lax.associative_scan(chain, (decay, *outs[:-1]), axis=3)[1:]
    return [jnp.concatenate([jnp.zeros_like(e[:, :, :, :1]), e[:, :, :, :-1]], axis=3)
            for e in ends]


def _directions(q, k, v, g, interpret, segments):
    """Padded inputs (K = Kp, V = Vp, L = segments x tokens per segment) ->
    ``[2, B, L, H, Vp]`` float32: ``F`` and ``B``."""
    B, L, H, kp = q.shape
    _, bv, vp = _layout(q, v)
    rows, cols, _, out_cols, state, _ = _specs(L, kp, bv)
    (s0,) = _segment_starts([(k, v)], g, segments, interpret)
    return pl.pallas_call(
        functools.partial(_forward_kernel, length=L, per=L // segments),
        grid=_grid(q, v, segments),
        in_specs=[rows, rows, cols, cols, None if s0 is None else state], out_specs=out_cols,
        out_shape=jax.ShapeDtypeStruct((2, B, L, H, vp), jnp.float32),
        compiler_params=_params(kp, bv), interpret=interpret, name="lion_value_decay_scan",
    )(q, k, v, g, s0)


def _gradients(q, k, v, do, g, interpret, segments):
    """Padded inputs -> ``(dq, dk [B, L, H, Kp], dvB, dvF [B, L, H, Vp])`` float32."""
    B, L, H, kp = q.shape
    _, bv, vp = _layout(q, v)
    blocks = vp // bv
    rows, cols, out_rows, out_cols, state, _ = _specs(L, kp, bv)
    s0_kv, s0_qo = _segment_starts([(k, v), (q, do)], g, segments, interpret)
    starts = [None if s0_kv is None else state] * 2
    dq, dk, dv = pl.pallas_call(
        functools.partial(_backward_kernel, length=L, per=L // segments),
        grid=_grid(q, v, segments),
        in_specs=[rows, rows, cols, cols, cols] + starts,
        out_specs=[out_rows, out_rows, out_cols],
        out_shape=[jax.ShapeDtypeStruct((2, B, L, H, blocks * kp), jnp.float32)] * 2
        + [jax.ShapeDtypeStruct((2, B, L, H, vp), jnp.float32)],
        compiler_params=_params(kp, bv), interpret=interpret, name="lion_value_decay_grads",
    )(q, k, v, do, g, s0_kv, s0_qo)
    fold = lambda x: x.reshape(2, B, L, H, blocks, kp).sum(axis=(0, 4))  # noqa: E731
    return fold(dq), fold(dk), dv[0], dv[1]


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _lion(q, k, v, g, interpret, segments):
    return jnp.sum(_directions(q, k, v, g, interpret, segments), axis=0)


def _lion_fwd(q, k, v, g, interpret, segments):
    both = _directions(q, k, v, g, interpret, segments)
    return both[0] + both[1], (q, k, v, g, both)


def _lion_bwd(interpret, segments, residuals, dy):
    q, k, v, g, (forward, backward) = residuals
    dq, dk, dv_b, dv_f = _gradients(q, k, v, dy, g, interpret, segments)
    dA = dy * (forward - backward) - v.astype(jnp.float32) * (dv_f - dv_b)
    return (dq.astype(q.dtype), dk.astype(k.dtype), (dv_b + dv_f).astype(v.dtype),
            reverse_cumsum(dA).astype(g.dtype))


_lion.defvjp(_lion_fwd, _lion_bwd)
# jitted with its static layout, so that a model's layers of one shape share one trace and
# one lowering of the kernels (pallas_kernels/__init__.py, "Lowered once")
_lion_once = jax.jit(_lion, static_argnums=(4, 5))


def lion_value_decay(q, k, v, log_decay, *, segment=None, interpret=None):
    """LION's numerator with a decay per value feature (see the module docstring), not SCALE-d.

    Args:
      q, k: ``[B, L, H, K]``; v: ``[B, L, H, V]``, one dtype (float32, bfloat16 or float16).
      log_decay: ``[B, L, H, V]``, entries ``<= 0`` (used in float32).
      segment: tokens a walk takes at most before the next segment's takes over (module
        docstring, :func:`segment_layout`); <= 0: one walk over all L; None: ``SEGMENT``,
        read at the call (``experiments.bench_value_decay --segments`` sets it).
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
    segments, per = segment_layout(L, SEGMENT if segment is None else int(segment))
    lp = segments * per
    pad = lambda x, d: _pad_axis(_pad_axis(x, 1, lp), 3, d)  # noqa: E731  exact: zeros
    y = _lion_once(pad(q, kp), pad(k, kp), pad(v, vp), pad(log_decay.astype(jnp.float32), vp),
                   bool(interpret), segments)
    return y[:, :L, :, :V]
