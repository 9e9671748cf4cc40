"""The causal chunked forward pass with per-feature decay as one Pallas Mosaic GPU kernel
(Hopper, sm_90).

Same math as ``per_feature.chunk_scan_per_feature`` (forward, key decay, not strict), in GLA's
one-product form: for chunk n with chunk-local inclusive cumulative log-decays ``b [C, Kp]``
(``b_i = sum_{s <= i} g_s`` per key feature, float32), the state ``S`` entering the chunk and
``b_last`` the chunk's last row,

    W = (Q e^b)(K e^-b)^T [i >= j]                                 [C, C]
    O = W V + (Q e^b) S                                            [C, BV]
    S <- diag(e^(b_last)) S + (K e^(b_last - b))^T V

The caller checks that every chunk's log-decays sum to at least ``-ONE_PRODUCT_RANGE`` in every
feature (``per_feature.chunk_scan_per_feature(fused=True)``, ``lax.cond`` between this kernel
and the three passes), so every factor lies within ``e^+-20``: bf16 inputs only (``e^20`` is
outside fp16's range).

Why one kernel: the three passes store every chunk's state in HBM (``L Kp Vp / C`` entries)
and read them back in the output pass. Here the program that walks the chunks also computes
their outputs, so the state stays in registers and reaches HBM only when the backward pass
asks for it (``store_states``).

Kernel layout: one program (one warpgroup) per (b, h, V-block j of ``BLOCK_V`` columns, run r
of chunks; one run unless ``splits``, each starting from the state the caller gives it)
walks its chunks with a TMA pipeline (``plgpu.emit_pipeline``) over q, k ``[C, Kp]``, v
``[C, BV]``, the float32 tile b ``[C, Kp]`` and the row ``b_last``. Per chunk: the state is
rounded to the input dtype into a shared-memory tile (the B operand of ``(Q e^b) S``, and the
chunk's stored state); the decayed queries and keys ``Q e^b``, ``K e^-b`` overwrite q and k in
shared memory; one wgmma computes their product, masked causally in registers into the W tile;
the keys become ``K e^(b_last - b)``; then one accumulator takes ``W V + (Q e^b) S`` and a
second, zeroed one ``(K e^(b_last - b))^T V`` (K read transposed from shared memory), and
``S = diag(e^(b_last)) S + update`` is the only serial work. y (and the stored state) go out by
TMA from two steps' worth of buffers, each step's copies overlapping the next step.

Rounding: the state is multiplied in the input dtype, W and the decayed keys and queries are
rounded to it (the update's keys twice: ``K e^-b``, then times ``e^(b_last)``), products
accumulate in float32.

Per-token decay (``g [B, L, H]``) has its one-kernel forward in ``mosaic_causal_warps.py``
(warp-specialized, in runs of chunks); it shares this module's layout checks
(:func:`layout_reason`) and constants.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.mosaic_states import SMEM_BYTES, _TILE16, _TILE32
from pallas_kernels.mosaic_tiles import (COLS, ROWS, WGMMA, cols_of, compiler_params, rows_of,
                                        tile_iota)

# V columns per program (the state is [Kp, BLOCK_V] float32 in registers).
BLOCK_V = 64
# Pipeline steps in flight (chunks loaded ahead of the one computed, plus that one).
STAGES = 2
CHUNK = 64
# Chunks whose log-decays sum to at least -ONE_PRODUCT_RANGE (in every feature) take the
# one-product form (Q e^b)(K e^-b)^T: factors within e^+-20, far inside bf16's range (fp16's
# 65504 is not: fp16 inputs take the three passes). ``per_feature.FAST_RANGE`` is this bound:
# its Triton kernels take the same form for the same chunks.
ONE_PRODUCT_RANGE = 20.0


def _smem_bytes(chunk, kp, bv, itemsize, stages):
    """Shared memory of the walk: ``stages`` pipeline steps of inputs (16-bit q, k, v tiles, the
    float32 ``[C, Kp]`` tile b and its last row), the two steps of y and state buffers and the W
    tile. (The float32 state tile of the first and last state is scoped apart, before and
    after.)"""
    step = (2 * chunk * kp + chunk * bv) * itemsize + 4 * (chunk * kp + kp)
    buffers = 2 * (chunk * bv + kp * bv) * itemsize + chunk * chunk * itemsize
    return max(stages * step + buffers, 4 * kp * bv)


def layout_reason(q, v, chunk, kernel, smem, instead="the two-pass kernels"):
    """Why a Mosaic GPU chunk kernel (``kernel``, its name in the message; ``instead``, what
    takes other inputs) does not take these padded inputs, or None: 16-bit, Kp 64 or 128, Vp
    a multiple of ``BLOCK_V``, chunks of ``CHUNK``, and ``smem`` (bytes, with ``4096`` to
    spare) within ``SMEM_BYTES``."""
    if q.dtype not in (jnp.bfloat16, jnp.float16) or v.dtype != q.dtype:
        return (f"the {kernel} takes bf16 or fp16 inputs (got {q.dtype}, {v.dtype}); use "
                f"{instead}")
    kp, vp, L = q.shape[-1], v.shape[-1], q.shape[1]
    if kp % 64 or kp > 128 or vp % BLOCK_V:
        return (f"the {kernel} needs Kp = 64 or 128 and Vp a multiple of {BLOCK_V} (got "
                f"Kp={kp}, Vp={vp})")
    if chunk != CHUNK or L % chunk:
        return f"the {kernel} takes chunks of {CHUNK} dividing L (got {chunk}, L={L})"
    if smem + 4096 > SMEM_BYTES:
        return (f"the {kernel} at Kp = {kp} needs {smem + 4096} bytes of shared memory (at "
                f"most {SMEM_BYTES})")
    return None


def supported(q, v, chunk=CHUNK, stages=STAGES):
    """None when :func:`causal_forward_mosaic` takes these (padded) inputs, else why."""
    if q.dtype != jnp.bfloat16:
        return (f"the fused Mosaic causal forward with per-feature decay takes bf16 inputs "
                f"(exp(-b) up to e^20 leaves fp16's range; got {q.dtype})")
    smem = _smem_bytes(chunk, q.shape[-1], BLOCK_V, q.dtype.itemsize, stages)
    return layout_reason(q, v, chunk, f"fused Mosaic causal forward with {stages} stages", smem)


def _kernel(q_ref, k_ref, v_ref, b_ref, last_ref, s0_ref, *refs, chunk, run, bv, stages,
            store):
    """One (b, h, V-block j, run r) program over chunks ``r * run ... (r + 1) * run - 1``.

    q, k ``[B, L, H, Kp]``; v ``[B, L, H, Vp]``; ``b_ref [B, L, H, Kp]`` float32, the
    chunk-local inclusive cumulative log-decays b, and ``last_ref [B, H, N * Kp]``, b at each
    chunk's last token; s0 ``[B, H, R, Kp, Vp]`` float32 (the state entering each run) or None
    (zero); outputs y ``[B, L, H, Vp]``, h ``[B, H, N, Kp, Vp]`` (the state entering every
    chunk, in the input dtype; ``store``), ends ``[B, H, R, Kp, Vp]`` float32.
    """
    refs = list(refs)
    y_ref = refs.pop(0)
    h_ref = refs.pop(0) if store else None
    end_ref = refs.pop(0)
    b, hd, j, r = (lax.axis_index(a) for a in "bhjr")
    cols = pl.ds(j * bv, bv)
    first = r * run
    kp = q_ref.shape[-1]
    dtype = q_ref.dtype
    f32 = jnp.float32
    state_smem = plgpu.SMEM((kp, bv), f32, transforms=_TILE32)

    if s0_ref is None:
        state = plgpu.layout_cast(jnp.zeros((kp, bv), f32), WGMMA)
    else:
        def load_s0(s_smem, s_bar):
            plgpu.copy_gmem_to_smem(s0_ref.at[b, hd, r, :, cols], s_smem, s_bar.at[0])
            plgpu.barrier_wait(s_bar.at[0])
            return plgpu.load(s_smem, layout=WGMMA)

        state = pl.run_scoped(load_s0, state_smem, plgpu.Barrier(num_barriers=1))

    def scores(q_s, k_s):
        def mma(acc):
            plgpu.wgmma(acc, q_s, k_s.transpose((1, 0)))
            return acc[...]

        return pl.run_scoped(mma, plgpu.ACC((chunk, chunk), f32))

    def scale(x_s, factor):
        """x_s *= factor(x) in float32, rounded back to the input dtype."""
        x = plgpu.load(x_s, layout=WGMMA).astype(f32)
        x_s[...] = (x * factor(x)).astype(dtype)

    def walk(y_buf, h_buf, w_s):
        causal = tile_iota((chunk, chunk), 0) >= tile_iota((chunk, chunk), 1)

        def feature_decay(q_s, k_s, b_s, last_s):
            """Q e^b into q_s, K e^-b into k_s, W = (Q e^b)(K e^-b)^T masked into w_s, then
            K e^(b_last - b) into k_s; returns exp(b_last) on the state's rows."""
            scale(q_s, lambda x: jnp.exp(plgpu.load(b_s, layout=WGMMA)))
            scale(k_s, lambda x: jnp.exp(-plgpu.load(b_s, layout=WGMMA)))
            plgpu.commit_smem()
            w_s[...] = jnp.where(causal, scores(q_s, k_s), 0.0).astype(dtype)
            # K e^-b is done with: the keys of the state update
            scale(k_s, lambda x: cols_of(jnp.exp(plgpu.load(last_s, layout=COLS)), x.shape))
            return rows_of(jnp.exp(plgpu.load(last_s, layout=ROWS)), (kp, bv))

        def step(idx, q_s, k_s, v_s, b_s, last_s, state):
            slot = lax.rem(idx[0], jnp.asarray(2, idx[0].dtype))
            n = first + idx[0]
            plgpu.wait_smem_to_gmem(1, wait_read_only=True)  # this slot's copies of n - 2 read
            y_s, h_s = y_buf.at[slot], h_buf.at[slot]
            h_s[...] = state.astype(dtype)  # the state entering chunk n
            decay = feature_decay(q_s, k_s, b_s, last_s)
            plgpu.commit_smem()  # visible to the wgmmas

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

        tile = lambda width, tiling=_TILE16: plgpu.BlockSpec(
            (chunk, width), lambda i: (first + i, 0), transforms=tiling)
        specs = [tile(kp), tile(kp), tile(bv), tile(kp, _TILE32),
                 plgpu.BlockSpec((kp,), lambda i: (first + i,))]
        in_refs = [q_ref.at[b, :, hd, :], k_ref.at[b, :, hd, :], v_ref.at[b, :, hd, cols],
                   b_ref.at[b, :, hd, :], last_ref.at[b, hd]]
        end = plgpu.emit_pipeline(step, grid=(run,), in_specs=specs,
                                  max_concurrent_steps=stages, init_carry=state)(*in_refs)
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # before the buffers are reused
        return end

    state = pl.run_scoped(walk, plgpu.SMEM((2, chunk, bv), dtype, transforms=_TILE16),
                          plgpu.SMEM((2, kp, bv), dtype, transforms=_TILE16),
                          plgpu.SMEM((chunk, chunk), dtype, transforms=_TILE16))

    def store_end(s_smem):
        s_smem[...] = state
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(s_smem, end_ref.at[b, hd, r, :, cols])
        plgpu.wait_smem_to_gmem(0)

    pl.run_scoped(store_end, state_smem)


