"""Fused backward pass of causal chunked linear attention with per-token decay.

With ``A = cumsum(log_decay)``, ``M_ij = exp(A_i - A_j)`` for ``i >= j``, the forward pass
``y_i = sum_{j <= i} (q_i . k_j) M_ij v_j + exp(A_i) S0^T q_i`` and its final state ``S_T``,
the gradients for output cotangent ``do`` and final-state cotangent ``dS_T`` are

    dq_i = sum_{j <= i} (do_i . v_j) M_ij k_j + exp(A_i) S0 do_i
    dk_j = sum_{i >= j} (do_i . v_j) M_ij q_i + exp(A_T - A_j) dS_T v_j
    dv_j = sum_{i >= j} (q_i . k_j) M_ij do_i + exp(A_T - A_j) dS_T^T k_j
    dlog_decay_t = sum_{i >= t > j} P_ij,   P_ij = (q_i . k_j)(do_i . v_j) M_ij,
    dS0 = exp(A_T) dS_T + sum_i exp(A_i) q_i do_i^T

(in dlog_decay, S0 counts as keys before the first token and dS_T as queries after the last:
every pair whose decay spans token t). That equals the reverse cumsum of
``q_t . dq_t - k_t . dk_t``, but those terms are O(1) and cancel: in bf16 their rounding,
summed over L, gave relative errors up to 1.4e-2; the pair sums below stay relative to the
result.

Chunked: the forward states ``h[n]`` of ``(k, v)`` from S0 (kept from the forward pass, or
recomputed by ``two_pass.chunk_states``), one states launch for the reverse states ``dh[n]``
of ``(q, do)`` from ``dS_T`` (every chunk after n), then one kernel per chunk that reads q, k,
v, do once and computes all of dq, dk, dv and dlog_decay (FLA's ``chunk_bwd_dqkwg`` structure
for dq, dk, dv, written from the equations above):

    P = (Q K^T) * D,  dP = (dO V^T) * D,  D_ij = exp(seg_ij) for i >= j, else 0
    dQ = dP K + (dO h^T) * exp(head)
    dK = dP^T Q + (V dh^T) * exp(tail)
    dV = P^T dO + (K dh) * exp(tail)
    dlog_decay = crossing_sums(before=rowsum(K * (V dh^T) exp(tail)),
                               after=rowsum(Q * (dO h^T) exp(head)) + pair_balance(X))
                 + exp(sum(a)) <h, dh>,     X = (Q K^T) * (dO V^T) * D below the diagonal

(float32; ``chunk_scan.crossing_sums``: pairs with one end in the chunk, pairs inside it, and
the keys before and queries after the chunk, through its whole decay: the kernel writes
``rowsum(h * dh)`` from the state tiles it holds, ``chunk_scan.spread_through`` decays and
spreads their sums in XLA, so no XLA pass reads the state arrays again). Measured on an H200
(B4 H16 bf16, L = 16K, states kept): the backward took 0.97 ms at D = 64 (0.77 with the
reverse cumsum) and 1.79 ms at D = 128 (2.59: computing the inter terms one at a time also
freed registers).

Eight matmuls per chunk instead of twelve in three separate scans, one read of the inputs, and
one serial state walk (two when the forward states are recomputed) instead of three. The
program holds full ``[Kp, Vp]`` tiles, so this path takes head dims up to ``MAX_DIM``; larger
ones use the three-scan backward. The per-chunk kernel is Triton, or on Hopper at Kp = Vp = 64
the same math as a Mosaic GPU kernel (``mosaic_causal_backward.py``, ``grads``).
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.chunk_scan import (crossing_sums, intra_decay, pad_state, pair_balance,
                                       spread_through)
from pallas_kernels.mosaic_causal_backward import grads_mosaic, takes_mosaic
from pallas_kernels.mosaic_causal_backward import supported as mosaic_grads_reason
from pallas_kernels.two_pass import backward_layout

MAX_DIM = 128
# float32 tiles take twice the shared memory: at head dims 96/80 the float32 kernel asked for
# 272 KiB of the H100's 227 (measured), so float32 takes head dims up to 64.
MAX_DIM_F32 = 64
# Rows of the state tiles per slice of the gradients kernel's rowsum(h * dh).
INNER_ROWS = 32


def _grads_kernel(q_ref, k_ref, v_ref, do_ref, g_ref, h_ref, dh_ref, dq_ref, dk_ref, dv_ref,
                  dg_ref, inner_ref, *, precision):
    """One (b, h, n): q, k, dq, dk ``[C, Kp]``; v, do, dv ``[C, Vp]``; g, dg ``[C]``;
    h, dh ``[Kp, Vp]`` (forward state entering the chunk, reverse state leaving it); dg the
    chunk's d log_decay but the pairs spanning the whole chunk (``chunk_scan.crossing_sums``);
    inner ``[Kp]`` float32, ``rowsum(h * dh)``, for those pairs (``chunk_scan.spread_through``)
    from the tiles the kernel holds, in slices of ``INNER_ROWS`` rows (fewer registers than
    the whole tile at Kp = 128)."""
    q, k, v, do = q_ref[...], k_ref[...], v_ref[...], do_ref[...]
    dtype, f32 = q.dtype, jnp.float32
    a = g_ref[...].astype(f32)
    decay, head, tail = intra_decay(a, reverse=False, strict=False)
    dot = functools.partial(pltriton.dot, precision=precision)
    scores, grad_w = dot(q, k, trans_b=True), dot(do, v, trans_b=True)  # before the mask
    idx = jnp.arange(a.shape[0])
    after = pair_balance(jnp.where(idx[:, None] > idx[None, :], scores * grad_w * decay, 0.0))
    p, dp = (scores * decay).astype(dtype), (grad_w * decay).astype(dtype)
    tail_w = jnp.exp(tail)[:, None]
    dq_inter = dot(do, h_ref[...], trans_b=True) * jnp.exp(head)[:, None]  # keys before
    after = after + jnp.sum(q.astype(f32) * dq_inter, axis=1)
    dq_ref[...] = (dot(dp, k) + dq_inter).astype(dq_ref.dtype)
    dh = dh_ref[...]
    dk_inter = dot(v, dh, trans_b=True) * tail_w  # queries after the chunk
    before = jnp.sum(k.astype(f32) * dk_inter, axis=1)
    dk_ref[...] = (dot(dp, q, trans_a=True) + dk_inter).astype(dk_ref.dtype)
    dv_ref[...] = (dot(p, do, trans_a=True) + dot(k, dh) * tail_w).astype(dv_ref.dtype)
    dg_ref[...] = crossing_sums(before, after)
    rows = min(INNER_ROWS, h_ref.shape[0])
    for start in range(0, h_ref.shape[0], rows):
        part = pl.ds(start, rows)
        inner_ref[part] = jnp.sum(h_ref[part, :].astype(f32) * dh_ref[part, :].astype(f32),
                                  axis=1)


def supported(k_dim, v_dim, dtype):
    """Whether the fused backward takes these head dims and dtype (else use the three-scan
    backward): up to ``MAX_DIM`` for 16-bit inputs, ``MAX_DIM_F32`` for float32."""
    return max(k_dim, v_dim) <= (MAX_DIM_F32 if dtype == jnp.float32 else MAX_DIM)


@functools.partial(jax.jit, static_argnames=("chunk", "interpret", "num_warps", "num_stages",
                                             "splits", "backend", "grads"))
def causal_backward(q, k, v, log_decay, initial_state, dy, d_state, h=None, *,
                    chunk=64, interpret=False, num_warps=None, num_stages=2, splits=None,
                    backend=None, grads="auto"):
    """Gradients of the causal scan (see the module docstring).

    Args:
      q, k: ``[B, L, H, K]``; v, dy: ``[B, L, H, V]``, one dtype; L a multiple of ``chunk``.
      log_decay: ``[B, L, H]`` float32, entries ``<= 0``.
      initial_state: None or ``[B, H, K, V]`` float32; d_state: ``[B, H, K, V]`` float32, the
        cotangent of the forward's final state.
      h: None or the forward's states entering every chunk, ``[B, H, N, Kp, Vp]`` in the input
        dtype and tile layout (``chunk_scan_two_pass(..., return_states=True)``); None:
        recomputed here.
      chunk, interpret, num_stages: as for ``chunk_scan``; num_warps: of the gradients kernel
        (None: ``two_pass.BACKWARD_WARPS``); splits, backend: as for
        ``two_pass.chunk_states`` (backend: the states walks' kernel).
      grads: the gradients kernel: "auto" (the Mosaic GPU kernel of
        ``mosaic_causal_backward.py`` where the walks run on Mosaic GPU and it takes the
        inputs, else Triton), "mosaic" (a ValueError with the reason where it cannot) or
        "triton".
    Returns:
      ``(dq, dk, dv, dlog_decay [B, L, H] float32, dS0 [B, H, K, V] float32 or None)``;
      dq, dk, dv in the input dtype.
    """
    B, L, H, K = q.shape
    V = v.shape[-1]
    q, k, v, do, g, kp, vp, precision, params, states = backward_layout(
        q, k, v, dy, log_decay, max_dim=MAX_DIM, chunk=chunk, interpret=interpret,
        num_warps=num_warps, num_stages=num_stages, splits=splits, backend=backend)
    if h is None:
        h, _ = states(k, v, s0=pad_state(initial_state, kp, vp), reverse=False)
    elif h.shape != (B, H, L // chunk, kp, vp):
        raise ValueError(f"h must be [B, H, N, Kp, Vp] = {(B, H, L // chunk, kp, vp)}; "
                         f"got {h.shape}")
    dh, ds0 = states(q, do, s0=pad_state(d_state, kp, vp), reverse=True)
    ds0 = None if initial_state is None else ds0[:, :, :K, :V]
    if takes_mosaic(grads, mosaic_grads_reason(q, v, chunk), k, v, chunk=chunk, backend=backend,
                    interpret=interpret):
        dq, dk, dv, dlog_decay = grads_mosaic(
            q, k, v, do, g, h, dh, chunk=chunk,
            interpret=plgpu.InterpretGPUParams() if interpret else None)
    else:
        dq, dk, dv, dlog_decay, inner = _triton_grads(q, k, v, do, g, h, dh, chunk=chunk,
                                                      precision=precision, params=params,
                                                      interpret=interpret)
        dlog_decay = dlog_decay + spread_through(inner, g, chunk)
    return dq[..., :K], dk[..., :K], dv[..., :V], dlog_decay, ds0


def _triton_grads(q, k, v, do, g, h, dh, *, chunk, precision, params, interpret):
    """The Triton gradients kernel over every chunk: ``(dq, dk, dv, dlog_decay, inner)``, the
    gradients padded as the inputs, dlog_decay without the pairs spanning a whole chunk,
    inner ``[B, H, N]`` float32 their ``<h, dh>`` per chunk."""
    B, L, H, _ = q.shape
    kp, vp = q.shape[-1], v.shape[-1]
    dtype = q.dtype
    qk_spec = pl.BlockSpec((None, chunk, None, kp), lambda b, h, n: (b, n, h, 0))
    v_spec = pl.BlockSpec((None, chunk, None, vp), lambda b, h, n: (b, n, h, 0))
    row_spec = pl.BlockSpec((None, chunk, None), lambda b, h, n: (b, n, h))
    h_spec = pl.BlockSpec((None, None, None, kp, vp), lambda b, h, n: (b, h, n, 0, 0))
    inner_spec = pl.BlockSpec((None, None, kp), lambda b, h, n: (b, h, n))
    N = L // chunk
    dq, dk, dv, dlog_decay, inner = pl.pallas_call(
        functools.partial(_grads_kernel, precision=precision),
        grid=(B, H, N),
        in_specs=[qk_spec, qk_spec, v_spec, v_spec, row_spec, h_spec, h_spec],
        out_specs=[qk_spec, qk_spec, v_spec, row_spec, inner_spec],
        out_shape=[jax.ShapeDtypeStruct(q.shape, dtype), jax.ShapeDtypeStruct(k.shape, dtype),
                   jax.ShapeDtypeStruct(v.shape, dtype),
                   jax.ShapeDtypeStruct((B, L, H), jnp.float32),
                   jax.ShapeDtypeStruct((B, H, N * kp), jnp.float32)],
        compiler_params=params, interpret=interpret, name="causal_backward",
    )(q, k, v, do, g, h, dh)
    return dq, dk, dv, dlog_decay, jnp.sum(inner.reshape(B, H, N, kp), axis=-1)
