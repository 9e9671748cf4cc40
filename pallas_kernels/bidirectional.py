"""Fused bidirectional (LION) chunked scan: one output kernel for both directions.

For ``M_ij = exp(-|A_i - A_j|)`` (``A = cumsum(log_decay)`` over L) :func:`bidirectional_scan`
computes

    num_i = sum_j (q_i . k_j) M_ij v_j,     den_i = sum_j (q_i . k_j) M_ij,
    o_i = num_i / (den_i + eps)   (normalize)   or   num_i

in two launches (plus two short ones when the states kernel splits the chunks, see
``two_pass.py``): the states kernel walking forward (``hf[n]``, the state of every chunk before
n) and in reverse (``hb[n]``, of every chunk after n) in one launch (``reverse=BOTH``: twice the
programs, the two walks side by side), then one output kernel per chunk:

    S_n   = (Q K^T) * exp(seg + seg^T)            [C, C], seg[i, j] = sum_{j < s <= i} a_s
    num_n = S_n V + (Q * exp(head)) hf[n] + (Q * exp(tail)) hb[n]
    den_n = rowsum(S_n) + (Q * exp(head)) zf[n] + (Q * exp(tail)) zb[n]

The intra-chunk block is computed once with the symmetric mask (the diagonal counted once:
``seg + seg^T`` is 0 there), and the normaliser comes out of the same pass: ``zf``, ``zb`` are
the normaliser states ``sum_j decay_j k_j`` that the states kernel carries beside the state
(``with_z``). Every exponent is a chunk-local
sum of log-decays (<= 0), summed directly.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.chunk_scan import (BOTH, _next_pow2, _pad_axis, chunk_decays, crossing_sums,
                                       pad_layout, pair_balance, through_terms)
from pallas_kernels.mosaic_causal_backward import takes_mosaic
from pallas_kernels.mosaic_lion_backward import lion_grads_mosaic
from pallas_kernels.mosaic_lion_backward import supported as mosaic_grads_reason
from pallas_kernels.mosaic_outputs import bidirectional_outputs_mosaic
from pallas_kernels.mosaic_outputs import supported as mosaic_output_reason
from pallas_kernels.two_pass import (WALK_BLOCK_V, backward_layout, chunk_states, fitted_chunk,
                                     output_block_v, walk_backend)


def _signs(c):
    """``[C, C]``: +1 below the diagonal (key before query: the causal part), -1 above, 0 on it
    (the diagonal's share of dA cancels between q.dq and k.dk)."""
    idx = jnp.arange(c)
    rows, cols = idx[:, None], idx[None, :]
    return jnp.where(rows > cols, 1.0, jnp.where(rows < cols, -1.0, 0.0))


def two_parts(x, dtype):
    """float32 ``x`` as ``(hi, lo)`` in the 16-bit ``dtype``: x rounded, then what that rounding
    lost, rounded. Matmuls against both keep ~16 bits of x instead of 8 (bf16).

    Normalised LION uses it for the attention weights (forward), for the output's low part
    that the backward's dden needs (``low_part``), and for the weights' cotangent G * M
    (backward): the weights' cotangent has zero mean under the weights, so dq and dk are sums
    that cancel, and the 8-bit rounding of those operands set their bf16 error (dq up to
    5.2e-3 over 12 seeds; 3.5e-3 with both split; docs/benchmarks.md, one H200, 2026-11-21)."""
    hi = x.astype(dtype)
    return hi, (x - hi.astype(jnp.float32)).astype(dtype)


def rounded_xla(x, dtype):
    """float32 ``x`` rounded to the 16-bit ``dtype``'s precision, still float32, for XLA code
    outside the kernels that needs the rounded value itself. XLA on the GPU may drop a float32
    -> 16-bit -> float32 round trip (excess precision is allowed by default; reported as
    openxla/xla#41605), so ``x.astype(dtype).astype(float32)`` can come back unrounded there;
    ``reduce_precision`` rounds as the cast does and is the op XLA keeps as a barrier to that
    simplification (openxla/xla#19038's review). Casting the result to ``dtype`` is exact."""
    info = jnp.finfo(dtype)
    return jax.lax.reduce_precision(x, exponent_bits=info.nexp, mantissa_bits=info.nmant)


def two_parts_xla(x, dtype):
    """:func:`two_parts` for XLA code outside the kernels, split by :func:`rounded_xla` (with
    the plain cast XLA on the GPU may make the low part zero)."""
    hi = rounded_xla(x, dtype)
    return hi.astype(dtype), (x - hi).astype(dtype)


def to_float32(y, y_low):
    """Normalised 16-bit y to ~16 bits as float32, ``y + y_low``
    (``bidirectional_scan(low_part=True)``); y_low None: y as it is."""
    y = y.astype(jnp.float32)
    return y if y_low is None else y + y_low.astype(jnp.float32)


def _output_kernel(q_ref, k_ref, v_ref, g_ref, hf_ref, hb_ref, *refs, normalize, eps, low_part,
                   offset, precision):
    """One (b, h, n, V-block): q, k ``[C, Kp]``; v, o (o's low part) ``[C, BV]``;
    g ``[C]``; hf, hb ``[Kp, BV]``; zf, zb ``[Kp]`` (normalize); m ``[BV]`` (offset);
    den ``[C]`` float32."""
    refs = list(refs)
    zf_ref, zb_ref = (refs.pop(0), refs.pop(0)) if normalize else (None, None)
    m_ref = refs.pop(0) if offset else None
    o_ref = refs.pop(0)
    lo_ref = refs.pop(0) if low_part else None
    q, k, v = q_ref[...], k_ref[...], v_ref[...]
    dtype = q.dtype
    a = g_ref[...].astype(jnp.float32)
    seg, head, tail = chunk_decays(a, reverse=False)
    scores = pltriton.dot(q, k, trans_b=True, precision=precision) * jnp.exp(seg + seg.T)
    q_f = q * jnp.exp(head)[:, None]
    q_b = q * jnp.exp(tail)[:, None]
    inter_f = pltriton.dot(q_f.astype(dtype), hf_ref[...], precision=precision)
    inter_b = pltriton.dot(q_b.astype(dtype), hb_ref[...], precision=precision)
    if normalize and dtype != jnp.float32:  # the weights in two 16-bit parts (see two_parts)
        num = sum(pltriton.dot(part, v, precision=precision)
                  for part in two_parts(scores, dtype)) + inter_f + inter_b
    else:
        num = pltriton.dot(scores.astype(dtype), v, precision=precision) + inter_f + inter_b
    if normalize:
        zf = zf_ref[...].astype(jnp.float32)
        zb = zb_ref[...].astype(jnp.float32)
        # den from the weights as the numerator's matmuls see them (the scores to ~16 bits,
        # the decayed queries rounded to the input dtype), so that y stays a weighted average
        # of v: the backward relies on it.
        rounded = lambda x: x.astype(dtype).astype(jnp.float32)
        den = (jnp.sum(scores, axis=1) + jnp.sum(rounded(q_f) * zf[None, :], axis=1)
               + jnp.sum(rounded(q_b) * zb[None, :], axis=1))
        if offset:  # v came centred: num = num_c + den m
            num = num + den[:, None] * m_ref[...][None, :]
        y = num / (den + eps)[:, None]
        if low_part:
            o_ref[...], lo_ref[...] = two_parts(y, o_ref.dtype)
        else:
            o_ref[...] = y.astype(o_ref.dtype)
        refs.pop(0)[...] = den
    else:
        o_ref[...] = num.astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("normalize", "eps", "chunk", "block_v",
                                             "out_dtype", "interpret", "num_warps",
                                             "num_stages", "splits", "return_states",
                                             "low_part", "backend"))
