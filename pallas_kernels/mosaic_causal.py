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
transposed through shared memory, ``mosaic_tiles.row_and_column_tiles``); the decayed queries
and keys overwrite q and k in shared memory; then one accumulator takes ``W V + (Q e^A) S`` and a
second, zeroed one ``(K e^tail)^T V`` (K read transposed from shared memory), and
``S = d S + update`` is the only serial work. y (and the stored state) go out by TMA from two
steps' worth of buffers, each step's copies overlapping the next step.

Rounding as the two-pass kernels: the state is multiplied in the input dtype, W and the
decayed keys and queries are rounded to it, products accumulate in float32. The mask's
exponent is a difference of the chunk cumsum (off by about ulp(|A|) <= 1.2e-4 at log-decay -20
per token, far below a 16-bit operand's 2^-9), so only 16-bit inputs are taken.

The one-product form (GLA's): when every chunk's log-decays sum to at least
``-ONE_PRODUCT_RANGE`` (bf16 inputs; checked at run time, ``lax.cond`` between two builds of
the kernel), ``W = (Q e^A)(K e^-A)^T`` masked causally, every factor within ``e^+-20``: no
``C x C`` exponentials and no transposed tile, and ``Q e^A`` serves both products. The
update's keys are then ``(K e^-A) e^(A_last)``, rounded twice. Per-feature decay
(``g [B, L, H, Kp]``, bf16, the caller checking the same bound per feature) always takes this
form, with the chunk-local cumsums b per feature as a float32 ``[C, Kp]`` tile:
``W = (Q e^b)(K e^-b)^T``, ``S <- diag(e^(b_last)) S + (K e^(b_last - b))^T V``.

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

from pallas_kernels.chunk_scan import entering_states, mask_rows, stacked_decay_factors
from pallas_kernels.mosaic_states import SMEM_BYTES, _TILE16, _TILE32, walk_states
from pallas_kernels.mosaic_tiles import COLS, ROWS, WGMMA, cols_of, row_and_column_tiles, rows_of

# V columns per program (the state is [Kp, BLOCK_V] float32 in registers).
BLOCK_V = 64
# Pipeline steps in flight (chunks loaded ahead of the one computed, plus that one).
STAGES = 2
CHUNK = 64
# Chunks whose log-decays sum to at least -ONE_PRODUCT_RANGE (in every feature) take the
# one-product form (Q e^b)(K e^-b)^T: factors within e^+-20, far inside bf16's range (fp16's
# 65504 is not: fp16 inputs keep the mask of differences). ``per_feature.FAST_RANGE`` is this
# bound: its Triton kernels take the same form for the same chunks.
ONE_PRODUCT_RANGE = 20.0


def _smem_bytes(chunk, kp, bv, itemsize, stages, per_feature):
    """Shared memory of the walk: ``stages`` pipeline steps of inputs (16-bit q, k, v tiles and
    the decays: three float32 rows, or per feature a float32 ``[C, Kp]`` tile and a row), the
    two steps of y and state buffers, the W tile and (scalar decay) A's transposed tile. (The
    float32 state tile of the first and last state is scoped apart, before and after.)"""
    decays = 4 * (chunk * kp + kp) if per_feature else 3 * 4 * chunk
    step = (2 * chunk * kp + chunk * bv) * itemsize + decays
    buffers = 2 * (chunk * bv + kp * bv) * itemsize + chunk * chunk * itemsize
    transposed = 0 if per_feature else 4 * chunk * chunk
    return max(stages * step + buffers + transposed, 4 * kp * bv)


def layout_reason(q, v, chunk, kernel, smem):
    """Why a one-kernel causal forward (``kernel``, its name in the message) does not take
    these padded inputs, or None: 16-bit, Kp 64 or 128, Vp a multiple of ``BLOCK_V``, chunks
    of ``CHUNK``, and ``smem`` (bytes, with ``4096`` to spare) within ``SMEM_BYTES``."""
    if q.dtype not in (jnp.bfloat16, jnp.float16) or v.dtype != q.dtype:
        return (f"the {kernel} takes bf16 or fp16 inputs (got {q.dtype}, {v.dtype}); use "
                f"the two-pass kernels")
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


def supported(q, v, chunk=CHUNK, stages=STAGES, per_feature=False):
    """None when :func:`causal_forward_mosaic` takes these (padded) inputs, else why;
    ``per_feature``: with log-decays ``[B, L, H, Kp]``."""
    if per_feature and q.dtype != jnp.bfloat16:
        return (f"the fused Mosaic causal forward with per-feature decay takes bf16 inputs "
                f"(exp(-b) up to e^20 leaves fp16's range; got {q.dtype})")
    smem = _smem_bytes(chunk, q.shape[-1], BLOCK_V, q.dtype.itemsize, stages, per_feature)
    return layout_reason(q, v, chunk, f"fused Mosaic causal forward with {stages} stages", smem)


def _kernel(q_ref, k_ref, v_ref, decay_ref, last_ref, s0_ref, *refs, chunk, run, bv, stages,
            store, factored):
    """One (b, h, V-block j, run r) program over chunks ``r * run ... (r + 1) * run - 1``.

    q, k ``[B, L, H, Kp]``; v ``[B, L, H, Vp]``; the decays: scalar (``last_ref`` None)
    ``decay_ref [3, B, H, L]`` float32 rows (A, e^A, e^tail); per feature ``decay_ref
    [B, L, H, Kp]`` float32, the chunk-local inclusive cumulative log-decays b, and
    ``last_ref [B, H, N * Kp]``, b at each chunk's last token; s0 ``[B, H, R, Kp, Vp]``
    float32 (the state entering each run) or None (zero); outputs y ``[B, L, H, Vp]``, h
    ``[B, H, N, Kp, Vp]`` (the state entering every chunk, in the input dtype; ``store``),
    ends ``[B, H, R, Kp, Vp]`` float32 (each run's end state). ``factored``: scalar decay in
    the one-product form (every chunk's log-decays summing to at least ``-ONE_PRODUCT_RANGE``).
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
    state_smem = plgpu.SMEM((kp, bv), f32, transforms=_TILE32)
    first = r * run
    per_feature = last_ref is not None

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

    def walk(y_buf, h_buf, w_s, t_buf=None):
        causal = (plgpu.layout_cast(lax.broadcasted_iota(jnp.int32, (chunk, chunk), 0),
                                    WGMMA)
                  >= plgpu.layout_cast(lax.broadcasted_iota(jnp.int32, (chunk, chunk), 1),
                                       WGMMA))

        def one_product(q_s, k_s, up, down, last):
            """GLA's one-product form, for decays within ``e^+-ONE_PRODUCT_RANGE`` over the
            chunk: Q e^b into q_s, K e^-b into k_s, W = (Q e^b)(K e^-b)^T masked into w_s, then
            K e^(b_last - b) into k_s; ``up``, ``down``, ``last``: a tile of q or k -> its
            factors e^b, e^-b, e^(b_last) (b the chunk-local cumulative log-decays)."""
            scale(q_s, up)
            scale(k_s, down)
            plgpu.commit_smem()
            w_s[...] = jnp.where(causal, scores(q_s, k_s), 0.0).astype(dtype)
            scale(k_s, last)  # K e^-b is done with: the keys of the state update

        def scalar_decay(q_s, k_s, a_s, eh_s, et_s):
            """W into w_s, Q e^A into q_s, K e^tail into k_s; returns exp(A_last)."""
            if factored:
                one_product(q_s, k_s, lambda x: rows_of(plgpu.load(eh_s, layout=ROWS), x.shape),
                            lambda x: rows_of(jnp.exp(-plgpu.load(a_s, layout=ROWS)), x.shape),
                            lambda x: eh_s[chunk - 1])
                return eh_s[chunk - 1]
            s = scores(q_s, k_s)
            a_i, a_j = row_and_column_tiles(a_s, t_buf, s.shape)  # A_i on row i, A_j on col j
            # exponents <= 0 where kept (A does not increase along the chunk)
            w_s[...] = jnp.where(causal, s * jnp.exp(jnp.minimum(a_i - a_j, 0.0)),
                                 0.0).astype(dtype)
            # q, k are done with (Q K^T has been read): the decayed ones take their tiles, one
            # after the other (fewer registers live at Kp = 128)
            for x_s, factor_s in ((q_s, eh_s), (k_s, et_s)):
                scale(x_s, lambda x, f=factor_s: rows_of(plgpu.load(f, layout=ROWS),
                                                         x.shape))
            return eh_s[chunk - 1]

        def feature_decay(q_s, k_s, b_s, last_s):
            """Per-feature decay in :func:`one_product`'s form; returns exp(b_last) on the
            state's rows."""
            one_product(q_s, k_s, lambda x: jnp.exp(plgpu.load(b_s, layout=WGMMA)),
                        lambda x: jnp.exp(-plgpu.load(b_s, layout=WGMMA)),
                        lambda x: cols_of(jnp.exp(plgpu.load(last_s, layout=COLS)), x.shape))
            return rows_of(jnp.exp(plgpu.load(last_s, layout=ROWS)), (kp, bv))

        def step(idx, q_s, k_s, v_s, *rest):
            *decay_s, state = rest
            n = first + idx[0]
            slot = lax.rem(idx[0], jnp.asarray(2, idx[0].dtype))
            plgpu.wait_smem_to_gmem(1, wait_read_only=True)  # this slot's copies of i - 2 read
            y_s, h_s = y_buf.at[slot], h_buf.at[slot]
            h_s[...] = state.astype(dtype)  # the state entering chunk n
            decay = (feature_decay if per_feature else scalar_decay)(q_s, k_s, *decay_s)
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
        row = lambda width: plgpu.BlockSpec((width,), lambda i: (first + i,))
        specs = [tile(kp), tile(kp), tile(bv)]
        in_refs = [q_ref.at[b, :, hd, :], k_ref.at[b, :, hd, :], v_ref.at[b, :, hd, cols]]
        if per_feature:
            specs += [tile(kp, _TILE32), row(kp)]
            in_refs += [decay_ref.at[b, :, hd, :], last_ref.at[b, hd]]
        else:
            specs += [row(chunk)] * 3
            in_refs += [decay_ref.at[x, b, hd] for x in range(3)]
        end = plgpu.emit_pipeline(step, grid=(run,), in_specs=specs, max_concurrent_steps=stages,
                                  init_carry=state)(*in_refs)
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # before the buffers are reused
        return end

    scratch = [plgpu.SMEM((2, chunk, bv), dtype, transforms=_TILE16),
               plgpu.SMEM((2, kp, bv), dtype, transforms=_TILE16),
               plgpu.SMEM((chunk, chunk), dtype, transforms=_TILE16)]
    if not (per_feature or factored):  # A's transposed tile
        scratch.append(plgpu.SMEM((chunk, chunk), f32))
    state = pl.run_scoped(walk, *scratch)

    def store_end(s_smem):
        s_smem[...] = state
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(s_smem, end_ref.at[b, hd, r, :, cols])
        plgpu.wait_smem_to_gmem(0)

    pl.run_scoped(store_end, state_smem)


def run_states(k, v, g, s0, *, chunk, splits, interpret):
    """The state entering each of ``splits`` runs of chunks, ``[B, H, R, Kp, Vp]`` float32 (or
    None: one run from zero): the runs walked from zero keeping their end states
    (``mosaic_states.walk_states``), then scanned from ``s0`` (None or ``[B, H, Kp, Vp]``);
    g the per-token log-decays ``[B, L, H]``."""
    N = k.shape[1] // chunk
    if splits < 1 or N % splits:
        raise ValueError(f"splits must divide the number of chunks {N}; got {splits}")
    if splits == 1:
        return None if s0 is None else s0[:, :, None]
    w, d = stacked_decay_factors(g, chunk, (False,))
    ends = walk_states(k, v, w, d, None, chunk=chunk, bv=BLOCK_V, splits=splits, store=False,
                       interpret=interpret)[0]
    return entering_states(ends[0], d[0], s0, reverse=False)


def causal_forward_mosaic(q, k, v, g, s0=None, *, chunk=CHUNK, splits=1, store_states=False,
                          stages=STAGES, interpret=None):
    """The causal forward pass (not strict) of padded inputs in one Mosaic GPU kernel.

    Args:
      q, k: ``[B, L, H, Kp]``; v: ``[B, L, H, Vp]``, bf16 or fp16, padded as
        ``chunk_scan.pad_layout`` pads them (see :func:`supported`), L a multiple of
        ``chunk``.
      g: float32 log-decays (entries <= 0): ``[B, L, H]``, or per key feature
        ``[B, L, H, Kp]`` (bf16 inputs, ``splits=1``, and every chunk's log-decays summing to
        at least ``-ONE_PRODUCT_RANGE`` in every feature, which the caller checks: the
        kernel takes them in GLA's one-product form, ``exp(-b)`` up to ``e^20``).
      s0: None or ``[B, H, Kp, Vp]`` float32, the state before the first token.
      splits: runs to cut the chunks into (a power of two dividing N; module docstring).
      store_states: also return the state entering every chunk (the backward's residual).
      stages: pipeline steps in flight.
      interpret: None, or ``plgpu.InterpretGPUParams()`` to run the Mosaic GPU interpreter.
    Returns:
      ``(y [B, L, H, Vp] q.dtype, final [B, H, Kp, Vp] float32)``, then with
      ``store_states`` ``h [B, H, N, Kp, Vp]`` q.dtype.
    """
    per_feature = g.ndim == 4
    if (reason := supported(q, v, chunk, stages, per_feature)) is not None:
        raise ValueError(reason)
    B, L, H, kp = q.shape
    vp = v.shape[-1]
    N, nvb = L // chunk, vp // BLOCK_V
    if per_feature and splits > 1:
        raise ValueError("per-feature decay walks the chunks in one run (splits=1)")
    s0 = run_states(k, v, g, s0, chunk=chunk, splits=splits, interpret=interpret)
    if per_feature:  # b: chunk-local inclusive cumsums per feature; and b at each chunk's end
        b = jnp.cumsum(g.reshape(B, N, chunk, H, kp), axis=2)
        decay, last = b.reshape(B, L, H, kp), b[:, :, -1].transpose(0, 2, 1, 3).reshape(B, H, -1)
    else:  # A, e^A and e^tail per token
        decay, last = mask_rows(g, chunk), None
    out_type = [jax.ShapeDtypeStruct((B, L, H, vp), q.dtype)]
    if store_states:
        out_type.append(jax.ShapeDtypeStruct((B, H, N, kp, vp), q.dtype))
    out_type.append(jax.ShapeDtypeStruct((B, H, splits, kp, vp), jnp.float32))

    def kernel(factored):
        return plgpu.kernel(
            functools.partial(_kernel, chunk=chunk, run=N // splits, bv=BLOCK_V, stages=stages,
                              store=store_states, factored=factored),
            out_type=tuple(out_type), grid=(B, H, nvb, splits), grid_names=tuple("bhjr"),
            interpret=interpret,
        )(q, k, v, decay, last, s0)

    if per_feature or q.dtype != jnp.bfloat16:
        y, *rest = kernel(factored=False)
    else:  # scalar decay, bf16: the one-product form when every chunk is mild (run time)
        mild = jnp.min(jnp.sum(g.reshape(B, N, chunk, H), axis=2)) >= -ONE_PRODUCT_RANGE
        y, *rest = jax.lax.cond(mild, lambda: kernel(True), lambda: kernel(False))
    final = rest[-1][:, :, -1]
    return (y, final, rest[0]) if store_states else (y, final)
