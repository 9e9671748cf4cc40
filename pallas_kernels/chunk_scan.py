"""The one Pallas kernel behind every op of this package: a chunked, decayed linear scan.

For one direction, ``chunk_scan`` computes

    forward (reverse=False):  o_i = sum_{j <= i} (q_i . k_j) exp(A_i - A_j) v_j + exp(A_i) q_i^T S0
    reverse (reverse=True):   o_i = sum_{j >= i} (q_i . k_j) exp(A_j - A_i) v_j
                                    + exp(A_T - A_i) q_i^T S0

with ``A = cumsum(log_decay)`` over L and ``A_T`` its last entry (``j < i`` / ``j > i`` when
``strict``). In the reverse direction ``S0`` is the state after the last token. It also returns
the state the scan ends with: ``S = sum_j exp(A_T - A_j) k_j v_j^T + exp(A_T) S0`` forward and
``S = sum_j exp(A_j) k_j v_j^T + exp(A_T) S0`` in reverse.

Causal attention is the forward scan; LION's bidirectional attention is a forward scan plus a
strict reverse scan; every gradient is again one of these scans with the arguments permuted (see
``linear_attention.py``). ``two_pass.py`` computes the same scan chunk-parallel from this
module's per-chunk helpers (``chunk_decays``, ``intra_decay``, ``chunk_output``).

Algorithm (Lightning Attention-2, generalised to per-token decay). Per chunk of C tokens with
chunk-local cumulative decay ``b_i`` (sum of log_decay from the chunk start to i, inclusive;
never a cumulative sum over the whole sequence, never exponentiated when positive):

    intra:  O = ((Q K^T) * exp(where(mask_ij, +-(b_i - b_j), -inf))) V

where ``b_i - b_j`` and ``b_C - b_j`` are summed directly over their segment (a masked cumsum
of the C x C matrix) rather than subtracted: with log_decay near -20 per token, ``b`` reaches
-20 C and a difference of two such float32 numbers is off by ~1e-5 in the exponent.
    inter:  O += (Q * exp(b_i)) S           [reverse: Q * exp(b_C - b_i)]
    state:  S = exp(b_C) S + (K * exp(b_C - b_j))^T V   [reverse: K * exp(b_j)]

One program per (batch, head, block of V columns) walks the chunks in order (or in reverse),
carrying the ``[K, block_v]`` float32 state in registers. Dots take the input dtype
(bf16/fp16: tensor cores with float32 accumulation) and float32 inputs use exact float32 dots
(``Precision.HIGHEST``: no TF32).
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _pad_axis(x, axis, size):
    """Zero-pads ``x`` at the end of ``axis`` to ``size``."""
    if x.shape[axis] == size:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, widths)


def pad_state(state, kp, vp):
    """A ``[B, H, K, V]`` state (or None) as float32, zero-padded to ``[B, H, kp, vp]``."""
    if state is None:
        return None
    return _pad_axis(_pad_axis(state.astype(jnp.float32), 2, kp), 3, vp)


# Shared memory a scan program may take by :func:`fit_layout`'s estimate (the ``[C, Kp]`` q and k
# tiles and the ``[Kp, BV]`` states; Triton adds pipelining buffers and the rest). H100, 227 KiB
# per program (2026-11-24 H100, docs/benchmarks.md): every layout estimated at <= 160 KiB compiled
# (float32 Kp = 256 C = 64 scans, 128 KiB; Kp = 512 C = 16, 160 KiB), every one at >= 192 KiB
# asked for more than the GPU has (float32 Kp = 512 C = 32: 271 KB; LION's fused forward at
# float32 Kp = 256 C = 64: 295 KB; bf16 Kp = 512 C = 64: 283 KB).
SHARED_MEMORY_BUDGET = 160 * 1024


def fit_layout(chunk, kp, bv, itemsize, state_bytes):
    """``(chunk, bv)`` for a scan program's tiles to fit in shared memory.

    A program holds ``[C, Kp]`` q and k tiles of ``itemsize`` bytes and ``[Kp, BV]`` states of
    ``state_bytes`` per entry in all (4 for one float32 state). The chunk, then the V-block,
    are halved (not below 16) until the estimate is within ``SHARED_MEMORY_BUDGET``. At the
    default chunk of 64 only head dims above 128 and LION's scans against ``[v | 1]``
    (Kp = 512 at V = 256) need it; a smaller chunk changes the tiling, not the result (L stays
    a multiple of it).
    """
    def estimate(c, b):
        return c * kp * itemsize + kp * b * state_bytes
    while estimate(chunk, bv) > SHARED_MEMORY_BUDGET and (chunk > 16 or bv > 16):
        if chunk > 16:
            chunk //= 2
        else:
            bv //= 2
    return chunk, bv


def reverse_cumsum(x, axis=1):
    """``out_t = sum_{s >= t} x_s`` along ``axis``."""
    return jnp.flip(jnp.cumsum(jnp.flip(x, axis), axis=axis), axis)


def pad_layout(q, k, v, block_v, num_warps, num_stages):
    """The tile layout every scan kernel uses, and its inputs padded to it.

    K is padded to a power of two >= 16 and V to a multiple of the V-block ``bv`` (a power of
    two >= 16, at most ``block_v``), as Triton tiles need. ``num_warps`` None: 8 for states of
    64 x 64 entries or more, else 4 (measured best at D=64 and D=128, docs/kernels.md).

    Returns:
      ``(q, k, v, kp, bv, vp, precision, compiler_params)``; ``precision`` is HIGHEST (exact
      float32 dots, no TF32) for float32 inputs, else None.
    """
    kp = _next_pow2(max(k.shape[-1], 16))
    bv = min(block_v, _next_pow2(max(v.shape[-1], 16)))
    vp = -(-v.shape[-1] // bv) * bv
    q, k, v = _pad_axis(q, 3, kp), _pad_axis(k, 3, kp), _pad_axis(v, 3, vp)
    precision = jax.lax.Precision.HIGHEST if q.dtype == jnp.float32 else None
    params = pltriton.CompilerParams(
        num_warps=num_warps or (8 if kp * bv >= 64 * 64 else 4), num_stages=num_stages)
    return q, k, v, kp, bv, vp, precision, params


def chunk_ends(a):
    """``(head [C], tail [C])`` of one chunk's log-decays ``a [C]`` float32: ``head_i = sum_{s <= i}
    a_s`` (decay from the chunk start) and ``tail_j = sum_{s > j} a_s`` (to the chunk end), each
    summed directly (``tail`` as a masked row sum, not ``sum(a) - head``), so both are exact to
    rounding however strong the decay."""
    idx = jnp.arange(a.shape[0])
    tail = jnp.sum(jnp.where(idx[None, :] > idx[:, None], a[None, :], 0.0), axis=1)
    return jnp.cumsum(a), tail


def chunk_decays(a, *, reverse, segments="direct"):
    """Chunk-local decay exponents (all ``<= 0``) of one chunk's log-decays ``a [C]`` float32.

    Returns ``(seg [C, C], head [C], tail [C])``: forward ``seg[i, j] = sum_{j < s <= i} a_s``,
    reverse ``seg[i, j] = sum_{i < s <= j} a_s`` (each zero on and beyond the diagonal: callers
    mask the other triangle) and ``head``, ``tail`` of :func:`chunk_ends`. ``segments="direct"``
    sums each segment on its own (a masked cumsum of a C x C matrix: no cancellation however
    strong the decay); ``"difference"`` takes differences of the chunk cumsum ``head`` (cheaper;
    off by ~ulp(|head|) in the exponent).
    """
    head, tail = chunk_ends(a)
    if segments == "difference":
        seg = head[None, :] - head[:, None] if reverse else head[:, None] - head[None, :]
        return seg, head, tail
    idx = jnp.arange(a.shape[0])
    rows, cols = idx[:, None], idx[None, :]
    seg = jnp.cumsum(jnp.where(rows > cols, a[:, None], 0.0), axis=0)
    return (seg.T if reverse else seg), head, tail


def intra_decay(a, *, reverse, strict, segments="direct"):
    """``(decay [C, C], head, tail)``: the one-direction intra-chunk mask ``exp(seg)`` on its
    triangle (the diagonal unless ``strict``), 0 elsewhere, and :func:`chunk_ends`."""
    idx = jnp.arange(a.shape[0])
    rows, cols = idx[:, None], idx[None, :]
    if reverse:
        mask = rows < cols if strict else rows <= cols
    else:
        mask = rows > cols if strict else rows >= cols
    seg, head, tail = chunk_decays(a, reverse=reverse, segments=segments)
    return jnp.exp(jnp.where(mask, seg, -jnp.inf)), head, tail


def crossing_sums(before, after):
    """One chunk's share of ``d log_decay``, summed by position ``[C]`` float32.

    ``d log_decay_t`` is the sum of the terms of every (query i, key j) pair whose decay
    ``exp(A_i - A_j)`` spans token t, i.e. ``j < t <= i`` (``exp(-|A_i - A_j|)``: either order).
    Within a chunk: ``out_t = sum_{s < t} before_s + sum_{s >= t} after_s``, ``before_s`` the
    terms of pairs whose earlier end is s and whose later end is after the chunk, ``after_s``
    those whose later end is s and whose earlier end is before the chunk, plus the pairs inside
    the chunk as ``rowsum(X) - colsum(X)`` of their terms ``X [later, earlier]`` (zero on and
    above the diagonal; summed from t on, the pairs with both ends from t on cancel in sums of
    exact float32 products). Pairs spanning the whole chunk are the caller's (``through_terms``).
    Every sum runs within one chunk, so rounding stays relative to chunk-local magnitudes: a
    reverse cumsum of ``q.dq - k.dk`` over L cancels O(1) terms across the whole sequence.
    """
    return jnp.cumsum(before) - before + jnp.sum(after) - jnp.cumsum(after) + after


def pair_balance(pairs):
    """``rowsum(pairs) - colsum(pairs)`` ``[C]`` of a float32 ``[C, C]`` tile (see
    :func:`crossing_sums`)."""
    return jnp.sum(pairs, axis=1) - jnp.sum(pairs, axis=0)


def through_terms(pairs, g, chunk):
    """The pairs that span a whole chunk, ``[B, L, H]`` float32: per chunk n and every token
    of it, ``exp(sum of chunk n's log-decays) sum_p <states_p[n], partner_p[n]>`` over the
    ``pairs`` ``(states_p, partner_p)``, each ``[B, H, N, ...]`` (``<., .>`` sums the trailing
    axes): the keys' state entering the chunk against the queries' state leaving it (with
    ``g [B, L, H]``). Each pair is one multiply-and-sum that XLA fuses into a read of both
    arrays: H200, B4 H16 L = 16K, LION's four pairs took 0.53 ms at D = 128 (0.16 at D = 64)
    against 1.56 (0.43) for the einsum over the stacked directions this replaced."""
    inner = sum(jnp.sum(s.astype(jnp.float32) * p.astype(jnp.float32),
                        axis=tuple(range(3, s.ndim))) for s, p in pairs)  # [B, H, N]
    return spread_through(inner, g, chunk)


def spread_through(inner, g, chunk):
    """:func:`through_terms` from the summed inner products ``inner [B, H, N]`` float32 (the
    Mosaic GPU gradients kernels sum them from the state tiles they hold): ``[B, L, H]``."""
    B, L, H = g.shape
    decay = jnp.exp(jnp.sum(g.reshape(B, L // chunk, chunk, H), axis=2))  # [B, N, H]
    return jnp.repeat(jnp.swapaxes(inner, 1, 2) * decay, chunk, axis=1)


def chunk_output(q, k, v, a, state, *, reverse, strict, precision, segments="direct"):
    """One chunk's outputs ``[C, BV]`` float32: the intra-chunk term plus the entering state's.

    q, k ``[C, Kp]`` and v ``[C, BV]`` in the input dtype, ``a [C]`` float32 log-decays,
    ``state [Kp, BV]`` float32 (the state entering the chunk in the scan's direction).
    """
    dtype = q.dtype
    decay, head, tail = intra_decay(a, reverse=reverse, strict=strict, segments=segments)
    scores = pltriton.dot(q, k, trans_b=True, precision=precision) * decay
    out = pltriton.dot(scores.astype(dtype), v, precision=precision)
    q_dec = (q * jnp.exp(tail if reverse else head)[:, None]).astype(dtype)
    return out + pltriton.dot(q_dec, state.astype(dtype), precision=precision)


def chunk_update(k, v, a, *, reverse, precision):
    """One chunk's contribution to the state, ``(K * exp(tail))^T V`` (reverse: ``exp(head)``),
    ``[Kp, BV]`` float32; the state leaving the chunk is ``exp(sum(a)) * state + this``."""
    head, tail = chunk_ends(a)
    k_dec = (k * jnp.exp(head if reverse else tail)[:, None]).astype(k.dtype)
    return pltriton.dot(k_dec, v, trans_a=True, precision=precision)


def _kernel(q_ref, k_ref, v_ref, g_ref, s0_ref, o_ref, s_ref, *, chunk, num_chunks, reverse,
            strict, precision, segments):
    """One (batch, head, V-block) program.

    Refs: q, k ``[Lp, Kp]``; v, o ``[Lp, BV]``; g (log_decay) ``[Lp]``; s0, s ``[Kp, BV]``.
    s0_ref is None when the scan starts from zero.
    """
    def body(step, state):
        n = num_chunks - 1 - step if reverse else step
        sl = pl.ds(n * chunk, chunk)
        k, v = k_ref[sl, :], v_ref[sl, :]
        a = g_ref[sl].astype(jnp.float32)
        out = chunk_output(q_ref[sl, :], k, v, a, state, reverse=reverse, strict=strict,
                           precision=precision, segments=segments)
        o_ref[sl, :] = out.astype(o_ref.dtype)
        update = chunk_update(k, v, a, reverse=reverse, precision=precision)
        return jnp.exp(jnp.sum(a)) * state + update

    if s0_ref is None:
        state = jnp.zeros(s_ref.shape, jnp.float32)
    else:
        state = s0_ref[...].astype(jnp.float32)
    s_ref[...] = jax.lax.fori_loop(0, num_chunks, body, state)


@functools.partial(jax.jit, static_argnames=("reverse", "strict", "chunk", "block_v",
                                             "out_dtype", "interpret", "num_warps",
                                             "num_stages", "segments"))
def chunk_scan(q, k, v, log_decay, initial_state=None, *, reverse=False, strict=False,
               chunk=64, block_v=64, out_dtype=jnp.float32, interpret=False, num_warps=None,
               num_stages=2, segments="direct"):
    """Chunked decayed linear scan in one direction (see the module docstring).

    Args:
      q, k: ``[B, L, H, K]``; v: ``[B, L, H, V]``, all one dtype; L a multiple of ``chunk``.
      log_decay: ``[B, L, H]`` (any float dtype; used in float32), entries ``<= 0``.
      initial_state: None or ``[B, H, K, V]`` float32.
      reverse: scan from the last token to the first.
      strict: leave out the diagonal ``j == i``.
      chunk: tokens per chunk, a power of two >= 16 (smaller where the tiles would not fit in
        shared memory, :func:`fit_layout`).
      block_v: V columns per program, a power of two >= 16.
      out_dtype: dtype of ``o``.
      interpret: run the Pallas interpreter (CPU) instead of compiling with Triton.
      num_warps, num_stages: Triton launch settings (num_warps None: 8 for states of 64 x 64
        entries or more, else 4; measured best at D=64 and D=128, see docs/kernels.md).
      segments: how the intra-chunk decay exponents are formed, see :func:`chunk_decays`.
    Returns:
      ``(o [B, L, H, V] out_dtype, state [B, H, K, V] float32)``.
    """
    B, L, H, K = q.shape
    V = v.shape[-1]
    q, k, v, kp, bv, vp, precision, params = pad_layout(q, k, v, block_v, num_warps, num_stages)
    chunk, bv = fit_layout(chunk, kp, bv, q.dtype.itemsize, 4)

    in_specs = [
        pl.BlockSpec((None, L, None, kp), lambda b, h, j: (b, 0, h, 0)),
        pl.BlockSpec((None, L, None, kp), lambda b, h, j: (b, 0, h, 0)),
        pl.BlockSpec((None, L, None, bv), lambda b, h, j: (b, 0, h, j)),
        pl.BlockSpec((None, L, None), lambda b, h, j: (b, 0, h)),
    ]
    state_spec = pl.BlockSpec((None, None, kp, bv), lambda b, h, j: (b, h, 0, j))
    args = [q, k, v, log_decay]
    if initial_state is None:
        in_specs.append(None)
        args.append(None)
    else:
        in_specs.append(state_spec)
        args.append(pad_state(initial_state, kp, vp))

    kernel = functools.partial(_kernel, chunk=chunk, num_chunks=L // chunk, reverse=reverse,
                               strict=strict, precision=precision, segments=segments)
    o, state = pl.pallas_call(
        kernel,
        grid=(B, H, vp // bv),
        in_specs=in_specs,
        out_specs=[pl.BlockSpec((None, L, None, bv), lambda b, h, j: (b, 0, h, j)), state_spec],
        out_shape=[jax.ShapeDtypeStruct((B, L, H, vp), out_dtype),
                   jax.ShapeDtypeStruct((B, H, kp, vp), jnp.float32)],
        compiler_params=params,
        interpret=interpret,
        name="chunk_scan_reverse" if reverse else "chunk_scan",
    )(*args)
    return o[..., :V], state[:, :, :K, :V]


def decay_factors(g, chunk, *, reverse):
    """Per-token key factors and per-chunk decay factors of the states kernel, float32.

    ``g [B, L, H]`` log-decays -> ``(w [B, H, L], d [B, H, N])``: forward
    ``w_j = exp(sum_{s > j} a_s)`` (to the chunk end), reverse ``w_j = exp(sum_{s <= j} a_s)``
    (from the chunk start), ``d_n = exp(sum of chunk n)``; every exponent a direct sum over its
    own segment (cumulative sums within one chunk, no differences), so exact to rounding.
    """
    B, L, H = g.shape
    a = jnp.swapaxes(g, 1, 2).reshape(B, H, L // chunk, chunk)
    if reverse:
        expo = jnp.cumsum(a, axis=-1)
    else:  # exclusive reverse cumsum: sum over s > j
        after = reverse_cumsum(a[..., 1:], axis=-1)
        expo = jnp.concatenate([after, jnp.zeros_like(a[..., :1])], axis=-1)
    return jnp.exp(expo).reshape(B, H, L), jnp.exp(jnp.sum(a, axis=-1))


def mask_rows(g, chunk):
    """The per-token rows the Mosaic GPU chunk kernels build their masks and decayed queries
    and keys from (``mosaic_outputs.py``, ``mosaic_causal_warps.py``): ``[3, B, H, L]``
    float32 of ``A`` (chunk-local inclusive cumsums of ``g [B, L, H]``), ``e^A`` and the
    forward walk's key factors ``exp(sum_{s > j} a_s)`` (:func:`decay_factors`)."""
    B, L, H = g.shape
    a = jnp.cumsum(jnp.swapaxes(g, 1, 2).reshape(B, H, L // chunk, chunk), axis=-1)
    a = a.reshape(B, H, L)
    return jnp.stack([a, jnp.exp(a), decay_factors(g, chunk, reverse=False)[0]])


# Runs of chunks (runs_until) keep at least this many chunks each.
MIN_RUN_CHUNKS = 8


def runs_until(programs, num_chunks, target):
    """The number of runs (a power of two dividing ``num_chunks``, at least ``MIN_RUN_CHUNKS``
    chunks each) to cut the chunks into until ``programs * runs`` reaches ``target``."""
    runs = 1
    while (programs * runs < target and num_chunks % (2 * runs) == 0
           and num_chunks // (2 * runs) >= MIN_RUN_CHUNKS):
        runs *= 2
    return runs


def entering_states(ends, d, start, *, reverse):
    """The state entering each run, from each run's end state when walked from zero.

    ``ends [B, H, R, ...]`` (R runs of equal length), ``d [B, H, N]`` the chunk decay factors,
    ``start`` None (zero) or ``[B, H, ...]`` the state before the first run scanned; returns
    ``[B, H, R, ...]``: ``R`` steps of ``S = (run decay) S + end`` in the scan's direction."""
    B, H, splits = ends.shape[:3]
    run_decay = jnp.prod(d.reshape(B, H, splits, -1), axis=-1)
    run_decay = run_decay.reshape(B, H, splits, *[1] * (ends.ndim - 3))
    state = jnp.zeros_like(ends[:, :, 0]) if start is None else start
    states = [None] * splits
    for r in reversed(range(splits)) if reverse else range(splits):
        states[r] = state
        state = run_decay[:, :, r] * state + ends[:, :, r]
    return jnp.stack(states, axis=2)


# A states walk's ``reverse``: False, True, or BOTH, the two directions in one launch.
BOTH = (False, True)


def walk_directions(reverse):
    """The directions a walk's ``reverse`` asks for: ``(reverse,)`` or ``BOTH``."""
    if isinstance(reverse, tuple):
        if reverse != BOTH:
            raise ValueError(f"reverse must be a bool or {BOTH}; got {reverse}")
        return reverse
    return (bool(reverse),)


def stacked_decay_factors(g, chunk, directions, key_scale=None):
    """:func:`decay_factors` of each direction, stacked: ``(w [D, B, H, L], d [D, B, H, N])``;
    ``key_scale`` None or ``[B, L, H]``: w also scales every key row by it (both directions)."""
    w, d = zip(*(decay_factors(g, chunk, reverse=r) for r in directions))
    w = jnp.stack(w)
    if key_scale is not None:
        w = w * jnp.swapaxes(key_scale, 1, 2).astype(jnp.float32)
    return w, jnp.stack(d)


def walk_in_runs(walk, d, s0, *, reverse, splits, with_z):
    """Runs a states walk in ``splits`` runs per direction and returns its results.

    ``walk(s0, z0, store=)`` is one launch of a states kernel (Triton or Mosaic GPU) over every
    direction and run, its results with a leading direction axis: ``[h, hz,] ends[, zends]``
    (``ends [D, B, H, R, Kp, Vp]``, ``zends [D, B, H, R, Kp]``). With ``splits > 1`` a
    first launch walks each run from zero keeping only its end state, :func:`entering_states`
    gives the state entering each run, and the second launch walks the runs again from those.
    ``d [D, B, H, N]``: the chunk decay factors; ``s0`` None or the state before the first
    chunk scanned (``[B, H, Kp, Vp]``; ``[2, B, H, Kp, Vp]`` for ``BOTH``).

    Returns ``(h, final)`` or with_z ``(h, hz, final)``, ``final`` the state after the last
    chunk scanned, each with a leading axis of 2 for ``reverse=BOTH``, else without it.
    """
    directions = walk_directions(reverse)
    if s0 is not None and len(directions) == 1:
        s0 = s0[None]

    def entering(ends, start):
        return jnp.stack([entering_states(ends[i], d[i], None if start is None else start[i],
                                          reverse=r) for i, r in enumerate(directions)])

    z0 = None
    if splits > 1:
        ends, *zends = walk(None, None, store=False)
        s0 = entering(ends, s0)
        if with_z:
            z0 = entering(zends[0], None)
    elif s0 is not None:
        s0 = s0[:, :, :, None]
    outs = walk(s0, z0, store=True)
    ends = outs[2 if with_z else 1]
    final = jnp.stack([ends[i, :, :, 0 if r else -1] for i, r in enumerate(directions)])
    outs = (outs[0], outs[1], final) if with_z else (outs[0], final)
    return outs if len(directions) == 2 else tuple(x[0] for x in outs)
