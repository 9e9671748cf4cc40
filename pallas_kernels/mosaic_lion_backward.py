"""LION's gradients kernel (``bidirectional.lion_backward``, one kernel) as a Pallas Mosaic GPU
kernel (Hopper, sm_90).

Same math as ``bidirectional._grads_kernel`` with ``parts="all"``: for chunk n with
chunk-local inclusive cumulative log-decays ``A`` (float32), ``e^head = exp(A)``, ``e^tail_j =
exp(sum_{s > j} a_s)``, the states of ``(k, v)`` before and after the chunk ``hf``, ``hb``
and those of ``(q, dnum)`` ``dhf``, ``dhb`` (normalised: their z, and the rows ``r = 1 / (den
+ eps)`` and ``u = -(dy . y)``),

    M  = exp(-|A_i - A_j|),   W = (Q K^T) * M,   G = dy V^T  (normalised: (G + u) * r)
    dQ = (G M) K + (dy hf^T [+ u zf]) [* r] * e^head + (dy hb^T [+ u zb]) [* r] * e^tail
    dK = (G M)^T Q + (V dhb^T [+ dzb]) * e^tail + (V dhf^T [+ dzf]) * e^head
    dV = (W [* r])^T dy + (K e^tail) dhb + (K e^head) dhf

(normalised with 16-bit inputs ``G M`` enters dQ's product in two 16-bit parts,
``bidirectional.two_parts``) and d log_decay's terms within the chunk
(``chunk_scan.crossing_sums``): the sums of the states' terms (``rowsum(Q * ...)``,
``rowsum(K * ...)``) by which side of the chunk their partner lies, and ``rowsum(Y) -
colsum(Y)``, ``Y = G * W * sign(i - j)``; and the pairs spanning the chunk
(``chunk_scan.through_terms``) from ``rowsum(hf * dhb + hb * dhf) [+ zf * dzb + zb * dzf]``,
the state tiles it holds. The kernel writes the three per-token sums and the ``Kp`` row sums;
the rest runs in XLA (``mosaic_causal_backward.log_decay_grads``).

Layout as ``mosaic_causal_backward.py``: one warpgroup per (b, h, run r) program walks the
chunks of its run with a TMA pipeline over q, k, v, dy, the four state tiles, the decay rows
(and r, u, the four z); per chunk ``Q K^T`` and ``dy V^T`` (two wgmmas), the masks and the
16-bit operands (``W r``, the parts of ``G M``, ``K e^tail`` over the chunk's k tile and ``K
e^head``) into shared memory, then dq's three products (the states' row sums while they
run) and dk's and dv's six, each group issued together. dq, dk, dv and the sums go out by
TMA from two steps' worth of buffers.
Rounding as the Triton kernel but the decayed keys of dv's state terms, rounded to the input
dtype before their products; 16-bit inputs only. Whole ``[Kp, Vp]`` tiles of four states per
step: Kp = Vp = 64 fits in shared memory (:func:`supported`).

On one H200 (2026-12-07, B 4, H 16, L 16K, D 64, bf16; docs/benchmarks.md) normalised LION's
forward + backward took 1.818 ms with this kernel against 2.078 with the Triton one.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.chunk_scan import mask_rows, runs_until
from pallas_kernels.mosaic_causal_backward import (SUMS, TARGET_PROGRAMS, chunk_inputs,
                                                   log_decay_grads, score_products,
                                                   store_outputs)
from pallas_kernels.mosaic_causal import layout_reason
from pallas_kernels.mosaic_states import _TILE16
from pallas_kernels.mosaic_tiles import (COLS, DECAY_ROWS, ROWS, WGMMA, cols_of,
                                        compiler_params, lion_mask, rows_of,
                                        tile_iota)

STAGES = 2


def smem_bytes(chunk, kp, vp, itemsize, normalize, stages=STAGES):
    """Shared memory of one program: ``stages`` steps of q, k, v, dy, four states, the rows
    (and r, u, four z); ``W r``, one or two parts of ``G M``, ``K e^head``; two steps of output
    buffers (dq, dk, dv and the float32 sums)."""
    step = (2 * chunk * kp + 2 * chunk * vp + 4 * kp * vp) * itemsize
    step += 4 * (len(DECAY_ROWS) * chunk + normalize * (2 * chunk + 4 * kp))
    scratch = (chunk * chunk * (2 + normalize) + chunk * kp) * itemsize
    outs = (2 * chunk * kp + chunk * vp) * itemsize + 4 * (SUMS * chunk + kp)
    return stages * step + scratch + 2 * outs


def supported(q, v, chunk, normalize):
    """None when :func:`lion_grads_mosaic` takes these padded inputs, else why (the Triton
    kernel takes them)."""
    smem = smem_bytes(chunk, q.shape[-1], v.shape[-1], q.dtype.itemsize, normalize)
    return layout_reason(q, v, chunk, "Mosaic LION gradients kernel", smem, "the Triton kernel")


def _kernel(q_ref, k_ref, v_ref, dy_ref, rows_ref, ru_ref, h_ref, dh_ref, z_ref, dz_ref,
            dq_ref, dk_ref, dv_ref, sums_ref, inner_ref, *, chunk, run, normalize):
    """One (b, h, run r) program over chunks ``r * run ... (r + 1) * run - 1``.

    q, k, dq, dk ``[B, L, H, Kp]``; v, dy, dv ``[B, L, H, Vp]``; rows ``[3, B, H, L]``
    float32 (A, e^head, e^tail); h, dh ``[2, B, H, N * Kp, Vp]`` (before the chunk, after it);
    normalize: ru ``[2, B, H, L]`` float32 (r, u), z, dz ``[2, B, H, N * Kp]`` float32, else
    None; sums ``[SUMS, B, H, L]`` and inner ``[B, H, N * Kp]`` (the states' row sums)
    float32.
    """
    b, hd, r = (lax.axis_index(a) for a in "bhr")
    kp, vp = q_ref.shape[-1], v_ref.shape[-1]
    dtype, f32 = q_ref.dtype, jnp.float32
    tile = (chunk, chunk)
    signs = jnp.sign((tile_iota(tile, 0) - tile_iota(tile, 1)).astype(f32))

    def step(idx, q_s, k_s, v_s, dy_s, a_s, eh_s, et_s, a_cols_s, hf_s, hb_s, dhf_s, dhb_s,
             *norm_s, p_s, gm_s, ke_s, outs):
        n = first + idx[0]
        slot = lax.rem(idx[0], jnp.asarray(2, idx[0].dtype))
        plgpu.wait_smem_to_gmem(1, wait_read_only=True)  # this slot's copies of step i - 2 read
        dq_s, dk_s, dv_s, sums_s, inner_s = (buf.at[slot] for buf in outs)
        row = lambda ref, shape: rows_of(plgpu.load(ref, layout=ROWS), shape)
        col = lambda ref, shape: cols_of(plgpu.load(ref, layout=COLS), shape)

        s, grad = score_products(q_s, k_s, dy_s, v_s)
        mask = lion_mask(a_s, a_cols_s, tile)
        w = s * mask
        if normalize:
            r_s, u_s, zf_s, zb_s, dzf_s, dzb_s = norm_s
            r_t = row(r_s, tile)
            grad = (grad + row(u_s, tile)) * r_t
            w_r = w * r_t
        else:
            w_r = w
        y = grad * w * signs
        gm = grad * mask
        p_s[...] = w_r.astype(dtype)
        gm_hi = gm.astype(dtype)
        gm_s[0] = gm_hi
        if normalize:  # dq's operand in two 16-bit parts (bidirectional.two_parts)
            gm_s[1] = (gm - gm_hi.astype(f32)).astype(dtype)
        plgpu.commit_smem()  # visible to the wgmmas

        def dq_products(acc_q, acc_f, acc_b):
            for m in range(1 + normalize):
                plgpu.wgmma(acc_q, gm_s.at[m], k_s)
            plgpu.wgmma(acc_f, dy_s, hf_s.transpose((1, 0)))  # keys before the chunk
            plgpu.wgmma(acc_b, dy_s, hb_s.transpose((1, 0)))  # keys after it
            # while they run: the pairs spanning the chunk (chunk_scan.through_terms)
            inner = sum(jnp.sum(plgpu.load(x, layout=WGMMA).astype(f32)
                                * plgpu.load(y, layout=WGMMA).astype(f32), axis=1)
                        for x, y in ((hf_s, dhb_s), (hb_s, dhf_s)))
            if normalize:
                z = [plgpu.load(x, layout=ROWS) for x in (zf_s, zb_s, dzf_s, dzb_s)]
                inner = inner + z[0] * z[3] + z[1] * z[2]
            inner_s[...] = inner
            return acc_q[...], acc_f[...], acc_b[...]

        acc = plgpu.ACC((chunk, kp), f32)
        dq, from_before, from_after = pl.run_scoped(dq_products, acc, acc, acc)
        shape = dq.shape
        eh, et = row(eh_s, shape), row(et_s, shape)
        if normalize:
            u, r_q = row(u_s, shape), row(r_s, shape)
            from_before = (from_before + u * col(zf_s, shape)) * r_q
            from_after = (from_after + u * col(zb_s, shape)) * r_q
        from_before, from_after = from_before * eh, from_after * et
        q = plgpu.load(q_s, layout=WGMMA).astype(f32)
        after = jnp.sum(y, axis=1) + jnp.sum(q * from_before, axis=1)
        before = jnp.sum(q * from_after, axis=1)
        dq_s[...] = (dq + from_before + from_after).astype(dtype)
        sums_s[1] = jnp.sum(y, axis=0)
        k = plgpu.load(k_s, layout=WGMMA).astype(f32)
        k_s[...] = (k * et).astype(dtype)  # (G M) K has read k
        ke_s[...] = (k * eh).astype(dtype)
        plgpu.commit_smem()

        def dkv_products(acc_k, acc_l, acc_e, acc_v):
            plgpu.wgmma(acc_k, gm_s.at[0].transpose((1, 0)), q_s)
            plgpu.wgmma(acc_l, v_s, dhb_s.transpose((1, 0)))  # queries after the chunk
            plgpu.wgmma(acc_e, v_s, dhf_s.transpose((1, 0)))  # queries before it
            plgpu.wgmma(acc_v, p_s.transpose((1, 0)), dy_s)
            plgpu.wgmma(acc_v, k_s, dhb_s)
            plgpu.wgmma(acc_v, ke_s, dhf_s)
            return acc_k[...], acc_l[...], acc_e[...], acc_v[...]

        dk, later, earlier, dv = pl.run_scoped(dkv_products, acc, acc, acc,
                                               plgpu.ACC((chunk, vp), f32))
        if normalize:
            later = later + col(dzb_s, shape)
            earlier = earlier + col(dzf_s, shape)
        later, earlier = later * et, earlier * eh
        sums_s[0] = after + jnp.sum(k * earlier, axis=1)
        sums_s[2] = before + jnp.sum(k * later, axis=1)
        dk_s[...] = (dk + later + earlier).astype(dtype)
        dv_s[...] = dv.astype(dtype)
        store_outputs((dq_s, dk_s, dv_s, sums_s, inner_s),
                      (dq_ref, dk_ref, dv_ref, sums_ref, inner_ref), b, hd, n, chunk)

    first = r * run
    states = [x.at[e, b, hd] for x in (h_ref, dh_ref) for e in (0, 1)]
    in_specs, in_refs, row_spec = chunk_inputs((q_ref, k_ref, v_ref, dy_ref), rows_ref, states,
                                               b, hd, first, chunk)
    if normalize:
        in_specs += [row_spec] * 2 + [plgpu.BlockSpec((kp,), lambda i: (first + i,))] * 4
        in_refs += [ru_ref.at[e, b, hd] for e in (0, 1)]
        in_refs += [x.at[e, b, hd] for x in (z_ref, dz_ref) for e in (0, 1)]

    def walk(p_s, gm_s, ke_s, *outs):
        plgpu.emit_pipeline(
            functools.partial(step, p_s=p_s, gm_s=gm_s, ke_s=ke_s, outs=outs),
            grid=(run,), in_specs=in_specs, max_concurrent_steps=STAGES)(*in_refs)
        plgpu.wait_smem_to_gmem(0)

    pl.run_scoped(walk, plgpu.SMEM(tile, dtype, transforms=_TILE16),
                  plgpu.SMEM((1 + normalize, *tile), dtype, transforms=_TILE16),
                  plgpu.SMEM((chunk, kp), dtype, transforms=_TILE16),
                  plgpu.SMEM((2, chunk, kp), dtype, transforms=_TILE16),
                  plgpu.SMEM((2, chunk, kp), dtype, transforms=_TILE16),
                  plgpu.SMEM((2, chunk, vp), dtype, transforms=_TILE16),
                  plgpu.SMEM((2, SUMS, chunk), f32), plgpu.SMEM((2, kp), f32))


def lion_grads_mosaic(q, k, v, dy, g, kv, qd, rows=None, *, chunk, normalize, interpret=None):
    """dq, dk, dv and d log_decay's in-chunk share of LION's backward on Mosaic GPU.

    Args:
      q, k: ``[B, L, H, Kp]``; v, dy: ``[B, L, H, Vp]``, bf16 or fp16, padded as
        ``two_pass.backward_layout`` pads them (see :func:`supported`); g: ``[B, L, H]``
        float32 log-decays.
      kv, qd: the states of ``(k, v)`` and of ``(q, dnum)`` as ``lion_backward`` walks them:
        ``(h[, z])``, h ``[2, B, H, N, Kp, Vp]`` in the input dtype (before the chunk, after
        it), z ``[2, B, H, N, Kp]`` float32 (normalize).
      rows: normalize only, ``(r, u)`` ``[B, L, H]`` float32 (``lion_backward``).
      interpret: None, or ``plgpu.InterpretGPUParams()`` to run the Mosaic GPU interpreter.
    Returns:
      ``(dq, dk, dv, dlog_decay [B, L, H] float32)``: the gradients padded as their inputs.
    """
    if (reason := supported(q, v, chunk, normalize)) is not None:
        raise ValueError(reason)
    B, L, H, kp = q.shape
    N = L // chunk
    runs = runs_until(B * H, N, TARGET_PROGRAMS)
    states = lambda x: x.reshape(2, B, H, N * kp, *x.shape[5:])
    norm = [None] * 3
    if normalize:
        norm = [jnp.stack([jnp.swapaxes(x, 1, 2) for x in rows]), states(kv[1]), states(qd[1])]
    out_type = (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(k.shape, q.dtype),
                jax.ShapeDtypeStruct(v.shape, q.dtype),
                jax.ShapeDtypeStruct((SUMS, B, H, L), jnp.float32),
                jax.ShapeDtypeStruct((B, H, N * kp), jnp.float32))
    dq, dk, dv, sums, inner = plgpu.kernel(
        functools.partial(_kernel, chunk=chunk, run=N // runs, normalize=normalize),
        out_type=out_type, grid=(B, H, runs), grid_names=tuple("bhr"), interpret=interpret,
        kernel_name="lion_grads_mosaic", compiler_params=compiler_params(),
    )(q, k, v, dy, mask_rows(g, chunk), norm[0], states(kv[0]), states(qd[0]), *norm[1:])
    return dq, dk, dv, log_decay_grads(sums, inner, g, chunk)
