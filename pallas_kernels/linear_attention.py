"""Public ops: causal and bidirectional (LION) chunked linear attention with custom VJPs.

Conventions (ARCHITECTURE.md section 3): ``q, k: [B, L, H, K]``, ``v: [B, L, H, V]``,
``log_decay: [B, L, H]`` (entries ``<= 0``) or None, ``A = cumsum(log_decay)`` over L.

Every forward and backward pass is a handful of calls of one kernel,
:func:`pallas_kernels.chunk_scan.chunk_scan` (a forward or reverse decayed scan). With
``W_ij = (q_i . k_j) exp(A_i - A_j)`` for ``i >= j`` (causal) the gradients are again scans:

    dq = scan_fwd(do, v, k; S0^T):  dq_i = sum_{j<=i} (do_i . v_j) e^{A_i-A_j} k_j + e^{A_i} S0 do_i
    dk = scan_rev(v, do, q; dS_T^T): dk_j = sum_{i>=j} (do_i . v_j) e^{A_i-A_j} q_i
                                             + e^{A_T-A_j} dS_T v_j
    dv = scan_rev(k, q, do; dS_T), whose end state is dS0
    dlog_decay_t = sum_{j < t <= i} (q_i . k_j)(do_i . v_j) e^{A_i-A_j}   (pair_sums.py)

For LION's symmetric mask ``M_ij = exp(-|A_i - A_j|)``: ``dq = Bidir(do, v, k)``,
``dk = Bidir(v, do, q)``, ``dv = Bidir(k, q, do)``, and d log_decay sums the pairs of both
orders. d log_decay is never the reverse cumsum of ``q_t . dq_t - k_t . dk_t`` for scalar
decay: its O(1) terms cancel over L, and their rounding added up (bf16 1.4e-2 before the pair
sums of the fused kernels; float32 1.1e-5, bf16 6.4e-3 on the scan paths before
``pair_sums.py``).
The residuals are the inputs (and the final state), plus, for the fused two-pass backward
kernels, the forward's chunk states when they are at most twice the size of q or v
(``keep_states``; the backward then skips those states walks): O(L d), never O(L^2).

Per-feature decay ``[B, L, H, K]`` (causal only; ``per_feature.py``): ``y`` is the key-decay scan
and, with the decay now on the state's K axis, ``dq = scan_value(do, v, k; S0^T)``,
``dk = scan_value_rev(v, do, q; dS_T^T)``, ``dv = scan_key_rev(k, q, do; dS_T)`` (end state
``dS0``), all on float32 operands, and d log_decay from them: in-chunk sums of
``q * dq - k * dk`` plus the states at the chunk ends (``_per_feature_bwd``).

Normalised LION's scan backwards (head dims above the fused kernels', and
``algorithm="sequential"``) take dq from float32 scans (``_normalised_dq``), and the sequential
one recomputes y and den by float32 scans: dq cancels, and 16-bit operands had left it at up to
7.7e-3 (bf16, interpret mode) and 1.8e-2 (head dim 256, one H100, 2026-11-24).

Two algorithms. ``"two_pass"`` (the default): a states kernel walks the chunks (one small
matmul per step, ``two_pass.py``), then every chunk is a program of its own; the causal forward
is ``chunk_scan_two_pass`` (compiled on Hopper, 16-bit: one warp-specialized kernel that walks
the chunks and writes the outputs, ``CAUSAL_FORWARD``), its backward one fused kernel
(``causal_backward.py``: dq, dk, dv and dlog_decay from the forward and reverse states in one
pass); LION's forward is one fused bidirectional kernel with the normaliser in the same pass and
its backward another (``bidirectional.py``). The fused backwards do not reverse-cumsum dA: they
sum every pair's term over the tokens its decay spans (``chunk_scan.crossing_sums``), which
keeps bf16 rounding from adding up over L (causal bf16 d log_decay under strong decay: 1.4e-2
-> 2.7e-4). Head dims above 128 fall back to the scans above (three for the causal backward,
three fused bidirectional scans for LION's) with d log_decay from ``pair_sums.py`` (XLA).
``"sequential"``: every scan is ``chunk_scan`` (one program per (b, h, V-block) walking the
chunks), LION as a forward plus a reverse scan with the normaliser as a ones column of V.
Per-feature decay always uses the chunk-parallel form of ``per_feature.py``. ``backend``
picks the two-pass states walks' kernel: Mosaic GPU on Hopper where it applies
(``mosaic_states.py``), else Triton.
"""

import functools

import jax
import jax.numpy as jnp

from pallas_kernels.bidirectional import (bidirectional_scan, lion_backward, rounded_xla,
                                          to_float32, two_parts_xla)
from pallas_kernels.bidirectional import supported as lion_backward_supported
from pallas_kernels.causal_backward import causal_backward
from pallas_kernels.causal_backward import supported as causal_backward_supported
from pallas_kernels.chunk_scan import chunk_scan, fit_layout
from pallas_kernels.pair_sums import causal_pair_sums, lion_pair_sums
from pallas_kernels.per_feature import (FLOAT32_X3, chunk_scan_per_feature,
                                       chunk_states_per_feature, leaving_states, mild_chunks)
from pallas_kernels.per_feature_grads import per_feature_grads
from pallas_kernels.mosaic_states import supported as mosaic_walk_reason
from pallas_kernels.two_pass import (BACKENDS, WALK_BLOCK_V, chunk_scan_two_pass, hopper,
                                     output_block_v)

