"""The states walk of ``two_pass.py`` as a Pallas Mosaic GPU kernel (Hopper, sm_90).

Same math and results as ``two_pass.chunk_states`` (with_z too): one program per
(batch b, head h, V-block j, run r) walks its chunks in order (reverse: in reverse order),

    h[n] = S;   S = d[n] S + kd_n^T v_n

with ``kd = k * w`` (the per-token key factors of ``chunk_scan.decay_factors``, products in
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

with_z (LION's normaliser, optionally weighted) also carries ``z [Kp]`` float32, per chunk
``z = d[n] z + sum_rows(kd_n * u_n)``, the row sums by default from one more wgmma per step
(``kd^T U``, U a shared-memory tile holding u in two 16-bit parts; ``z_method="mma"``) or by
a float32 cross-warp reduction of ``k * w * u`` in registers (``z_method="reduce"``: no
rounding of k * w, but slower). Measured on an H200 (same bench, ``--with-z``, one run):
64 x 64 0.24 ms with z (0.30 weighted) against 0.20 without and 0.54 (0.63) for Triton with
z; 128 x 64 0.35 (0.43) against 0.30 and 0.78 (0.85); "reduce" 0.37-0.38 and 0.73-0.74 ms.
With several V-blocks the "mma" z is split by rows among them (:func:`z_parts`): at D = 128
(Kp = 128, two V-blocks of 64) each walks a 64-row half, which took the wgmma's accumulator from
252 to 217 registers; LION's two-way walks (H200, B4 H16 L = 16K) took 0.82 ms with all of z
in one V-block and take 0.69 split, against 0.68-0.71 without z; weighted, with key scales,
0.89 -> 0.78 ms (docs/benchmarks.md, one H200, 2026-11-22).
A 128 x 128 state with z spills registers: 1.49 (1.68) ms against 0.59 without and 1.15
(1.50) for Triton, so walk such states in V-blocks of 64.

Only bf16 / fp16 inputs with ``Kp`` and ``BV`` multiples of 64 (see :func:`supported`); float32
inputs use the Triton kernel of ``two_pass.py``.
"""

import functools
import itertools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.chunk_scan import (BOTH, stacked_decay_factors, walk_directions,
                                       walk_in_runs)

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
# with_z, z_method="mma": the U tile of the z wgmma is [group * C, ZN] (narrower B tiles, in
# the 32 / 64-byte swizzles, failed Mosaic GPU's layout inference in jax 0.11.2).
ZN = 64


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


Z_METHODS = ("mma", "reduce")


def z_parts(kp, nvb):
    """with_z, "mma": the V-blocks that share z's wgmma and row sums, each ``Kp / parts`` rows
    (whole 64-row wgmma tiles): the most ``parts <= nvb`` that split Kp so. The work is
    spread instead of piled on one V-block; the V-blocks from ``parts`` on skip z."""
    return max(p for p in range(1, nvb + 1) if kp % (64 * p) == 0)


def pick_z_method(dtype, weighted):
    """The default ``z_method`` (see :func:`chunk_states_mosaic`): "mma", but "reduce" for fp16
    with weights (whose u could overflow or underflow fp16 in the U tile)."""
    return "reduce" if weighted and dtype == jnp.float16 else "mma"


# The chunk decay factors d go to shared memory in one bulk copy as [Np / D_ROW, D_ROW] rows
# (a TMA copy moves at most 256 elements along each dimension; N can reach 1024 and more).
D_ROW = 128