def bidirectional_scan(q, k, v, log_decay, offset=None, *, normalize=False,
                       eps=1e-6, chunk=64, block_v=None, out_dtype=None, interpret=False,
                       num_warps=None, num_stages=2, splits=None, return_states=False,
                       low_part=False, backend=None):
    """LION attention, both directions fused (see the module docstring).

    Args:
      q, k: ``[B, L, H, K]``; v: ``[B, L, H, V]``, one dtype; L a multiple of ``chunk``.
      log_decay: ``[B, L, H]``, entries ``<= 0``.
      normalize, eps: divide by ``den + eps``; also return ``den``.
      offset: normalize only: None or m ``[B, H, V]`` float32, a constant the caller took
        from v (``v = v_c + m``, v_c passed as ``v``): the output is then
        ``(num_c + den m) / (den + eps)``, the normalised output of ``v_c + m``. Centred
        values keep the 16-bit states small (see ``linear_attention.centred_values``).
      chunk, interpret, num_warps, num_stages: as for ``chunk_scan`` (the chunk smaller where
        the tiles would not fit in shared memory, ``two_pass.fitted_chunk``).
      block_v: V columns per output program (None: ``two_pass.output_block_v``).
      out_dtype: dtype of ``o`` (None: v.dtype), 16-bit when low_part.
      low_part: normalize only: also return what rounding ``o`` to out_dtype lost, rounded
        (``two_parts``: ``o + low`` holds ~16 bits, for the backward's dden) without writing
        a float32 output and casting it.
      splits, backend: the states walks' runs and kernel (see ``two_pass.chunk_states``);
        where the walks run on Mosaic GPU, the output kernel does too when
        ``mosaic_outputs.supported`` takes the inputs (16-bit, chunk 64, Kp and Vp multiples of
        64, y in the input dtype), else it is the Triton kernel.
      return_states: also return the states of ``(k, v)`` for :func:`lion_backward`: the tuple
        ``(h,)`` (``[2, B, H, N, Kp, Vp]``, forward then reverse, input dtype, tile layout)
        or, if normalize, ``(h, z)`` (z ``[2, B, H, N, Kp]`` float32).
    Returns:
      ``o [B, L, H, V]``, then its low part if low_part, then ``den [B, L, H]`` float32 if
      normalize, then the states if
      return_states (a tuple when more than ``o``).
    """
    B, L, H, K = q.shape
    V = v.shape[-1]
    out_dtype = out_dtype or v.dtype
    block_v = block_v or output_block_v(K, V, q.dtype)
    q, k, v, kp, bv, vp, precision, params = pad_layout(q, k, v, block_v, num_warps or 4,
                                                        num_stages)
    # two [Kp, BV] state tiles (forward and reverse) in the input dtype
    chunk, bv = fitted_chunk(chunk, kp, bv, q.dtype, 2 * q.dtype.itemsize, return_states)
    g = log_decay.astype(jnp.float32)
    walk_bv = min(bv, WALK_BLOCK_V)
    # both directions' states in one launch: (h [2, ...], [z [2, ...],] final)
    states = chunk_states(k, v, g, None, chunk=chunk, bv=walk_bv, reverse=BOTH,
                          precision=precision, interpret=interpret, splits=splits,
                          with_z=normalize, backend=backend)[:-1]
    if offset is not None and not normalize:
        raise ValueError("offset needs normalize: the numerator alone is linear in v")
    if low_part and (not normalize or jnp.dtype(out_dtype).itemsize != 2):
        raise ValueError(f"low_part needs normalize and a 16-bit out_dtype; got normalize="
                         f"{normalize}, out_dtype {jnp.dtype(out_dtype).name}")
    mosaic = (walk_backend(k, v, chunk=chunk, bv=walk_bv, backend=backend, interpret=interpret,
                           with_z=normalize) == "mosaic"
              and mosaic_output_reason(q, v, chunk, normalize, out_dtype) is None)
    if mosaic:  # the output kernel on Mosaic GPU too (mosaic_outputs.py)
        outs = bidirectional_outputs_mosaic(
            q, k, v, g, *states, offset=None if offset is None else _pad_axis(
                offset.astype(jnp.float32), 2, vp),
            chunk=chunk, normalize=normalize, eps=eps, low_part=low_part, out_dtype=out_dtype,
            interpret=plgpu.InterpretGPUParams() if interpret else None)
    else:
        outs = _triton_outputs(q, k, v, g, states, offset, chunk=chunk, bv=bv, kp=kp, vp=vp,
                               normalize=normalize, eps=eps, low_part=low_part,
                               out_dtype=out_dtype, precision=precision, params=params,
                               interpret=interpret)
    outs = [x[..., :V] for x in outs[:1 + low_part]] + list(outs[1 + low_part:])
    if return_states:
        outs.append(states)
    return outs[0] if len(outs) == 1 else tuple(outs)