_FLOATS = (jnp.float32, jnp.bfloat16, jnp.float16)
ALGORITHMS = ("sequential", "two_pass")
# algorithm=None picks "two_pass": in one H100 run (2026-11-21, docs/benchmarks.md) it was
# 1.4-2.3x faster than "sequential" forward+backward at L = 4K and 16K, D = 64 and 128, for the
# causal and LION ops; its forward was within 10 % (causal, D = 128) or faster.
DEFAULT_ALGORITHM = "two_pass"
# The per-feature backward of bf16 inputs: "chunks" (pallas_kernels.per_feature_grads:
# products of each chunk's bf16 tiles, d log_decay without sums that cancel across chunks;
# where every chunk is bounded, the scans otherwise) or "scans" (three scans and two state
# walks on float32 operands, _per_feature_bwd). On one H100 (2026-12-07, B 4, H 16, L 4K,
# D 64, bf16) "chunks" took forward + backward from 2.618 to 1.948 ms (docs/benchmarks.md).
# Read when the op is traced; `python -m experiments.bench_kernels` times both
# (pallas_causal_per_feature, the default, and pallas_causal_per_feature_scans).
PER_FEATURE_BACKWARD = "chunks"
# The causal forward of per-token decay (algorithm "two_pass"): "fused"
# (chunk_scan_two_pass(fused=True): one warp-specialized Mosaic GPU kernel where it applies,
# 16-bit inputs on Hopper), "two_pass" (the states walk, then the outputs kernel), or "auto":
# fused when compiled, the two passes in the interpreter (which runs the fused kernel's three
# warpgroups as three XLA CPU programs; on a 2-core machine the third may never start,
# tests/test_mosaic_causal.py). On one H100 (2026-12-07, B 4, H 16, L 16K, bf16) fused took
# the op's forward from 0.489 to 0.370 ms at D 64 and from 1.093 to 0.511 at D 128, forward +
# backward from 1.444 to 1.413 and from 3.216 to 2.859 (docs/benchmarks.md). Read when the op
# is traced; `python -m experiments.bench_kernels` times both (pallas_causal_2pass, the
# default, and pallas_causal_two_kernels).
CAUSAL_FORWARD = "auto"
# The fused backwards' gradients kernel (per-token decay: causal_backward.py's and
# bidirectional.lion_backward's ``grads``): "auto" (the Mosaic GPU kernels,
# mosaic_causal_backward.py and mosaic_lion_backward.py, where the states walks run on Mosaic
# GPU and they take the inputs: 16-bit, Kp = Vp = 64; else Triton) or "triton". On one H200
# (2026-12-07, B 4, H 16, L 16K, D 64, bf16) "auto" took the causal op's forward + backward
# from 1.279 to 1.040 ms and LION's (normalised) from 2.078 to 1.818 (docs/benchmarks.md).
# Read when the op is traced; `python -m experiments.bench_kernels` times both
# (pallas_causal_2pass and pallas_lion_2pass, the defaults, against
# pallas_causal_triton_grads and pallas_lion_triton_grads). Above Kp 64 the Triton kernel is
# the faster: 14 % ahead of a Mosaic GPU layout for Kp 128 (one H100, 2026-12-07,
# docs/benchmarks.md, "Interleaved A/Bs").
GRADS_KERNEL = "auto"
# The causal forward of per-feature decay: "three_passes" (per_feature.chunk_scan_per_feature:
# chunk states, their walk, the outputs), "fused" (chunk_scan_per_feature(fused=True): one
# Mosaic GPU kernel, mosaic_causal.py, where every chunk is mild, bf16 on Hopper or in the
# interpreter, picked at run time; the three passes otherwise; with gradients it also stores
# the chunk states per_feature_grads reads), or "auto": "fused" when compiled, the three
# passes in the interpreter (their kernels are the CPU tests'; the fused kernel's tests set
# "fused"). In interleaved A/Bs on one H100 (2026-12-07, B 4, H 16, L 4K, bf16, mild decay,
# docs/benchmarks.md, "Per-feature decay's settings") "fused" took the forward at D 128 from
# 1.008-1.026 ms to 0.765 and forward + backward from 2.982 to 2.652 (both with
# per_feature_grads' D 128 settings), and at D 64 the forward from 0.367-0.386 to 0.370 and
# forward + backward from 1.137-1.160 to 1.095. Read when the op is traced.
PER_FEATURE_FORWARD = "auto"
# Columns of v (and of the state) per program in the per-feature op's three passes: each of
# the Vp / this V-blocks recomputes its chunk's decayed q and k (Kp 128: two blocks of 64, each
# taking 2 x 64 x 128 exponentials per chunk). With the three passes' forward, 128 took 0.902
# ms against 1.008-1.026 at D 128 (one H100, 2026-12-07, the A/B above, `python -m
# experiments.ab_settings --op pallas_causal_per_feature --length 4096 --dims 128 --pass fwd
# --variant bv128:PER_FEATURE_BLOCK_V=128`); left at 64 since the fused forward takes those
# inputs, and the three passes' others (chunks of strong decay, GPUs before Hopper) are not
# timed with it. Read when the op is traced.
PER_FEATURE_BLOCK_V = 64
# Head dims below this are zero-padded to it (the kernels' tiles need 16 rows for tl.dot): the
# padded features of q and k add exact zeros to every q . k, the padded value columns give
# output columns that are sliced off, so the result is the unpadded op's, gradients included.
MIN_HEAD_DIM = 16


def _scan(q, k, v, g, s0=None, *, algorithm=None, decay_on="key", **kwargs):
    """One decayed scan with ``chunk_scan``'s arguments.

    Per-feature decay (``g [B, L, H, K]``) runs ``chunk_scan_per_feature`` with the decay on the
    state's key axis, or on its value axis (``decay_on="value"``) for the transposed scans of
    the backward pass; scalar decay (``g [B, L, H]``, the same on both axes) runs the
    configured ``algorithm``.
    """
    if g.ndim == 4:
        return chunk_scan_per_feature(q, k, v, g, s0, decay_on=decay_on, **kwargs)
    scan = chunk_scan if algorithm == "sequential" else chunk_scan_two_pass
    return scan(q, k, v, g, s0, **kwargs)


# ----------------------------------------------------------------------------- causal core


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _causal(q, k, v, g, s0, cfg):
    """``(y [B, Lp, H, V] v.dtype, S_T [B, H, K, V] f32)``; Lp a multiple of the chunk;
    ``g [B, Lp, H]`` or, per feature, ``[B, Lp, H, K]``."""
    return _scan(q, k, v, g, s0, out_dtype=v.dtype, **cfg, **_forward_switch(g, cfg))


def _forward_switch(g, cfg):
    """``{"fused": True}`` where the settings pick a one-kernel causal forward: per-feature
    decay under ``PER_FEATURE_FORWARD``, the two-pass scan of per-token decay under
    ``CAUSAL_FORWARD``; else ``{}``."""
    if g.ndim == 4:
        use = _one_kernel(PER_FEATURE_FORWARD, "PER_FEATURE_FORWARD", "three_passes", cfg)
    else:
        use = (_one_kernel(CAUSAL_FORWARD, "CAUSAL_FORWARD", "two_pass", cfg)
               and cfg.get("algorithm") == "two_pass")
    return {"fused": True} if use else {}


