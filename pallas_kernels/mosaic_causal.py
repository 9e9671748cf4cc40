"""The causal chunked forward pass as one Pallas Mosaic GPU kernel (Hopper, sm_90).

Same math as ``two_pass.chunk_scan_two_pass`` (forward direction, not strict): for chunk n
with chunk-local inclusive cumulative log-decays ``A`` (``A_i = sum_{s <= i} a_s``, float32),
the state ``S`` entering the chunk and ``d = exp(A_last)``,

    W = (Q K^T) * exp(A_i - A_j) [i >= j]                          [C, C]
    O = W V + (Q * e^A) S                                          [C, BV]
    S <- d S + (K * e^tail)^T V,   e^tail_j = exp(sum_{s > j} a_s)

Why one kernel: the two-pass forward walks the chunks once to store every chunk's state in
HBM (``L Kp Vp / C`` entries) and reads them back in the output kernel. Here the program that
walks the chunks also computes their outputs, so the state stays in registers and reaches HBM
only when the backward pass asks for it (``store_states``).

Kernel layout: one program (one warpgroup) per (b, h, V-block j of ``BLOCK_V`` columns, run r)
walks the chunks of its run with a TMA pipeline (``plgpu.emit_pipeline``) over q, k
``[C, Kp]``, v ``[C, BV]`` and the rows of A, e^A and e^tail. Per chunk: the state is rounded to
the input dtype into a shared-memory tile (the B operand of ``(Q e^A) S``, and the chunk's
stored state); one wgmma computes ``Q K^T``; the mask is built in registers (A_j as A_i's tile
transposed through shared memory, as in ``mosaic_outputs.py``); the decayed queries and keys
overwrite q and k in shared memory; then one accumulator takes ``W V + (Q e^A) S`` and a
second, zeroed one ``(K e^tail)^T V`` (K read transposed from shared memory), and
``S = d S + update`` is the only serial work. y (and the stored state) go out by TMA from two
steps' worth of buffers, each step's copies overlapping the next step.

Rounding as the two-pass kernels: the state is multiplied in the input dtype, W and the
decayed keys and queries are rounded to it, products accumulate in float32. The mask's
exponent is a difference of the chunk cumsum (off by about ulp(|A|) <= 1.2e-4 at log-decay -20
per token, far below a 16-bit operand's 2^-9), so only 16-bit inputs are taken.

Runs: with few programs (``B H Vp / BLOCK_V`` below ``two_pass.MOSAIC_TARGET_PROGRAMS``) the
chunks are cut into ``splits`` runs: ``mosaic_states.walk_states`` walks each run from zero
keeping only its end state, ``chunk_scan.entering_states`` gives the state entering each run,
and this kernel starts each run from its state.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.chunk_scan import (decay_factors, entering_states, stacked_decay_factors)
from pallas_kernels.mosaic_states import SMEM_BYTES, _TILE16, _TILE32, walk_states

# V columns per program (the state is [Kp, BLOCK_V] float32 in registers).
BLOCK_V = 64
# Pipeline steps in flight (chunks loaded ahead of the one computed, plus that one).
STAGES = 2
CHUNK = 64


def _smem_bytes(chunk, kp, bv, itemsize, stages):
    """Shared memory of ``stages`` pipeline steps of inputs (16-bit q, k, v tiles and three
    float32 rows), the two steps of y and state buffers, the W tile, A's transposed tile and
    the float32 state tile of the first and last state."""
    step = (2 * chunk * kp + chunk * bv) * itemsize + 3 * 4 * chunk
    buffers = 2 * (chunk * bv + kp * bv) * itemsize + chunk * chunk * itemsize
    return stages * step + buffers + 4 * chunk * chunk + 4 * kp * bv


def supported(q, v, chunk=CHUNK, stages=STAGES):
    """None when :func:`causal_forward_mosaic` takes these (padded) inputs, else why."""
    if q.dtype not in (jnp.bfloat16, jnp.float16) or v.dtype != q.dtype:
        return (f"the fused Mosaic causal forward takes bf16 or fp16 inputs (got {q.dtype}, "
                f"{v.dtype}); use the two-pass kernels")
    kp, vp, L = q.shape[-1], v.shape[-1], q.shape[1]
    if kp % 64 or kp > 128 or vp % BLOCK_V:
        return (f"the fused Mosaic causal forward needs Kp = 64 or 128 and Vp a multiple of "
                f"{BLOCK_V} (got Kp={kp}, Vp={vp})")
    if chunk != CHUNK or L % chunk:
        return (f"the fused Mosaic causal forward takes chunks of {CHUNK} dividing L (got "
                f"{chunk}, L={L})")
    need = _smem_bytes(chunk, kp, BLOCK_V, q.dtype.itemsize, stages) + 4096  # + barriers
    if need > SMEM_BYTES:
        return (f"the fused Mosaic causal forward at Kp = {kp} with {stages} stages needs "
                f"{need} bytes of shared memory (at most {SMEM_BYTES})")
    return None


def _kernel(q_ref, k_ref, v_ref, rows_ref, s0_ref, *refs, chunk, run, bv, stages, store):
    """One (b, h, V-block j, run r) program over chunks ``r * run ... (r + 1) * run - 1``.

    q, k ``[B, L, H, Kp]``; v ``[B, L, H, Vp]``; rows ``[3, B, H, L]`` float32 (A, e^A,
    e^tail); s0 ``[B, H, R, Kp, Vp]`` float32 (the state entering each run) or None (zero);
    outputs y ``[B, L, H, Vp]``, h ``[B, H, N, Kp, Vp]`` (the state entering every chunk, in
    the input dtype; ``store``), ends ``[B, H, R, Kp, Vp]`` float32 (each run's end state).
    """
    refs = list(refs)
    y_ref = refs.pop(0)
    h_ref = refs.pop(0) if store else None
    end_ref = refs.pop(0)
    b, hd, j, r = (lax.axis_index(a) for a in "bhjr")
    cols = pl.ds(j * bv, bv)
    kp = q_ref.shape[-1]
    dtype = q_ref.dtype
    f32 = jnp.float32
    wgmma_layout = plgpu.Layout.WGMMA
    row_layout = wgmma_layout.reduce(1)
    rows_of = lambda x, shape: lax.broadcast_in_dim(x, shape, [0])  # x_i on row i
    state_smem = plgpu.SMEM((kp, bv), f32, transforms=_TILE32)
    first = r * run

    if s0_ref is None:
        state = plgpu.layout_cast(jnp.zeros((kp, bv), f32), wgmma_layout)
    else:
        def load_s0(s_smem, s_bar):
            plgpu.copy_gmem_to_smem(s0_ref.at[b, hd, r, :, cols], s_smem, s_bar.at[0])
            plgpu.barrier_wait(s_bar.at[0])
            return plgpu.load(s_smem, layout=wgmma_layout)

        state = pl.run_scoped(load_s0, state_smem, plgpu.Barrier(num_barriers=1))

    def walk(y_buf, h_buf, w_s, t_buf):
        causal = (plgpu.layout_cast(lax.broadcasted_iota(jnp.int32, (chunk, chunk), 0),
                                    wgmma_layout)
                  >= plgpu.layout_cast(lax.broadcasted_iota(jnp.int32, (chunk, chunk), 1),
                                       wgmma_layout))

        def step(idx, q_s, k_s, v_s, a_s, eh_s, et_s, state):
            n = first + idx[0]
            slot = lax.rem(idx[0], jnp.asarray(2, idx[0].dtype))
            plgpu.wait_smem_to_gmem(1, wait_read_only=True)  # this slot's copies of i - 2 read
            y_s, h_s = y_buf.at[slot], h_buf.at[slot]
            h_s[...] = state.astype(dtype)  # the state entering chunk n

            def scores(acc):
                plgpu.wgmma(acc, q_s, k_s.transpose((1, 0)))
                return acc[...]

            s = pl.run_scoped(scores, plgpu.ACC((chunk, chunk), f32))
            # A_i on row i, and A_j on column j as A_i's tile transposed through shared memory
            # (mosaic_outputs.py: Mosaic GPU, jax 0.11.2, takes no row- and column-indexed
            # broadcasts in one expression)
            a_i = rows_of(plgpu.load(a_s, layout=row_layout), s.shape)
            t_buf[...] = a_i
            plgpu.commit_smem()
            a_j = plgpu.layout_cast(plgpu.load(t_buf.T, layout=plgpu.Layout.WGMMA_TRANSPOSED),
                                    wgmma_layout)
            # exponents <= 0 where kept (A does not increase along the chunk)
            w = jnp.where(causal, s * jnp.exp(jnp.minimum(a_i - a_j, 0.0)), 0.0)
            w_s[...] = w.astype(dtype)
            # q, k are done with (Q K^T has been read): the decayed ones take their tiles, one
            # after the other (fewer registers live at Kp = 128)
            for x_s, factor_s in ((q_s, eh_s), (k_s, et_s)):
                x = plgpu.load(x_s, layout=wgmma_layout).astype(f32)
                factor = rows_of(plgpu.load(factor_s, layout=row_layout), x.shape)
                x_s[...] = (x * factor).astype(dtype)
            plgpu.commit_smem()  # visible to the wgmmas
            decay = eh_s[chunk - 1]  # exp(A_last): the chunk's decay

            def mma(acc_y, acc_s):
                plgpu.wgmma(acc_y, w_s, v_s)
                plgpu.wgmma(acc_y, q_s, h_s)
                plgpu.wgmma(acc_s, k_s.transpose((1, 0)), v_s)
                return acc_y[...], acc_s[...]

            y, update = pl.run_scoped(mma, plgpu.ACC((chunk, bv), f32), plgpu.ACC((kp, bv), f32))
            y_s[...] = y.astype(dtype)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(y_s, y_ref.at[b, pl.ds(n * chunk, chunk), hd, cols],
                                    commit_group=False)
            if store:
                plgpu.copy_smem_to_gmem(h_s, h_ref.at[b, hd, n, :, cols], commit_group=False)
            plgpu.commit_smem_to_gmem_group()
            return state * decay + update

        tile = lambda width: plgpu.BlockSpec((chunk, width), lambda i: (first + i, 0),
                                             transforms=_TILE16)
        row = plgpu.BlockSpec((chunk,), lambda i: (first + i,))
        in_refs = [q_ref.at[b, :, hd, :], k_ref.at[b, :, hd, :], v_ref.at[b, :, hd, cols]]
        in_refs += [rows_ref.at[x, b, hd] for x in range(3)]
        end = plgpu.emit_pipeline(step, grid=(run,), in_specs=[tile(kp), tile(kp), tile(bv)]
                                  + [row] * 3, max_concurrent_steps=stages,
                                  init_carry=state)(*in_refs)
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # before the buffers are reused
        return end

    state = pl.run_scoped(
        walk, plgpu.SMEM((2, chunk, bv), dtype, transforms=_TILE16),
        plgpu.SMEM((2, kp, bv), dtype, transforms=_TILE16),
        plgpu.SMEM((chunk, chunk), dtype, transforms=_TILE16),
        plgpu.SMEM((chunk, chunk), f32))

    def store_end(s_smem):
        s_smem[...] = state
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(s_smem, end_ref.at[b, hd, r, :, cols])
        plgpu.wait_smem_to_gmem(0)

    pl.run_scoped(store_end, state_smem)


def causal_forward_mosaic(q, k, v, g, s0=None, *, chunk=CHUNK, splits=1, store_states=False,
                          stages=STAGES, interpret=None):
    """The causal forward pass (not strict) of padded inputs in one Mosaic GPU kernel.

    Args:
      q, k: ``[B, L, H, Kp]``; v: ``[B, L, H, Vp]``, bf16 or fp16, padded as
        ``chunk_scan.pad_layout`` pads them (see :func:`supported`); g: ``[B, L, H]`` float32
        log-decays (entries <= 0), L a multiple of ``chunk``.
      s0: None or ``[B, H, Kp, Vp]`` float32, the state before the first token.
      splits: runs to cut the chunks into (a power of two dividing N; module docstring).
      store_states: also return the state entering every chunk (the backward's residual).
      stages: pipeline steps in flight.
      interpret: None, or ``plgpu.InterpretGPUParams()`` to run the Mosaic GPU interpreter.
    Returns:
      ``(y [B, L, H, Vp] q.dtype, final [B, H, Kp, Vp] float32)``, then with
      ``store_states`` ``h [B, H, N, Kp, Vp]`` q.dtype.
    """
    if (reason := supported(q, v, chunk, stages)) is not None:
        raise ValueError(reason)
    B, L, H, kp = q.shape
    vp = v.shape[-1]
    N, nvb = L // chunk, vp // BLOCK_V
    if splits < 1 or N % splits:
        raise ValueError(f"splits must divide the number of chunks {N}; got {splits}")
    if splits > 1:  # the state entering each run: the runs walked from zero, then scanned
        w, d = stacked_decay_factors(g, chunk, (False,))
        ends = walk_states(k, v, w, d, None, chunk=chunk, bv=BLOCK_V, splits=splits,
                           store=False, interpret=interpret)[0]
        s0 = entering_states(ends[0], d[0], s0, reverse=False)
    elif s0 is not None:
        s0 = s0[:, :, None]
    a = jnp.cumsum(jnp.swapaxes(g, 1, 2).reshape(B, H, N, chunk), axis=-1).reshape(B, H, L)
    rows = jnp.stack([a, jnp.exp(a), decay_factors(g, chunk, reverse=False)[0]])
    out_type = [jax.ShapeDtypeStruct((B, L, H, vp), q.dtype)]
    if store_states:
        out_type.append(jax.ShapeDtypeStruct((B, H, N, kp, vp), q.dtype))
    out_type.append(jax.ShapeDtypeStruct((B, H, splits, kp, vp), jnp.float32))
    kernel = plgpu.kernel(
        functools.partial(_kernel, chunk=chunk, run=N // splits, bv=BLOCK_V, stages=stages,
                          store=store_states),
        out_type=tuple(out_type), grid=(B, H, nvb, splits), grid_names=tuple("bhjr"),
        interpret=interpret,
    )
    y, *rest = kernel(q, k, v, rows, s0)
    final = rest[-1][:, :, -1]
    return (y, final, rest[0]) if store_states else (y, final)
