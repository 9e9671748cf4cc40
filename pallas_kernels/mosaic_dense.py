"""``lion_dense``'s kernels as Pallas Mosaic GPU kernels (Hopper, sm_90): the forward, and the
dq and dk/dv launches of the backward.

Same math and outputs as ``lion_dense``'s Triton kernels. Forward: for a block of 64 query
rows ``i`` and every key ``j`` of the sequence (L <= 256),

    P_ij = (q_i . k_j) M_ij,   M_ij = mean_p exp(-|A^p_i - A^p_j|)   (M = 1 without decay),
    num_i = sum_j P_ij v_j,   den_i = sum_j P_ij,   y_i = num_i / (den_i + eps)  (normalize),

over the token orders p whose cumulative log-decays ``A^p`` (read back in token order) are
given (``lion_dense``'s ``orders``; one order: the token order's A, or one permutation's);
float32 accumulation, P rounded to the input dtype for ``P V`` (in two 16-bit parts with
``split``, and then y's low part written too, as the Triton kernel does under
differentiation). Backward (``lion_dense``'s module docstring has the formulas, one dA^p per
order): :func:`_dq_kernel` per query block takes delta from dy and y (+ its low part), writes
dq (dS in two 16-bit parts with ``split``), dden and each order's dA row part;
:func:`_dkv_kernel` per key block writes dk, dv and each order's dA column part, on transposed
tiles (keys on the rows). Unlike the Triton kernels these take the full mask on every tile and
dA's sums from float32 ``G^p = dP * S * M_p / n`` tiles, so dk needs no two-part products; the
signs of those sums come from the token indices in the token order, else from each order's
positions (``lion_dense``'s table, as ``[n, Lp]`` float32 rows).

Layout: one program (one warpgroup) per (b, h, 64-row block). The forward issues the TMA
copies of its query block and of all ``ceil(L / 64)`` key and value blocks at once (at most
four of each: at K = V = 128 they take 144 KiB of shared memory) and walks the key blocks as
they land: ``S = Q K^T`` (one wgmma, K read transposed from shared memory), the mask in
registers from the query rows' A (ROWS layout) and the key block's A (COLS layout), P to
shared memory as the A operand of the ``P V`` wgmma, issued together with the next block's
``Q K^T``; the row sums while they run. The backward kernels walk the other side's blocks in
a two-step TMA pipeline (``plgpu.emit_pipeline``), the gradients carried in registers.
TMA fills rows of a block past L with zeros (which add nothing: their S and dy are 0) and
drops stores past L; but its copies into swizzled tiles view the whole array in 8-row tiles,
so for L not a multiple of 8 (ViT's 197) the ``[B, L, H, D]`` arrays are padded to one and
the results sliced back (:func:`_whole_tiles`: copies in XLA, the cost of this first version;
docs/kernels.md, "lion_dense on Mosaic GPU"). Float32 rows (A, den, dden, dA) go as
``[B, H, Lp]``, L padded to a multiple of 64.

16-bit q, k, v with head dims 64 or 128 (:func:`supported`); ``lion_dense(...,
backend="mosaic")`` runs them. Tested in the Mosaic GPU interpreter and on one H200
(docs/kernels.md has the times).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.mosaic_states import SMEM_BYTES, _TILE16
from pallas_kernels.mosaic_tiles import COLS, ROWS, cols_of, rows_of

BLOCK = 64  # query rows per program (one warpgroup's wgmma) and key rows per step
MAX_LEN = 256
LOG2_E = float(np.log2(np.e))


def _smem_bytes(L, kp, vp, itemsize, orders):
    """The query block, all key and value blocks, P and its low part, the output blocks, and
    the float32 rows of each order's A and of den."""
    nb = -(-L // BLOCK)
    tiles = BLOCK * kp + nb * BLOCK * (kp + vp) + 2 * BLOCK * BLOCK + 2 * BLOCK * vp
    return tiles * itemsize + 4 * BLOCK * (orders * (nb + 1) + 1)


def _padded(L):
    """L up to a multiple of ``BLOCK``: the length of the kernels' float32 rows ``[B, H, Lp]``
    (padded to whole blocks, a copy of ``B H L`` floats, so no copy of a row runs past its
    array's end)."""
    return -(-L // BLOCK) * BLOCK


def _rows(x):
    """``[B, L, H]`` as the kernels' rows ``[B, H, Lp]`` (zeros past L)."""
    L = x.shape[1]
    return jnp.pad(jnp.swapaxes(x, 1, 2), ((0, 0), (0, 0), (0, _padded(L) - L)))


def _whole_tiles(*xs):
    """``[B, L, H, D]`` arrays with L padded by zeros to a multiple of 8 (as they are when it
    is one): TMA copies into swizzled shared-memory tiles view the whole array in 8-row
    tiles, so L = 197 takes copies of the arrays to 200 rows and of the results back."""
    pad = -xs[0].shape[1] % 8
    return [x if x is None or not pad else jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0)))
            for x in xs]