def _triton_outputs(q, k, v, g, states, offset, *, chunk, bv, kp, vp, normalize, eps, low_part,
                    out_dtype, precision, params, interpret):
    """The output pass of :func:`bidirectional_scan` as a Triton kernel (one program per chunk
    and V-block): ``[y, [y_low,] [den [B, L, H]]]`` with y padded to Vp."""
    B, L, H, _ = q.shape
    N, nvb = L // chunk, vp // bv
    qk_spec = pl.BlockSpec((None, chunk, None, kp), lambda b, h, n, j: (b, n, h, 0))
    v_spec = pl.BlockSpec((None, chunk, None, bv), lambda b, h, n, j: (b, n, h, j))
    row_spec = pl.BlockSpec((None, None, chunk, None), lambda b, h, n, j: (b, j, n, h))
    h_specs = [pl.BlockSpec((None, None, None, None, kp, bv),
                            lambda b, h, n, j, e=e: (e, b, h, n, 0, j)) for e in (0, 1)]
    args = [q, k, v, g, states[0], states[0]]
    in_specs = [qk_spec, qk_spec, v_spec,
                pl.BlockSpec((None, chunk, None), lambda b, h, n, j: (b, n, h))] + h_specs
    out_specs = [v_spec] * (1 + low_part)
    out_shape = [jax.ShapeDtypeStruct((B, L, H, vp), out_dtype)] * (1 + low_part)
    row_shape = jax.ShapeDtypeStruct((B, nvb, L, H), jnp.float32)
    if normalize:
        args += [states[1], states[1]]
        in_specs += [pl.BlockSpec((None, None, None, None, kp),
                                  lambda b, h, n, j, e=e: (e, b, h, n, 0)) for e in (0, 1)]
        if offset is not None:
            args.append(_pad_axis(offset.astype(jnp.float32), 2, vp))
            in_specs.append(pl.BlockSpec((None, None, bv), lambda b, h, n, j: (b, h, j)))
        out_specs.append(row_spec)
        out_shape.append(row_shape)
    outs = pl.pallas_call(
        functools.partial(_output_kernel, normalize=normalize, eps=eps, low_part=low_part,
                          offset=offset is not None, precision=precision),
        grid=(B, H, N, nvb), in_specs=in_specs, out_specs=out_specs, out_shape=out_shape,
        compiler_params=params, interpret=interpret, name="bidirectional_outputs",
    )(*args)
    outs = list(outs)
    if normalize:
        outs[-1] = outs[-1][:, 0]
    return outs