def _one_kernel(setting, name, other, cfg):
    """Whether a forward setting ("fused", ``other`` or "auto": "fused" when compiled, ``other``
    in the interpreter) picks the one-kernel forward; another value is one error line."""
    if setting not in ("auto", "fused", other):
        raise ValueError(f"linear_attention.{name} must be 'auto', 'fused' or {other!r}; got "
                         f"{setting!r}")
    return setting == "fused" or (setting == "auto" and not cfg["interpret"])


def keep_states(k_dim, v_dim, chunk):
    """Whether a custom VJP keeps the forward's chunk states as residuals (so the backward skips
    that states walk): they hold ``L * Kp * Vp / C`` entries (Kp, Vp: the head dims rounded up
    to powers of two), kept when that is at most twice the larger of q and v, i.e.
    ``min(Kp, Vp) <= 2 C``; otherwise the backward recomputes them."""
    return min(_next_pow2(max(k_dim, 16)), _next_pow2(max(v_dim, 16))) <= 2 * chunk


def _fused_causal_backward(q, v, g, cfg):
    return (cfg.get("algorithm") == "two_pass" and g.ndim == 3
            and causal_backward_supported(q.shape[-1], v.shape[-1], q.dtype))


def _chunks_backward(q, g):
    """Whether the per-feature backward may take ``per_feature_grads`` (``PER_FEATURE_BACKWARD``;
    at run time, where every chunk is mild)."""
    return g.ndim == 4 and PER_FEATURE_BACKWARD == "chunks" and q.dtype == jnp.bfloat16


def _causal_fwd(q, k, v, g, s0, cfg):
    h = None
    keep = keep_states(q.shape[-1], v.shape[-1], cfg["chunk"])
    if _fused_causal_backward(q, v, g, cfg) and keep:
        y, state, h = chunk_scan_two_pass(q, k, v, g, s0, out_dtype=v.dtype, return_states=True,
                                          **_fused_cfg(cfg), **_forward_switch(g, cfg))
    elif _chunks_backward(q, g) and keep:
        # the chunk states (three passes' or one kernel's), which per_feature_grads would walk
        # again (it takes them in the input dtype)
        y, state, h = _scan(q, k, v, g, s0, out_dtype=v.dtype, return_states=True,
                            states_dtype=q.dtype, **cfg, **_forward_switch(g, cfg))
    else:
        y, state = _causal(q, k, v, g, s0, cfg)
    return (y, state), (q, k, v, g, s0, state, h)


def _per_feature_bwd(q, k, v, g, s0, dy, d_state, cfg):
    """Gradients of the per-feature op, every scan on float32 operands (float32 products: exact
    for float32 inputs, three bf16 parts for 16-bit ones).

    dq, dk without the diagonal pairs (``dq_s``, ``dk_s``), and with ``D_n`` the queries' state
    at the end of chunk n (``sum_{i > end} diag(exp(A_i - A_end)) q_i do_i^T`` plus the decayed
    ``dS_T``) and ``S_n`` the state after it, each pair ``j < t <= i`` of ``dlog_decay_t`` is
    counted once by

        dlog_decay_t = sum_{s >= t in t's chunk} (q_s * dq_s - k_s * dk_s) + rowsum(S_n * D_n)

    (per key feature): the in-chunk sum counts the pairs whose query lies in the chunk at or
    after t (their keys anywhere before it) less those whose key does too, and ``S_n . D_n``
    restores the pairs with the key before t and the query after the chunk. Terms cancel only
    inside a chunk and in float32 (the global reverse cumsum cancels O(1) terms over L). So
    the forward's states are recomputed here from float32 operands (states only, no outputs):
    the forward's own, from 16-bit operands, would not cancel against float32 dk.

    Two state walks serve all three scans: ``dq = S do`` reads the forward states ``S_n``
    (transposed: its scan decays the value axis) and ``dk = D v`` the reverse states ``D_n``
    of ``dv = D^T k``.
    """
    f32 = functools.partial(jnp.asarray, dtype=jnp.float32)
    q32, k32, v32, dy32 = (f32(x) for x in (q, k, v, dy))
    # 16-bit inputs: the float32 operands' products on the tensor cores as three bf16 parts
    # (per_feature.FLOAT32_X3); float32 inputs keep exact float32 products
    cfg = dict(cfg, precision=None if q.dtype == jnp.float32 else FLOAT32_X3)
    states, final = chunk_states_per_feature(k32, v32, g, s0, chunk=cfg["chunk"],
                                             interpret=cfg["interpret"],
                                             precision=cfg["precision"])
    dv, ds0, queries = chunk_scan_per_feature(k32, q32, dy32, g, d_state, reverse=True,
                                              return_states=True, **cfg)
    dq, _ = chunk_scan_per_feature(dy32, v32, k32, g, decay_on="value", strict=True,
                                   states=jnp.swapaxes(states, 3, 4), **cfg)
    dk, _ = chunk_scan_per_feature(v32, dy32, q32, g, decay_on="value", reverse=True,
                                   strict=True, states=jnp.swapaxes(queries, 3, 4), **cfg)
    B, L, H, K = q.shape
    C, N = cfg["chunk"], L // cfg["chunk"]
    after = jnp.concatenate([states[:, :, 1:], final[:, :, None]], axis=2)  # S_n
    ends = jnp.sum(after * leaving_states(queries, g, C), axis=-1)  # S_n . D_n: [B, H, N, K]
    terms = (q32 * dq - k32 * dk).reshape(B, N, C, H, K)
    in_chunk = jnp.flip(jnp.cumsum(jnp.flip(terms, 2), axis=2), 2)
    dA = (in_chunk + ends.transpose(0, 2, 1, 3)[:, :, None]).reshape(B, L, H, K)
    diagonal = _dot_last(dy, v)[..., None]
    return ((dq + diagonal * k32).astype(q.dtype), (dk + diagonal * q32).astype(k.dtype),
            dv.astype(v.dtype), dA.astype(g.dtype), None if s0 is None else ds0)


