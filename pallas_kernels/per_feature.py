"""Chunk-parallel decayed linear scan with per-feature decay (GLA, HGRN2, LightNet causal).

With ``A = cumsum(log_decay)`` over L taken per feature, :func:`chunk_scan_per_feature` computes

    decay_on="key" (g: [B, L, H, K]):
        o_i = sum_{j <= i} q_i^T diag(exp(A_i - A_j)) k_j v_j^T + q_i^T diag(e^{A_i}) S0
        state S_t = diag(exp(a_t)) S_{t-1} + k_t v_t^T
    decay_on="value" (g: [B, L, H, V]):
        o_i = sum_{j <= i} (q_i . k_j) exp(A_i - A_j) * v_j + exp(A_i) * (S0^T q_i)
        state S_t = S_{t-1} diag(exp(a_t)) + k_t v_t^T

(``*`` elementwise over V). The causal op is the key form; its gradients dq and dk are the value
form with permuted arguments (see ``linear_attention.py``). ``reverse=True`` runs the same scan
from the last token (``sum_{j >= i}``, decays ``A_j - A_i``) by flipping L and shifting the
log-decays by one token in XLA (the reverse recurrence decays on leaving a token); its end
state, the state before token 0, then takes the decay of token 0.

Structure: three passes (chunk states in parallel, :func:`prefix_states` walking the chunks,
chunk outputs in parallel). The state terms take per-feature factors directly: ``exp(b_i)`` on
q (or on the output) and ``exp(b_C - b_j)`` on k (or on v), all exponents <= 0.

Intra-chunk term and its stability. With per-feature decay the C x C scores
``P_ij = sum_k q_ik k_jk exp(b_ik - b_jk)`` are no longer a matrix product times one mask. The
output kernel walks its chunk one sub-chunk of c = 16 tokens at a time, carrying the float32
state ``S`` entering the sub-chunk (the chunk's entering state at the first): the pairs with
earlier tokens are ``(q_i * exp(h_i)) S`` with ``h_i = sum_{p <= s <= i} a_s`` from the
sub-chunk's first token p, then ``S <- diag(exp(sum_{s in sub-chunk} a_s)) S +
(k * exp(t))^T v`` with ``t_j = sum_{j < s < p + c} a_s`` (the value form puts the decays on
S's columns and on v). Every exponent is a sum of log-decays (<= 0) over its own segment, so
every factor lies in [0, 1] (no overflow whatever the decay, e.g. -20 per token) and their
product is the exact decay up to rounding: a factor that underflows to 0 belongs to a product
smaller still. No exponent is a difference of two cumulative sums, so each has a rounding error
relative to its own size, which matters only where the factor is exponentially small. (This
walk replaced one that scored each sub-chunk against every earlier key of the chunk, with
per-boundary segment sums of the whole chunk: ``experiments.bench_kernels``, one H100, L 16K,
D 64, bf16, 2026-11-27: forward 11.34 -> 6.15 ms, forward + backward 160.6 -> 35.5 ms.)

Within the diagonal sub-block (j, i in I) the decays ``exp(sum_{j < s <= i} a_sk)`` are running
products over the keys from the last: ``D_j = D_{j+1} * exp(a_{j+1})`` on the rows i > j and 1
on row j, applied elementwise one key at a time (c^2 K products per sub-chunk instead of C^2 K
exponentials for the whole chunk). Each is a product of at most c - 1 factors in [0, 1], so its
relative error is at most ~c ulp whatever the decay, and it underflows only to values smaller
still. (Differences of the sub-chunk's cumsum, ``exp(h_ik - h_jk)``, are off by ~ulp(|h|) in
the exponent: y, dq, dk, dv stayed within 5.4e-7, but d log_decay, whose in-chunk sums cancel
(``linear_attention._per_feature_bwd``), reached 1.2e-5 and 2.5e-5 in float32; L 90,
K = V = 16, chunk 64, log-decays uniform in [-20, 0], interpret mode, a throwaway script,
2026-11-26. Current errors: docs/benchmarks.md, ``experiments.kernel_precision``.)

Blocks of mild decay take a shorter path. Where every feature's log-decays over the whole chunk
sum to at least ``-FAST_RANGE`` (20; the check is per program, on its chunk and V-block), the
chunk-local cumulative sums ``b`` lie in ``[-20, 0]`` and the decays factor over the chunk as in
GLA's chunk form: scores ``(q * exp(b)) (k * exp(-b))^T`` masked causally, one product for the
whole chunk (value form: ``exp(b) * (scores (v * exp(-b)))``), and the state term
``(q * exp(b)) S`` (value: ``(q S) * exp(b)``). The states pass takes such a chunk's tails
``exp(b_C - b_j)`` from the same cumulative sums. Other chunks walk, and each sub-chunk whose
sums are at least ``-FAST_RANGE`` takes its own pairs in that product instead of the
key-by-key running products below. Every factor stays within ``[e^-20, e^20]``,
far inside float32's and bf16's range, and an exponent of at most 20 in size carries a rounding
error of ~ulp(20) (2e-6 relative in the factor), against ~ulp(320) for the sub-chunk
differences above. float16 inputs (range 65504) always take the walk. Where every chunk of
a forward key-decay scan is mild (:func:`mild_chunks`, checked at run time by ``lax.cond``),
its states and output kernels are a second build holding that path alone: one kernel with
both paths' code was the slower (one H100, 2026-12-07, B4 H16 L 4K D 64 bf16: the op's
forward 0.451 -> 0.350 ms, forward + backward 1.126 -> 1.019; docs/benchmarks.md).
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.chunk_scan import _pad_axis, pad_layout, pad_state, runs_until
from pallas_kernels.mosaic_causal import BLOCK_V, ONE_PRODUCT_RANGE, causal_forward_mosaic
from pallas_kernels.mosaic_causal import supported as fused_forward_reason
from pallas_kernels.two_pass import hopper

_EXACT = jax.lax.Precision.HIGHEST
# Products of float32 operands as three bf16 tensor-core products (each operand as a bf16 high
# part and a bf16 low part; the low parts' product dropped), accumulated in float32: about 16
# bits of each operand, for the float32 scans of the 16-bit per-feature backward
# (``linear_attention._per_feature_bwd``), where IEEE float32 products leave the tensor cores
# idle. Emulated on a CPU (docs/benchmarks.md, "Per-feature decay's backward by float32
# scans"; XLA on CPU computes this preset as exact float32, so the interpreter does not show
# its rounding): d log_decay 1.4e-5 from float64, against 6.6e-3 from one bf16 pass.
FLOAT32_X3 = jax.lax.DotAlgorithmPreset.BF16_BF16_F32_X3
# chunks whose log-decays sum to >= -FAST_RANGE per feature: one product (module docstring)
FAST_RANGE = ONE_PRODUCT_RANGE
PREFIX_BLOCK_K = 32  # K rows per prefix_states program (docs/kernels.md)
# The fused forward (``fused=True``, mosaic_causal.py) cuts the chunks into runs, one program
# each starting from its entering state (the states walk, :func:`chunk_states_per_feature`,
# of the chunks before the last run), until B H V-blocks runs reaches this
# (``chunk_scan.runs_until``): at B 4, H 16, D 64 one run per (b, h) is 64 programs for an
# H100's 132 multiprocessors. 1 (no runs) until a GPU A/B times it (`python
# -m experiments.ab_settings --op pallas_causal_per_feature --length 4096 --dims 64 --pass
# fwd --variant runs:per_feature.FUSED_TARGET_PROGRAMS=128`). Read when the op is traced.
FUSED_TARGET_PROGRAMS = 1


def _segment_sums(a, mask):
    """``out_j = sum_s mask[j, s] a_s`` as an exact float32 product: ``[C, C] x [C, D]``."""
    return pltriton.dot(mask.astype(jnp.float32), a, precision=_EXACT)


def _prefix_kernel(u_ref, d_ref, s0_ref, s_in_ref, s_ref, *, num_chunks, reverse):
    """Pass B, one (b, h, K-block, V-block): u, s_in ``[N, BK, BV]`` (aliased); d ``[N, dk, dv]``
    chunk decay factors with dk in {1, BK}, dv in {1, BV}; s0, s ``[BK, BV]`` (s0_ref may be
    None); ``reverse``: the chunks from the last. The walk is latency-bound, so each step loads
    the next chunk's u and d before it stores and updates (a read of the next chunk before the
    write of this one, safe with the aliasing)."""
    chunk_at = (lambda step: num_chunks - 1 - step) if reverse else (lambda step: step)

    def body(step, carry):
        state, update, factor = carry
        following = chunk_at(jnp.minimum(step + 1, num_chunks - 1))
        next_update, next_factor = u_ref[following], d_ref[following]
        s_in_ref[chunk_at(step)] = state.astype(s_in_ref.dtype)
        return factor * state + update, next_update, next_factor

    state = (jnp.zeros(s_ref.shape, jnp.float32) if s0_ref is None
             else s0_ref[...].astype(jnp.float32))
    last = chunk_at(0)
    s_ref[...] = jax.lax.fori_loop(0, num_chunks, body, (state, u_ref[last], d_ref[last]))[0]


def prefix_states(u, decay, initial_state, *, block_k, block_v, interpret, num_warps=4,
                  reverse=False, out_dtype=jnp.float32):
    """Pass B: the state entering each chunk (``reverse``: from the right, walking the chunks
    from the last) and the final state.

    The state's entries are independent walks (the chunk factors act elementwise), so the
    programs split it into ``block_k x block_v`` tiles: one (b, h, K-block, V-block) each.

    Args:
      u: ``[B, H, N, Kp, Vp]`` float32 chunk contributions (Kp a multiple of block_k, Vp of
        block_v; both powers of two >= 16 as Triton tiles need).
      decay: ``[B, H, N, dk, dv]`` float32 factor each chunk multiplies the state by
        (``exp`` of its summed log-decays), dk in {1, Kp} and dv in {1, Vp}.
      initial_state: None or ``[B, H, Kp, Vp]`` float32.
      out_dtype: s_in's dtype (the walk carries float32 either way).
    Returns:
      ``(s_in [B, H, N, Kp, Vp] out_dtype, final [B, H, Kp, Vp] float32)`` (s_in[n]: the
      state before chunk n's contribution; final: after every chunk's); float32 s_in reuses
      u's buffer.
    """
    B, H, N, kp, vp = u.shape
    dk, dv = decay.shape[-2:]
    bk, bv = min(block_k, kp), min(block_v, vp)
    chunks_spec = pl.BlockSpec((None, None, N, bk, bv), lambda b, h, i, j: (b, h, 0, i, j))
    decay_spec = pl.BlockSpec(
        (None, None, N, 1 if dk == 1 else bk, 1 if dv == 1 else bv),
        lambda b, h, i, j: (b, h, 0, 0 if dk == 1 else i, 0 if dv == 1 else j))
    state_spec = pl.BlockSpec((None, None, bk, bv), lambda b, h, i, j: (b, h, i, j))
    return pl.pallas_call(
        functools.partial(_prefix_kernel, num_chunks=N, reverse=reverse),
        grid=(B, H, kp // bk, vp // bv),
        in_specs=[chunks_spec, decay_spec, None if initial_state is None else state_spec],
        out_specs=[chunks_spec, state_spec],
        out_shape=[jax.ShapeDtypeStruct(u.shape, out_dtype),
                   jax.ShapeDtypeStruct((B, H, kp, vp), jnp.float32)],
        input_output_aliases={0: 0} if jnp.dtype(out_dtype) == jnp.float32 else {},
        compiler_params=pltriton.CompilerParams(num_warps=num_warps, num_stages=1),
        interpret=interpret,
        name="prefix_states",
    )(u, decay, initial_state)


def _states_kernel(k_ref, v_ref, g_ref, u_ref, *, on_key, precision, head, mild):
    """Pass A, one (b, h, n, V-block): u = (K * exp(tail))^T V (key) or K^T (V * exp(tail)),
    ``tail_j = sum_{s > j} a_s``: for a chunk of mild decay the difference of the chunk's sum
    and its cumulative sums (exponents in [-FAST_RANGE, 0], off by ~ulp(FAST_RANGE)), else
    each segment summed on its own (an exact float32 product of a 0/1 mask). ``head`` (the
    reverse walk's contributions): ``exp(head)`` in place of ``exp(tail)``, ``head_j = sum_{s
    <= j} a_s``, the chunk's inclusive cumulative sums (no difference: every chunk alike).
    ``mild``: every chunk is known to be mild (:func:`_three_passes`), so only that path is
    built."""
    a = g_ref[...].astype(jnp.float32)

    def write(tail):
        k, v = k_ref[...], v_ref[...]
        if on_key:
            k = (k * jnp.exp(tail)).astype(k.dtype)
        else:
            v = (v * jnp.exp(tail)).astype(v.dtype)
        u_ref[...] = pltriton.dot(k, v, trans_a=True, precision=precision)

    def exact():
        idx = jnp.arange(a.shape[0])
        write(_segment_sums(a, idx[None, :] > idx[:, None]))

    if head:
        write(jnp.cumsum(a, axis=0))
        return

    def mild_tails():
        write(jnp.sum(a, axis=0)[None, :] - jnp.cumsum(a, axis=0))

    if mild:
        mild_tails()
        return
    if not _fast(k_ref.dtype):
        exact()
        return
    chunk_mild = _mild(a)
    pl.when(chunk_mild)(mild_tails)
    pl.when(jnp.logical_not(chunk_mild))(exact)


def _diagonal(q, k_ref, v_ref, g_ref, p, *, on_key, strict, dtype, precision):
    """The pairs of one sub-chunk with itself: ``[c, BV]`` float32 for the queries ``q [c, Kp]``
    of tokens ``p .. p + c - 1``. The decays ``exp(sum_{j < s <= i} a_s)`` are running products
    over the keys from the last, ``D_j = D_{j+1} * exp(a_{j+1})`` on the rows i > j and 1 on
    row j, applied elementwise one key at a time (module docstring); strict leaves out j == i.

    The loop over the c keys is a Python loop (unrolled when traced, every load at a static
    offset from p): with a ``fori_loop`` the op took 6.15 / 35.5 ms forward / forward +
    backward, unrolled 4.70 / 30.8 (one H100, L 16K D 64 bf16, ``bench_kernels``,
    docs/benchmarks.md)."""
    sub = q.shape[0]
    r = jnp.arange(sub)[:, None]  # row (query) index within the sub-chunk
    cols = jnp.arange(sub)[None, :]
    d = jnp.zeros((sub, g_ref.shape[1]), jnp.float32)
    if on_key:
        qf = q.astype(jnp.float32)
        scores = jnp.zeros((sub, sub), jnp.float32)
    else:
        scores = pltriton.dot(q, k_ref[pl.ds(p, sub), :], trans_b=True, precision=precision)
        out = jnp.zeros((sub, v_ref.shape[1]), jnp.float32)
    for j in range(sub - 1, -1, -1):
        e = jnp.exp(g_ref[pl.ds(p + min(j + 1, sub - 1), 1), :].astype(jnp.float32))
        d = jnp.where(r > j, d * e, jnp.where(r == j, 1.0, 0.0))  # D_j from D_{j+1}
        masked = jnp.where(r > j, d, 0.0) if strict else d
        if on_key:
            k_j = k_ref[pl.ds(p + j, 1), :].astype(jnp.float32)
            col = jnp.sum(qf * k_j * masked, axis=1)
            scores = jnp.where(cols == j, col[:, None], scores)
        else:
            w = jnp.sum(jnp.where(cols == j, scores, 0.0), axis=1)
            out = out + w[:, None] * masked * v_ref[pl.ds(p + j, 1), :].astype(jnp.float32)
    if on_key:
        return pltriton.dot(scores.astype(dtype), v_ref[pl.ds(p, sub), :], precision=precision)
    return out


def _output_kernel(q_ref, k_ref, v_ref, g_ref, s_ref, o_ref, *, sub, on_key, strict,
                   precision, mild):
    """Pass C, one (b, h, n, V-block): q, k ``[C, Kp]``, v, o ``[C, BV]``, g ``[C, Kp]`` (key)
    or ``[C, BV]`` (value), s ``[Kp, BV]`` the state entering the chunk; strict: without the
    diagonal ``j == i``.

    The chunk is walked one sub-chunk of c tokens at a time with the float32 state ``S``
    entering it: the outputs ``(q * exp(h)) S`` (key) or ``(q S) * exp(h)`` (value), with
    ``h_i = sum_{p <= s <= i} a_s``, plus the sub-chunk's own pairs (:func:`_diagonal`); then
    ``S <- diag(exp(sum_c a)) S + (k * exp(t))^T v`` (key; value: the decay on S's columns and
    ``t`` on v) with ``t_j = sum_{j < s < p + c} a_s``. Every factor is the exponential of a
    sum of log-decays over its own segment, in [0, 1] (module docstring). Chunks of mild
    decay (every feature's sum over the chunk >= ``-FAST_RANGE``) take :func:`_whole_chunk`;
    with ``mild`` (every chunk known to be mild, :func:`_three_passes`) only that is built.
    """
    refs = (q_ref, k_ref, v_ref, g_ref, s_ref, o_ref)
    whole = functools.partial(_whole_chunk, *refs, on_key=on_key, strict=strict,
                              precision=precision)
    walk = functools.partial(_walk_chunk, *refs, sub=sub, on_key=on_key, strict=strict,
                             precision=precision)
    if mild:
        whole()
        return
    if not _fast(q_ref.dtype):
        walk()
        return
    chunk_mild = _mild(g_ref[...].astype(jnp.float32))
    pl.when(chunk_mild)(whole)
    pl.when(jnp.logical_not(chunk_mild))(walk)


def _fast(dtype):
    """Whether blocks of mild decay may take :func:`_product_pairs` (module docstring)."""
    return dtype != jnp.float16 and FAST_RANGE > 0


def _mild(a):
    """Whether the log-decays ``a [n, F]`` of a block of tokens sum to at least
    ``-FAST_RANGE`` in every feature (a scalar bool)."""
    return jnp.min(jnp.sum(a, axis=0)) >= -FAST_RANGE


def _product_pairs(q, k, v, b, *, on_key, strict, dtype, precision):
    """The pairs ``j <= i`` (strict: ``j < i``) of a block of tokens of mild decay in one
    product, ``[n, BV]`` float32: ``b [n, F]`` the block's inclusive cumulative log-decays,
    in ``[-FAST_RANGE, 0]``, so ``exp(b)`` and ``exp(-b)`` stay within ``e^+-FAST_RANGE``
    (module docstring)."""
    idx = jnp.arange(q.shape[0])
    keep = idx[:, None] > idx[None, :] if strict else idx[:, None] >= idx[None, :]
    if on_key:
        scores = pltriton.dot((q * jnp.exp(b)).astype(dtype), (k * jnp.exp(-b)).astype(dtype),
                              trans_b=True, precision=precision)
        return pltriton.dot(jnp.where(keep, scores, 0.0).astype(dtype), v, precision=precision)
    scores = jnp.where(keep, pltriton.dot(q, k, trans_b=True, precision=precision), 0.0)
    return jnp.exp(b) * pltriton.dot(scores.astype(dtype), (v * jnp.exp(-b)).astype(dtype),
                                     precision=precision)


def _state_term(q, state, head, *, on_key, dtype, precision):
    """The pairs of a block's queries ``q [n, Kp]`` with every earlier token, through the
    float32 ``state`` entering the block: ``(q * head) S`` (key) or ``(q S) * head`` (value),
    ``head = exp(h)`` of the block's inclusive cumulative log-decays."""
    if on_key:
        return pltriton.dot((q * head).astype(dtype), state.astype(dtype), precision=precision)
    return pltriton.dot(q, state.astype(dtype), precision=precision) * head


def _whole_chunk(q_ref, k_ref, v_ref, g_ref, s_ref, o_ref, *, on_key, strict, precision):
    """The outputs of a chunk of mild decay: the state term with the chunk-local cumulative
    log-decays ``b``, plus every pair in one product (:func:`_product_pairs`)."""
    dtype = q_ref.dtype
    q, k, v = q_ref[...], k_ref[...], v_ref[...]
    b = jnp.cumsum(g_ref[...].astype(jnp.float32), axis=0)
    out = _state_term(q, s_ref[...], jnp.exp(b), on_key=on_key, dtype=dtype,
                      precision=precision)
    out += _product_pairs(q, k, v, b, on_key=on_key, strict=strict, dtype=dtype,
                          precision=precision)
    o_ref[...] = out.astype(o_ref.dtype)


def _walk_chunk(q_ref, k_ref, v_ref, g_ref, s_ref, o_ref, *, sub, on_key, strict, precision):
    """The outputs of any chunk, walked one sub-chunk at a time (:func:`_output_kernel`); a
    sub-chunk of mild decay takes its own pairs in one product (:func:`_product_pairs`), the
    others by :func:`_diagonal`."""
    dtype = q_ref.dtype
    sub_range = jnp.arange(sub)
    later = sub_range[None, :] > sub_range[:, None]  # [j, s]: s > j
    state = s_ref[...]
    for p in range(0, q_ref.shape[0], sub):
        rows = pl.ds(p, sub)
        q, k, v = q_ref[rows, :], k_ref[rows, :], v_ref[rows, :]
        a = g_ref[rows, :].astype(jnp.float32)
        h = jnp.cumsum(a, axis=0)
        tail = jnp.exp(_segment_sums(a, later))  # exp(t_j)
        whole = jnp.exp(jnp.sum(a, axis=0))  # the sub-chunk's decay of the state
        out = _state_term(q, state, jnp.exp(h), on_key=on_key, dtype=dtype,
                          precision=precision)
        if on_key:
            update = pltriton.dot((k * tail).astype(dtype), v, trans_a=True,
                                  precision=precision)
            state = whole[:, None] * state + update
        else:
            update = pltriton.dot(k, (v * tail).astype(dtype), trans_a=True,
                                  precision=precision)
            state = whole[None, :] * state + update

        def walk(p=p, q=q):
            return _diagonal(q, k_ref, v_ref, g_ref, p, on_key=on_key, strict=strict,
                             dtype=dtype, precision=precision)

        def product(q=q, k=k, v=v, h=h):
            return _product_pairs(q, k, v, h, on_key=on_key, strict=strict, dtype=dtype,
                                  precision=precision)
        out += jax.lax.cond(_mild(a), product, walk) if _fast(dtype) else walk()
        o_ref[rows, :] = out.astype(o_ref.dtype)


def _padded_states(k, v, g, s0, *, on_key, chunk, bv, kp, vp, params, precision, interpret,
                   reverse=False, mild=False, sums=None, out_dtype=jnp.float32):
    """Passes A and B on padded inputs: ``(s_in [B, H, N, Kp, Vp] out_dtype, final [B, H, Kp,
    Vp] float32)``, the state entering each chunk and the one after the last (``reverse``: the state
    leaving each chunk, of the tokens after it, and the one before the first, both decayed
    through the token they reach). ``mild``: as for :func:`_three_passes`; ``sums``: None or
    :func:`chunk_sums` of g; ``out_dtype``: s_in's (:func:`prefix_states`)."""
    B, L, H, _ = k.shape
    N = L // chunk
    grid = (B, H, N, vp // bv)
    k_spec = pl.BlockSpec((None, chunk, None, kp), lambda b, h, n, j: (b, n, h, 0))
    v_spec = pl.BlockSpec((None, chunk, None, bv), lambda b, h, n, j: (b, n, h, j))
    state_spec = pl.BlockSpec((None, None, None, kp, bv), lambda b, h, n, j: (b, h, n, 0, j))
    u = pl.pallas_call(
        functools.partial(_states_kernel, on_key=on_key, precision=precision, head=reverse,
                          mild=mild),
        grid=grid, in_specs=[k_spec, v_spec, k_spec if on_key else v_spec],
        out_specs=state_spec, out_shape=jax.ShapeDtypeStruct((B, H, N, kp, vp), jnp.float32),
        compiler_params=params, interpret=interpret, name="chunk_states_per_feature",
    )(k, v, g)
    # Chunk decay factors [B, H, N, Kp, 1] (key) or [B, H, N, 1, Vp] (value).
    sums = chunk_sums(g, chunk) if sums is None else sums
    decay = jnp.exp(sums).transpose(0, 2, 1, 3)
    decay = decay[..., :, None] if on_key else decay[..., None, :]
    s0 = None if s0 is None else pad_state(s0, kp, vp)
    return prefix_states(u, decay, s0, block_k=PREFIX_BLOCK_K, block_v=bv, interpret=interpret,
                         reverse=reverse, out_dtype=out_dtype)


def _reversed(log_decay):
    """The log-decays ``[B, L, ...]`` of a reverse scan run as a forward scan of the flipped
    tokens: the reverse recurrence decays on leaving a token, so shifted by one, then
    flipped."""
    shifted = jnp.concatenate([log_decay[:, 1:], jnp.zeros_like(log_decay[:, :1])], axis=1)
    return jnp.flip(shifted, axis=1)


def chunk_sums(log_decay, chunk):
    """Each chunk's log-decays ``[B, L, H, F]`` (L a multiple of ``chunk``) summed per feature:
    ``[B, N, H, F]`` float32."""
    B, L, H, F = log_decay.shape
    return jnp.sum(log_decay.astype(jnp.float32).reshape(B, L // chunk, chunk, H, F), axis=2)


def mild_chunks(log_decay, chunk, sums=None):
    """Whether every chunk's log-decays ``[B, L, H, K]`` (L a multiple of ``chunk``) sum to at
    least ``-FAST_RANGE`` in every feature (a traced bool): GLA's one-product form, whose
    factors ``e^+-b`` stay within ``e^FAST_RANGE``, takes them all. ``sums``: None or their
    :func:`chunk_sums`."""
    sums = chunk_sums(log_decay, chunk) if sums is None else sums
    return jnp.min(sums) >= -FAST_RANGE


@functools.partial(jax.jit, static_argnames=("decay_on", "reverse", "strict", "chunk",
                                             "block_v", "out_dtype", "interpret", "num_warps",
                                             "num_stages", "return_states", "precision",
                                             "fused", "states_dtype"))
def chunk_scan_per_feature(q, k, v, log_decay, initial_state=None, *, decay_on="key",
                           reverse=False, strict=False, chunk=64, block_v=64,
                           out_dtype=jnp.float32, interpret=False, num_warps=None,
                           num_stages=2, return_states=False, states=None, precision=None,
                           fused=False, states_dtype=jnp.float32):
    """Decayed linear scan with per-feature decay (see the module docstring).

    Args:
      q, k: ``[B, L, H, K]``; v: ``[B, L, H, V]``, one dtype; L a multiple of ``chunk``.
      log_decay: ``[B, L, H, K]`` (decay_on="key") or ``[B, L, H, V]`` ("value"), ``<= 0``.
      initial_state: None or ``[B, H, K, V]`` float32 (reverse: the state after the last token).
      decay_on: "key" or "value", the state axis the decay acts on.
      reverse: scan from the last token to the first.
      strict: leave out the diagonal ``j == i``.
      chunk: tokens per chunk, a power of two >= 16 (sub-chunks of 16).
      block_v, out_dtype, interpret, num_warps, num_stages: as for ``chunk_scan``.
      return_states: also return the state the scan carries into each chunk, in
        ``states_dtype`` (float32, or the inputs' dtype for a caller that keeps them so:
        then a bf16 scan of mild chunks writes them so directly, see :func:`_three_passes`).
      states: None, or those states ``[B, H, N, K, V]`` float32 (as ``return_states`` gives
        them, the initial state included) when the caller has them: the state passes are
        skipped and the final state returned is None. Not with ``initial_state``.
      precision: of the kernels' products (None: ``chunk_scan.pad_layout``'s, exact float32
        for float32 inputs); see :data:`FLOAT32_X3`.
      fused: a forward key-decay scan of bf16 inputs writing bf16 (no states given; states
        asked for only in bf16, ``states_dtype``), on a Hopper GPU or in the interpreter,
        whose every chunk is mild (each feature's log-decays summing to at least
        ``-FAST_RANGE``), runs as one Mosaic GPU kernel (``mosaic_causal.py``: the states
        walk and the outputs in GLA's one-product form, the states stored as it walks)
        instead of the three passes, picked at run time by ``lax.cond``. The op passes it
        when compiled (``linear_attention.PER_FEATURE_FORWARD``).
    Returns:
      ``(o [B, L, H, V] out_dtype, final state [B, H, K, V] float32)``, with
      ``return_states`` also ``states [B, H, N, K, V]`` in states_dtype (N = L / chunk): forward,
      ``S`` after token ``n C - 1`` (the initial state for n = 0); reverse, the state after
      token ``(n + 1) C`` in the reverse recurrence before the decay of that token, i.e.
      ``sum_{j >= (n+1) C} diag(exp(A_j - A_{(n+1) C})) k_j v_j^T`` plus the decayed
      initial state (that initial state itself for the last chunk).
    """
    if states is not None:
        if initial_state is not None:
            raise ValueError("chunk_scan_per_feature: give states or initial_state, not both "
                             "(the states already hold the initial state)")
        want = (q.shape[0], q.shape[2], q.shape[1] // chunk, k.shape[-1], v.shape[-1])
        if states.shape != want:
            raise ValueError(f"chunk_scan_per_feature: states must be [B, H, L / chunk, K, V]"
                             f" = {want}; got {states.shape}")
    kwargs = dict(decay_on=decay_on, strict=strict, chunk=chunk, block_v=block_v,
                  out_dtype=out_dtype, interpret=interpret, num_warps=num_warps,
                  num_stages=num_stages, return_states=return_states, precision=precision,
                  states_dtype=states_dtype)
    if reverse:
        flip = functools.partial(jnp.flip, axis=1)
        o, state, *out_states = chunk_scan_per_feature(
            flip(q), flip(k), flip(v), _reversed(log_decay), initial_state,
            states=None if states is None else jnp.flip(states, axis=2), **kwargs)
        if state is not None:
            first = jnp.exp(log_decay[:, 0].astype(jnp.float32))  # the decay entering token 0
            state = state * (first[..., :, None] if decay_on == "key" else first[..., None, :])
        return (flip(o), state, *(jnp.flip(x, axis=2) for x in out_states))
    on_key = decay_on == "key"
    K, V = q.shape[-1], v.shape[-1]
    q, k, v, kp, bv, vp, exact, params = pad_layout(q, k, v, block_v, num_warps, num_stages)
    precision = exact if precision is None else precision
    g = _pad_axis(log_decay.astype(jnp.float32), 3, kp if on_key else vp)
    sums = chunk_sums(g, chunk)
    passes = dict(kwargs, precision=precision, kp=kp, bv=bv, vp=vp, params=params, dims=(K, V),
                  sums=sums)
    three_passes = functools.partial(_three_passes, q, k, v, g, initial_state, states=states,
                                     **passes)
    states_in_dtype = not return_states or jnp.dtype(states_dtype) == q.dtype
    if (fused and on_key and not strict and states is None and states_in_dtype
            and _one_kernel_reason(q, v, chunk, out_dtype, interpret) is None):
        B, L, H, _ = q.shape
        splits = runs_until(B * H * (vp // BLOCK_V), L // chunk, FUSED_TARGET_PROGRAMS)

        def one_kernel():
            s0 = pad_state(initial_state, kp, vp)
            if splits > 1:  # the states entering the runs: the states walk of the chunks
                # before the last run, every run-th state and the one after them
                before = (L // splits) * (splits - 1)
                walked, after = chunk_states_per_feature(
                    k[:, :before], v[:, :before], g[:, :before], s0, chunk=chunk,
                    interpret=interpret, precision=precision)
                s0 = jnp.concatenate([walked[:, :, ::L // chunk // splits], after[:, :, None]],
                                     axis=2)
            y, final, *h = causal_forward_mosaic(
                q, k, v, g, s0, chunk=chunk, splits=splits, store_states=return_states,
                interpret=plgpu.InterpretGPUParams() if interpret else None)
            return (y[..., :V], final[:, :, :K, :V], *(x[..., :K, :V] for x in h))

        return jax.lax.cond(mild_chunks(g, chunk, sums), one_kernel, three_passes)
    if on_key and not strict and _fast(q.dtype):
        # key-decay scans that are not strict (the op's forward; in the float32-scans backward
        # also dv's): kernels built for mild chunks only where every chunk is, picked at run
        # time; the value-decay and strict scans keep one build each, for compile time
        return jax.lax.cond(mild_chunks(g, chunk, sums),
                            functools.partial(three_passes, mild=True), three_passes)
    return three_passes()


def _one_kernel_reason(q, v, chunk, out_dtype, interpret):
    """Why the padded inputs of a forward key-decay scan do not take the fused Mosaic GPU kernel
    (``chunk_scan_per_feature(fused=True)``), or None when they do."""
    if not interpret and not hopper():
        return "not on a Hopper GPU"
    if jnp.dtype(out_dtype) != q.dtype:
        return f"out_dtype {jnp.dtype(out_dtype)} is not the inputs' {q.dtype}"
    return fused_forward_reason(q, v, chunk)


def _three_passes(q, k, v, g, initial_state, *, decay_on, strict, chunk, block_v, out_dtype,
                  interpret, num_warps, num_stages, return_states, precision, kp, bv, vp,
                  params, dims, sums, states_dtype, states=None, mild=False):
    """:func:`chunk_scan_per_feature` (forward) of padded inputs by its three passes; ``sums``:
    :func:`chunk_sums` of g. ``mild``: every chunk is mild (:func:`mild_chunks`; a bf16 or
    float32 key-decay scan), so the states and output kernels are built for that path only
    (one product per chunk, no sub-chunk walk; the op's forward took 0.350 ms against 0.451
    with one build holding both paths, module docstring). There the
    output kernel rounds the entering state to the input dtype before its one product, so
    with bf16 inputs the walk writes the states in bf16 (the same products, half the bytes)
    unless they are asked for in float32."""
    del block_v, num_warps, num_stages
    on_key = decay_on == "key"
    B, L, H, _ = q.shape
    K, V = dims
    rounded = mild and q.dtype == jnp.bfloat16 and not (
        return_states and jnp.dtype(states_dtype) == jnp.float32)
    if states is None:
        s_in, state = _padded_states(k, v, g, initial_state, on_key=on_key, chunk=chunk,
                                     bv=bv, kp=kp, vp=vp, params=params, precision=precision,
                                     interpret=interpret, mild=mild, sums=sums,
                                     out_dtype=q.dtype if rounded else jnp.float32)
    else:
        s_in, state = _pad_axis(_pad_axis(states.astype(jnp.float32), 3, kp), 4, vp), None
    grid = (B, H, L // chunk, vp // bv)
    qk_spec = pl.BlockSpec((None, chunk, None, kp), lambda b, h, n, j: (b, n, h, 0))
    v_spec = pl.BlockSpec((None, chunk, None, bv), lambda b, h, n, j: (b, n, h, j))
    state_spec = pl.BlockSpec((None, None, None, kp, bv), lambda b, h, n, j: (b, h, n, 0, j))
    o = pl.pallas_call(
        functools.partial(_output_kernel, sub=16, on_key=on_key, strict=strict,
                          precision=precision, mild=mild),
        grid=grid, in_specs=[qk_spec, qk_spec, v_spec, qk_spec if on_key else v_spec,
                             state_spec],
        out_specs=v_spec, out_shape=jax.ShapeDtypeStruct((B, L, H, vp), out_dtype),
        compiler_params=params, interpret=interpret, name="chunk_outputs_per_feature",
    )(q, k, v, g, s_in)
    out = (o[..., :V], None if state is None else state[:, :, :K, :V])
    return out + (s_in[..., :K, :V].astype(states_dtype),) if return_states else out


@functools.partial(jax.jit, static_argnames=("chunk", "interpret", "precision", "reverse"))
def chunk_states_per_feature(k, v, log_decay, initial_state=None, *, chunk=64,
                             interpret=False, precision=None, reverse=False):
    """The key-decay scan's states only (passes A and B, no outputs).

    Args: k ``[B, L, H, K]``, v ``[B, L, H, V]``, log_decay ``[B, L, H, K]``, initial_state
    and precision as for :func:`chunk_scan_per_feature` (decay_on="key"). Returns ``(states
    [B, H, N, K, V], final [B, H, K, V])`` float32: forward, ``states`` as that function's
    ``return_states`` and ``final`` as its final state; ``reverse``, walking the chunks from
    the last with no flip of the tokens, the states *leaving* each chunk n, ``sum_{j > end}
    diag(exp(A_j - A_end)) k_j v_j^T`` plus the initial state decayed to the chunk's end (the
    initial state itself for the last chunk; :func:`leaving_states` of that function's
    reverse states), and ``final`` the state before token 0 decayed through it, ``sum_j
    diag(exp(A_j)) k_j v_j^T`` plus the decayed initial state.
    """
    K, V = k.shape[-1], v.shape[-1]
    _, k, v, kp, bv, vp, exact, params = pad_layout(k, k, v, 64, None, 2)
    precision = exact if precision is None else precision
    g = _pad_axis(log_decay.astype(jnp.float32), 3, kp)
    s_in, state = _padded_states(k, v, g, initial_state, on_key=True, chunk=chunk, bv=bv,
                                 kp=kp, vp=vp, params=params, precision=precision,
                                 interpret=interpret, reverse=reverse)
    return s_in[..., :K, :V], state[:, :, :K, :V]


def leaving_states(reverse_states, log_decay, chunk):
    """The reverse key-decay scan's states (:func:`chunk_scan_per_feature`'s with
    ``reverse=True``, ``[B, H, N, K, V]``: decays to token ``(n + 1) C``) decayed by one token
    more, to the end of chunk n: ``sum_{j > end} diag(exp(A_j - A_end)) k_j v_j^T`` (plus the
    decayed initial state)."""
    next_first = jnp.concatenate([log_decay[:, chunk::chunk],
                                  jnp.zeros_like(log_decay[:, :1])], axis=1)  # [B, N, H, K]
    return reverse_states * jnp.exp(jnp.swapaxes(next_first, 1, 2))[..., None]