def causal_forward_mosaic(q, k, v, g, s0=None, *, chunk=CHUNK, splits=1, store_states=False,
                          stages=STAGES, interpret=None):
    """The causal forward pass (not strict, key decay) of padded inputs in one Mosaic GPU
    kernel.

    Args:
      q, k: ``[B, L, H, Kp]``; v: ``[B, L, H, Vp]``, bf16, padded as ``chunk_scan.pad_layout``
        pads them (see :func:`supported`), L a multiple of ``chunk``.
      g: float32 log-decays per key feature ``[B, L, H, Kp]`` (entries <= 0), every chunk's
        summing to at least ``-ONE_PRODUCT_RANGE`` in every feature, which the caller checks
        (the kernel takes them in GLA's one-product form, ``exp(-b)`` up to ``e^20``).
      s0: None or ``[B, H, Kp, Vp]`` float32, the state before the first token; with
        ``splits`` > 1 the state entering each run, ``[B, H, splits, Kp, Vp]``.
      splits: runs to cut the chunks into (dividing N), one program each.
      store_states: also return the state entering every chunk (the backward's residual).
      stages: pipeline steps in flight.
      interpret: None, or ``plgpu.InterpretGPUParams()`` to run the Mosaic GPU interpreter.
    Returns:
      ``(y [B, L, H, Vp] q.dtype, final [B, H, Kp, Vp] float32)``, then with
      ``store_states`` ``h [B, H, N, Kp, Vp]`` q.dtype.
    """
    if g.shape != q.shape:
        raise ValueError(f"the fused Mosaic causal forward takes per-feature log-decays "
                         f"[B, L, H, Kp] = {q.shape} (got {g.shape}); per-token decay: "
                         f"mosaic_causal_warps.causal_forward_warps")
    if (reason := supported(q, v, chunk, stages)) is not None:
        raise ValueError(reason)
    B, L, H, kp = q.shape
    vp = v.shape[-1]
    N = L // chunk
    if splits < 1 or N % splits:
        raise ValueError(f"splits must divide the number of chunks {N}; got {splits}")
    if splits > 1 and (s0 is None or s0.shape != (B, H, splits, kp, vp)):
        got = None if s0 is None else s0.shape
        raise ValueError(f"with splits={splits}, s0 must be the state entering each run, "
                         f"[B, H, splits, Kp, Vp] = {(B, H, splits, kp, vp)}; got {got}")
    if splits == 1 and s0 is not None:
        s0 = s0[:, :, None]
    # b: chunk-local inclusive cumsums per feature; and b at each chunk's end
    b = jnp.cumsum(g.reshape(B, N, chunk, H, kp), axis=2)
    last = b[:, :, -1].transpose(0, 2, 1, 3).reshape(B, H, N * kp)
    out_type = [jax.ShapeDtypeStruct((B, L, H, vp), q.dtype)]
    if store_states:
        out_type.append(jax.ShapeDtypeStruct((B, H, N, kp, vp), q.dtype))
    out_type.append(jax.ShapeDtypeStruct((B, H, splits, kp, vp), jnp.float32))
    y, *rest = plgpu.kernel(
        functools.partial(_kernel, chunk=chunk, run=N // splits, bv=BLOCK_V, stages=stages,
                          store=store_states),
        out_type=tuple(out_type), grid=(B, H, vp // BLOCK_V, splits), grid_names=tuple("bhjr"),
        interpret=interpret, compiler_params=compiler_params(),
    )(q, k, v, b.reshape(B, L, H, kp), last, s0)
    final = rest[-1][:, :, -1]
    return (y, final, rest[0]) if store_states else (y, final)