def _n_pad(num_chunks):
    """The d rows hold this many entries: N rounded up to whole rows of ``D_ROW``."""
    return -(-num_chunks // D_ROW) * D_ROW


def _smem_stages(chunk, group, kp, bv, itemsize, num_chunks, with_z=False, z_weights=False):
    """``(default, most)`` pipeline stages of ``group`` chunks of k, v and w (and the z weights
    u): ``most`` fit in shared memory beside the two h buffers and the d row; ``default`` hold
    about ``LOAD_BYTES_AHEAD`` bytes."""
    step = group * chunk * ((kp + bv) * itemsize + 4 * (1 + z_weights))
    fixed = 2 * group * kp * bv * itemsize + _n_pad(num_chunks) * 4 + 4096  # + barriers, align
    if with_z:  # the two z buffers, the U tile ("mma"), the cross-warp reduction's scratch
        fixed += 2 * group * kp * 4 + group * chunk * ZN * itemsize + 2048
    most = (SMEM_BYTES - fixed) // step
    return min(most, max(2, LOAD_BYTES_AHEAD // step)), most


def _walk_kernel(k_ref, v_ref, w_ref, d_ref, u_ref, s0_ref, z0_ref, *refs, chunk, run, group,
                 bv, directions, store, stages, with_z, z_method):
    """One (direction e, b, h, V-block j, run r) program: walks chunks
    ``r * run ... (r + 1) * run - 1`` in the order of ``directions[e]``, ``group`` chunks per
    pipeline step.

    Inputs: k ``[B, L, H, Kp]`` (already times w when w_ref is None), v ``[B, L, H, Vp]``,
    w ``[D, B, H, L]`` float32 or None, d ``[D, B, H, Np / D_ROW, D_ROW]`` (zero-padded), u
    ``[B, H, L]`` float32 z weights or None (ones), s0 ``[D, B, H, R, Kp, Vp]`` or None, z0
    ``[D, B, H, R, Kp]`` or None; outputs: h ``[D, B, H, N, Kp, Vp]`` (when ``store``), hz
    ``[D, B, H, N, Kp]`` (``store`` and ``with_z``), ends ``[D, B, H, R, Kp, Vp]``,
    zends ``[D, B, H, R, Kp]`` (``with_z``); scratch: d_smem ``[Np / D_ROW, D_ROW]``
    float32 and its barrier. ``D = len(directions)``: one direction (static) or ``BOTH``, the
    direction then picked by e. The s0 / end-state buffers, the h (and z) buffers and the
    pipeline's buffers are scoped one after the other (their shared memory is reused).

    with_z: ``z [Kp]`` float32 in registers, per chunk ``z = d[n] z + sum_rows(k * w * u)``,
    the row sums by ``z_method`` (see :func:`chunk_states_mosaic`): "mma" one more wgmma per
    step, ``kd^T U`` with U ``[group * C, ZN]`` in shared memory (chunk g's rows: u rounded to
    the input dtype in column 2 g, what that rounding lost, rounded, in column 2 g + 1, other
    columns 0; u None: ones in column 2 g, written once), chunk g's update the row sums of
    those two accumulator columns, z in the layout of row sums; "reduce" the column sums of
    the float32 ``k * w * u`` tile in registers (a cross-warp reduction) before ``k * w`` is
    rounded for the wgmma of h. With "mma" V-block ``p < z_parts(Kp, V-blocks)`` walks and
    stores rows ``p Kp / parts ...`` of z (its share of the z wgmma, U written by each), the
    other V-blocks no z; with "reduce" every V-block walks all of z and V-block 0 stores it.
    """
    refs = list(refs)
    h_ref = refs.pop(0) if store else None
    hz_ref = refs.pop(0) if store and with_z else None
    end_ref = refs.pop(0)
    zend_ref = refs.pop(0) if with_z else None
    d_smem, bar = refs
    e, b, hd, j, r = (lax.axis_index(a) for a in "ebhjr")
    cols = pl.ds(j * bv, bv)
    kp = k_ref.shape[-1]
    dtype = k_ref.dtype
    state_smem = plgpu.SMEM((kp, bv), jnp.float32, transforms=_TILE32)
    mma_z = with_z and z_method == "mma"
    # with_z: V-block p < zparts walks and stores z's rows p * zk ... (p + 1) * zk - 1
    zparts = z_parts(kp, v_ref.shape[-1] // bv) if mma_z else 1
    zk = kp // zparts
    z_part = j < zparts
    z_cols = pl.ds(jnp.minimum(j, zparts - 1) * zk, zk)
    # z [zk]: row sums of a [zk, ZN] accumulator (mma) or column sums of a [C, Kp] tile
    z_layout = plgpu.Layout.WGMMA.reduce(1 if mma_z else 0)

    plgpu.copy_gmem_to_smem(d_ref.at[e, b, hd], d_smem, bar.at[0])
    if s0_ref is None:
        state = plgpu.layout_cast(jnp.zeros((kp, bv), jnp.float32), plgpu.Layout.WGMMA)
    else:
        def load_s0(s_smem, s_bar):
            plgpu.copy_gmem_to_smem(s0_ref.at[e, b, hd, r, :, cols], s_smem, s_bar.at[0])
            plgpu.barrier_wait(s_bar.at[0])
            return plgpu.load(s_smem, layout=plgpu.Layout.WGMMA)

        state = pl.run_scoped(load_s0, state_smem, plgpu.Barrier(num_barriers=1))
    z = None
    if with_z and z0_ref is None:
        z = plgpu.layout_cast(jnp.zeros((zk,), jnp.float32), z_layout)
    elif with_z:
        def load_z0(z_smem, z_bar):
            plgpu.copy_gmem_to_smem(z0_ref.at[e, b, hd, r, z_cols], z_smem, z_bar.at[0])
            plgpu.barrier_wait(z_bar.at[0])
            return plgpu.load(z_smem, layout=z_layout)

        z = pl.run_scoped(load_z0, plgpu.SMEM((zk,), jnp.float32),
                          plgpu.Barrier(num_barriers=1))
    plgpu.barrier_wait(bar.at[0])

    steps = run // group
    if len(directions) == 1:
        reverse = directions[0]
        block_of = lambda i: r * steps + (steps - 1 - i if reverse else i)  # of `group` chunks
    else:  # BOTH, one chunk per block (group 1), so the order within a block is moot
        block_of = lambda i: r * steps + jnp.where(e == 1, steps - 1 - i, i)
        reverse = False
    order = list(reversed(range(group)) if reverse else range(group))  # chunks within a block
    rows = lambda g: pl.ds(g * chunk, chunk)
    row_layout = plgpu.Layout.WGMMA.reduce(1)

    def columns(rows_, cols_):
        return plgpu.layout_cast(lax.broadcasted_iota(jnp.int32, (rows_, cols_), 1),
                                 plgpu.Layout.WGMMA)

    def u_columns(g, u=None):
        """Chunk g's rows of U: u (None: ones) in column 2 g, its rounding error in 2 g + 1."""
        col = columns(chunk, ZN)
        if u is None:
            return jnp.where(col == 2 * g, 1.0, 0.0).astype(dtype)
        u = lax.broadcast_in_dim(u, (chunk, ZN), [0])
        hi = u.astype(dtype)
        lo = (u - hi.astype(jnp.float32)).astype(dtype)
        return jnp.where(col == 2 * g, hi, jnp.where(col == 2 * g + 1, lo, jnp.zeros_like(hi)))

    def z_sums(acc):
        """The z update of each chunk of the block: the row sums of its two columns."""
        if group == 1:  # the other columns are zero
            return [jnp.sum(acc, axis=1)]
        col = columns(zk, ZN)
        return [jnp.sum(jnp.where((col == 2 * g) | (col == 2 * g + 1), acc, 0.0), axis=1)
                for g in range(group)]

    def walk(h_smem=None, z_smem=None, u_tile=None):
        if mma_z and u_ref is None:  # the ones columns, once
            for g in range(group):
                u_tile[rows(g)] = u_columns(g)
            plgpu.commit_smem()

        def step(idx, k_s, v_s, *rest):
            *rest, (state, z) = rest
            w_s = rest.pop(0) if w_ref is not None else None
            u_s = rest.pop(0) if u_ref is not None else None
            i = idx[0]
            first = block_of(i) * group
            z_updates = []
            if with_z and not mma_z:  # chunk by chunk: the column sums of k * w * u
                for g in range(group):
                    k = plgpu.load(k_s.at[rows(g)], layout=plgpu.Layout.WGMMA)
                    k = k.astype(jnp.float32)
                    if w_s is not None:  # k_s *= w in place, rounded as two_pass does
                        w = plgpu.load(w_s.at[rows(g)], layout=row_layout)
                        k = k * lax.broadcast_in_dim(w, k.shape, [0])
                        k_s[rows(g)] = k.astype(dtype)
                    if u_s is not None:  # k * w * u in float32 (k * w rounded if w_s is None)
                        u = plgpu.load(u_s.at[rows(g)], layout=row_layout)
                        k = k * lax.broadcast_in_dim(u, k.shape, [0])
                    z_updates.append(jnp.sum(k, axis=0))
            elif w_s is not None:  # k_s *= w in place, rounded to the input dtype as two_pass
                w = plgpu.load(w_s, layout=row_layout)
                k = plgpu.load(k_s, layout=plgpu.Layout.WGMMA).astype(jnp.float32)
                k_s[...] = (k * lax.broadcast_in_dim(w, k.shape, [0])).astype(dtype)
            if mma_z and u_s is not None:
                @pl.when(z_part)
                def _():
                    for g in range(group):
                        u_tile[rows(g)] = u_columns(g, plgpu.load(u_s.at[rows(g)],
                                                                  layout=row_layout))
            if w_s is not None or (mma_z and u_s is not None):
                plgpu.commit_smem()  # visible to the wgmmas
            if store:
                slot = lax.rem(i, 2)
                h_s = h_smem.at[slot]
                plgpu.wait_smem_to_gmem(1, wait_read_only=True)  # h_s's copy of i - 2 is done

            def mma(*acc_refs):  # zeroed accumulators: the wgmmas do not wait for the state
                acc_refs, z_refs = acc_refs[:group], acc_refs[group:]
                for acc_ref, g in zip(acc_refs, order):
                    plgpu.wgmma(acc_ref, k_s.at[rows(g)].transpose((1, 0)), v_s.at[rows(g)])
                for z_ref, p in itertools.product(z_refs, range(zparts)):
                    @pl.when(j == p)  # one wgmma: chunk g's z update in columns 2 g, 2 g + 1
                    def _():
                        keys = k_s.at[:, pl.ds(p * zk, zk)] if zparts > 1 else k_s
                        plgpu.wgmma(z_ref, keys.transpose((1, 0)), u_tile)
                if store:
                    h_s[order[0]] = state.astype(dtype)  # overlaps the wgmmas
                return ([acc_ref[...] for acc_ref in acc_refs],
                        [z for z_ref in z_refs for z in z_sums(z_ref[...])])

            accs = [plgpu.ACC((kp, bv), jnp.float32)] * group
            if mma_z:
                accs.append(plgpu.ACC((zk, ZN), jnp.float32))
            updates, mma_z_updates = pl.run_scoped(mma, *accs)
            if mma_z:
                z_updates = mma_z_updates
            for t, (g, update) in enumerate(zip(order, updates)):
                if store and t:
                    h_s[g] = state.astype(dtype)
                if store and with_z:
                    z_smem[slot, g] = z
                decay = d_smem[(first + g) // D_ROW, (first + g) % D_ROW]
                state = state * decay + update
                if with_z:
                    z = z * decay + z_updates[g]
            if store:  # one bulk group per step, for the wait above
                plgpu.commit_smem()
                for g in range(group):
                    plgpu.copy_smem_to_gmem(h_s.at[g], h_ref.at[e, b, hd, first + g, :, cols],
                                            commit_group=False)
                if with_z:
                    @pl.when(z_part)
                    def _():
                        plgpu.copy_smem_to_gmem(z_smem.at[slot],
                                                hz_ref.at[e, b, hd, pl.ds(first, group), z_cols],
                                                commit_group=False)
                plgpu.commit_smem_to_gmem_group()
            return state, z

        block = lambda i: (block_of(i), 0)
        specs = [plgpu.BlockSpec((group * chunk, kp), block, transforms=_TILE16),
                 plgpu.BlockSpec((group * chunk, bv), block, transforms=_TILE16)]
        refs = [k_ref.at[b, :, hd, :], v_ref.at[b, :, hd, cols]]
        for token_ref in (None if w_ref is None else w_ref.at[e],
                          None if u_ref is None else u_ref):
            if token_ref is not None:
                specs.append(plgpu.BlockSpec((group * chunk,), lambda i: (block_of(i),)))
                refs.append(token_ref.at[b, hd])
        out = plgpu.emit_pipeline(step, grid=(steps,), in_specs=specs,
                                  max_concurrent_steps=stages, init_carry=(state, z))(*refs)
        if store:
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # before the h buffers are reused
        return out

    scratch = {}
    if store:
        scratch["h_smem"] = plgpu.SMEM((2, group, kp, bv), dtype, transforms=_TILE16)
        if with_z:
            scratch["z_smem"] = plgpu.SMEM((2, group, zk), jnp.float32)
    if mma_z:
        scratch["u_tile"] = plgpu.SMEM((group * chunk, ZN), dtype, transforms=_TILE16)
    state, z = pl.run_scoped(lambda **refs: walk(**refs), **scratch) if scratch else walk()

    def store_end(s_smem, z_smem=None):
        s_smem[...] = state
        if with_z:
            z_smem[...] = z
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(s_smem, end_ref.at[e, b, hd, r, :, cols])
        if with_z:
            @pl.when(z_part)
            def _():
                plgpu.copy_smem_to_gmem(z_smem, zend_ref.at[e, b, hd, r, z_cols])
        plgpu.wait_smem_to_gmem(0)

    pl.run_scoped(store_end, state_smem, *([plgpu.SMEM((zk,), jnp.float32)] if with_z else []))


def walk_states(k, v, w, d, s0, z0=None, *, chunk, bv, directions=(False,), splits=1,
                runs=None, store=True, stages=None, group=1, interpret=None, with_z=False,
                u=None, z_method=None):
    """One launch of the Mosaic GPU kernel over ``splits`` runs of ``N / splits`` chunks in each
    of ``directions`` (``(False,)``, ``(True,)`` or ``chunk_scan.BOTH``; ``D`` of them), or
    over the first ``runs`` of them.

    Args:
      k: ``[B, L, H, Kp]``, v: ``[B, L, H, Vp]``; w: ``[D, B, H, L]`` float32 key factors, or
        None when k is already multiplied by them (one direction); d: ``[D, B, H, N]`` float32
        chunk decay factors (w and d as ``chunk_scan.stacked_decay_factors`` returns them);
        s0: None or ``[D, B, H, splits, Kp, Vp]`` float32, the state entering each run. Others
        as :func:`chunk_states_mosaic`.
      runs: None (all ``splits``) or how many runs to walk, the first by position (chunks
        ``0 ... runs N / splits - 1``; what a forward scan's later runs enter from), without
        ``store``: the others' chunks are not read.
      store: also return the state entering every chunk.
      with_z: also walk ``z``; u: None (ones) or ``[B, H, L]`` float32 z weights; z0: None or
        ``[D, B, H, splits, Kp]`` float32, the z entering each run; z_method: as
        :func:`chunk_states_mosaic`.
    Returns:
      ``[h [D, B, H, N, Kp, Vp] k.dtype,] ends [D, B, H, R, Kp, Vp] float32`` (h when
      ``store``; R = runs or splits): the state entering every chunk and the state each run
      ends with; with_z ``[h, hz,] ends, zends`` with ``hz [D, B, H, N, Kp]`` and ``zends
      [D, B, H, R, Kp]`` float32 (walked and stored by V-block 0 only).
    """
    if (reason := supported(k, v, chunk, bv)) is not None:
        raise ValueError(reason)
    if not with_z and (u is not None or z0 is not None):
        raise ValueError("u and z0 need with_z=True")
    z_method = pick_z_method(k.dtype, u is not None) if z_method is None else z_method
    if z_method not in Z_METHODS:
        raise ValueError(f"z_method must be None or one of {Z_METHODS}; got {z_method!r}")
    directions = tuple(directions)
    if directions not in ((False,), (True,), BOTH):
        raise ValueError(f"directions must be (False,), (True,) or {BOTH}; got {directions}")
    if len(directions) == 2 and (group > 1 or w is None):
        raise ValueError("both directions in one launch need group=1 and the key factors w")
    B, L, H, kp = k.shape
    vp = v.shape[-1]
    N, D = L // chunk, len(directions)
    if N % (splits * group):
        raise ValueError(f"splits * group must divide the number of chunks {N}; got "
                         f"{splits} * {group}")
    runs = splits if runs is None else runs
    if not 1 <= runs <= splits or (store and runs < splits):
        raise ValueError(f"runs must be None or 1 ... splits = {splits}, and all of them with "
                         f"store=True (the others' h would stay unwritten); got {runs}")
    n_pad = _n_pad(N)
    d = jnp.pad(d, ((0, 0), (0, 0), (0, 0), (0, n_pad - N)))
    d = d.reshape(D, B, H, n_pad // D_ROW, D_ROW)
    default, most = _smem_stages(chunk, group, kp, bv, k.dtype.itemsize, N, with_z=with_z,
                                 z_weights=u is not None)
    stages = default if stages is None else stages
    if not 1 <= stages <= most:
        raise ValueError(f"{stages} pipeline stages of {group} chunks do not fit in shared "
                         f"memory (at most {most})")
    out_type = [jax.ShapeDtypeStruct((D, B, H, runs, kp, vp), jnp.float32)]
    if with_z:
        out_type.append(jax.ShapeDtypeStruct((D, B, H, runs, kp), jnp.float32))
    if store:
        out_type[:0] = [jax.ShapeDtypeStruct((D, B, H, N, kp, vp), k.dtype)]
        if with_z:
            out_type.insert(1, jax.ShapeDtypeStruct((D, B, H, N, kp), jnp.float32))
    kernel = plgpu.kernel(
        functools.partial(_walk_kernel, chunk=chunk, run=N // splits, group=group, bv=bv,
                          directions=directions, store=store, stages=stages, with_z=with_z,
                          z_method=z_method),
        out_type=tuple(out_type),
        scratch_types=(plgpu.SMEM((n_pad // D_ROW, D_ROW), jnp.float32),
                       plgpu.Barrier(num_barriers=1)),
        grid=(D, B, H, vp // bv, runs), grid_names=tuple("ebhjr"),
        interpret=interpret,
    )
    return list(kernel(k, v, w, d, u, s0, z0))


def chunk_states_mosaic(k, v, g, s0, *, chunk, bv, reverse, splits=1, scale_in_kernel=True,
                        stages=None, group=1, interpret=None, with_z=False, z_weights=None,
                        key_scale=None, z_method=None):
    """The state entering each chunk in the scan's direction, and the final state.

    Args:
      k: ``[B, L, H, Kp]``, v: ``[B, L, H, Vp]``, bf16 or fp16, padded as for
        ``two_pass.chunk_states`` (see :func:`supported` for the shapes handled); g:
        ``[B, L, H]`` float32 log-decays (entries <= 0), L a multiple of ``chunk``.
      s0: None or ``[B, H, Kp, Vp]`` float32, the state before the first chunk scanned.
      chunk: chunk size C; bv: V-block width.
      reverse: walk the chunks last to first; ``chunk_scan.BOTH``: both directions in one
        launch, as ``two_pass.chunk_states`` (every result with a leading axis of 2).
      splits: runs to cut the chunks into, as in ``two_pass.chunk_states``: > 1 walks each run
        from zero keeping its end state, scans the runs in XLA, then walks each run again from
        the state entering it, storing h. More programs but every chunk read twice: worth it
        only for few programs (B=1, H=8, 64 x 64, L=16K on an H100: 0.08-0.09 ms in 8 runs,
        0.20-0.22 in one; B=4, H=16: 0.31 ms in 2 runs, 0.21 in one).
      scale_in_kernel: multiply the keys by their factors w in the kernel (in shared memory,
        before each wgmma); False (one direction only): in XLA before the kernel (one more
        pass over k: 0.31-0.33 against 0.20-0.22 ms end to end for B=4, H=16, 64 x 64, L=16K).
      stages: pipeline steps of k / v loaded ahead; None: about ``LOAD_BYTES_AHEAD`` bytes.
      group: chunks per pipeline step (one direction only): one TMA copy of ``group * chunk``
        rows of k and v, ``group`` wgmmas issued together and one copy of ``group`` states to
        h per step.
      interpret: None, or ``plgpu.InterpretGPUParams()`` to run the Mosaic GPU interpreter.
      with_z: also carry ``z = sum_j decay_j u_j k_j`` from zero, as
        ``two_pass.chunk_states(with_z=True)``: per chunk ``z = d[n] z + sum_rows(k * w * u)``
        in float32, the row sums as ``z_method`` says.
      z_weights: None (u = 1) or ``[B, L, H]`` float32, the ``u`` of ``z`` (TMA-loaded per
        step like w).
      key_scale: None or ``[B, L, H]``: scales the keys, folded into w (as
        ``two_pass.chunk_states``).
      z_method: how with_z sums the rows; None: :func:`pick_z_method`.
        "mma": one more wgmma per step, ``kd^T U`` with U a ``[group * C, ZN]`` tile of u
        (two columns per chunk, see ``_walk_kernel``): z sums the same keys
        ``kd = k * w`` rounded to the input dtype as the wgmma of h (as a ones column of v
        would: numerator and normaliser consistent), so z is off the exact float32 sum of
        ``k * w * u`` by that rounding (relative error <= 2e-3 for bf16 measured against
        float64, ~2e-4 for fp16); u enters as two 16-bit parts (u rounded, then what that
        lost, rounded: about 16 bits), the products and sums in float32 (tensor cores).
        fp16 u must stay within fp16's range. Cheap: 0.24 against 0.20 ms without z (64 x 64,
        H200, module docstring).
        "reduce": the float32 column sums of ``k * w * u`` in registers before ``k * w`` is
        rounded (~1e-7 from float64; with ``scale_in_kernel=False`` the rounded ``k * w`` XLA
        passes in), a cross-warp reduction per chunk: 1.6-2.4x slower than "mma".
    Returns:
      ``(h [B, H, N, Kp, Vp] k.dtype, final [B, H, Kp, Vp] float32)``, as
      ``two_pass.chunk_states(..., splits=splits)``; with_z
      ``(h, hz [B, H, N, Kp] float32, final)``, hz the z entering each chunk.
    """
    if (reason := supported(k, v, chunk, bv)) is not None:
        raise ValueError(reason)
    if z_weights is not None and not with_z:
        raise ValueError("z_weights needs with_z=True")
    directions = walk_directions(reverse)
    w, d = stacked_decay_factors(g, chunk, directions, key_scale)
    if not scale_in_kernel:
        if len(directions) == 2:
            raise ValueError("scale_in_kernel=False walks one direction at a time")
        k = (k.astype(jnp.float32) * jnp.swapaxes(w[0], 1, 2)[..., None]).astype(k.dtype)
        w = None
    u = None if z_weights is None else jnp.swapaxes(z_weights, 1, 2).astype(jnp.float32)
    walk = functools.partial(walk_states, k, v, w, d, chunk=chunk, bv=bv, directions=directions,
                             splits=splits, stages=stages, group=group, interpret=interpret,
                             with_z=with_z, u=u, z_method=z_method)
    return walk_in_runs(walk, d, s0, reverse=reverse, splits=splits, with_z=with_z)