# ---------------------------------------------------------------------------- fused backward

# Head dims up to which the fused backward holds whole [Kp, Vp] tiles in one program.
MAX_BACKWARD_DIM = 128
# Above this head dim the backward runs as two kernels (dq; dk and dv), each holding fewer
# tiles at once; at or below it as one. H100, L = 16K, 4 warps: D = 64 one kernel 1.71 ms,
# two 1.81; D = 128 one 6.66, two 5.03 (docs/benchmarks.md). H200, kernel times alone, D = 64:
# one 0.93 ms, two 0.42 + 0.68 (profile_kernels --settings, one H200, 2026-11-22).
MAX_ONE_KERNEL_DIM = 64
# The largest [C, max(Kp, Vp)] tile of the fused backward, in bytes: chunk 64 at head dim 128
# in bf16 (see supported).
MAX_BACKWARD_TILE_BYTES = 64 * 128 * 2


def supported(k_dim, v_dim, dtype, chunk):
    """Whether :func:`lion_backward` takes these head dims, dtype and chunk (else three fused
    scans): head dims up to ``MAX_BACKWARD_DIM`` for 16-bit inputs, 64 for float32 (twice the
    bytes per tile: the causal backward's float32 tiles at head dims 96/80 overflowed an H100's
    shared memory), and ``[C, max(Kp, Vp)]`` tiles of at most ``MAX_BACKWARD_TILE_BYTES``
    (chunk 128 at head dim 128, bf16, asked an H200 for 256 KiB of shared memory of 227)."""
    kp, vp = (_next_pow2(max(d, 16)) for d in (k_dim, v_dim))
    dims = max(k_dim, v_dim) <= (64 if dtype == jnp.float32 else MAX_BACKWARD_DIM)
    return dims and chunk * max(kp, vp) * jnp.dtype(dtype).itemsize <= MAX_BACKWARD_TILE_BYTES