def _causal_bwd(cfg, res, cotangents):
    q, k, v, g, s0, state, h = res
    dy, d_state = cotangents
    dy = dy.astype(v.dtype)
    if _chunks_backward(q, g):
        return jax.lax.cond(
            mild_chunks(g, cfg["chunk"]),
            lambda args: per_feature_grads(*args, chunk=cfg["chunk"], interpret=cfg["interpret"],
                                           states=h),
            lambda args: _per_feature_bwd(*args, cfg), (q, k, v, g, s0, dy, d_state))
    if g.ndim == 4:
        return _per_feature_bwd(q, k, v, g, s0, dy, d_state, cfg)
    if _fused_causal_backward(q, v, g, cfg):
        dq, dk, dv, dlog_decay, ds0 = causal_backward(
            q, k, v, g, s0, dy, d_state, h, chunk=cfg["chunk"],
            interpret=cfg["interpret"], backend=cfg["backend"], grads=GRADS_KERNEL)
        return dq, dk, dv, dlog_decay.astype(g.dtype), ds0
    s0_t = None if s0 is None else jnp.swapaxes(s0, 2, 3)
    # dq and dk without the diagonal pairs (strict scans), whose terms q_t k_t (dy_t . v_t)
    # are added back in float32.
    dq, _ = _scan(dy, v, k, g, s0_t, decay_on="value", strict=True, **cfg)
    dk, _ = _scan(v, dy, q, g, jnp.swapaxes(d_state, 2, 3), decay_on="value", reverse=True,
                  strict=True, **cfg)
    dv, ds0 = _scan(k, q, dy, g, d_state, reverse=True, **cfg)
    q32, k32 = q.astype(jnp.float32), k.astype(jnp.float32)
    # each pair's term over the tokens its decay spans, per key feature for [B, L, H, K] decay
    # (no O(1) terms cancel over L)
    dA = causal_pair_sums(q, k, v, dy, g, chunk=cfg["chunk"], initial_state=s0,
                          d_state=d_state)
    diagonal = _dot_last(dy, v)[..., None]
    return ((dq + diagonal * k32).astype(q.dtype), (dk + diagonal * q32).astype(k.dtype),
            dv.astype(v.dtype), dA.astype(g.dtype), None if s0 is None else ds0)


_causal.defvjp(_causal_fwd, _causal_bwd)


# ---------------------------------------------------------------------- bidirectional core


def _bidir_scans(q, k, v, g, cfg):
    """LION numerator ``sum_j (q_i . k_j) exp(-|A_i - A_j|) v_j`` as its (causal j <= i,
    anti-causal j > i) float32 parts."""
    forward, _ = _scan(q, k, v, g, **cfg)
    backward, _ = _scan(q, k, v, g, reverse=True, strict=True, **cfg)
    return forward, backward


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _bidir(q, k, v, g, cfg):
    """LION numerator ``[B, Lp, H, V]`` float32; Lp a multiple of the chunk."""
    forward, backward = _bidir_scans(q, k, v, g, cfg)
    return forward + backward


def _bidir_fwd(q, k, v, g, cfg):
    return _bidir(q, k, v, g, cfg), (q, k, v, g)


def _bidir_bwd(cfg, res, dy):
    q, k, v, g = res
    dy = dy.astype(v.dtype)
    return _bidir_grads(q, k, g, cfg, dy, v, dy)


def _bidir_grads(q, k, g, cfg, dq_in, v_in, dnum, with_dq=True, pairs=None):
    """``(dq, dk, dv, dlog_decay)`` of the numerator ``Bidir(q, k, v)`` by six scans: the weights'
    cotangent is ``dq_in_i . v_in_j`` (``dnum``, ``v`` for the numerator alone; with LION's
    normaliser the columns of :func:`_normalised_cotangents`, whose float32 ``pairs`` then
    give d log_decay), dv takes ``dnum``. ``with_dq`` False: dq is None (normalised LION takes
    it from :func:`_normalised_dq`)."""
    dq = sum(_bidir_scans(dq_in, v_in, k, g, cfg)).astype(q.dtype) if with_dq else None
    dk = sum(_bidir_scans(v_in, dq_in, q, g, cfg))
    dv = sum(_bidir_scans(k, q, dnum, g, cfg))
    dA = lion_pair_sums(q, k, *(pairs or (v_in, dq_in)), g, chunk=cfg["chunk"])
    return dq, dk.astype(k.dtype), dv.astype(dnum.dtype), dA.astype(g.dtype)