def _tokens(x, L):
    """The kernels' rows ``[B, H, Lp]`` back as ``[B, L, H]``."""
    return jnp.swapaxes(x[..., :L], 1, 2)


def supported(q, k, v, orders=1):
    """None when :func:`dense_forward_mosaic` takes these inputs (with ``orders`` arrays of
    A), else why (one line)."""
    if q.dtype not in (jnp.bfloat16, jnp.float16) or not q.dtype == k.dtype == v.dtype:
        return (f"the Mosaic dense forward takes bf16 or fp16 inputs (got {q.dtype}, "
                f"{k.dtype}, {v.dtype})")
    kp, vp, L = q.shape[-1], v.shape[-1], q.shape[1]
    if kp % 64 or vp % 64 or kp > 128 or vp > 128:
        return f"the Mosaic dense forward takes head dims 64 or 128 (got K={kp}, V={vp})"
    if not 1 <= L <= MAX_LEN:
        return f"the Mosaic dense forward takes L <= {MAX_LEN} (got {L})"
    need = _smem_bytes(L, kp, vp, q.dtype.itemsize, orders) + 4096
    if need > SMEM_BYTES:
        return f"the Mosaic dense forward needs {need} bytes of shared memory"
    return None


def _kernel(q_ref, k_ref, v_ref, a_ref, *out_refs, length, normalize, eps, split):
    """One (b, h, query block i). q, k ``[B, L, H, Kp]``; v ``[B, L, H, Vp]``; a
    ``[orders, B, H, Lp]`` float32 or None; outputs y ``[B, L, H, Vp]``, den ``[B, H, Lp]``
    float32 (normalize), y's low part ``[B, L, H, Vp]`` (split)."""
    out_refs = list(out_refs)
    y_ref = out_refs.pop(0)
    den_ref = out_refs.pop(0) if normalize else None
    lo_ref = out_refs.pop(0) if split else None
    b, hd, i = (lax.axis_index(x) for x in "bhi")
    nb = -(-length // BLOCK)
    kp, vp = q_ref.shape[-1], v_ref.shape[-1]
    dtype = q_ref.dtype
    f32 = jnp.float32
    orders = 0 if a_ref is None else a_ref.shape[0]
    rows = pl.ds(i * BLOCK, BLOCK)
    tile = (BLOCK, BLOCK)
    # The key blocks' starts as traced values: a static block past L fails Pallas's trace-time
    # bound check, while TMA itself zero-fills reads past the array's end.
    zero = i * 0

    def body(q_s, k_s, v_s, p_s, o_s, aq_s, akv_s, den_s, q_bar, kv_bars):
        plgpu.copy_gmem_to_smem(q_ref.at[b, rows, hd, :], q_s, q_bar)
        for o in range(orders):
            plgpu.copy_gmem_to_smem(a_ref.at[o, b, hd, rows], aq_s.at[o], q_bar)
        for j in range(nb):
            keys = pl.ds(zero + j * BLOCK, BLOCK)
            plgpu.copy_gmem_to_smem(k_ref.at[b, keys, hd, :], k_s.at[j], kv_bars.at[j])
            plgpu.copy_gmem_to_smem(v_ref.at[b, keys, hd, :], v_s.at[j], kv_bars.at[j])
            for o in range(orders):
                plgpu.copy_gmem_to_smem(a_ref.at[o, b, hd, keys], akv_s.at[o, j], kv_bars.at[j])
        plgpu.barrier_wait(q_bar)
        a_i = [rows_of(plgpu.load(aq_s.at[o], layout=ROWS), tile) for o in range(orders)]

        def scores(acc):
            plgpu.barrier_wait(kv_bars.at[0])
            plgpu.wgmma(acc, q_s, k_s.at[0].transpose((1, 0)))
            return acc[...]

        s = pl.run_scoped(scores, plgpu.ACC(tile, f32))
        num = den = None
        for j in range(nb):
            p = s
            if orders:
                p = p * _masks(a_i, [akv_s.at[o, j] for o in range(orders)], p.shape)[1]
            p_hi = p.astype(dtype)
            parts = [p_hi] + ([(p - p_hi.astype(f32)).astype(dtype)] if split else [])
            for n, part in enumerate(parts):
                p_s.at[n][...] = part
            plgpu.commit_smem()

            def products(acc_pv, *acc_s, j=j, n_parts=len(parts), p=p):
                """P V of block j, and S of block j + 1 (if any) behind it; den's sums of
                block j while they run."""
                for n in range(n_parts):
                    plgpu.wgmma(acc_pv, p_s.at[n], v_s.at[j])
                if acc_s:
                    plgpu.barrier_wait(kv_bars.at[j + 1])
                    plgpu.wgmma(acc_s[0], q_s, k_s.at[j + 1].transpose((1, 0)))
                row_sums = jnp.sum(p, axis=1) if normalize else None
                return acc_pv[...], (acc_s[0][...] if acc_s else None), row_sums

            accs = [plgpu.ACC((BLOCK, vp), f32)] + [plgpu.ACC(tile, f32)] * (j + 1 < nb)
            pv, s, row_sums = pl.run_scoped(products, *accs)
            num = pv if num is None else num + pv
            if normalize:
                den = row_sums if den is None else den + row_sums
        if normalize:
            y = num / rows_of(den + eps, num.shape)
        else:
            y = num
        y_hi = y.astype(dtype)
        o_s.at[0][...] = y_hi
        if split:
            o_s.at[1][...] = (y - y_hi.astype(f32)).astype(dtype)
        if normalize:
            den_s[...] = den
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_s.at[0], y_ref.at[b, rows, hd, :])
        if split:
            plgpu.copy_smem_to_gmem(o_s.at[1], lo_ref.at[b, rows, hd, :])
        if normalize:
            plgpu.copy_smem_to_gmem(den_s, den_ref.at[b, hd, rows])
        plgpu.wait_smem_to_gmem(0)

    parts = 1 + split
    pl.run_scoped(
        body,
        plgpu.SMEM((BLOCK, kp), dtype, transforms=_TILE16),
        plgpu.SMEM((nb, BLOCK, kp), dtype, transforms=_TILE16),
        plgpu.SMEM((nb, BLOCK, vp), dtype, transforms=_TILE16),
        plgpu.SMEM((parts, BLOCK, BLOCK), dtype, transforms=_TILE16),
        plgpu.SMEM((parts, BLOCK, vp), dtype, transforms=_TILE16),
        plgpu.SMEM((max(orders, 1), BLOCK), f32),
        plgpu.SMEM((max(orders, 1), nb, BLOCK), f32),
        plgpu.SMEM((BLOCK,), f32),
        plgpu.Barrier(num_arrivals=1 + orders),  # the query block's copies
        plgpu.Barrier(num_arrivals=2 + orders, num_barriers=nb),  # each key block's
    )