def _grads_kernel(q_ref, k_ref, v_ref, dy_ref, g_ref, *refs, normalize, precision, parts):
    """One (b, h, n): q, k, dq, dk ``[C, Kp]``; v, dy, dv ``[C, Vp]``; g, dg ``[C]``.

    ``parts`` picks the outputs: "dq" (refs: hf, hb ``[Kp, Vp]``, the states of (k, v) before
    and after the chunk; then dq, dg), "dkv" (dhf, dhb, the states of (q, dnum); then dk, dv,
    dg) or "all" (hf, hb, dhf, dhb; dq, dk, dv, dg). With normalize, after the states: r and u
    ``[C]`` (``dnum = r dy``, ``dden = r u``, see :func:`lion_backward`) and the z states
    ``[Kp]`` (zf, zb of (k, 1) for dq; dzf, dzb of (q, dden) for dk).

    ``dg`` is this kernel's share of d log_decay (``chunk_scan.crossing_sums``) but the pairs
    spanning the whole chunk: every pair's term ``G_ij w_ij`` counts at the tokens its decay
    spans. The dq part takes the queries' pairs with keys outside the chunk; the dk, dv part
    the keys' pairs with queries outside and the pairs inside the chunk (from ``signs * X``,
    ``X = G * M * (Q K^T)``: both orders), which need the scores dv needs anyway."""
    want_dq, want_dkv = parts in ("dq", "all"), parts in ("dkv", "all")
    refs = list(refs)

    def take(n):
        return [refs.pop(0) for _ in range(n)]

    hf_ref, hb_ref = take(2) if want_dq else (None, None)
    dhf_ref, dhb_ref = take(2) if want_dkv else (None, None)
    if normalize:
        r_ref, u_ref = take(2)
        zf_ref, zb_ref = take(2) if want_dq else (None, None)
        dzf_ref, dzb_ref = take(2) if want_dkv else (None, None)
    dq_ref, = take(1) if want_dq else (None,)
    dk_ref, dv_ref = take(2) if want_dkv else (None, None)
    dg_ref, = take(1)
    q, k, v, dy = q_ref[...], k_ref[...], v_ref[...], dy_ref[...]
    dtype = q.dtype
    f32 = jnp.float32
    dot = functools.partial(pltriton.dot, precision=precision)
    a = g_ref[...].astype(f32)
    seg, head, tail = chunk_decays(a, reverse=False)
    mask = jnp.exp(seg + seg.T)
    eh, et = jnp.exp(head)[:, None], jnp.exp(tail)[:, None]
    grad = dot(dy, v, trans_b=True)  # G_ij = d loss / d w_ij = r_i (dy_i . v_j + u_i)
    if normalize:
        r, u = r_ref[...][:, None], u_ref[...][:, None]
        grad = (grad + u) * r
    before = after = jnp.zeros(a.shape, f32)  # terms counted after / up to their token
    # Every [C, Kp] / [C, Vp] float32 term is finished before the next starts (registers at
    # head dim 128): dv first, then dq, then dk (H200, D = 128, L = 16K: the dk, dv kernel
    # took 1.86 ms with dv last, 1.47 with dv first).
    if want_dkv:  # the weights give dv, and signs * X (X = G * w): the rowsum - colsum of the
        weights = dot(q, k, trans_b=True) * mask  # lower part of X + X^T (both orders)
        after = pair_balance(grad * weights * _signs(a.shape[0]))
        dv = dot((weights * r if normalize else weights).astype(dtype), dy, trans_a=True)
        dv = dv + dot(k, dhb_ref[...]) * et  # queries after the chunk
        dv_ref[...] = (dv + dot(k, dhf_ref[...]) * eh).astype(dtype)  # and before it
    # the cotangent of the weights times the mask, rounded; dq's in two 16-bit parts when
    # normalised: its sum over keys cancels (G has zero mean under the weights of each query),
    # dk's over queries does not (bf16, L = 100: dk 1.9e-3 with two parts, 2.5e-3 with one,
    # as causal's 2.4e-3; experiments.kernel_precision, docs/benchmarks.md, one H200, 2026-11-22)
    grad = grad * mask
    gws = two_parts(grad, dtype) if normalize and dtype != f32 else (grad.astype(dtype),)
    if want_dq:
        dq = sum(dot(gw, k) for gw in gws)
        from_before = dot(dy, hf_ref[...], trans_b=True)  # keys before the chunk (causal)
        if normalize:
            from_before = (from_before + u * zf_ref[...][None, :]) * r
        from_before = from_before * eh
        after = after + jnp.sum(q.astype(f32) * from_before, axis=1)
        dq = dq + from_before
        from_after = dot(dy, hb_ref[...], trans_b=True)  # keys after it (anti-causal)
        if normalize:
            from_after = (from_after + u * zb_ref[...][None, :]) * r
        from_after = from_after * et
        before = before + jnp.sum(q.astype(f32) * from_after, axis=1)
        dq_ref[...] = (dq + from_after).astype(dtype)
    if want_dkv:
        dk = dot(gws[0], q, trans_a=True)
        later = dot(v, dhb_ref[...], trans_b=True)  # queries after the chunk (causal for k)
        if normalize:
            later = later + dzb_ref[...][None, :]
        later = later * et
        before = before + jnp.sum(k.astype(f32) * later, axis=1)
        dk = dk + later
        earlier = dot(v, dhf_ref[...], trans_b=True)  # queries before it (anti-causal)
        if normalize:
            earlier = earlier + dzf_ref[...][None, :]
        earlier = earlier * eh
        after = after + jnp.sum(k.astype(f32) * earlier, axis=1)
        dk_ref[...] = (dk + earlier).astype(dtype)
    dg_ref[...] = crossing_sums(before, after)


