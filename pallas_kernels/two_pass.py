"""Chunk-parallel form of :func:`pallas_kernels.chunk_scan` (the "chunk state" structure).

Same inputs, outputs and math as the sequential kernel (``chunk_scan.py``), computed in three
launches so that every chunk is a program of its own instead of one program walking them all:

    A. chunk states (parallel over B, H, chunks N, V-blocks):
         U_n = (K_n * exp(tail))^T V_n          [reverse: K_n * exp(head)]       [Kp, BV] f32
    B. prefix states (sequential over N, parallel over B, H, V-blocks; elementwise only):
         S_in[n] = S;  S = exp(sum_{s in n} a_s) S + U_n     (n = 0..N-1, reverse: N-1..0)
       S starts at the initial state and ends as the final state; S_in is written over U.
    C. outputs (parallel over B, H, N, V-blocks): ``chunk_output`` with the entering S_in[n].

The states entering each chunk, ``[B, H, N, Kp, Vp]`` float32 (O(L d^2 / C)), live only inside
one call: the custom VJPs keep the inputs as residuals (O(L d)) and the backward scans compute
their own states again. Decay exponents are chunk-local and summed directly (``chunk_decays``).

:func:`prefix_states` (pass B) is shared with the per-feature-decay kernels (``per_feature.py``).
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.chunk_scan import _pad_axis, chunk_output, chunk_update, pad_layout


def _states_kernel(k_ref, v_ref, g_ref, u_ref, *, reverse, precision):
    """Pass A, one (b, h, n, V-block): k ``[C, Kp]``, v ``[C, BV]``, g ``[C]`` -> u [Kp, BV]."""
    a = g_ref[...].astype(jnp.float32)
    u_ref[...] = chunk_update(k_ref[...], v_ref[...], a, reverse=reverse, precision=precision)


def _prefix_kernel(u_ref, d_ref, s0_ref, s_in_ref, s_ref, *, num_chunks, reverse):
    """Pass B, one (b, h, V-block): u, s_in ``[N, Kp, BV]`` (aliased); d ``[N, dk, dv]`` chunk
    decay factors with dk in {1, Kp}, dv in {1, BV}; s0, s ``[Kp, BV]`` (s0_ref may be None)."""
    def body(step, state):
        n = num_chunks - 1 - step if reverse else step
        update = u_ref[n]
        s_in_ref[n] = state
        return d_ref[n] * state + update

    state = (jnp.zeros(s_ref.shape, jnp.float32) if s0_ref is None
             else s0_ref[...].astype(jnp.float32))
    s_ref[...] = jax.lax.fori_loop(0, num_chunks, body, state)


def prefix_states(u, decay, initial_state, *, reverse, block_v, interpret, num_warps=4):
    """Pass B: the state entering each chunk and the final state.

    Args:
      u: ``[B, H, N, Kp, Vp]`` float32 chunk contributions (Vp a multiple of block_v).
      decay: ``[B, H, N, dk, dv]`` float32 factor each chunk multiplies the state by
        (``exp`` of its summed log-decays), dk in {1, Kp} and dv in {1, Vp}.
      initial_state: None or ``[B, H, Kp, Vp]`` float32.
      reverse: walk the chunks from the last one.
    Returns:
      ``(s_in [B, H, N, Kp, Vp], final [B, H, Kp, Vp])`` float32; s_in reuses u's buffer.
    """
    B, H, N, kp, vp = u.shape
    dk, dv = decay.shape[-2:]
    bv = min(block_v, vp)
    chunks_spec = pl.BlockSpec((None, None, N, kp, bv), lambda b, h, j: (b, h, 0, 0, j))
    decay_spec = pl.BlockSpec((None, None, N, dk, dv if dv == 1 else bv),
                              lambda b, h, j: (b, h, 0, 0, 0 if dv == 1 else j))
    state_spec = pl.BlockSpec((None, None, kp, bv), lambda b, h, j: (b, h, 0, j))
    kernel = functools.partial(_prefix_kernel, num_chunks=N, reverse=reverse)
    return pl.pallas_call(
        kernel,
        grid=(B, H, vp // bv),
        in_specs=[chunks_spec, decay_spec, None if initial_state is None else state_spec],
        out_specs=[chunks_spec, state_spec],
        out_shape=[jax.ShapeDtypeStruct(u.shape, jnp.float32),
                   jax.ShapeDtypeStruct((B, H, kp, vp), jnp.float32)],
        input_output_aliases={0: 0},
        compiler_params=pltriton.CompilerParams(num_warps=num_warps, num_stages=1),
        interpret=interpret,
        name="prefix_states",
    )(u, decay, initial_state)


def _output_kernel(q_ref, k_ref, v_ref, g_ref, s_ref, o_ref, *, reverse, strict, precision):
    """Pass C, one (b, h, n, V-block): q, k ``[C, Kp]``, v, o ``[C, BV]``, g ``[C]``,
    s ``[Kp, BV]`` (the state entering the chunk)."""
    a = g_ref[...].astype(jnp.float32)
    out = chunk_output(q_ref[...], k_ref[...], v_ref[...], a, s_ref[...], reverse=reverse,
                       strict=strict, precision=precision)
    o_ref[...] = out.astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("reverse", "strict", "chunk", "block_v",
                                             "out_dtype", "interpret", "num_warps",
                                             "num_stages"))
def chunk_scan_two_pass(q, k, v, log_decay, initial_state=None, *, reverse=False, strict=False,
                        chunk=64, block_v=64, out_dtype=jnp.float32, interpret=False,
                        num_warps=None, num_stages=2):
    """:func:`pallas_kernels.chunk_scan` computed chunk-parallel (same arguments and results).

    Args:
      q, k: ``[B, L, H, K]``; v: ``[B, L, H, V]``, one dtype; L a multiple of ``chunk``.
      log_decay: ``[B, L, H]``, entries ``<= 0``; initial_state: None or ``[B, H, K, V]``.
      reverse, strict, chunk, block_v, out_dtype, interpret, num_warps, num_stages: as there.
    Returns:
      ``(o [B, L, H, V] out_dtype, state [B, H, K, V] float32)``.
    """
    B, L, H, K = q.shape
    V = v.shape[-1]
    N = L // chunk
    q, k, v, kp, bv, vp, precision, params = pad_layout(q, k, v, block_v, num_warps, num_stages)
    g = log_decay.astype(jnp.float32)
    grid = (B, H, N, vp // bv)
    qk_spec = pl.BlockSpec((None, chunk, None, kp), lambda b, h, n, j: (b, n, h, 0))
    v_spec = pl.BlockSpec((None, chunk, None, bv), lambda b, h, n, j: (b, n, h, j))
    g_spec = pl.BlockSpec((None, chunk, None), lambda b, h, n, j: (b, n, h))
    state_spec = pl.BlockSpec((None, None, None, kp, bv), lambda b, h, n, j: (b, h, n, 0, j))

    u = pl.pallas_call(
        functools.partial(_states_kernel, reverse=reverse, precision=precision),
        grid=grid, in_specs=[qk_spec, v_spec, g_spec], out_specs=state_spec,
        out_shape=jax.ShapeDtypeStruct((B, H, N, kp, vp), jnp.float32),
        compiler_params=params, interpret=interpret, name="chunk_states",
    )(k, v, g)
    # Chunk decay factors exp(sum of the chunk's log-decays) [B, H, N, 1, 1].
    decay = jnp.exp(jnp.sum(g.reshape(B, N, chunk, H), axis=2)).transpose(0, 2, 1)
    s0 = None
    if initial_state is not None:
        s0 = _pad_axis(_pad_axis(initial_state.astype(jnp.float32), 2, kp), 3, vp)
    s_in, state = prefix_states(u, decay[..., None, None], s0, reverse=reverse, block_v=bv,
                                interpret=interpret)
    o = pl.pallas_call(
        functools.partial(_output_kernel, reverse=reverse, strict=strict, precision=precision),
        grid=grid, in_specs=[qk_spec, qk_spec, v_spec, g_spec, state_spec], out_specs=v_spec,
        out_shape=jax.ShapeDtypeStruct((B, L, H, vp), out_dtype),
        compiler_params=params, interpret=interpret, name="chunk_outputs",
    )(q, k, v, g, s_in)
    return o[..., :V], state[:, :, :K, :V]
