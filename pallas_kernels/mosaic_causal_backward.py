"""The causal backward's gradients kernel (``causal_backward.py``) as a Pallas Mosaic GPU
kernel (Hopper, sm_90).

Same math as ``causal_backward._grads_kernel``: for chunk n with chunk-local inclusive
cumulative log-decays ``A`` (float32), the forward state ``h`` entering the chunk and the
reverse state ``dh`` of ``(q, do)`` leaving it,

    D   = exp(A_i - A_j) [i >= j]                                  [C, C]
    P   = (Q K^T) * D,       dP = (dO V^T) * D
    dQ  = dP K + (dO h^T) * e^A                  e^A_i = exp(A_i)
    dK  = dP^T Q + (V dh^T) * e^tail             e^tail_j = exp(sum_{s > j} a_s)
    dV  = P^T dO + (K * e^tail) dh

and d log_decay's terms within the chunk (``chunk_scan.crossing_sums``): ``after`` =
``rowsum(X) + rowsum(Q * (dO h^T) e^A)`` less ``colsum(X)``, ``X = (Q K^T) * (dO V^T) * D``
below the diagonal, and ``before = rowsum(K * (V dh^T) e^tail)``; and the pairs spanning the
chunk (``chunk_scan.through_terms``) from ``rowsum(h * dh)``, the state tiles it holds. The
kernel writes the three per-token sums and the ``Kp`` row sums; the cumulative sums over each
chunk's tokens and the rest of the through terms run in XLA (:func:`grads_mosaic`).

Kernel layout: one program per (b, h, run r) walks the chunks of its run with a TMA pipeline
(``plgpu.emit_pipeline``, ``STAGES`` steps in flight) over q, k ``[C, Kp]``, v, do ``[C,
Vp]``, h[n], dh[n] ``[Kp, Vp]`` and four decay rows (A, e^A, e^tail, and A again, read in the
columns' layout); one warpgroup per program. Per chunk: two wgmmas for ``Q K^T`` and ``dO
V^T``; the mask, P and dP in registers, P and dP rounded to the input dtype into shared
memory; then two groups of wgmmas, each issued together: dq's (``dO h^T``, ``dP K``) and
dk's and dv's (``V dh^T``, ``dP^T Q``, ``P^T dO`` and ``(K e^tail) dh``, the scaled keys
written over the chunk's k tile, which ``dP K`` has read), ``rowsum(h * dh)`` while those
run. P and dP enter the last products transposed from shared memory (the wgmma reads them in
either order). dq, dk, dv and the sums go out by TMA from two steps' worth of buffers, each
step's copies overlapping the next step.

Rounding: as the Triton kernel but ``K e^tail``, rounded to the input dtype before its
product and in the keys' state term of d log_decay (the forward kernels round their decayed
operands the same way), so only 16-bit inputs are taken.

Shared memory: whole ``[Kp, Vp]`` state tiles per step. At Kp = Vp = 64 two steps of every
input fit, as above. At Kp or Vp 128 two steps of every input would take 258 KiB of the 227, so
there (:func:`layout`, ``SINGLE_BUFFERED``) the pipeline takes q, k, v, do and the decay rows
only, one pair of state tiles receives chunk n's h and dh by TMA at the step's start (read
while ``Q K^T`` and ``dO V^T`` are formed), dk's products are issued before dv's (fewer
accumulators held at once), and dq, dk and dv go out from the chunk's own q, k and v tiles
once nothing reads them, the step waiting for those copies before the pipeline refills the
tiles (212.5 KiB at Kp = Vp = 128).

On one H200 (2026-12-07, B 4, H 16, L 16K, D 64, bf16; docs/benchmarks.md) the causal op's
forward + backward took 1.040 ms with this kernel against 1.279 with the Triton one.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.chunk_scan import crossing_sums, mask_rows, runs_until, spread_through
from pallas_kernels.mosaic_causal import layout_reason
from pallas_kernels.mosaic_states import SMEM_BYTES, _TILE16
from pallas_kernels.mosaic_tiles import (DECAY_ROWS, ROWS, WGMMA, causal_mask,
                                        compiler_params, rows_of, tile_iota)
from pallas_kernels.two_pass import WALK_BLOCK_V, walk_backend

# Pipeline steps in flight (chunks loaded ahead of the one computed, plus that one).
STAGES = 2
# Cut the chunks into runs until there are this many programs (chunk_scan.runs_until).
TARGET_PROGRAMS = 512
# Whether the kernel takes inputs whose states do not fit its pipeline (Kp or Vp 128: one pair
# of state tiles, :func:`layout`). Off until compiled and timed on a GPU (tested in the Mosaic
# GPU interpreter against the Triton kernel); read when the op is traced
# (``experiments.ab_settings``: mosaic_causal_backward.SINGLE_BUFFERED=True).
SINGLE_BUFFERED = False
# Per-token sums written per chunk: rowsum(X) + the queries' states term, colsum(X), and
# the keys' states term.
SUMS = 3


def smem_bytes(chunk, kp, vp, itemsize, piped, stages=STAGES):
    """Shared memory of one program: ``stages`` steps of q, k, v, do (16-bit) and the decay
    rows; P and dP; two steps of the float32 sums; ``piped``: the states h, dh in the pipeline
    too and two steps of output buffers (dq, dk, dv), else one pair of state tiles (the
    gradients go out from the chunk's own q, k and v tiles)."""
    step = (2 * chunk * kp + 2 * chunk * vp) * itemsize + len(DECAY_ROWS) * 4 * chunk
    sums = 2 * 4 * (SUMS * chunk + kp)
    states = 2 * kp * vp * itemsize
    outs = 2 * (2 * chunk * kp + chunk * vp) * itemsize
    fixed = 2 * chunk * chunk * itemsize + sums
    if piped:
        return stages * (step + states) + outs + fixed
    return stages * step + states + fixed


def layout(q, v, chunk):
    """``(piped, reason)``: whether the kernel keeps the states in its pipeline (two chunks'
    ``[Kp, Vp]`` tiles of h and dh, and output buffers of their own; Kp = Vp = 64), else one
    pair of state tiles loaded at each chunk's start, the gradients stored from the chunk's own
    input tiles (Kp 128: two steps of every input would take 258 KiB of the 227); ``reason`` None
    when it takes these padded inputs, else why (the Triton kernel takes them)."""
    args = (chunk, q.shape[-1], v.shape[-1], q.dtype.itemsize)
    piped = smem_bytes(*args, piped=True) + 4096 <= SMEM_BYTES
    smem = smem_bytes(*args, piped=piped)
    reason = layout_reason(q, v, chunk, "Mosaic causal gradients kernel", smem,
                           "the Triton kernel")
    if reason is None and not piped and not SINGLE_BUFFERED:
        reason = (f"the Mosaic causal gradients kernel takes Kp = {args[1]}, Vp = {args[2]} "
                  f"only with mosaic_causal_backward.SINGLE_BUFFERED = True (not yet timed on "
                  f"a GPU); use the Triton kernel")
    return piped, reason


def supported(q, v, chunk):
    """None when :func:`grads_mosaic` takes these padded inputs (``two_pass.pad_layout``),
    else why (the Triton kernel takes them)."""
    return layout(q, v, chunk)[1]


def takes_mosaic(grads, reason, k, v, *, chunk, backend, interpret):
    """Whether a fused backward takes its Mosaic GPU gradients kernel (this module's or
    ``mosaic_lion_backward.py``'s) for its ``grads`` argument: "auto" where the states walks
    run on Mosaic GPU (``two_pass.walk_backend``) and ``reason`` (the kernel's ``supported``)
    is None, "mosaic" (a ValueError with the reason where it is not None) or "triton"."""
    if grads not in ("auto", "mosaic", "triton"):
        raise ValueError(f"grads must be 'auto', 'mosaic' or 'triton'; got {grads!r}")
    if grads == "mosaic" and reason is not None:
        raise ValueError(f"grads='mosaic': {reason}; use grads='auto' or 'triton'")
    if grads != "auto":
        return grads == "mosaic"
    walk = walk_backend(k, v, chunk=chunk, bv=min(v.shape[-1], WALK_BLOCK_V), backend=backend,
                        interpret=interpret)
    return reason is None and walk == "mosaic"


def chunk_inputs(tokens, rows_ref, states, b, hd, first, chunk):
    """The pipeline's inputs from chunk ``first`` on, for program (b, hd): ``(specs, refs,
    row_spec)`` of the token refs ``tokens`` (q, k ``[B, L, H, Kp]``, v, dy ``[B, L, H,
    Vp]``), the decay rows (``DECAY_ROWS`` of ``rows_ref [3, B, H, L]``) and the state refs
    ``states`` (each ``[N * Kp, Vp]``, this program's), and the spec of one more row."""
    kp, vp = tokens[0].shape[-1], tokens[2].shape[-1]
    tile = lambda width: plgpu.BlockSpec((chunk, width), lambda i: (first + i, 0),
                                         transforms=_TILE16)
    row = plgpu.BlockSpec((chunk,), lambda i: (first + i,))
    state = plgpu.BlockSpec((kp, vp), lambda i: (first + i, 0), transforms=_TILE16)
    specs = [tile(kp)] * 2 + [tile(vp)] * 2 + [row] * len(DECAY_ROWS) + [state] * len(states)
    refs = [x.at[b, :, hd, :] for x in tokens] + [rows_ref.at[e, b, hd] for e in DECAY_ROWS]
    return specs, refs + list(states), row


def score_products(q_s, k_s, dy_s, v_s):
    """``(Q K^T, dy V^T)``, ``[C, C]`` float32 each: two wgmmas issued together, K and V read
    transposed from shared memory."""
    def products(acc_s, acc_g):
        plgpu.wgmma(acc_s, q_s, k_s.transpose((1, 0)))
        plgpu.wgmma(acc_g, dy_s, v_s.transpose((1, 0)))
        return acc_s[...], acc_g[...]

    tile = (q_s.shape[0], k_s.shape[0])
    return pl.run_scoped(products, plgpu.ACC(tile, jnp.float32), plgpu.ACC(tile, jnp.float32))


def store_outputs(bufs, refs, b, hd, n, chunk):
    """Chunk n's dq, dk, dv ``[C, Kp|Vp]``, sums ``[SUMS, C]`` and inner ``[Kp]`` from the
    shared-memory ``bufs`` to the kernel's output ``refs`` by TMA, one bulk group."""
    plgpu.commit_smem()
    tokens = pl.ds(n * chunk, chunk)
    *grads, sums_s, inner_s = bufs
    *grad_refs, sums_ref, inner_ref = refs
    for src, dst in zip(grads, grad_refs):
        plgpu.copy_smem_to_gmem(src, dst.at[b, tokens, hd, :], commit_group=False)
    for e in range(SUMS):
        plgpu.copy_smem_to_gmem(sums_s.at[e], sums_ref.at[e, b, hd, tokens], commit_group=False)
    kp = inner_s.shape[0]
    plgpu.copy_smem_to_gmem(inner_s, inner_ref.at[b, hd, pl.ds(n * kp, kp)], commit_group=False)
    plgpu.commit_smem_to_gmem_group()


def _kernel(q_ref, k_ref, v_ref, do_ref, rows_ref, h_ref, dh_ref, dq_ref, dk_ref, dv_ref,
            sums_ref, inner_ref, *, chunk, run, piped):
    """One (b, h, run r) program over chunks ``r * run ... (r + 1) * run - 1``.

    q, k, dq, dk ``[B, L, H, Kp]``; v, do, dv ``[B, L, H, Vp]``; rows ``[3, B, H, L]`` float32
    (A, e^A, e^tail); h, dh ``[B, H, N * Kp, Vp]``; sums ``[SUMS, B, H, L]`` and inner ``[B,
    H, N * Kp]`` (``rowsum(h * dh)``) float32. ``piped``: the states in the pipeline and the
    gradients in buffers of their own (else :func:`layout`'s single-buffered form).
    """
    b, hd, r = (lax.axis_index(a) for a in "bhr")
    kp, vp = q_ref.shape[-1], v_ref.shape[-1]
    dtype, f32 = q_ref.dtype, jnp.float32
    tile = (chunk, chunk)
    rows_i, cols_j = tile_iota(tile, 0), tile_iota(tile, 1)
    causal = rows_i >= cols_j
    first = r * run

    def step(idx, q_s, k_s, v_s, do_s, a_s, ea_s, et_s, a_cols_s, *piped_states, p_s, dp_s,
             outs, states, bars):
        n = first + idx[0]
        slot = lax.rem(idx[0], jnp.asarray(2, idx[0].dtype))
        if piped:
            h_s, dh_s = piped_states
            plgpu.wait_smem_to_gmem(1, wait_read_only=True)  # this slot's copies of i - 2 read
            dq_s, dk_s, dv_s = (buf.at[slot] for buf in outs[:3])
        else:  # chunk n's states into the one pair of tiles, read while S and dP are formed
            h_s, dh_s = states
            for e, (src, dst) in enumerate(((h_ref, h_s), (dh_ref, dh_s))):
                plgpu.copy_gmem_to_smem(src.at[b, hd, pl.ds(n * kp, kp)], dst, bars.at[e])
            dq_s, dk_s, dv_s = q_s, k_s, v_s  # each written once the chunk is done with it
        sums_s, inner_s = (buf.at[slot] for buf in outs[-2:])

        s, grad_w = score_products(q_s, k_s, do_s, v_s)
        decay = causal_mask(a_s, a_cols_s, causal)
        p = s * decay
        x = jnp.where(rows_i > cols_j, p * grad_w, 0.0)
        x_rows, x_cols = jnp.sum(x, axis=1), jnp.sum(x, axis=0)
        p_s[...] = p.astype(dtype)
        dp_s[...] = (grad_w * decay).astype(dtype)
        plgpu.commit_smem()  # visible to the wgmmas
        if not piped:
            plgpu.barrier_wait(bars.at[0])

        def dq_products(acc_i, acc_q):
            plgpu.wgmma(acc_i, do_s, h_s.transpose((1, 0)))  # keys before the chunk
            plgpu.wgmma(acc_q, dp_s, k_s)
            return acc_i[...], acc_q[...]

        inter, dq = pl.run_scoped(dq_products, plgpu.ACC((chunk, kp), f32),
                                  plgpu.ACC((chunk, kp), f32))
        inter = inter * rows_of(plgpu.load(ea_s, layout=ROWS), inter.shape)
        q = plgpu.load(q_s, layout=WGMMA).astype(f32)
        sums_s[0] = x_rows + jnp.sum(q * inter, axis=1)
        sums_s[1] = x_cols
        dq = (dq + inter).astype(dtype)
        if piped:  # its own buffer: out of the registers before the larger products
            dq_s[...] = dq
        et = rows_of(plgpu.load(et_s, layout=ROWS), (chunk, kp))
        k_s[...] = (plgpu.load(k_s, layout=WGMMA).astype(f32) * et).astype(dtype)  # dP K read k
        plgpu.commit_smem()
        if not piped:
            plgpu.barrier_wait(bars.at[1])

        def dk_products(acc_i, acc_k):
            plgpu.wgmma(acc_i, v_s, dh_s.transpose((1, 0)))  # queries after the chunk
            plgpu.wgmma(acc_k, dp_s.transpose((1, 0)), q_s)

        def dv_products(acc_v):
            plgpu.wgmma(acc_v, p_s.transpose((1, 0)), do_s)
            plgpu.wgmma(acc_v, k_s, dh_s)

        def through():
            """The pairs spanning the chunk (chunk_scan.through_terms): rowsum(h * dh), in
            halves of the state rows at Kp 128."""
            half = min(kp, 64)
            for lo in range(0, kp, half):
                rows = pl.ds(lo, half)
                h, dh = (plgpu.load(x.at[rows], layout=WGMMA).astype(f32) for x in (h_s, dh_s))
                inner_s[rows] = jnp.sum(h * dh, axis=1)

        if piped:  # every product issued together, the pairs spanning the chunk meanwhile
            def products(acc_i, acc_k, acc_v):
                dk_products(acc_i, acc_k)
                dv_products(acc_v)
                through()
                return acc_i[...], acc_k[...], acc_v[...]

            inter, dk, dv = pl.run_scoped(products, plgpu.ACC((chunk, kp), f32),
                                          plgpu.ACC((chunk, kp), f32), plgpu.ACC((chunk, vp), f32))
        else:  # fewer accumulators at a time, and q's tile free for dq before dv's products
            def products(acc_i, acc_k):
                dk_products(acc_i, acc_k)
                return acc_i[...], acc_k[...]

            inter, dk = pl.run_scoped(products, plgpu.ACC((chunk, kp), f32),
                                      plgpu.ACC((chunk, kp), f32))
        k_et = plgpu.load(k_s, layout=WGMMA).astype(f32)
        sums_s[2] = jnp.sum(k_et * inter, axis=1)
        if not piped:  # q's tile, free once dk's products have read it
            dq_s[...] = dq
        dk = (dk + inter * et).astype(dtype)
        if not piped:
            def products(acc_v):
                dv_products(acc_v)
                return acc_v[...]

            dv = pl.run_scoped(products, plgpu.ACC((chunk, vp), f32))
            through()
        dk_s[...] = dk
        dv_s[...] = dv.astype(dtype)
        store_outputs((dq_s, dk_s, dv_s, sums_s, inner_s),
                      (dq_ref, dk_ref, dv_ref, sums_ref, inner_ref), b, hd, n, chunk)
        if not piped:  # the pipeline loads the next chunks into these tiles
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)

    in_specs, in_refs, _ = chunk_inputs(
        (q_ref, k_ref, v_ref, do_ref), rows_ref,
        (h_ref.at[b, hd], dh_ref.at[b, hd]) if piped else (), b, hd, first, chunk)

    def walk(p_s, dp_s, outs, states, bars):
        plgpu.emit_pipeline(
            functools.partial(step, p_s=p_s, dp_s=dp_s, outs=outs, states=states, bars=bars),
            grid=(run,), in_specs=in_specs, max_concurrent_steps=STAGES)(*in_refs)
        plgpu.wait_smem_to_gmem(0)

    square = plgpu.SMEM(tile, dtype, transforms=_TILE16)
    sums = [plgpu.SMEM((2, SUMS, chunk), f32), plgpu.SMEM((2, kp), f32)]
    state = plgpu.SMEM((kp, vp), dtype, transforms=_TILE16)
    if piped:
        outs = [plgpu.SMEM((2, chunk, kp), dtype, transforms=_TILE16),
                plgpu.SMEM((2, chunk, kp), dtype, transforms=_TILE16),
                plgpu.SMEM((2, chunk, vp), dtype, transforms=_TILE16)] + sums
        pl.run_scoped(lambda p_s, dp_s, *outs: walk(p_s, dp_s, outs, (), None),
                      square, square, *outs)
    else:
        pl.run_scoped(lambda p_s, dp_s, sums_s, inner_s, h_s, dh_s, bars: walk(
                          p_s, dp_s, (sums_s, inner_s), (h_s, dh_s), bars),
                      square, square, *sums, state, state, plgpu.Barrier(num_barriers=2))


