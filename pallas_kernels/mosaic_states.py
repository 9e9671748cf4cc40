"""The states walk of ``two_pass.py`` as a Pallas Mosaic GPU kernel (Hopper, sm_90).

Same math and results as ``two_pass.chunk_states(..., with_z=False)``: one program per
(batch b, head h, V-block j, run r) walks its chunks in order (reverse: in reverse order),

    h[n] = S;   S = d[n] S + kd_n^T v_n

with ``kd = k * w`` (the per-token key factors of ``two_pass.decay_factors``, products in
float32 rounded to the input dtype, as the Triton kernel rounds them), ``kd_n, v_n`` the
``C x Kp`` and ``C x BV`` rows of chunk n and ``d[n]`` the chunk's decay factor.

Kernel layout: one warpgroup keeps S ``[Kp, BV]`` float32 in registers (WGMMA layout). A TMA
pipeline (``plgpu.emit_pipeline``) streams blocks of ``group`` chunks of k, v and w into
swizzled shared memory about ``LOAD_BYTES_AHEAD`` ahead of the walk. Per step: k is scaled by
w in shared memory (or arrives scaled from XLA, ``scale_in_kernel=False``: slower end to end),
one wgmma per chunk computes ``kd_n^T v_n`` into a zeroed accumulator (kd_n read transposed
from shared memory) while the old S is rounded into one of two h buffers, TMA copies send that
buffer to ``h`` asynchronously, and ``S = d[n] S + update`` is the only serial work. The
program's decay factors d and s0 are loaded into shared memory once, before the walk.

Measured on an H100 (B=4, H=16, L=16K, bf16, experiments/bench_mosaic_states.py, three runs):
0.20-0.22 ms for a 64 x 64 state against 0.35-0.48 ms for the Triton kernel (split / unsplit),
0.30-0.37 against 0.46-0.50 ms for 128 x 64, 0.54-0.58 against 0.64-0.69 ms for 128 x 128; the
memory floor is 0.12, 0.20 and 0.32 ms.

Only bf16 / fp16 inputs with ``Kp`` and ``BV`` multiples of 64 (see :func:`supported`); float32
inputs use the Triton kernel of ``two_pass.py``.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.two_pass import decay_factors, entering_states

# Default pipeline depth: as many steps as hold this many bytes of k, v and w (at least 2, at
# most what fits): 6 steps for a 64 x 64 state, 4 for 128 x 64, 3 for 128 x 128. On an H100 at
# L = 16K a 64 x 64 walk took 0.29 / 0.25 / 0.23 / 0.21 ms with 2 / 3 / 4 / 6 stages; from 4 to
# 8 stages, and with 2 chunks per step, the differences stayed within run-to-run noise (~10%).
LOAD_BYTES_AHEAD = 100 * 1024
SMEM_BYTES = 227 * 1024  # per block on an H100
# 16-bit tiles: rows of 64 elements (128 bytes) in the 128-byte swizzle wgmma expects.
_TILE16 = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
# float32 tiles (s0, end state): rows of 32 elements in the same swizzle.
_TILE32 = (plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(128))


def supported(k, v, chunk, bv):
    """None when :func:`chunk_states_mosaic` handles these (padded) inputs, else the reason."""
    if k.dtype not in (jnp.bfloat16, jnp.float16) or v.dtype != k.dtype:
        return (f"the Mosaic states kernel takes bf16 or fp16 k and v (got {k.dtype}, "
                f"{v.dtype}); use the Triton path (two_pass.chunk_states)")
    kp, vp, L = k.shape[-1], v.shape[-1], k.shape[1]
    if kp % 64 or bv % 64 or vp % bv or bv > 256:
        return (f"the Mosaic states kernel needs Kp and BV multiples of 64, BV <= 256 dividing "
                f"Vp (got Kp={kp}, BV={bv}, Vp={vp})")
    if chunk % 64 or chunk > 256 or L % chunk:
        return f"the chunk must be a multiple of 64, at most 256, dividing L (got {chunk}, L={L})"
    if _smem_stages(chunk, 1, kp, bv, k.dtype.itemsize, L // chunk)[1] < 2:
        return f"a {kp} x {bv} state and chunk {chunk} leave no room for 2 pipeline stages"
    return None


def _n_pad(num_chunks):
    """The d row is one bulk copy: padded to a multiple of 16 bytes."""
    return -(-num_chunks // 4) * 4


def _smem_stages(chunk, group, kp, bv, itemsize, num_chunks):
    """``(default, most)`` pipeline stages of ``group`` chunks of k, v and w: ``most`` fit in
    shared memory beside the two h buffers and the d row; ``default`` hold about
    ``LOAD_BYTES_AHEAD`` bytes."""
    step = group * chunk * ((kp + bv) * itemsize + 4)
    fixed = 2 * group * kp * bv * itemsize + _n_pad(num_chunks) * 4 + 4096  # + barriers, align
    most = (SMEM_BYTES - fixed) // step
    return min(most, max(2, LOAD_BYTES_AHEAD // step)), most


def _walk_kernel(k_ref, v_ref, w_ref, d_ref, s0_ref, *refs, chunk, run, group, bv, reverse,
                 store, stages):
    """One (b, h, V-block j, run r) program: walks chunks ``r * run ... (r + 1) * run - 1``,
    ``group`` chunks per pipeline step.

    Inputs: k ``[B, L, H, Kp]`` (already times w when w_ref is None), v ``[B, L, H, Vp]``,
    w ``[B, H, L]`` float32 or None, d ``[B, H, Np]``, s0 ``[B, H, R, Kp, Vp]`` or None;
    outputs: h ``[B, H, N, Kp, Vp]`` (when ``store``), ends ``[B, H, R, Kp, Vp]``; scratch:
    d_smem ``[Np]`` float32 and its barrier. The s0 / end-state buffer, the two h buffers and
    the pipeline's buffers are scoped one after the other (their shared memory is reused).
    """
    *outs, d_smem, bar = refs
    h_ref, end_ref = outs if store else (None, *outs)
    b, hd, j, r = (lax.axis_index(a) for a in "bhjr")
    cols = pl.ds(j * bv, bv)
    kp = k_ref.shape[-1]
    dtype = k_ref.dtype
    state_smem = plgpu.SMEM((kp, bv), jnp.float32, transforms=_TILE32)

    plgpu.copy_gmem_to_smem(d_ref.at[b, hd], d_smem, bar.at[0])
    if s0_ref is None:
        state = plgpu.layout_cast(jnp.zeros((kp, bv), jnp.float32), plgpu.Layout.WGMMA)
    else:
        def load_s0(s_smem, s_bar):
            plgpu.copy_gmem_to_smem(s0_ref.at[b, hd, r, :, cols], s_smem, s_bar.at[0])
            plgpu.barrier_wait(s_bar.at[0])
            return plgpu.load(s_smem, layout=plgpu.Layout.WGMMA)

        state = pl.run_scoped(load_s0, state_smem, plgpu.Barrier(num_barriers=1))
    plgpu.barrier_wait(bar.at[0])

    steps = run // group
    block_of = lambda i: r * steps + (steps - 1 - i if reverse else i)  # of `group` chunks
    order = list(reversed(range(group)) if reverse else range(group))  # chunks within a block

    def walk(h_smem=None):
        def step(idx, k_s, v_s, *rest):
            *w_s, state = rest
            i = idx[0]
            first = block_of(i) * group
            if w_s:  # k_s *= w in place, rounded to the input dtype as two_pass does
                w = plgpu.load(w_s[0], layout=plgpu.Layout.WGMMA.reduce(1))
                k = plgpu.load(k_s, layout=plgpu.Layout.WGMMA).astype(jnp.float32)
                k_s[...] = (k * lax.broadcast_in_dim(w, k.shape, [0])).astype(dtype)
                plgpu.commit_smem()  # visible to the wgmma
            if store:
                h_s = h_smem.at[lax.rem(i, 2)]
                plgpu.wait_smem_to_gmem(1, wait_read_only=True)  # h_s's copy of i - 2 is done
            rows = lambda g: pl.ds(g * chunk, chunk)

            def mma(*acc_refs):  # zeroed accumulators: the wgmmas do not wait for the state
                for acc_ref, g in zip(acc_refs, order):
                    plgpu.wgmma(acc_ref, k_s.at[rows(g)].transpose((1, 0)), v_s.at[rows(g)])
                if store:
                    h_s[order[0]] = state.astype(dtype)  # overlaps the wgmmas
                return [acc_ref[...] for acc_ref in acc_refs]

            updates = pl.run_scoped(mma, *[plgpu.ACC((kp, bv), jnp.float32)] * group)
            for t, (g, update) in enumerate(zip(order, updates)):
                if store and t:
                    h_s[g] = state.astype(dtype)
                state = state * d_smem[first + g] + update
            if store:  # one bulk group per step, for the wait above
                plgpu.commit_smem()
                for g in range(group):
                    plgpu.copy_smem_to_gmem(h_s.at[g], h_ref.at[b, hd, first + g, :, cols],
                                            commit_group=False)
                plgpu.commit_smem_to_gmem_group()
            return state

        block = lambda i: (block_of(i), 0)
        specs = [plgpu.BlockSpec((group * chunk, kp), block, transforms=_TILE16),
                 plgpu.BlockSpec((group * chunk, bv), block, transforms=_TILE16)]
        refs = [k_ref.at[b, :, hd, :], v_ref.at[b, :, hd, cols]]
        if w_ref is not None:
            specs.append(plgpu.BlockSpec((group * chunk,), lambda i: (block_of(i),)))
            refs.append(w_ref.at[b, hd])
        state_out = plgpu.emit_pipeline(step, grid=(steps,), in_specs=specs,
                                        max_concurrent_steps=stages, init_carry=state)(*refs)
        if store:
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # before the h buffers are reused
        return state_out

    if store:
        h_smem = plgpu.SMEM((2, group, kp, bv), dtype, transforms=_TILE16)
        state = pl.run_scoped(walk, h_smem)
    else:
        state = walk()

    def store_end(s_smem):
        s_smem[...] = state
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(s_smem, end_ref.at[b, hd, r, :, cols])
        plgpu.wait_smem_to_gmem(0)

    pl.run_scoped(store_end, state_smem)


def walk_states(k, v, w, d, s0, *, chunk, bv, reverse, splits=1, store=True, stages=None,
                group=1, interpret=None):
    """One launch of the Mosaic GPU kernel over ``splits`` runs of ``N / splits`` chunks.

    Args:
      k: ``[B, L, H, Kp]``, v: ``[B, L, H, Vp]``; w: ``[B, H, L]`` float32 key factors, or None
        when k is already multiplied by them; d: ``[B, H, N]`` float32 chunk decay factors (w
        and d as ``two_pass.decay_factors`` returns them); s0: None or ``[B, H, splits, Kp, Vp]``
        float32, the state entering each run. Others as :func:`chunk_states_mosaic`.
      store: also return the state entering every chunk.
    Returns:
      ``(h [B, H, N, Kp, Vp] k.dtype, ends [B, H, splits, Kp, Vp] float32)``, only ends when
      not ``store``: the state each run ends with.
    """
    if (reason := supported(k, v, chunk, bv)) is not None:
        raise ValueError(reason)
    B, L, H, kp = k.shape
    vp = v.shape[-1]
    N = L // chunk
    if N % (splits * group):
        raise ValueError(f"splits * group must divide the number of chunks {N}; got "
                         f"{splits} * {group}")
    n_pad = _n_pad(N)
    d = jnp.pad(d, ((0, 0), (0, 0), (0, n_pad - N)))
    default, most = _smem_stages(chunk, group, kp, bv, k.dtype.itemsize, N)
    stages = default if stages is None else stages
    if not 1 <= stages <= most:
        raise ValueError(f"{stages} pipeline stages of {group} chunks do not fit in shared "
                         f"memory (at most {most})")
    out_type = [jax.ShapeDtypeStruct((B, H, splits, kp, vp), jnp.float32)]
    if store:
        out_type.insert(0, jax.ShapeDtypeStruct((B, H, N, kp, vp), k.dtype))
    kernel = plgpu.kernel(
        functools.partial(_walk_kernel, chunk=chunk, run=N // splits, group=group, bv=bv,
                          reverse=reverse, store=store, stages=stages),
        out_type=tuple(out_type),
        scratch_types=(plgpu.SMEM((n_pad,), jnp.float32), plgpu.Barrier(num_barriers=1)),
        grid=(B, H, vp // bv, splits), grid_names=tuple("bhjr"),
        interpret=interpret,
    )
    outs = kernel(k, v, w, d, s0)
    return outs if store else outs[0]


def chunk_states_mosaic(k, v, g, s0, *, chunk, bv, reverse, splits=1, scale_in_kernel=True,
                        stages=None, group=1, interpret=None):
    """The state entering each chunk in the scan's direction, and the final state.

    Args:
      k: ``[B, L, H, Kp]``, v: ``[B, L, H, Vp]``, bf16 or fp16, padded as for
        ``two_pass.chunk_states`` (see :func:`supported` for the shapes handled); g:
        ``[B, L, H]`` float32 log-decays (entries <= 0), L a multiple of ``chunk``.
      s0: None or ``[B, H, Kp, Vp]`` float32, the state before the first chunk scanned.
      chunk: chunk size C; bv: V-block width; reverse: walk the chunks last to first.
      splits: runs to cut the chunks into, as in ``two_pass.chunk_states``: > 1 walks each run
        from zero keeping its end state, scans the runs in XLA, then walks each run again from
        the state entering it, storing h. More programs but every chunk read twice: worth it
        only for few programs (B=1, H=8, 64 x 64, L=16K on an H100: 0.08-0.09 ms in 8 runs,
        0.20-0.22 in one; B=4, H=16: 0.31 ms in 2 runs, 0.21 in one).
      scale_in_kernel: multiply the keys by their factors w in the kernel (in shared memory,
        before each wgmma); False: in XLA before the kernel (one more pass over k: 0.31-0.33
        against 0.20-0.22 ms end to end for B=4, H=16, 64 x 64, L=16K).
      stages: pipeline steps of k / v loaded ahead; None: about ``LOAD_BYTES_AHEAD`` bytes.
      group: chunks per pipeline step: one TMA copy of ``group * chunk`` rows of k and v,
        ``group`` wgmmas issued together and one copy of ``group`` states to h per step.
      interpret: None, or ``plgpu.InterpretGPUParams()`` to run the Mosaic GPU interpreter.
    Returns:
      ``(h [B, H, N, Kp, Vp] k.dtype, final [B, H, Kp, Vp] float32)``, as
      ``two_pass.chunk_states(..., splits=splits)``.
    """
    if (reason := supported(k, v, chunk, bv)) is not None:
        raise ValueError(reason)
    w, d = decay_factors(g, chunk, reverse=reverse)
    if not scale_in_kernel:
        k = (k.astype(jnp.float32) * jnp.swapaxes(w, 1, 2)[..., None]).astype(k.dtype)
        w = None
    walk = functools.partial(walk_states, k, v, w, d, chunk=chunk, bv=bv, reverse=reverse,
                             splits=splits, stages=stages, group=group, interpret=interpret)
    if splits > 1:  # the state entering each run, from each run's end state from zero
        s0 = entering_states(walk(None, store=False), d, s0, reverse=reverse)
    elif s0 is not None:
        s0 = s0[:, :, None]
    h, ends = walk(s0)
    return h, ends[:, :, 0 if reverse else -1]