_bidir.defvjp(_bidir_fwd, _bidir_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _bidir_normalised(q, k, v, g, m, cfg, eps):
    """Normalised LION ``[B, Lp, H, V]`` float32 by the scans: the denominator is the numerator
    of a ones column of V. m None, or ``[B, H, V]``: the output of the values ``v + m`` (v
    centred, see :func:`centred_values`), ``(num + den m) / (den + eps)``."""
    return _bidir_normalised_fwd(q, k, v, g, m, cfg, eps)[0]


def _normalised_output(q, k, v, g, m, cfg, eps):
    """``(y, den)`` float32 of normalised LION by the scans (values ``v + m``, m None: 0)."""
    ones = jnp.ones(v.shape[:3] + (1,), v.dtype)
    out = sum(_bidir_scans(q, k, jnp.concatenate([v, ones], axis=-1), g, cfg))
    num, den = out[..., :-1], out[..., -1]
    if m is not None:
        num = num + den[..., None] * m[:, None]
    return num / (den + eps)[..., None], den


def _bidir_normalised_fwd(q, k, v, g, m, cfg, eps):
    return _normalised_output(q, k, v, g, m, cfg, eps)[0], (q, k, v, g, m)


def _bidir_normalised_bwd(cfg, eps, res, dy):
    """The gradients need y to float32 precision (the weights' cotangent
    ``dnum_i . (v_j - y_i)`` has zero mean under the weights, and dq, dk cancel): 16-bit scans
    leave y off by ~bf16's rounding, which put bf16 dq at 4.2e-3 with dq itself exact
    (log-decay ~ U[-20, 0], L = 100; 1.7e-3 with y recomputed, bf16's output rounding). So y
    and den are recomputed here by float32 scans (``_normalised_dq``'s float32 walks)."""
    q, k, v, g, m = res
    f32 = functools.partial(jnp.asarray, dtype=jnp.float32)
    y, den = _normalised_output(f32(q), f32(k), f32(v), g, m, _float32_cfg(cfg), eps)
    dm = None
    if m is not None:  # the values' centre is a constant (centred_values)
        y, dm = y - m[:, None], jnp.zeros_like(m)
    dnum, dq_in, v_in, pairs = _normalised_cotangents(dy, y, den, eps, v)
    _, dk, dv, dA = _bidir_grads(q, k, g, cfg, dq_in, v_in, dnum, with_dq=False, pairs=pairs)
    return _normalised_dq(q, k, v, g, cfg, dy, y, den, eps), dk, dv, dA, dm


_bidir_normalised.defvjp(_bidir_normalised_fwd, _bidir_normalised_bwd)


# ------------------------------------------------------- bidirectional core, fused kernels


def _fused_cfg(cfg):
    return {key: val for key, val in cfg.items() if key != "algorithm"}


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _lion(q, k, v, g, m, cfg, normalize, eps):
    """LION output ``[B, Lp, H, V]`` in v.dtype from the fused kernel (normalised or not);
    m None, or (normalised) ``[B, H, V]``: the output of the values ``v + m`` (v centred, see
    :func:`centred_values`)."""
    out = bidirectional_scan(q, k, v, g, offset=m, normalize=normalize, eps=eps,
                             **_fused_cfg(cfg))
    return out[0] if normalize else out


def _lion_fwd(q, k, v, g, m, cfg, normalize, eps):
    keep = (lion_backward_supported(q.shape[-1], v.shape[-1], q.dtype, cfg["chunk"])
            and keep_states(q.shape[-1], v.shape[-1], cfg["chunk"]))
    # Normalised, the backward needs y to float32 precision (see _lion_bwd): 16-bit y comes
    # with its low part (y + low to ~16 bits), float32 y is exact.
    low = normalize and v.dtype != jnp.float32
    out = bidirectional_scan(q, k, v, g, offset=m, normalize=normalize, eps=eps,
                             return_states=keep, low_part=low, **_fused_cfg(cfg))
    out = list(out) if isinstance(out, tuple) else [out]
    y = out[0]
    y_res = (y, out[1] if low else None) if normalize else None
    den = out[1 + low] if normalize else None
    return y, (q, k, v, g, m, y_res, den, out[-1] if keep else None)


def _lion_bwd(cfg, normalize, eps, res, dy):
    """With ``y = num / (den + eps)``: ``dnum = dy / (den + eps)`` and
    ``dden = -(dy . y) / (den + eps) = -(dnum . y)``; since ``den = Bidir(q, k, 1)`` the pair
    enters the dq and dk scans as one more feature column (``[dnum | dden]`` against ``[v | 1]``).

    The weights' cotangent ``G_ij = dnum_i . (v_j - y_i)`` has zero mean under the attention
    weights, so dq and dk are sums that cancel: an error in dden that is not matched in dnum is
    amplified. The three scans therefore take dden as ``-(dnum . y)`` from dnum as they see it
    (rounded to the input dtype) and y to float32 precision, 16-bit y plus its low part; the
    fused backward (``lion_backward``) takes dy, y and den and scales rows in its kernels."""
    q, k, v, g, m, y_res, den, kv_states = res
    scan = functools.partial(bidirectional_scan, **_fused_cfg(cfg))
    dy = dy.astype(v.dtype)
    y, low = y_res if normalize else (None, None)
    dm = None if m is None else jnp.zeros_like(m)
    if lion_backward_supported(q.shape[-1], v.shape[-1], q.dtype, cfg["chunk"]):
        dq, dk, dv, dlog_decay = lion_backward(q, k, v, g, dy, kv_states, y=y, y_low=low,
                                               den=den, offset=m, normalize=normalize,
                                               eps=eps, chunk=cfg["chunk"],
                                               interpret=cfg["interpret"],
                                               backend=cfg["backend"], grads=GRADS_KERNEL)
        return dq, dk, dv, dlog_decay.astype(g.dtype), dm
    dnum, dq_in, v_in, pairs = dy, dy, v, (v, dy)
    if normalize:  # larger head dims: fused scans, [dnum | dden] against [v | 1]
        y = to_float32(y, low)
        if m is not None:
            y = y - m[:, None]
        dnum, dq_in, v_in, pairs = _normalised_cotangents(dy, y, den, eps, v)
        dq = _normalised_dq(q, k, v, g, cfg, dy, y, den, eps)
    else:
        dq = scan(dq_in, v_in, k, g, out_dtype=q.dtype)
    dk = scan(v_in, dq_in, q, g, out_dtype=k.dtype)
    dv = scan(k, q, dnum, g, out_dtype=v.dtype)
    dA = lion_pair_sums(q, k, *pairs, g, chunk=cfg["chunk"])
    return dq, dk, dv, dA.astype(g.dtype), dm


_lion.defvjp(_lion_fwd, _lion_bwd)


def _normalised_cotangents(dy, y, den, eps, v):
    """``(dnum, dq_in, v_in, pairs)`` of normalised LION for the scans of its backward pass, from
    dy ``[B, L, H, V]``, ``y - m`` to float32 precision (the output less the values' centre
    m, :func:`centred_values`; m = 0 uncentred), den ``[B, L, H]`` float32 and v (centred).

    ``dnum = dy / (den + eps)`` in v's dtype and ``dden = -(dnum . (y - m))`` from dnum as the
    scans see it (rounded by :func:`bidirectional.rounded_xla`: with a plain cast, XLA on an
    H100 took dden from the unrounded dnum, and bf16 dk was 0.82-1.1e-2 on the three
    ``test_half_precision_decays`` cases of this path, 2026-11-27; computing dden from the
    unrounded dnum in the interpreter gives the same 0.74-1.05e-2, against 2.6-3.1e-3), so that
    the weights' cotangent ``G_ij = dnum_i . v_j + dden_i`` keeps its zero mean under the
    weights (dq and dk are sums that cancel); ``dq_in = [dnum | dden]`` and ``v_in = [v | 1]``
    carry dden through the dq and dk scans as one more feature column, two for 16-bit v (dden in
    two 16-bit parts, ``bidirectional.two_parts_xla``, against two ones columns: bf16, L = 100,
    log-decay ~ U[-20, 0], dq's relative RMS error was 2.4e-2 with one part, docs/benchmarks.md,
    one H100, 2026-11-22).

    ``pairs = ([v | 1], [dnum | dden])`` in float32, dnum unrounded, for d log_decay's pair
    sums (float32 math; a sum of pair terms that cancel, so dnum's 16-bit rounding showed: bf16
    d log_decay up to 5.3e-3 on ``test_lion_offset_values``, V 144, seed 1932922269)."""
    exact = dy.astype(jnp.float32) / (den + eps)[..., None]
    dnum = rounded_xla(exact, v.dtype)  # not exact.astype(v.dtype) then back: see rounded_xla
    dden = -_dot_last(dnum, y)
    dnum = dnum.astype(v.dtype)
    parts = (dden,) if v.dtype == jnp.float32 else two_parts_xla(dden, v.dtype)
    dq_in = jnp.concatenate([dnum] + [p[..., None].astype(v.dtype) for p in parts], axis=-1)
    ones = jnp.ones(v.shape[:3] + (len(parts),), v.dtype)
    pairs = (jnp.concatenate([v.astype(jnp.float32), ones[..., :1].astype(jnp.float32)], -1),
             jnp.concatenate([exact, -_dot_last(exact, y)[..., None]], axis=-1))
    return dnum, dq_in, jnp.concatenate([v, ones], axis=-1), pairs


def _float32_cfg(cfg):
    """``cfg`` for scans of float32 operands: Mosaic GPU walks take 16-bit ones only."""
    return dict(cfg, backend=None) if cfg.get("backend") == "mosaic" else cfg


def _normalised_dq(q, k, v, g, cfg, dy, y, den, eps):
    """dq ``[B, Lp, H, K]`` in q.dtype of normalised LION for the scan backwards, by float32
    scans: ``dq_i = sum_j M_ij k_j (dnum_i . v_j + dden_i) = Bidir(dnum, v, k)_i
    + dden_i Bidir(1, 1, k)_i`` (dnum, dden as in :func:`_normalised_cotangents`, unrounded;
    y less the values' centre, to float32 precision).

    The two terms cancel (the weights' cotangent has zero mean under the weights), so 16-bit
    operands, whose rounding the terms do not share, set dq's error: bf16, L = 100, log-decay
    ~ U[-20, 0], dq was up to 7.7e-3 (sequential) and 5.5e-3 (V > 128) with the weights'
    cotangent and the states rounded to bf16; float32 scans take it to ~1e-6 (2026-11-24 H100,
    docs/benchmarks.md). These paths are for head dims above the fused kernels' and
    ``algorithm="sequential"``, not for speed; float32 operands take the Triton walks."""
    f32 = jnp.float32
    dnum = dy.astype(f32) / (den + eps)[..., None]
    dden = -jnp.sum(dnum * y, axis=-1)
    k32, ones = k.astype(f32), jnp.ones(k.shape[:3] + (1,), f32)
    cfg = _float32_cfg(cfg)
    dq = (sum(_bidir_scans(dnum, v.astype(f32), k32, g, cfg))
          + dden[..., None] * sum(_bidir_scans(ones, ones, k32, g, cfg)))
    return dq.astype(q.dtype)


def _dot_last(a, b):
    return jnp.sum(a.astype(jnp.float32) * b.astype(jnp.float32), axis=-1)


# -------------------------------------------------------------------------- public API


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def unsupported_reason(q, k, v, log_decay=None, *, chunk_size=64, bidirectional=False,
                       normalize=True, algorithm=None, backend=None):
    """Why the kernels cannot take these inputs, or None when they can.

    ``log_decay`` may be ``[B, L, H]`` or, for the causal op (``bidirectional=False``), per
    feature ``[B, L, H, K]``; ``algorithm`` must be None or one of :data:`ALGORITHMS`;
    ``backend`` None, ``"triton"`` or ``"mosaic"`` (whose states walks take only some inputs,
    checked for the backward pass too; ``normalize``: LION's, which changes its walks).

    The message names the argument and the expected shape or range; the public functions raise
    it as a ValueError, and ``lion_jax.ops`` (impl="auto") uses it to pick another form.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim != 4:
            return f"{name} must be [B, L, H, D]; got shape {x.shape}"
        if x.dtype not in _FLOATS:
            return f"{name} must be float32, bfloat16 or float16; got {x.dtype}"
        if not 1 <= x.shape[-1] <= 256:
            return f"{name} head dim must be in [1, 256]; got {x.shape[-1]}"
    if k.shape != q.shape:
        return f"k must have q's shape {q.shape}; got {k.shape}"
    if v.shape[:3] != q.shape[:3]:
        return f"v must be [B, L, H, V] = {q.shape[:3]} + (V,); got {v.shape}"
    if q.shape[1] < 1:
        return f"q must have at least one token; got shape {q.shape}"
    if log_decay is not None:
        if bidirectional and log_decay.shape != q.shape[:3]:
            return (f"log_decay must be [B, L, H] = {q.shape[:3]} (per token and head; "
                    f"per-feature decay is causal only) or None; got {log_decay.shape}")
        if log_decay.shape not in (q.shape[:3], q.shape):
            return (f"log_decay must be [B, L, H] = {q.shape[:3]}, [B, L, H, K] = {q.shape} "
                    f"(per feature) or None; got {log_decay.shape}")
        if not jnp.issubdtype(log_decay.dtype, jnp.floating):
            return f"log_decay must be a float array; got {log_decay.dtype}"
    if chunk_size < 16 or chunk_size & (chunk_size - 1):
        return f"chunk_size must be a power of two >= 16; got {chunk_size}"
    if algorithm is not None and algorithm not in ALGORITHMS:
        return f"algorithm must be None or one of {ALGORITHMS}; got {algorithm!r}"
    if backend is not None and backend not in BACKENDS:
        return f"backend must be None or one of {BACKENDS}; got {backend!r}"
    if backend == "mosaic":
        return _mosaic_reason(q, v, log_decay, chunk_size, algorithm, bidirectional, normalize)
    return None


def _mosaic_reason(q, v, log_decay, chunk_size, algorithm, bidirectional, normalize):
    """Why ``backend="mosaic"`` cannot run: its states walks need the two-pass algorithm, decay
    per token (or none) and inputs the Mosaic walk takes (``mosaic_states.supported``), checked
    for every walk of the forward and backward passes at the chunk its kernel runs with
    (``two_pass.fitted_chunk``): keys and values of head dims (K, V), (V, K) (the backward's
    scans with v or dy as keys) and, for normalised LION above the fused backward's head dims,
    ``[v | 1 | 1]`` keys (V + 2) against q."""
    if algorithm == "sequential" or (log_decay is not None and log_decay.ndim == 4):
        return ("backend='mosaic' runs the two-pass algorithm with decay per token (or none); "
                "use backend=None or 'triton' for algorithm='sequential' or per-feature decay")
    B, L, H, K = q.shape
    V = v.shape[-1]
    chunk = _chunk(chunk_size, L)
    Lp = -(-L // chunk) * chunk
    dtype = jnp.result_type(q, v)
    walks = {(K, V): "", (V, K): " (the backward's scans with v as keys)"}
    if bidirectional and normalize and not lion_backward_supported(K, V, dtype, chunk):
        walks[(V + 2, K)] = " (the backward's scans with [v | 1 | 1] as keys)"
    for (k_dim, v_dim), which in walks.items():
        kp, vp = _next_pow2(max(k_dim, 16)), _next_pow2(max(v_dim, 16))
        # the kernels' fit: 4 bytes per state entry (one float32 state, or LION's two 16-bit
        # ones; past the dtype check above, Mosaic walks are 16-bit)
        fitted, _ = fit_layout(chunk, kp, min(output_block_v(k_dim, v_dim, dtype), vp),
                               jnp.dtype(dtype).itemsize, 4)
        keys = jax.ShapeDtypeStruct((1, Lp, 1, kp), dtype)
        values = jax.ShapeDtypeStruct((1, Lp, 1, vp), dtype)
        if (reason := mosaic_walk_reason(keys, values, fitted, min(WALK_BLOCK_V, vp))) is not None:
            return f"backend='mosaic'{which}: {reason}; use backend=None or 'triton' here"
    return None


def _check_inputs(q, k, v, log_decay, chunk_size, **kwargs):
    """Raises ValueError naming the argument for unsupported shapes, dtypes or sizes."""
    reason = unsupported_reason(q, k, v, log_decay, chunk_size=chunk_size, **kwargs)
    if reason is not None:
        raise ValueError(f"pallas_kernels: {reason}")


def _chunk(chunk_size, L):
    """The chunk the kernels use: ``chunk_size``, smaller for short sequences."""
    return min(chunk_size, max(16, _next_pow2(L)))


def _prepare(q, k, v, log_decay, chunk_size, interpret, algorithm=None, backend=None):
    """Common dtype, zero padding of L to a multiple of the chunk and of head dims below
    :data:`MIN_HEAD_DIM` to it (callers slice ``[:, :L, :, :V]``), and the static kernel
    config."""
    L = q.shape[1]
    chunk = _chunk(chunk_size, L)
    pad = -L % chunk
    pad_k, pad_v = _head_pad(q), _head_pad(v)
    dtype = jnp.result_type(q, k, v)
    if log_decay is None:
        log_decay = jnp.zeros(q.shape[:3], jnp.float32)
    qk_widths = ((0, 0), (0, pad), (0, 0), (0, pad_k))
    q, k = (jnp.pad(x.astype(dtype), qk_widths) for x in (q, k))
    v = jnp.pad(v.astype(dtype), ((0, 0), (0, pad), (0, 0), (0, pad_v)))
    g = jnp.pad(log_decay.astype(jnp.float32), qk_widths[:log_decay.ndim])
    if interpret is None:
        interpret = jax.default_backend() == "cpu"
    if backend == "mosaic" and not interpret and not hopper():
        raise ValueError("pallas_kernels: backend='mosaic' needs an NVIDIA GPU of compute "
                         "capability >= 9.0 (Hopper) or interpret=True; use backend=None or "
                         f"'triton' on {jax.devices()[0].device_kind}")
    cfg = dict(chunk=chunk, block_v=PER_FEATURE_BLOCK_V if log_decay.ndim == 4 else 64,
               interpret=bool(interpret))
    if log_decay.ndim == 3:  # per-feature decay has only the chunk-parallel form
        cfg["algorithm"] = algorithm or DEFAULT_ALGORITHM
        if cfg["algorithm"] == "two_pass":
            cfg["backend"] = backend
            cfg["block_v"] = None  # the two-pass kernels' own default (output_block_v)
    return q, k, v, g, cfg


def _head_pad(x):
    """Zero columns that bring ``x``'s head dim up to :data:`MIN_HEAD_DIM`."""
    return max(0, MIN_HEAD_DIM - x.shape[-1])


def causal_linear_attention(q, k, v, log_decay=None, *, chunk_size=64, initial_state=None,
                            return_final_state=False, interpret=None, algorithm=None,
                            backend=None):
    """Causal chunked linear attention with per-token or per-feature decay (Pallas kernels).

    ``y_i = sum_{j<=i} q_i^T diag(exp(A_i - A_j)) k_j v_j^T + q_i^T diag(exp(A_i)) S0`` with
    ``A = cumsum(log_decay)`` over L (a scalar per token and head, or per key feature).

    Args:
      q, k: ``[B, L, H, K]``; v: ``[B, L, H, V]``; float32, bfloat16 or float16, head dims in
        [1, 256] (below 16 zero-padded internally, exactly); any L >= 1 (padded internally
        to a multiple of the chunk).
      log_decay: None (no decay), ``[B, L, H]`` or ``[B, L, H, K]``, entries ``<= 0``
        (float32 math).
      chunk_size: tokens per chunk, a power of two >= 16 (smaller for short L).
      initial_state: None or ``[B, H, K, V]`` (float32), the state before the first token.
      return_final_state: also return the state after token L.
      interpret: run the Pallas interpreter; None means "when the default backend is CPU".
      algorithm: "sequential", "two_pass" or None (``DEFAULT_ALGORITHM``, the faster one as
        measured); per-feature decay always runs chunk-parallel.
      backend: the states walks' kernels: None (Mosaic GPU on a Hopper GPU where its walk
        takes the inputs, else Triton), "triton" (Pallas lowered through Triton: Ampere,
        Hopper, the interpreter on CPU) or "mosaic" (Pallas Mosaic GPU walks: Hopper, 16-bit
        inputs, head dims above 32, chunks of 64..256; a ValueError says why otherwise). The
        other kernels are Triton-lowered either way.
    Returns:
      ``y [B, L, H, V]`` in v.dtype, or ``(y, final_state [B, H, K, V] float32)``.
    """
    _check_inputs(q, k, v, log_decay, chunk_size, algorithm=algorithm, backend=backend)
    B, L, H, K = q.shape
    V = v.shape[-1]
    if initial_state is not None and initial_state.shape != (B, H, K, V):
        raise ValueError(f"initial_state must be [B, H, K, V] = {(B, H, K, V)}; "
                         f"got {initial_state.shape}")
    out_dtype = v.dtype
    pad_k, pad_v = _head_pad(q), _head_pad(v)
    q, k, v, g, cfg = _prepare(q, k, v, log_decay, chunk_size, interpret, algorithm, backend)
    s0 = None if initial_state is None else jnp.pad(
        initial_state.astype(jnp.float32), ((0, 0), (0, 0), (0, pad_k), (0, pad_v)))
    y, state = _causal(q, k, v, g, s0, cfg)
    y = y[:, :L, :, :V].astype(out_dtype)
    return (y, state[:, :, :K, :V]) if return_final_state else y


def bidirectional_linear_attention(q, k, v, log_decay=None, *, normalize=True, eps=1e-6,
                                   chunk_size=64, interpret=None, algorithm=None, backend=None,
                                   centre_values=False):
    """LION bidirectional chunked linear attention (Pallas kernel).

    ``M_ij = exp(-|A_i - A_j|)``, ``s_ij = q_i . k_j``; with ``normalize`` the output is
    ``y_i = sum_j s_ij M_ij v_j / (sum_j s_ij M_ij + eps)``, else only the numerator.

    Args:
      q, k: ``[B, L, H, K]``; v: ``[B, L, H, V]``; float32, bfloat16 or float16, head dims in
        [1, 256] (below 16 zero-padded internally, exactly); any L >= 1.
      log_decay: None (no decay) or ``[B, L, H]``, entries ``<= 0``.
      normalize: divide by the masked row sums (LION's scaling).
      eps: added to the denominator.
      chunk_size: tokens per chunk, a power of two >= 16.
      interpret: run the Pallas interpreter; None means "when the default backend is CPU".
      algorithm: "sequential", "two_pass" or None (``DEFAULT_ALGORITHM``, the faster one as
        measured).
      backend: the states walks' kernels: None (Mosaic GPU on a Hopper GPU where its walk
        takes the inputs, else Triton), "triton" (Pallas lowered through Triton: Ampere,
        Hopper, the interpreter on CPU) or "mosaic" (Pallas Mosaic GPU walks: Hopper, 16-bit
        inputs, head dims above 32, chunks of 64..256; a ValueError says why otherwise). The
        other kernels are Triton-lowered either way.
      centre_values: normalize only: run the kernels on ``v - m`` (m: v's mean over L, see
        :func:`centred_values`) and add m back in the output. Exact either way; with 16-bit
        inputs and values far from zero mean it keeps the gradients' precision (H200, bf16,
        no decay, v = |N(0, 1)| + 2: dq's relative RMS error 2.5e-1 -> 2.8e-3 at L = 1K,
        5.2e-1 -> 3.3e-3 at 4K; uncentred it grows with L), at the cost of two XLA passes over
        v (B4 H16 L = 32K, D = 128: 0.52 ms, 5 % of forward + backward; docs/kernels.md).
    Returns:
      ``y [B, L, H, V]`` in v.dtype.
    """
    _check_inputs(q, k, v, log_decay, chunk_size, bidirectional=True, normalize=normalize,
                  algorithm=algorithm, backend=backend)
    if centre_values and not normalize:
        raise ValueError("pallas_kernels: centre_values=True needs normalize=True (without "
                         "the normaliser the output is linear in v and nothing cancels)")
    L, V = q.shape[1], v.shape[-1]
    out_dtype = v.dtype
    m = None
    if centre_values:
        v, m = centred_values(v.astype(jnp.result_type(q, k, v)))
        m = jnp.pad(m, ((0, 0), (0, 0), (0, _head_pad(v))))
    q, k, v, g, cfg = _prepare(q, k, v, log_decay, chunk_size, interpret, algorithm, backend)
    if cfg["algorithm"] == "two_pass":
        y = _lion(q, k, v, g, m, cfg, normalize, float(eps))
    elif normalize:
        y = _bidir_normalised(q, k, v, g, m, cfg, float(eps))
    else:
        y = _bidir(q, k, v, g, cfg)
    return y[:, :L, :, :V].astype(out_dtype)


def centred_values(v):
    """``(v - m, m)``: v ``[B, L, H, V]`` less ``m [B, H, V]`` float32, its mean over L rounded
    to a multiple of the unit in the last place (in v's dtype) of ``max |v|`` over L, so that
    ``v - m`` is exact in v's dtype but where it moves up a binade. m is a constant to autodiff
    (``stop_gradient``; the normalised output does not depend on it).

    Normalised LION's output is a weighted average of the values, ``y = (num_c + den m) /
    (den + eps)`` with ``num_c`` the numerator of ``v - m``, and its weights' cotangent
    ``G_ij = r_i dy_i . (v_j - y_i) = r_i (dy_i . (v_j - m) - dy_i . (y_i - m))`` has zero mean
    under the weights: dq and dk are sums that cancel. The kernels keep the states
    ``sum_j k_j v_j^T`` in the input dtype; with values far from zero mean those grow with L
    through the mean, and their 16-bit rounding enters the cancelling sums. Centred values
    keep the states and both terms of G small (bf16, no decay, v = |N(0, 1)|, H100: dq's
    relative RMS error was 1.5e-2 / 7.6e-2 / 1.6e-1 at L = 100 / 1K / 4K uncentred,
    docs/benchmarks.md, 2026-11-22 H100). m on that grid matters: ``v - mean`` rounded to bf16 errs
    by nearly the same amount for every token of a binade, an error the weighted average does
    not shrink (bf16 N(0, 1) values, L = 100: y's relative RMS error 1.7e-3 -> 5.7e-3)."""
    v32 = v.astype(jnp.float32)
    _, exponent = jnp.frexp(jnp.max(jnp.abs(v32), axis=1))  # max |v| = f 2^e, f in [0.5, 1)
    ulp = jnp.ldexp(jnp.float32(1), exponent - 1 - jnp.finfo(v.dtype).nmant)
    m = jax.lax.stop_gradient(jnp.round(jnp.mean(v32, axis=1) / ulp) * ulp)
    return (v32 - m[:, None]).astype(v.dtype), m