@functools.partial(jax.jit, static_argnames=("normalize", "eps", "chunk", "interpret",
                                             "num_warps", "num_stages", "splits", "one_kernel",
                                             "backend", "grads"))
def lion_backward(q, k, v, log_decay, dy, kv_states=None, *, y=None, y_low=None, den=None,
                  offset=None, normalize, eps=1e-6, chunk=64, interpret=False, num_warps=None,
                  num_stages=2, splits=None, one_kernel=None, backend=None, grads="auto"):
    """Gradients of LION attention in one pass over the chunks (head dims <= 128).

    With the weights ``w_ij = s_ij M_ij`` (``s_ij = q_i . k_j``) and their cotangents
    ``G_ij = dnum_i . v_j + dden_i``, for the output cotangent dy: ``dnum = dy``, no ``dden``;
    normalised (``y = num / (den + eps)``) ``dnum = r dy`` and ``dden = r u`` with
    ``r = 1 / (den + eps)`` and ``u = -(dy . y)`` (``-(dy . (y - m))`` for values centred by
    m, ``bidirectional_scan(offset=)``: then v is v_c). The kernels take dy, r and u and scale
    rows by r (the (q, dnum) walk folds r into its key factors), so no XLA pass writes dnum
    (H100, B4 H16 L = 16K, D = 128: the pass computing u took 0.27 ms, the one writing dnum
    and dden 0.35), and ``G_ij = r_i dy_i . (v_j - y_i)`` keeps its zero mean under the
    weights to float32 rounding: dq and dk are sums that cancel, so u takes y to float32
    precision
    (``y + y_low`` for 16-bit y: bf16, L = 100, dq's relative RMS error was 1.95e-2 with y in
    bf16, 4.95e-3 to float32 precision, ``experiments.kernel_precision``). Then:
    ``dq_i = sum_j G_ij M_ij k_j``, ``dk_j = sum_i G_ij M_ij q_i``,
    ``dv_j = sum_i s_ij M_ij dnum_i`` and ``dlog_decay_t`` the sum of ``G_ij w_ij`` over the
    pairs whose decay spans t (``min(i, j) < t <= max(i, j)``; ``chunk_scan.crossing_sums``
    within each chunk, ``chunk_scan.through_terms`` for the pairs spanning a whole chunk, not
    a reverse cumsum over L that cancels O(1) terms). States of ``(k, v)`` with the z of ones (kept
    from the forward pass, else one states launch walking both ways), one launch for the
    states of ``(q, dnum)`` with the z weighted by dden (both ways), then one kernel per chunk
    reading every input once (eleven matmuls) or, for larger head dims, two (a dq kernel and a
    dk, dv kernel, both computing ``dnum V^T``: twelve matmuls, fewer tiles held at once).
    Normalised with 16-bit inputs, dq's intra-chunk matmul takes two parts (one matmul more).

    Args:
      q, k: ``[B, L, H, K]``; v, dy: ``[B, L, H, V]``, one dtype; L a multiple of ``chunk``.
      log_decay: ``[B, L, H]`` float32.
      kv_states: None (recomputed) or the forward's states of ``(k, v)``,
        ``bidirectional_scan(..., return_states=True)``'s last output.
      y, y_low, den, eps: normalize only: the forward's output ``[B, L, H, V]``, its low part
        (``bidirectional_scan(low_part=True)``; None for float32 y), ``den [B, L, H]`` float32
        and the eps of ``den + eps``; offset: None or the m ``[B, H, V]`` float32 the forward
        took (``bidirectional_scan(offset=)``).
      one_kernel: one kernel or two; None: one for head dims <= ``MAX_ONE_KERNEL_DIM``.
      num_warps: of the gradients kernels (None: ``two_pass.BACKWARD_WARPS``); num_stages,
        chunk, interpret: as for ``chunk_scan``; splits, backend: as for
        ``two_pass.chunk_states`` (backend: the states walks' kernel).
      grads: the gradients kernel: "auto" (the Mosaic GPU kernel of
        ``mosaic_lion_backward.py`` where the walks run on Mosaic GPU and it takes the
        inputs, else Triton), "mosaic" (a ValueError with the reason where it cannot) or
        "triton" (``one_kernel`` picks the Triton kernels).
    Returns:
      ``(dq, dk, dv, dlog_decay [B, L, H] float32)``.
    """
    B, L, H, K = q.shape
    V = v.shape[-1]
    dtype = q.dtype
    if normalize and (y is None or den is None):
        raise ValueError("normalize needs the forward's y and den (and y_low for 16-bit y)")
    rows = []  # normalised: r and u [B, L, H] float32 (u: an XLA pass at memory bandwidth,
    if normalize:  # 0.36 ms at B4 H16 L = 32K, D = 128 on an H200; a Pallas kernel took 0.39)
        y = to_float32(y, y_low)
        if offset is not None:
            y = y - offset.astype(jnp.float32)[:, None]
        rows = [1.0 / (den.astype(jnp.float32) + eps),
                -jnp.sum(dy.astype(dtype).astype(jnp.float32) * y, axis=-1)]
    q, k, v, dy, g, kp, vp, precision, params, states = backward_layout(
        q, k, v, dy, log_decay, max_dim=MAX_BACKWARD_DIM, chunk=chunk, interpret=interpret,
        num_warps=num_warps, num_stages=num_stages, splits=splits, backend=backend)
    states = functools.partial(states, s0=None, with_z=normalize, reverse=BOTH)
    if kv_states is None:
        kv = states(k, v)[:-1]
    else:
        shape = (2, B, H, L // chunk, kp, vp)
        if len(kv_states) != 1 + normalize or kv_states[0].shape != shape:
            raise ValueError(f"kv_states must be (h[, z]) with h [2, B, H, N, Kp, Vp] = {shape}"
                             f" (z when normalize); got {[x.shape for x in kv_states]}")
        kv = kv_states
    # the states of (q, dnum) = (q * r, dy), both directions, the z weighted by u
    qd = states(q, dy, **(dict(key_scale=rows[0], z_weights=rows[1]) if normalize else {}))[:-1]

    qk_spec = pl.BlockSpec((None, chunk, None, kp), lambda b, h, n: (b, n, h, 0))
    v_spec = pl.BlockSpec((None, chunk, None, vp), lambda b, h, n: (b, n, h, 0))
    row_spec = pl.BlockSpec((None, chunk, None), lambda b, h, n: (b, n, h))
    h_specs = [pl.BlockSpec((None, None, None, None, kp, vp),
                            lambda b, h, n, e=e: (e, b, h, n, 0, 0)) for e in (0, 1)]
    z_specs = [pl.BlockSpec((None, None, None, None, kp), lambda b, h, n, e=e: (e, b, h, n, 0))
               for e in (0, 1)]
    grad_shapes = {"dq": [(q.shape, qk_spec)], "dkv": [(k.shape, qk_spec), (v.shape, v_spec)]}
    grad_shapes["all"] = grad_shapes["dq"] + grad_shapes["dkv"]

    def call(parts, walks):
        """``walks``: the (k, v) and / or (q, dnum) states ``(h[, z])``, both directions."""
        args = [q, k, v, dy, g] + [w[0] for w in walks for _ in (0, 1)]
        in_specs = [qk_spec, qk_spec, v_spec, v_spec, row_spec] + h_specs * len(walks)
        if normalize:
            args += rows + [w[1] for w in walks for _ in (0, 1)]
            in_specs += [row_spec] * 2 + z_specs * len(walks)
        shapes = grad_shapes[parts]
        return pl.pallas_call(
            functools.partial(_grads_kernel, normalize=normalize, precision=precision,
                              parts=parts),
            grid=(B, H, L // chunk), in_specs=in_specs,
            out_specs=[spec for _, spec in shapes] + [row_spec],
            out_shape=[jax.ShapeDtypeStruct(shape, dtype) for shape, _ in shapes]
            + [jax.ShapeDtypeStruct((B, L, H), jnp.float32)],
            compiler_params=params, interpret=interpret, name=f"lion_backward_{parts}",
        )(*args)

    if one_kernel is None:
        one_kernel = max(kp, vp) <= MAX_ONE_KERNEL_DIM
    if takes_mosaic(grads, mosaic_grads_reason(q, v, chunk, normalize), k, v, chunk=chunk,
                    backend=backend, interpret=interpret):
        dq, dk, dv, da = lion_grads_mosaic(
            q, k, v, dy, g, kv, qd, rows, chunk=chunk, normalize=normalize,
            interpret=plgpu.InterpretGPUParams() if interpret else None)
        return dq[..., :K], dk[..., :K], dv[..., :V], da
    if one_kernel:
        dq, dk, dv, da = call("all", (kv, qd))
    else:
        dq, da_q = call("dq", (kv,))
        dk, dv, da_k = call("dkv", (qd,))
        da = da_q + da_k
    # the pairs spanning a whole chunk: keys before it and queries after (the forward (k, v)
    # state against the reverse (q, dnum) state), or the reverse
    pairs = [(kv[0][e], qd[0][1 - e]) for e in (0, 1)]
    if normalize:  # z [2, B, H, N, Kp]
        pairs += [(kv[1][e], qd[1][1 - e]) for e in (0, 1)]
    da = da + through_terms(pairs, g, chunk)
    return dq[..., :K], dk[..., :K], dv[..., :V], da
