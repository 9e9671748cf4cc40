"""The per-feature causal op's gradients on bf16 operands, chunk-parallel (GLA's chunk form),
with d log_decay decomposed so that no sum cancels across chunks.

The op (``linear_attention.causal_linear_attention`` with ``log_decay [B, L, H, K]``):
``y_i = sum_{j <= i} q_i^T diag(exp(A_i - A_j)) k_j v_j^T + q_i^T diag(exp(A_i)) S0``. With
``b`` the chunk-local inclusive cumsum of the log-decays (float32), ``b_C`` its value at the
chunk's end, ``S_n`` the state entering chunk n (``S0`` for the first) and ``D_n`` the
queries' state leaving it (``sum_{i > end} diag(exp(A_i - A_end)) q_i dy_i^T``, plus the
decayed cotangent of the final state), each chunk's gradients are products of its own tiles::

    qt = q e^b,  kt = k e^-b,  kg = k e^(b_C - b)         (rounded to the input dtype)
    M = tril(dy v^T),  P = tril(qt kt^T)                  (rounded to the input dtype)
    dq = e^b (M kt + dy S^T),   dk = e^-b (M^T qt) + e^(b_C - b) (v D^T),
    dv = P^T dy + kg D

and d log_decay per key feature, the sum over the pairs ``j < t <= i`` that the decay of
token ``t`` spans, as four sums of which only the first cancels, and only between products of
the same rounded tiles::

    d log_decay_t = sum_{s >= t} (qt dqt - kt dkt)_s          pairs inside the chunk
                  + sum_{s >= t} (qt (dy S^T))_s               keys before the chunk
                  + sum_{s < t} (kg (v D^T))_s                 queries after it
                  + e^(b_C) rowsum(S * D)                      keys before, queries after

(``dqt = M kt``, ``dkt = M^T qt``; the sums run over the chunk's tokens s). The kernel sums the
first three within the chunk (one float32 cumsum over its tokens) and writes the fourth's row
sums; XLA adds that to every token of the chunk. The two walks that give S and D run over the
chunks as the forward's does (``per_feature.chunk_states_per_feature``; D in reverse, from the
last chunk, with no flip of the tokens), and S and D are rounded to the input dtype for the
products. S is the forward's own where the op kept it (``states``: the three passes' chunk
states, ``linear_attention._causal_fwd``), so only D's walk remains.

Why: the scans' form (``linear_attention._per_feature_bwd``) takes ``q . dq - k . dk`` of
whole-sequence gradients and a chunk-end correction, whose terms cancel across chunks; on
16-bit operands its d log_decay misses the bf16 bound (5e-3), so it runs its scans on float32
operands. Emulated in float64 with bf16 rounding where a kernel rounds (`python -m
experiments.dlog_decay_forms`, 2026-12-06: L 512 and 1024, K = V = 32 and 64, log-decays
uniform in [-0.1, 0] to [-1.2, 0]), d log_decay's relative error was 5.1e-3 to 9.5e-3 in the
scans' form and 2.8e-3 to 2.9e-3 in this one, as in this kernel (docs/benchmarks.md).

Bounded chunks only: ``e^-b`` needs every feature's log-decays over a chunk to sum to at least
``-per_feature.FAST_RANGE`` (20), so that the factors stay within ``e^+-20``;
:func:`per_feature.mild_chunks` says whether they do, and the op keeps its scans otherwise. bfloat16
inputs only: ``e^-b`` up to ``e^20`` is beyond float16's range (65504), and float32 inputs
keep the scans' exact float32 products.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.chunk_scan import _next_pow2
from pallas_kernels.per_feature import chunk_states_per_feature

# Warps per program, and K features per program: a wider Kp splits into K-blocks, one program
# each, every program computing its block's dq, dk and d log_decay and its part of dv (``p``
# and ``kg D`` sum over K), the parts summed in float32 by XLA. Why: the whole [C, Kp] tiles of
# one program exceed the 255 registers a thread has and spill (ptxas, sm_90a, on the CPU,
# 2026-12-07: ``python -m experiments.ptx_resources --kernels per_feature_grads --variant
# ...``, docs/benchmarks.md): at D 128, 5,566 bytes of spill stores per thread with 4 warps and
# one block, 140 with 8 warps in blocks of 64, none in blocks of 32. In interleaved A/Bs on one
# H100 (2026-12-07, B 4, H 16, L 4K, bf16, the op's forward + backward; docs/benchmarks.md,
# "Per-feature decay's settings") blocks of 64 with 8 warps took D 128 from 5.51-5.64 ms (one
# block, 4 warps) to 2.89-2.98, against 3.30-3.32 for one block with 8 warps and 3.42 for
# blocks of 32; at D 64 (one block either way) 8 warps took 1.044 ms against 1.049-1.064 with 4,
# and blocks of 32 1.306 (`python -m experiments.ab_settings --op pallas_causal_per_feature
# --length 4096 --dims 128 --pass fwd+bwd --variant
# w4:per_feature_grads.BLOCK_K=128,per_feature_grads.NUM_WARPS=4`). BLOCK_K: a power of two
# >= 16.
NUM_WARPS = 8
BLOCK_K = 64


def _kernel(q_ref, k_ref, v_ref, dy_ref, g_ref, s_ref, d_ref, dq_ref, dk_ref, dv_ref, dg_ref,
            cross_ref):
    """One (b, n, h, K-block): the chunk's gradients, d log_decay's first three sums (``dg``;
    module docstring) and the fourth's inner products (``cross``); tiles ``[C, BK]``, ``[C,
    Vp]`` (``g``: the chunk's float32 log-decays, of which ``b`` is the cumsum), states ``[BK,
    Vp]``. dv is this K-block's part (``p`` and ``kg D`` of its features; the whole dv where
    one block holds every feature)."""
    f32 = jnp.float32
    dtype = q_ref.dtype
    q, k = q_ref[...].astype(f32), k_ref[...].astype(f32)
    v, dy = v_ref[...], dy_ref[...]
    b = jnp.cumsum(g_ref[...], axis=0)
    C = b.shape[0]
    rows = jnp.arange(C)[:, None]
    # b's last row, exactly (a sum of g could round otherwise: e^(last - b) is 1 at the end)
    last = jnp.sum(jnp.where(rows == C - 1, b, 0.0), axis=0, keepdims=True)
    qt = (q * jnp.exp(b)).astype(dtype)
    kt = (k * jnp.exp(-b)).astype(dtype)
    kg = (k * jnp.exp(last - b)).astype(dtype)
    causal = jnp.arange(C)[:, None] >= jnp.arange(C)[None, :]
    m = jnp.where(causal, pltriton.dot(dy, v, trans_b=True), 0.0).astype(dtype)
    p = jnp.where(causal, pltriton.dot(qt, kt, trans_b=True), 0.0).astype(dtype)
    s, d = s_ref[...], d_ref[...]
    dqt = pltriton.dot(m, kt)
    dkt = pltriton.dot(m, qt, trans_a=True)
    q_inter = pltriton.dot(dy, s, trans_b=True)
    k_inter = pltriton.dot(v, d, trans_b=True)
    dq_ref[...] = (jnp.exp(b) * (dqt + q_inter)).astype(dq_ref.dtype)
    dk_ref[...] = (jnp.exp(-b) * dkt + jnp.exp(last - b) * k_inter).astype(dk_ref.dtype)
    dv_ref[...] = (pltriton.dot(p, dy, trans_a=True) + pltriton.dot(kg, d)).astype(dv_ref.dtype)
    qt, kt, kg = qt.astype(f32), kt.astype(f32), kg.astype(f32)
    suffix_terms = qt * dqt - kt * dkt + qt * q_inter  # summed over s >= t
    prefix_terms = kg * k_inter  # summed over s < t
    # both sums from one inclusive cumsum (Triton has no reverse one): sum_{s >= t} x_s =
    # total(x) - cumsum(x)_t + x_t and sum_{s < t} y_s = cumsum(y)_t - y_t
    dg_ref[...] = (jnp.sum(suffix_terms, axis=0, keepdims=True) + suffix_terms - prefix_terms
                   + jnp.cumsum(prefix_terms - suffix_terms, axis=0))
    cross_ref[...] = jnp.exp(last) * jnp.sum(s.astype(f32) * d.astype(f32), axis=1)[None]


def _pad_last(x, width):
    """``x`` with its last axis zero-padded to ``width``."""
    return jnp.pad(x, ((0, 0),) * (x.ndim - 1) + ((0, width - x.shape[-1]),))


@functools.partial(jax.jit, static_argnames=("chunk", "interpret"))
def per_feature_grads(q, k, v, g, s0, dy, d_state, *, chunk, interpret, states=None):
    """Gradients of the per-feature causal op (module docstring) for bounded chunks.

    Args:
      q, k: ``[B, L, H, K]``; v, dy: ``[B, L, H, V]``; bfloat16; L a multiple of ``chunk``.
      g: ``[B, L, H, K]`` float32 log-decays (every chunk mild: ``per_feature.mild_chunks``).
      s0: None or the initial state ``[B, H, K, V]``; d_state: the final state's cotangent
        ``[B, H, K, V]`` (zeros when it has none).
      states: None, or the forward's state entering each chunk ``[B, H, N, K, V]`` (float32 or
        the input dtype; the products take them rounded to it): the forward walk is skipped.
    Returns:
      ``(dq, dk, dv, d log_decay, d s0 or None)``: dq, dk, dv in the input dtype, d log_decay
      and d s0 float32.
    """
    B, L, H, K = q.shape
    V = v.shape[-1]
    C, N = chunk, L // chunk
    dtype = q.dtype
    kp, vp = _next_pow2(max(K, 16)), _next_pow2(max(V, 16))
    if states is None:
        states, _ = chunk_states_per_feature(k, v, g, s0, chunk=C, interpret=interpret)
    # the queries' states leaving each chunk (D_n), by the reverse walk of (q, dy); its end
    # state is d s0
    leaving, first = chunk_states_per_feature(q, dy, g, d_state, chunk=C, interpret=interpret,
                                              reverse=True)
    ds0 = None if s0 is None else first
    q, k, g_padded = (_pad_last(x, kp) for x in (q, k, g))
    v, dy = (_pad_last(x, vp) for x in (v, dy))
    s, d = (jnp.pad(x.astype(dtype), ((0, 0),) * 3 + ((0, kp - K), (0, vp - V)))
            for x in (states, leaving))
    if BLOCK_K < 16 or BLOCK_K & (BLOCK_K - 1):
        raise ValueError(f"per_feature_grads.BLOCK_K must be a power of two >= 16 (Triton "
                         f"tiles); got {BLOCK_K}")
    bk = min(BLOCK_K, kp)
    nk = kp // bk
    tok_k = pl.BlockSpec((None, C, None, bk), lambda b, n, h, j: (b, n, h, j))
    tok_v = pl.BlockSpec((None, C, None, vp), lambda b, n, h, j: (b, n, h, 0))
    state = pl.BlockSpec((None, None, None, bk, vp), lambda b, n, h, j: (b, h, n, j, 0))
    row = pl.BlockSpec((None, None, 1, bk), lambda b, n, h, j: (b, h, n, j))
    # dv whole where one program holds every feature, else each K-block's float32 part
    dv_part = ((v.shape, dtype, tok_v) if nk == 1 else
               ((nk, *v.shape), jnp.float32,
                pl.BlockSpec((None, None, C, None, vp), lambda b, n, h, j: (j, b, n, h, 0))))
    outs = [(q.shape, dtype, tok_k), (k.shape, dtype, tok_k), dv_part,
            (q.shape, jnp.float32, tok_k), ((B, H, N, kp), jnp.float32, row)]
    dq, dk, dv, dg, cross = pl.pallas_call(
        _kernel, grid=(B, N, H, nk),
        in_specs=[tok_k, tok_k, tok_v, tok_v, tok_k, state, state],
        out_specs=[spec for _, _, spec in outs],
        out_shape=[jax.ShapeDtypeStruct(shape, dt) for shape, dt, _ in outs],
        compiler_params=pltriton.CompilerParams(num_warps=NUM_WARPS, num_stages=1),
        interpret=interpret, name="per_feature_grads")(q, k, v, dy, g_padded, s, d)
    if nk > 1:
        dv = dv.sum(axis=0).astype(dtype)
    d_log_decay = (dg[..., :K].reshape(B, N, C, H, K)
                   + jnp.swapaxes(cross[..., :K], 1, 2)[:, :, None])
    return (dq[..., :K], dk[..., :K], dv[..., :V], d_log_decay.reshape(B, L, H, K), ds0)