def grads_mosaic(q, k, v, do, g, h, dh, *, chunk, interpret=None):
    """dq, dk, dv and d log_decay's in-chunk share of the causal backward on Mosaic GPU.

    Args:
      q, k: ``[B, L, H, Kp]``; v, do: ``[B, L, H, Vp]``, bf16 or fp16, padded as
        ``two_pass.backward_layout`` pads them (see :func:`supported`); g: ``[B, L, H]``
        float32 log-decays.
      h, dh: ``[B, H, N, Kp, Vp]`` in the input dtype: the forward states entering every chunk
        and the reverse states of ``(q, do)`` leaving it.
      interpret: None, or ``plgpu.InterpretGPUParams()`` to run the Mosaic GPU interpreter.
    Returns:
      ``(dq, dk, dv, dlog_decay [B, L, H] float32)``: the gradients padded as their inputs.
    """
    piped, reason = layout(q, v, chunk)
    if reason is not None:
        raise ValueError(reason)
    B, L, H, kp = q.shape
    vp = v.shape[-1]
    N = L // chunk
    runs = runs_until(B * H, N, TARGET_PROGRAMS)
    out_type = (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(k.shape, q.dtype),
                jax.ShapeDtypeStruct(v.shape, q.dtype),
                jax.ShapeDtypeStruct((SUMS, B, H, L), jnp.float32),
                jax.ShapeDtypeStruct((B, H, N * kp), jnp.float32))
    dq, dk, dv, sums, inner = plgpu.kernel(
        functools.partial(_kernel, chunk=chunk, run=N // runs, piped=piped),
        out_type=out_type, grid=(B, H, runs), grid_names=tuple("bhr"), interpret=interpret,
        kernel_name="causal_grads_mosaic", compiler_params=compiler_params(),
    )(q, k, v, do, mask_rows(g, chunk), h.reshape(B, H, N * kp, vp),
      dh.reshape(B, H, N * kp, vp))
    return dq, dk, dv, log_decay_grads(sums, inner, g, chunk)


def log_decay_grads(sums, inner, g, chunk):
    """d log_decay ``[B, L, H]`` from a Mosaic gradients kernel's per-token sums ``[SUMS, B,
    H, L]`` (``rowsum(X)`` with the queries' state terms, ``colsum(X)``, the keys' state
    terms) and its row sums of the state pairs spanning each chunk, ``inner [B, H, N * Kp]``;
    g ``[B, L, H]`` the log-decays."""
    _, B, H, L = sums.shape
    N = L // chunk
    sums = sums.reshape(SUMS, B, H, N, chunk)
    in_chunk = jnp.vectorize(crossing_sums, signature="(c),(c)->(c)")(
        sums[2], sums[0] - sums[1])
    through = spread_through(jnp.sum(inner.reshape(B, H, N, -1), axis=-1), g, chunk)
    return jnp.swapaxes(in_chunk.reshape(B, H, L), 1, 2) + through