def dense_forward_mosaic(q, k, v, a, *, normalize, eps, split, interpret=None):
    """``lion_dense``'s forward on Mosaic GPU for one token order.

    Args:
      q, k: ``[B, L, H, K]``; v: ``[B, L, H, V]``; bf16 or fp16 (:func:`supported`).
      a: ``()`` (no decay) or a tuple of ``[B, L, H]`` float32 arrays, each order's cumulative
        log-decays A read back in token order.
      normalize, eps: as ``lion_dense``; split: P in two 16-bit parts and y's low part out.
      interpret: None, or ``plgpu.InterpretGPUParams()`` to run the Mosaic GPU interpreter.
    Returns:
      ``(y [B, L, H, V] v.dtype, den [B, L, H] float32 or None, y's low part or None)``.
    """
    if (reason := supported(q, k, v, max(len(a), 1))) is not None:
        raise ValueError(reason)
    B, L, H, _ = q.shape
    q, k, v = _whole_tiles(q, k, v)
    out_type = [jax.ShapeDtypeStruct(v.shape, v.dtype)]
    if normalize:
        out_type.append(jax.ShapeDtypeStruct((B, H, _padded(L)), jnp.float32))
    if split:
        out_type.append(jax.ShapeDtypeStruct(v.shape, v.dtype))
    kernel = plgpu.kernel(
        functools.partial(_kernel, length=L, normalize=normalize, eps=eps, split=split),
        out_type=tuple(out_type), grid=(B, H, -(-L // BLOCK)), grid_names=tuple("bhi"),
        compiler_params=plgpu.CompilerParams(approx_math=True), interpret=interpret,
        kernel_name="lion_dense_forward_mosaic")
    a_t = jnp.stack([_rows(x) for x in a]) if a else None
    outs = list(kernel(q, k, v, a_t))
    y = outs.pop(0)[:, :L]
    den = _tokens(outs.pop(0), L) if normalize else None
    return y, den, (outs.pop(0)[:, :L] if split else None)


# ------------------------------------------------------------------------------------------
# Backward: ``lion_dense``'s dq and dk/dv launches, any number of orders.


def _signs(row_start, col_start, shape):
    """``sign(t_i - t_j)`` ``[R, C]`` float32 (WGMMA layout) for the tokens of a row block
    starting at ``row_start`` and a column block at ``col_start``: the sign of
    ``d(-|A_i - A_j|) / dA_i`` in the token order (``lion_dense``'s module docstring)."""
    rows = plgpu.broadcasted_iota(jnp.int32, shape, 0, layout=plgpu.Layout.WGMMA) + row_start
    cols = plgpu.broadcasted_iota(jnp.int32, shape, 1, layout=plgpu.Layout.WGMMA) + col_start
    return jnp.sign((rows - cols).astype(jnp.float32))


def _mask(a_rows, a_cols_s, shape):
    """``M = exp(-|A_i - A_j|)`` ``[R, C]`` from the rows' A (a tile) and the columns' A in
    shared memory."""
    a_j = cols_of(plgpu.load(a_cols_s, layout=COLS), shape)
    return jnp.exp2(jnp.abs(a_rows - a_j) * -LOG2_E)


def _masks(a_rows, a_cols_s, shape):
    """``(masks, mean)``: each order's mask (:func:`_mask`; ``a_rows`` a list of tiles,
    ``a_cols_s`` of shared-memory rows, one per order) and their mean, the mask of P."""
    masks = [_mask(a, a_s, shape) for a, a_s in zip(a_rows, a_cols_s)]
    return masks, masks[0] if len(masks) == 1 else sum(masks) * (1.0 / len(masks))


def _decay_terms(a_rows, a_cols_s, pos_rows, pos_cols_s, row_start, col_start, dp, s, da):
    """One tile's decay work in the backward: ``(mean mask, da)`` with each order's dA sums
    ``da`` (a tuple) plus ``rowsum(sign_p * dP * S * M_p)``. ``a_rows``, ``pos_rows``: each
    order's A and positions on the tile's rows (tiles); ``a_cols_s``, ``pos_cols_s``: on its
    columns (shared-memory rows); ``pos_rows`` None: the token order, whose signs come from
    the token indices (:func:`_signs`) at ``row_start`` and ``col_start``."""
    masks, mean = _masks(a_rows, a_cols_s, dp.shape)
    if pos_rows is None:
        signs = [_signs(row_start, col_start, dp.shape)] * len(masks)
    else:
        signs = [jnp.sign(p - cols_of(plgpu.load(p_s, layout=COLS), dp.shape))
                 for p, p_s in zip(pos_rows, pos_cols_s)]
    g = dp * s
    return mean, tuple(d + jnp.sum(sg * g * m, axis=1) for d, sg, m in zip(da, signs, masks))


def _write_back(outs, da, da_s, da_dst):
    """A backward kernel's end: each order's dA sums ``da`` over the orders' count into
    ``da_s.at[o]`` (free rows of shared memory) for ``da_dst(o)``, then every ``(shared, global)``
    pair of ``outs`` and those copied out by TMA, waited for."""
    outs = list(outs)
    for o, d in enumerate(da):
        da_s.at[o][...] = d * (1.0 / len(da))
        outs.append((da_s.at[o], da_dst(o)))
    plgpu.commit_smem()
    for src, dst in outs:
        plgpu.copy_smem_to_gmem(src, dst)
    plgpu.wait_smem_to_gmem(0)


def _two_parts(x, dtype):
    """``x`` float32 as ``[hi, lo]`` in ``dtype`` (``hi + lo`` to ~16 bits)."""
    hi = x.astype(dtype)
    return [hi, (x - hi.astype(jnp.float32)).astype(dtype)]


def _dq_kernel(q_ref, k_ref, v_ref, dy_ref, y_ref, lo_ref, den_ref, a_ref, pos_ref, dq_ref,
               *out_refs, length, normalize, eps, split):
    """One (b, h, query block i): dq, and (normalize) ``dden = -delta / (den + eps)``, (decay)
    the row part of each order's dA. q, k ``[B, L, H, K]``; v, dy, y, y's low part ``[B, L,
    H, V]``; den, dden ``[B, H, Lp]`` float32 (:func:`_rows`); a, dA ``[n, B, H, Lp]``, one A
    per order; pos ``[n, Lp]`` float32, each token's position in each order, None for the
    token order; y, lo, den None when not normalised (lo: not split), a None without decay."""
    out_refs = list(out_refs)
    dden_ref = out_refs.pop(0) if normalize else None
    da_ref = out_refs.pop(0) if a_ref is not None else None
    b, hd, i = (lax.axis_index(x) for x in "bhi")
    kp, vp = q_ref.shape[-1], v_ref.shape[-1]
    dtype, f32 = q_ref.dtype, jnp.float32
    n = 0 if a_ref is None else a_ref.shape[0]
    tables = n if pos_ref is not None else 0
    rows = pl.ds(i * BLOCK, BLOCK)
    tile = (BLOCK, BLOCK)

    def body(q_s, dy_s, y_s, lo_s, ds_s, den_s, a_s, pos_s, bar):
        ins = [(q_ref.at[b, rows, hd, :], q_s), (dy_ref.at[b, rows, hd, :], dy_s)]
        if normalize:
            ins += [(y_ref.at[b, rows, hd, :], y_s), (den_ref.at[b, hd, rows], den_s)]
            ins += [(lo_ref.at[b, rows, hd, :], lo_s)] * split
        ins += [(a_ref.at[o, b, hd, rows], a_s.at[o]) for o in range(n)]
        ins += [(pos_ref.at[o, rows], pos_s.at[o]) for o in range(tables)]
        for src, dst in ins:
            plgpu.copy_gmem_to_smem(src, dst, bar)
        plgpu.barrier_wait(bar)
        r = dden = None
        if normalize:
            y = plgpu.load(y_s, layout=plgpu.Layout.WGMMA).astype(f32)
            if split:
                y = y + plgpu.load(lo_s, layout=plgpu.Layout.WGMMA).astype(f32)
            delta = jnp.sum(plgpu.load(dy_s, layout=plgpu.Layout.WGMMA).astype(f32) * y, axis=1)
            r = 1.0 / (plgpu.load(den_s, layout=ROWS) + eps)
            dden = -r * delta
        a_i = [rows_of(plgpu.load(a_s.at[o], layout=ROWS), tile) for o in range(n)]
        pos_i = ([rows_of(plgpu.load(pos_s.at[o], layout=ROWS), tile) for o in range(n)]
                 if tables else None)

        def step(idx, k_s, v_s, *rest):
            *cols_s, (dq, da) = rest

            def products(acc_s, acc_dp):
                plgpu.wgmma(acc_s, q_s, k_s.transpose((1, 0)))
                plgpu.wgmma(acc_dp, dy_s, v_s.transpose((1, 0)))
                return acc_s[...], acc_dp[...]

            s, dp = pl.run_scoped(products, plgpu.ACC(tile, f32), plgpu.ACC(tile, f32))
            if normalize:
                dp = dp * rows_of(r, tile) + rows_of(dden, tile)
            ds = dp
            if n:
                mean, da = _decay_terms(a_i, cols_s[:n], pos_i, cols_s[n:], i * BLOCK,
                                        idx[0] * BLOCK, dp, s, da)
                ds = dp * mean
            parts = _two_parts(ds, dtype) if split else [ds.astype(dtype)]
            for m, part in enumerate(parts):
                ds_s.at[m][...] = part
            plgpu.commit_smem()

            def gradient(acc):
                for m in range(len(parts)):
                    plgpu.wgmma(acc, ds_s.at[m], k_s)
                return acc[...]

            return dq + pl.run_scoped(gradient, plgpu.ACC((BLOCK, kp), f32)), da

        specs = [plgpu.BlockSpec((BLOCK, kp), lambda j: (j, 0), transforms=_TILE16),
                 plgpu.BlockSpec((BLOCK, vp), lambda j: (j, 0), transforms=_TILE16)]
        refs = [k_ref.at[b, :, hd, :], v_ref.at[b, :, hd, :]]
        specs += [plgpu.BlockSpec((BLOCK,), lambda j: (j,))] * (n + tables)
        refs += [a_ref.at[o, b, hd] for o in range(n)] + [pos_ref.at[o] for o in range(tables)]
        zeros = (plgpu.layout_cast(jnp.zeros((BLOCK, kp), f32), plgpu.Layout.WGMMA),
                 tuple(plgpu.layout_cast(jnp.zeros((BLOCK,), f32), ROWS) for _ in range(n)))
        dq, da = plgpu.emit_pipeline(step, grid=(-(-length // BLOCK),), in_specs=specs,
                                     max_concurrent_steps=2, init_carry=zeros)(*refs)
        q_s[...] = dq.astype(dtype)  # the loaded tiles are free: the out buffers
        outs = [(q_s, dq_ref.at[b, rows, hd, :])]
        if normalize:
            den_s[...] = dden
            outs.append((den_s, dden_ref.at[b, hd, rows]))
        _write_back(outs, da, a_s, lambda o: da_ref.at[o, b, hd, rows])

    pl.run_scoped(
        body,
        plgpu.SMEM((BLOCK, kp), dtype, transforms=_TILE16),
        *[plgpu.SMEM((BLOCK, vp), dtype, transforms=_TILE16)] * 3,
        plgpu.SMEM((1 + split, BLOCK, BLOCK), dtype, transforms=_TILE16),
        plgpu.SMEM((BLOCK,), f32),
        plgpu.SMEM((max(n, 1), BLOCK), f32),
        plgpu.SMEM((max(tables, 1), BLOCK), f32),
        plgpu.Barrier(num_arrivals=2 + (2 + split) * normalize + n + tables),
    )


def _dkv_kernel(q_ref, k_ref, v_ref, dy_ref, den_ref, dden_ref, a_ref, pos_ref, dk_ref, dv_ref,
                *out_refs, length, normalize, eps):
    """One (b, h, key block j): dk, dv and (decay) the column part of each order's dA,
    walking the query blocks. Tiles are transposed (keys on the rows): ``S^T = K Q^T``,
    ``dP^T = V dY^T``, ``dv = (P r)^T dY``, ``dk = dS^T Q``. Refs as :func:`_dq_kernel`; den,
    dden None when not normalised."""
    da_ref = out_refs[0] if out_refs else None
    b, hd, j = (lax.axis_index(x) for x in "bhj")
    kp, vp = k_ref.shape[-1], v_ref.shape[-1]
    dtype, f32 = k_ref.dtype, jnp.float32
    n = 0 if a_ref is None else a_ref.shape[0]
    tables = n if pos_ref is not None else 0
    keys = pl.ds(j * BLOCK, BLOCK)
    tile = (BLOCK, BLOCK)

    def body(k_s, v_s, p_s, ds_s, a_s, pos_s, bar):
        ins = [(k_ref.at[b, keys, hd, :], k_s), (v_ref.at[b, keys, hd, :], v_s)]
        ins += [(a_ref.at[o, b, hd, keys], a_s.at[o]) for o in range(n)]
        ins += [(pos_ref.at[o, keys], pos_s.at[o]) for o in range(tables)]
        for src, dst in ins:
            plgpu.copy_gmem_to_smem(src, dst, bar)
        plgpu.barrier_wait(bar)
        a_k = [rows_of(plgpu.load(a_s.at[o], layout=ROWS), tile) for o in range(n)]
        pos_k = ([rows_of(plgpu.load(pos_s.at[o], layout=ROWS), tile) for o in range(n)]
                 if tables else None)

        def step(idx, q_s, dy_s, *rest):
            *cols_s, (dk, dv, da) = rest
            cols_s = list(cols_s)

            def products(acc_s, acc_dp):
                plgpu.wgmma(acc_s, k_s, q_s.transpose((1, 0)))
                plgpu.wgmma(acc_dp, v_s, dy_s.transpose((1, 0)))
                return acc_s[...], acc_dp[...]

            st, dpt = pl.run_scoped(products, plgpu.ACC(tile, f32), plgpu.ACC(tile, f32))
            if normalize:
                r = cols_of(1.0 / (plgpu.load(cols_s.pop(0), layout=COLS) + eps), tile)
                dpt = dpt * r + cols_of(plgpu.load(cols_s.pop(0), layout=COLS), tile)
            pt, dst = st, dpt
            if n:
                mean, da = _decay_terms(a_k, cols_s[:n], pos_k, cols_s[n:], j * BLOCK,
                                        idx[0] * BLOCK, dpt, st, da)
                pt, dst = st * mean, dpt * mean
            p_s[...] = (pt * r if normalize else pt).astype(dtype)
            ds_s[...] = dst.astype(dtype)
            plgpu.commit_smem()

            def gradients(acc_v, acc_k):
                plgpu.wgmma(acc_v, p_s, dy_s)
                plgpu.wgmma(acc_k, ds_s, q_s)
                return acc_v[...], acc_k[...]

            gv, gk = pl.run_scoped(gradients, plgpu.ACC((BLOCK, vp), f32),
                                   plgpu.ACC((BLOCK, kp), f32))
            return dk + gk, dv + gv, da

        specs = [plgpu.BlockSpec((BLOCK, kp), lambda i: (i, 0), transforms=_TILE16),
                 plgpu.BlockSpec((BLOCK, vp), lambda i: (i, 0), transforms=_TILE16)]
        refs = [q_ref.at[b, :, hd, :], dy_ref.at[b, :, hd, :]]
        row_refs = ([den_ref.at[b, hd], dden_ref.at[b, hd]] if normalize else []) + [
            a_ref.at[o, b, hd] for o in range(n)] + [pos_ref.at[o] for o in range(tables)]
        specs += [plgpu.BlockSpec((BLOCK,), lambda i: (i,))] * len(row_refs)
        zeros = (plgpu.layout_cast(jnp.zeros((BLOCK, kp), f32), plgpu.Layout.WGMMA),
                 plgpu.layout_cast(jnp.zeros((BLOCK, vp), f32), plgpu.Layout.WGMMA),
                 tuple(plgpu.layout_cast(jnp.zeros((BLOCK,), f32), ROWS) for _ in range(n)))
        dk, dv, da = plgpu.emit_pipeline(step, grid=(-(-length // BLOCK),), in_specs=specs,
                                         max_concurrent_steps=2, init_carry=zeros)(
            *refs, *row_refs)
        k_s[...] = dk.astype(dtype)  # the key and value tiles are free: the out buffers
        v_s[...] = dv.astype(dtype)
        outs = [(k_s, dk_ref.at[b, keys, hd, :]), (v_s, dv_ref.at[b, keys, hd, :])]
        _write_back(outs, da, a_s, lambda o: da_ref.at[o, b, hd, keys])

    pl.run_scoped(
        body,
        plgpu.SMEM((BLOCK, kp), dtype, transforms=_TILE16),
        plgpu.SMEM((BLOCK, vp), dtype, transforms=_TILE16),
        *[plgpu.SMEM(tile, dtype, transforms=_TILE16)] * 2,
        plgpu.SMEM((max(n, 1), BLOCK), f32),
        plgpu.SMEM((max(tables, 1), BLOCK), f32),
        plgpu.Barrier(num_arrivals=2 + n + tables),
    )


def _positions(positions, L):
    """Each order's positions (``lion_dense``'s table, a tuple per order) as ``[n, Lp]``
    float32 (tokens past L: their own index, which meets only zero tiles); None for ()."""
    if not positions:
        return None
    table = np.tile(np.arange(_padded(L), dtype=np.float32), (len(positions), 1))
    table[:, :L] = np.asarray(positions, np.float32)
    return jnp.asarray(table)


def dense_backward_mosaic(q, k, v, a, y, den, y_low, dy, *, positions, normalize, eps, split,
                          interpret=None):
    """``lion_dense``'s backward on Mosaic GPU.

    Args:
      q, k, v, dy: as the forward's inputs and y's cotangent (v's dtype).
      a: ``()`` or one A ``[B, L, H]`` float32 per order, in token order; positions: ``()``
        (the token order) or per order each token's position in it (``lion_dense``'s table);
        y, den, y_low: the forward's residuals (normalize; y_low with split, else None).
      normalize, eps, split: as the forward (split: dS in two 16-bit parts in the dq launch).
    Returns:
      ``(dq, dk, dv, dA)``: dq, dk, dv in the inputs' dtype; dA a list of float32
      ``[B, L, H]``, one per order (empty without decay).
    """
    if (reason := supported(q, k, v, max(len(a), 1))) is not None:
        raise ValueError(reason)
    B, L, H, _ = q.shape
    nb = -(-L // BLOCK)
    q, k, v, dy, y, y_low = _whole_tiles(q, k, v, dy, y, y_low)
    a_t = jnp.stack([_rows(x) for x in a]) if a else None
    pos_t = _positions(positions, L) if a else None
    den_t = _rows(den) if normalize else None
    vec = jax.ShapeDtypeStruct((B, H, _padded(L)), jnp.float32)
    das = jax.ShapeDtypeStruct((len(a), B, H, _padded(L)), jnp.float32)
    params = dict(compiler_params=plgpu.CompilerParams(approx_math=True), interpret=interpret)
    dq_out = [jax.ShapeDtypeStruct(q.shape, q.dtype)] + [vec] * normalize + [das] * bool(a)
    res = list(plgpu.kernel(
        functools.partial(_dq_kernel, length=L, normalize=normalize, eps=eps, split=split),
        out_type=tuple(dq_out), grid=(B, H, nb), grid_names=tuple("bhi"),
        kernel_name="lion_dense_dq_mosaic", **params)(
            q, k, v, dy, y if normalize else None, y_low if split else None, den_t, a_t, pos_t))
    dq = res.pop(0)
    dden = res.pop(0) if normalize else None
    dkv_out = [jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)]
    dk, dv, *da_cols = plgpu.kernel(
        functools.partial(_dkv_kernel, length=L, normalize=normalize, eps=eps),
        out_type=tuple(dkv_out + [das] * bool(a)), grid=(B, H, nb), grid_names=tuple("bhj"),
        kernel_name="lion_dense_dkv_mosaic", **params)(q, k, v, dy, den_t, dden, a_t, pos_t)
    dq, dk, dv = (x[:, :L] for x in (dq, dk, dv))
    return dq, dk, dv, [_tokens(d, L) for d in res[0] + da_cols[0]] if a else []
