"""LION attention for short sequences (L <= 256) as flash-attention-style Triton kernels.

    y_i = sum_j P_ij v_j / (sum_j P_ij + eps),   P_ij = (q_i . k_j) M_ij,
    M_ij = exp(-|A_i - A_j|),   A = cumsum(log_decay) over L (float32),

(without the division when not normalised; ``log_decay`` None: ``M = 1``). Shapes as
ARCHITECTURE.md section 3: ``q, k [B, L, H, K]``, ``v [B, L, H, V]``, ``log_decay [B, L, H]``
(one decay per token and head; a decay per feature is not taken), ``y [B, L, H, V]`` in
v.dtype; L <= ``MAX_LEN``, K, V <= ``MAX_DIM``.

Why: at ViT's 197 tokens or BERT's 128 the masked ``L x L`` product of one head is a few
tiles, so it is cheapest computed the way flash attention computes softmax attention: block
by block in registers, never written to memory, in one forward launch and two backward
launches. The chunked kernels (``bidirectional.py``) take several launches and store
per-chunk states in both directions, which at these lengths costs more than the product.

Forward (:func:`_forward_kernel`): one program per (b, h, block of ``block`` = 64 query rows;
fewer for L < 64), on a 1-D grid of ``B * H * ceil(L / block)`` programs with the blocks of
one (b, h) adjacent (they read the same keys and values, as in flash attention's grid order).
Each walks the key blocks in a static loop (at most ``MAX_LEN / block`` steps; the last only
as wide as the tokens left, rounded up to a power of two >= 16: at L = 197, 3 x 64 + 16).
Per step: ``S = Q K^T``, ``P = S * M`` (the mask from the two blocks' A), ``num += P V``,
``den += rowsum(P)``, accumulated in float32. Writes y and, normalising, ``den [B, L, H]``
float32.

Residuals: q, k, v, A (float32 ``[B, L, H]``, one or two arrays, :func:`_cumulative`; JAX's
cumsum VJP turns the kernels' dA into d log_decay), and when normalising y, den and (16-bit
inputs, ``two_parts``) y's low part. P is recomputed in the backward.

Backward, for the output cotangent dy: ``dnum_i = r_i dy_i``, ``dden_i = -r_i delta_i``,
``r_i = 1 / (den_i + eps)``, ``delta_i = dy_i . y_i`` (normalize; else ``dnum = dy``,
``dden = 0``), ``dP_ij = dnum_i . v_j + dden_i``, ``dS = dP * M``, ``G = dP * P``:

    dq_i = sum_j dS_ij k_j,   dk_j = sum_i dS_ij q_i,   dv_j = sum_i P_ij dnum_i,
    dA_t = sum_j sign(t - j) G_tj + sum_i sign(t - i) G_it

(the derivative of ``-|A_i - A_j|`` with the sign from the token order, as
``lion_jax.ops.masks.bidirectional_mask``; d log_decay is dA's reverse cumsum over L). Two
launches on the same grid: :func:`_dq_kernel`, one program per (b, h, query block) walking
the key blocks (dq and the row part of dA; normalising, it first takes ``delta`` from its dy
and y rows and writes ``dden [B, L, H]`` float32 for the second launch), then
:func:`_dkv_kernel`, one program per (b, h, key block) walking the query blocks (dk, dv and the
column part of dA). r is folded into the float32 tiles (``dP = (dy V^T) r + dden``,
``dv = (P r)^T dy``), so no XLA pass writes dnum or delta.

The token order's mask off the diagonal (:func:`_separable_mask`, :func:`_off_diagonal_da`):
A does not increase along the tokens, so for a row block and a column block that do not
overlap, with a token ``b`` between them, ``M_ij = exp(-|A_i - A_b|) exp(-|A_b - A_j|)``: a row
factor times a column factor, both in [0, 1], two exponentials per row and column where the
tile takes one per pair. Only the program's own (diagonal) block takes the tile, by a
``lax.cond`` on the step. There ``sign(t - j)`` is also one sign for the whole step, and
``sum_j G_tj = q_t . (sum_j dS_tj k_j)``: the row part of dA is the program's q times dq's
step (the column part k times dk's step), one reduction over the head dim, so the dq kernel
needs S only on the diagonal block. That step carries dS's rounding to 16 bits into dA, so
with ``two_parts`` the dk step too takes dS in two parts (d log_decay's bf16 error at ViT-T's
head shape, 10 seeds: 3.1e-6 to 4.4e-6, against 1.4e-3 to 4.1e-3 with dk's step in one part;
docs/benchmarks.md, "lion_dense's d log_decay in bf16").

No copies of the inputs: each program's refs span the whole (padded) sequence of one (b, h)
in the ``[B, L, H, D]`` layout (rows of D contiguous elements, H * D apart), and tiles past L
or past the head dim are masked on load (zeros, which add nothing) and on store. Matmuls take
16-bit inputs as they are, accumulating in float32; the float32 tiles P and dS are rounded to
the input dtype for the second matmul of each pair, as flash attention rounds its
probabilities. Float32 inputs take exact float32 matmuls (``precision=HIGHEST``, no TF32).

Normalised 16-bit gradients (``two_parts=True``, the default): dq and dk are sums that cancel
(dP has zero mean under each query's weights), so ``delta`` must match the weights to ~16 bits.
Under differentiation the forward then takes P in two 16-bit parts for ``P V``
(``bidirectional.two_parts``, one matmul more) and writes y's low part as a residual (so
``delta`` sees y to ~16 bits), and the dq launch takes dS in two parts (one matmul more).
Interpret mode, bf16, L = 100, K = V = 32, 5 seeds, worst relative RMS error of dq / dk against
float64 with log-decays -softplus(N(0, 1)): 5.6e-3 / 2.9e-3 in one part, 1.7e-3 / 2.5e-3 in two;
uniform in [-20, 0]: 2.4e-2 / 1.4e-2 in one part, 1.8e-3 / 2.5e-3 in two (the low part of y
alone left that dq at 2.3e-2, the forward's split alone at 1.4e-2). Calls that are not
differentiated take one part and write no low part.

Matmuls per (query block, key block) pair: forward 2 (3 split), dq 2 (3 split; with decay one
more, S, on the diagonal block, or on every block with orders), dk/dv 4 (5 split with decay in
the token order).

Several token orders (``orders``, LION-S v2, paper C.8): ``M = mean_p exp(-|A^p_i - A^p_j|)``,
``A^p`` the cumulative log-decays along order p read back in token order, so ``M_p`` is the
mask order p's cumsum builds (``lion_jax.ops.orders``), all in the same launches: S and the
matmuls once, one exponential per order and pair. The backward gives one dA^p per order,
``dA^p_t = sum_j sign_p(t, j) G^p_tj - sum_i sign_p(i, t) G^p_it`` with ``G^p = dS * S * M_p /
n`` and ``sign_p`` the sign of the two tokens' positions in order p (a table of positions per
order, static), and JAX's VJPs of the gathers and the cumsum take it to d log_decay. One
launch with both orders replaces two per order (numerator, and denominator on 16 ones
columns) of ``ops.lion_attention``'s generic per-order path. With several orders the dk/dv
launch runs on blocks of ``ORDERS_DKV_BLOCK`` rows (a finer grid over the same arrays), where
its extra mask tiles fit the registers.

``backend="mosaic"`` runs the same math in the Hopper wgmma kernels of ``mosaic_dense.py``
instead, and ``backend=None`` picks them where they won (:func:`default_backend`): on a Hopper
GPU, with a decay, at a length that is a multiple of 8. At L = 197 the copies that pad the
arrays to 200 rows for its TMA tiles eat the gain (docs/kernels.md), so ViTs pad their tokens
once instead (``VisionTransformer.token_multiple``).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.bidirectional import two_parts as _two_parts
from pallas_kernels.chunk_scan import _next_pow2
from pallas_kernels.mosaic_dense import dense_backward_mosaic, dense_forward_mosaic
from pallas_kernels.mosaic_dense import supported as mosaic_forward_reason
from pallas_kernels.two_pass import hopper

LOG2_E = float(np.log2(np.e))  # exp(x) = exp2(x log2(e)): :func:`_decay_masks`
MAX_LEN = 256
MAX_DIM = 128
# Rows of the programs' blocks and of the loops' steps (smaller for shorter sequences).
BLOCK = 64
# Rows of the dk/dv kernel's blocks with several orders: each order adds a mask tile and its dA
# sums to the loop, and at 64 rows the kernel took 0.94 ms per call, at 32 rows 0.25 (ViT-T's
# shape B = 256, L = 197, H = 3, K = V = 64, bf16, the row- and column-snake orders, 4 warps;
# one H100, 2026-11-26, `python -m experiments.profile_kernels --dense --dense_cases s_v2`).
# The forward and dq kernels stay at BLOCK there (0.13 and 0.20 ms at 64 rows, 0.19 and 0.32
# at 32). One order keeps BLOCK for all three (dk/dv 0.21 ms at 64 rows); its dk/dv time at 32
# rows was not isolated in that run, so whether 32 rows helps one order too is not known.
ORDERS_DKV_BLOCK = 32
NUM_WARPS = 4
NUM_STAGES = 2
_FLOATS = (jnp.float32, jnp.bfloat16, jnp.float16)


def unsupported_reason(q, k, v, log_decay):
    """Why :func:`lion_dense` cannot take these inputs (one line), or None when it can."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim != 4:
            return f"{name} must be [B, L, H, D]; got shape {x.shape}"
        if x.dtype not in _FLOATS:
            return f"{name} must be float32, bfloat16 or float16; got {x.dtype}"
    if k.shape != q.shape or v.shape[:3] != q.shape[:3]:
        return (f"q, k must be [B, L, H, K] and v [B, L, H, V] alike; got {q.shape}, "
                f"{k.shape}, {v.shape}")
    if not q.dtype == k.dtype == v.dtype:
        return f"q, k, v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}"
    if not 1 <= q.shape[1] <= MAX_LEN:
        return f"sequence length must be in [1, {MAX_LEN}]; got {q.shape[1]}"
    if not (1 <= q.shape[-1] <= MAX_DIM and 1 <= v.shape[-1] <= MAX_DIM):
        return f"head dims must be in [1, {MAX_DIM}]; got K={q.shape[-1]}, V={v.shape[-1]}"
    if log_decay is not None:
        if log_decay.shape != q.shape[:3]:
            return (f"log_decay must be None or [B, L, H] = {q.shape[:3]} (one decay per "
                    f"token and head); got {log_decay.shape}")
        if not jnp.issubdtype(log_decay.dtype, jnp.floating):
            return f"log_decay must be floating; got {log_decay.dtype}"
    return None


def _block(length, block):
    """Rows per block: ``block`` (None: ``BLOCK``), at most the length's power of two, at
    least 16 (Triton's smallest matmul)."""
    block = BLOCK if block is None else block
    if block < 16 or block & (block - 1):
        raise ValueError(f"lion_dense: block must be a power of two >= 16; got {block}")
    return max(16, min(block, _next_pow2(length)))


def _steps(length, block):
    """The static loops' steps ``(start, rows)``: the full blocks, then the tokens left in the
    narrowest power of two >= 16 that holds them (inside the last block)."""
    steps = [(s, block) for s in range(0, length - length % block, block)]
    if length % block:
        start = length - length % block
        steps.append((start, max(16, _next_pow2(length - start))))
    return steps


def _mask(start, rows, length, ref, width):
    """Rows ``< length`` (and columns ``< width`` of a 2-D ref) of a tile at ``start``."""
    ok = start + jnp.arange(rows) < length
    if ref.ndim == 1:
        return ok
    return ok[:, None] & (jnp.arange(ref.shape[-1])[None, :] < width)


def _in_bounds(start, rows, length, ref, width):
    """Whether a tile needs no mask: its rows inside L (static rows, or a program's block,
    whose dynamic start is a multiple of ``rows`` below L, when ``rows`` divides L) and all of
    a 2-D ref's columns used."""
    rows_in = (start + rows <= length if isinstance(start, int) else length % rows == 0)
    return rows_in and (ref.ndim == 1 or width == ref.shape[-1])


def _load(ref, start, rows, length, width=None):
    """Rows ``[start, start + rows)`` of a ``[Lp]`` or ``[Lp, Dp]`` block; zeros past
    ``length`` rows and ``width`` columns (masked: nothing is read there)."""
    idx = (pl.ds(start, rows),) + ((slice(None),) if ref.ndim == 2 else ())
    if _in_bounds(start, rows, length, ref, width):
        return ref[idx]
    return pltriton.load(ref.at[idx], mask=_mask(start, rows, length, ref, width), other=0)


def _store(ref, start, rows, length, value, width=None):
    """Stores ``value`` (cast to the ref's dtype) in rows ``[start, start + rows)``, masked as
    :func:`_load`."""
    idx = (pl.ds(start, rows),) + ((slice(None),) if ref.ndim == 2 else ())
    value = value.astype(ref.dtype)
    if _in_bounds(start, rows, length, ref, width):
        ref[idx] = value
    else:
        pltriton.store(ref.at[idx], value, mask=_mask(start, rows, length, ref, width))


def _load_a(a_refs, start, rows, length, orders):
    """Rows of A's arrays, one tuple per order: ``(A,)`` or ``(H, R)`` (:func:`_cumulative`)."""
    parts = [_load(ref, start, rows, length) for ref in a_refs]
    per = len(parts) // orders
    return [tuple(parts[o * per:(o + 1) * per]) for o in range(orders)]


def _decay_masks(a_rows, a_cols):
    """``[M_p]``, ``M_p = exp(-|A^p_i - A^p_j|)`` ``[R, C]`` in [0, 1] per order, from a row
    block and a column block of each order's A (:func:`_load_a`).

    As ``exp2(-|x| log2(e))``: Triton lowers float32 ``exp2`` to libdevice's ``exp2f``, which
    is shorter than its ``expf``; the product with log2(e) adds one float32 rounding (the
    kernel tests' tolerances hold). The three kernels' time at ViT-T's shape fell from 0.452
    to 0.426 ms per call (docs/benchmarks.md, "Where the train step's time goes")."""
    masks = []
    for rows, cols in zip(a_rows, a_cols):
        x = rows[0][:, None] - cols[0][None, :]
        if len(rows) == 2:
            x = x + (rows[1][:, None] - cols[1][None, :])
        masks.append(jnp.exp2(jnp.abs(x) * -LOG2_E))
    return masks


def _separable_mask(a_refs, a_rows, a_cols, row_start, col_start, length):
    """``M [R, C]`` of a row block and a column block that do not overlap, in token order (one
    order, no positions table), as the outer product of a row and a column factor in [0, 1]:
    with ``b = max(row_start, col_start)`` a token between the two blocks and ``s = +1`` when
    the rows come after the columns (``-1`` before),

        M_ij = exp(s (A_i - A_b)) exp(s (A_b - A_j)) = exp(-|A_i - A_j|),

    both exponents <= 0 since A does not increase along the tokens (so neither factor
    overflows; they are clamped at 0, which only rows and columns past L, loaded as A = 0,
    reach). Two exponentials per row and column instead of one per pair."""
    b = jnp.maximum(row_start, col_start)
    sign = (row_start > col_start).astype(jnp.float32) * 2.0 - 1.0
    a_b = [_load(ref, b, 1, length) for ref in a_refs]  # [1] each
    x_rows = sum(r - ab for r, ab in zip(a_rows[0], a_b))
    x_cols = sum(ab - c for c, ab in zip(a_cols[0], a_b))
    factor = lambda x: jnp.exp2(jnp.minimum(sign * x, 0.0) * LOG2_E)  # noqa: E731
    return factor(x_rows)[:, None] * factor(x_cols)[None, :]


def _token_order_mask(a_refs, a_rows, a_cols, row_start, col_start, length, block=None,
                      diagonal_da=None):
    """M of one step in token order: on the diagonal block (the program's own, ``row_start ==
    col_start``) the mask tile of :func:`_decay_masks`, elsewhere :func:`_separable_mask`.
    With ``diagonal_da``: ``(M, dA part [block])``, the part ``diagonal_da(M)`` on the
    diagonal block (the sign-weighted sums of G, whose sign changes inside the block) and
    zeros elsewhere (:func:`_off_diagonal_da` takes those)."""
    def diagonal():
        m = _decay_masks(a_rows, a_cols)[0]
        return m if diagonal_da is None else (m, diagonal_da(m))

    def off_diagonal():
        m = _separable_mask(a_refs, a_rows, a_cols, row_start, col_start, length)
        return m if diagonal_da is None else (m, jnp.zeros((block,), jnp.float32))
    return jax.lax.cond(row_start == col_start, diagonal, off_diagonal)


def _off_diagonal_da(start, s0, x, step):
    """The dA part of a step off the diagonal block, ``[block]``: there ``sign(t - j)`` is one
    sign for the whole step, ``sign(start - s0)``, and the sum of G over the step is the
    product of the program's rows with their gradient's step,

        sum_j G_tj = sum_j dS_tj (q_t . k_j) = q_t . (sum_j dS_tj k_j)

    (dq's step; the keys' column sums likewise ``k_t . `` dk's step), one reduction over the
    head dim instead of a tile of products. Zero on the diagonal block."""
    sign = (start > s0).astype(jnp.float32) - (start < s0).astype(jnp.float32)
    return sign * jnp.sum(x.astype(jnp.float32) * step, axis=1)


def _mean(masks):
    """The orders' mask: their mean (one order: itself)."""
    return masks[0] if len(masks) == 1 else sum(masks) * (1.0 / len(masks))


def _per_order(term, orders):
    """An order's share ``term / orders`` of the averaged mask's gradient (one order: as is)."""
    return term if orders == 1 else term * (1.0 / orders)


def _order_signs(row_start, rows, col_start, cols, positions=None):
    """``sign(pos(i) - pos(j))`` for the tokens ``i`` of a row block and ``j`` of a column
    block, ``[rows, cols]`` float32 (0 on the diagonal); ``positions``: None (the token order,
    ``pos(i) = i``) or ``(row positions, column positions)`` of one order."""
    if positions is None:
        i = row_start + jnp.arange(rows)[:, None]
        j = col_start + jnp.arange(cols)[None, :]
    else:
        i, j = positions[0][:, None], positions[1][None, :]
    return jnp.where(i > j, 1.0, jnp.where(i < j, -1.0, 0.0))


def _positions(pos_refs, start, rows, length):
    """Rows of each order's positions table (``[]`` for the token order)."""
    return [_load(ref, start, rows, length) for ref in pos_refs]


def _forward_kernel(q_ref, k_ref, v_ref, *refs, length, dims, block, decay, orders, tables,
                    separable, normalize, eps, precision, split, low):
    """One (b, h, query block). Refs: q, k ``[Lp, Kp]``; v ``[Lp, Vp]``; ``decay`` refs of A
    ``[Lp]`` (``orders`` groups); then y ``[Lp, Vp]``, den ``[Lp]`` (normalize), y's low part
    ``[Lp, Vp]`` (``low``). ``split``: P in two 16-bit parts for ``P V``. ``tables``: the
    number of positions tables (the backward's). ``separable``: the token order's mask, off
    the diagonal block :func:`_separable_mask` (``_Config.separable``)."""
    refs = list(refs)
    a_refs = [refs.pop(0) for _ in range(decay)]
    y_ref = refs.pop(0)
    den_ref = refs.pop(0) if normalize else None
    lo_ref = refs.pop(0) if low else None
    K, V = dims
    f32 = jnp.float32
    dtype = q_ref.dtype
    dot = functools.partial(pltriton.dot, precision=precision)
    start = pl.program_id(0) % -(-length // block) * block  # this program's block
    q = _load(q_ref, start, block, length, K)
    a_q = _load_a(a_refs, start, block, length, orders)
    num = jnp.zeros((block, v_ref.shape[-1]), f32)
    den = jnp.zeros((block,), f32)
    for s0, n in _steps(length, block):
        k = _load(k_ref, s0, n, length, K)
        v = _load(v_ref, s0, n, length, V)
        p = dot(q, k, trans_b=True)
        if decay:
            a_k = _load_a(a_refs, s0, n, length, orders)
            if separable:
                m = _token_order_mask(a_refs, a_q, a_k, start, s0, length)
            else:
                m = _mean(_decay_masks(a_q, a_k))
            p = p * m
        if split:
            num = num + sum(dot(part, v) for part in _two_parts(p, dtype))
        else:
            num = num + dot(p.astype(dtype), v)
        if normalize:
            den = den + jnp.sum(p, axis=1)
    if normalize:
        num = num / (den + eps)[:, None]
        _store(den_ref, start, block, length, den)
    if low:
        hi, lo = _two_parts(num, dtype)
        _store(y_ref, start, block, length, hi, V)
        _store(lo_ref, start, block, length, lo, V)
    else:
        _store(y_ref, start, block, length, num, V)


def _dq_kernel(q_ref, k_ref, v_ref, dy_ref, *refs, length, dims, block, decay, orders,
               tables, separable, normalize, eps, precision, split):
    """One (b, h, query block). Refs: q, k ``[Lp, Kp]``; v, dy ``[Lp, Vp]``; ``decay`` refs of
    A ``[Lp]`` (``orders`` groups), ``tables`` positions tables ``[Lp]`` (one per order when
    the orders are given, none for the token order); y ``[Lp, Vp]``, den ``[Lp]``
    (normalize), y's low part (``split``); then dq ``[Lp, Kp]``, dden ``[Lp]`` (normalize),
    the row part of each order's dA ``[Lp]`` (decay)."""
    refs = list(refs)
    a_refs = [refs.pop(0) for _ in range(decay)]
    pos_refs = [refs.pop(0) for _ in range(tables)]
    y_ref, den_ref = (refs.pop(0), refs.pop(0)) if normalize else (None, None)
    lo_ref = refs.pop(0) if split else None
    dq_ref = refs.pop(0)
    dden_ref = refs.pop(0) if normalize else None
    da_refs = [refs.pop(0) for _ in range(orders if decay else 0)]
    K, V = dims
    f32 = jnp.float32
    dtype = q_ref.dtype
    dot = functools.partial(pltriton.dot, precision=precision)
    start = pl.program_id(0) % -(-length // block) * block  # this program's block
    q = _load(q_ref, start, block, length, K)
    dy = _load(dy_ref, start, block, length, V)
    a_q = _load_a(a_refs, start, block, length, orders)
    pos_q = _positions(pos_refs, start, block, length)
    if normalize:
        r = 1.0 / (_load(den_ref, start, block, length) + eps)
        y = _load(y_ref, start, block, length, V).astype(f32)
        if split:
            y = y + _load(lo_ref, start, block, length, V).astype(f32)
        dden = -r * jnp.sum(dy.astype(f32) * y, axis=1)
        _store(dden_ref, start, block, length, dden)
    dq = jnp.zeros((block, q_ref.shape[-1]), f32)
    das = [jnp.zeros((block,), f32) for _ in da_refs]
    for s0, n in _steps(length, block):
        k = _load(k_ref, s0, n, length, K)
        ds = dot(dy, _load(v_ref, s0, n, length, V), trans_b=True)  # dP, then dS
        if normalize:
            ds = ds * r[:, None] + dden[:, None]
        if separable:
            m, da_diagonal = _token_order_mask(
                a_refs, a_q, _load_a(a_refs, s0, n, length, orders), start, s0, length, block,
                diagonal_da=lambda m: jnp.sum(_order_signs(start, block, s0, n)
                                  * (ds * dot(q, k, trans_b=True) * m), axis=1))
            ds = ds * m
        elif decay:
            masks = _decay_masks(a_q, _load_a(a_refs, s0, n, length, orders))
            g = ds * dot(q, k, trans_b=True)  # G^p = dP * S * M_p / orders
            pos_k = _positions(pos_refs, s0, n, length)
            for o, m in enumerate(masks):
                signs = _order_signs(start, block, s0, n,
                                     (pos_q[o], pos_k[o]) if pos_refs else None)
                das[o] = das[o] + _per_order(jnp.sum(signs * (g * m), axis=1), orders)
            ds = ds * _mean(masks)
        if split:
            step = sum(dot(part, k) for part in _two_parts(ds, dtype))
        else:
            step = dot(ds.astype(dtype), k)
        dq = dq + step
        if separable:
            das[0] = das[0] + da_diagonal + _off_diagonal_da(start, s0, q, step)
    _store(dq_ref, start, block, length, dq, K)
    for da_ref, da in zip(da_refs, das):
        _store(da_ref, start, block, length, da)


def _dkv_kernel(q_ref, k_ref, v_ref, dy_ref, *refs, length, dims, block, decay, orders,
                tables, separable, normalize, eps, precision, split):
    """One (b, h, key block). Refs: q, k ``[Lp, Kp]``; v, dy ``[Lp, Vp]``; ``decay`` refs of A
    ``[Lp]`` and the positions tables, as :func:`_dq_kernel`; den, dden ``[Lp]`` (normalize);
    then dk ``[Lp, Kp]``, dv ``[Lp, Vp]``, the column part of each order's dA ``[Lp]``
    (decay). ``split``: in the token order with decay, dk's step takes dS in two 16-bit parts
    (it also gives dA off the diagonal block, :func:`_off_diagonal_da`)."""
    refs = list(refs)
    a_refs = [refs.pop(0) for _ in range(decay)]
    pos_refs = [refs.pop(0) for _ in range(tables)]
    den_ref, dden_ref = (refs.pop(0), refs.pop(0)) if normalize else (None, None)
    dk_ref, dv_ref = refs.pop(0), refs.pop(0)
    da_refs = [refs.pop(0) for _ in range(orders if decay else 0)]
    K, V = dims
    f32 = jnp.float32
    dtype = q_ref.dtype
    dot = functools.partial(pltriton.dot, precision=precision)
    start = pl.program_id(0) % -(-length // block) * block  # this program's block
    k = _load(k_ref, start, block, length, K)
    v = _load(v_ref, start, block, length, V)
    a_k = _load_a(a_refs, start, block, length, orders)
    pos_k = _positions(pos_refs, start, block, length)
    dk = jnp.zeros((block, k_ref.shape[-1]), f32)
    dv = jnp.zeros((block, v_ref.shape[-1]), f32)
    das = [jnp.zeros((block,), f32) for _ in da_refs]
    for s0, n in _steps(length, block):
        q = _load(q_ref, s0, n, length, K)
        dy = _load(dy_ref, s0, n, length, V)
        p = dot(q, k, trans_b=True)  # [n, block]: queries down, keys across
        ds = dot(dy, v, trans_b=True)  # dP, then dS
        if normalize:
            r = (1.0 / (_load(den_ref, s0, n, length) + eps))[:, None]
            ds = ds * r + _load(dden_ref, s0, n, length)[:, None]
        if separable:
            m, da_diagonal = _token_order_mask(
                a_refs, _load_a(a_refs, s0, n, length, orders), a_k, s0, start, length, block,
                diagonal_da=lambda m: -jnp.sum(_order_signs(s0, n, start, block) * (ds * p * m),
                                               axis=0))
            ds = ds * m
            p = p * m
        elif decay:
            masks = _decay_masks(_load_a(a_refs, s0, n, length, orders), a_k)
            g = ds * p  # G^p = dP * S * M_p / orders
            pos_q = _positions(pos_refs, s0, n, length)
            for o, m in enumerate(masks):
                signs = _order_signs(s0, n, start, block,
                                     (pos_q[o], pos_k[o]) if pos_refs else None)
                das[o] = das[o] - _per_order(jnp.sum(signs * (g * m), axis=0), orders)
            m = _mean(masks)
            ds = ds * m
            p = p * m
        dv = dv + dot((p * r if normalize else p).astype(dtype), dy, trans_a=True)
        if split and separable:
            step = sum(dot(part, q, trans_a=True) for part in _two_parts(ds, dtype))
        else:
            step = dot(ds.astype(dtype), q, trans_a=True)
        dk = dk + step
        if separable:
            das[0] = das[0] + da_diagonal + _off_diagonal_da(start, s0, k, step)
    _store(dk_ref, start, block, length, dk, K)
    _store(dv_ref, start, block, length, dv, V)
    for da_ref, da in zip(da_refs, das):
        _store(da_ref, start, block, length, da)


@dataclasses.dataclass(frozen=True)
class _Config:
    """The static layout of one call (hashable: custom_vjp's non-differentiable argument)."""
    B: int
    L: int
    H: int
    dims: tuple  # (K, V)
    block: int
    decay: int  # A's arrays: 0 (no decay), or 1 or 2 per order (see _cumulative)
    orders: int  # token orders whose masks are averaged (1: the token order or one given)
    positions: tuple  # per given order, each token's position in it; () for the token order
    normalize: bool
    eps: float
    f32: bool  # float32 inputs: exact float32 matmuls
    split: bool  # normalised 16-bit inputs with two_parts: see the module docstring
    interpret: bool
    mosaic: bool  # the forward and backward on Mosaic GPU (mosaic_dense.py)
    forward_warps: int
    backward_warps: int
    num_stages: int

    @property
    def separable(self):
        """Decay in the token order (one order, no positions table): off the diagonal block
        the kernels take :func:`_separable_mask` and :func:`_off_diagonal_da`."""
        return bool(self.decay) and self.orders == 1 and not self.positions

    @property
    def blocks(self):
        return -(-self.L // self.block)

    def call(self, kernel, name, args, in_specs, outs, warps, **kwargs):
        """One launch, one program per (b, h, block): a 1-D grid of ``B * H * blocks`` with the
        blocks of one (b, h) side by side (they read the same keys and values: as flash
        attention orders its grid, so those stay in L2); ``outs``: ``(shape, dtype, spec)``;
        ``warps``: its ``num_warps``."""
        kernel = functools.partial(
            kernel, length=self.L, dims=self.dims, block=self.block, decay=self.decay,
            orders=self.orders, tables=len(self.positions) if self.decay else 0,
            separable=self.separable,
            normalize=self.normalize, eps=self.eps,
            precision=jax.lax.Precision.HIGHEST if self.f32 else None, **kwargs)
        return pl.pallas_call(
            kernel, grid=(self.B * self.H * self.blocks,),
            in_specs=in_specs, out_specs=[spec for _, _, spec in outs],
            out_shape=[jax.ShapeDtypeStruct(shape, dtype) for shape, dtype, _ in outs],
            compiler_params=pltriton.CompilerParams(num_warps=warps,
                                                    num_stages=self.num_stages),
            interpret=self.interpret, name=name,
        )(*args)

    def specs(self):
        """Whole-sequence blocks of one (b, h) for ``[B, L, H, K]``, ``[B, L, H, V]`` and
        ``[B, L, H]`` arrays, ``(Lp, Kp)``, ``(Lp, Vp)`` and ``(Lp,)``: L up to a multiple of
        the block, head dims up to powers of two >= 16 (masked past the arrays)."""
        nb, H = self.blocks, self.H
        lp = nb * self.block
        kp, vp = (_next_pow2(max(d, 16)) for d in self.dims)
        qk = pl.BlockSpec((None, lp, None, kp), lambda p: (p // (H * nb), 0, p // nb % H, 0))
        vs = pl.BlockSpec((None, lp, None, vp), lambda p: (p // (H * nb), 0, p // nb % H, 0))
        row = pl.BlockSpec((None, lp, None), lambda p: (p // (H * nb), 0, p // nb % H))
        return qk, vs, row


def _forward(q, k, v, a, cfg, differentiated):
    """``(y, den or None, y's low part or None)``; ``a``: A's arrays (:func:`_cumulative`)."""
    split = cfg.split and differentiated
    if cfg.mosaic:
        return dense_forward_mosaic(
            q, k, v, a, normalize=cfg.normalize, eps=cfg.eps, split=split,
            interpret=plgpu.InterpretGPUParams() if cfg.interpret else None)
    qk, vs, row = cfg.specs()
    outs = [(v.shape, v.dtype, vs)]
    if cfg.normalize:
        outs.append((q.shape[:3], jnp.float32, row))
    if split:
        outs.append((v.shape, v.dtype, vs))
    res = list(cfg.call(_forward_kernel, "lion_dense_forward", [q, k, v, *a],
                        [qk, qk, vs] + [row] * len(a), outs, cfg.forward_warps, split=split,
                        low=split))
    return res[0], (res[1] if cfg.normalize else None), (res[-1] if split else None)


def _backward(q, k, v, a, y, den, y_low, dy, cfg):
    """``(dq, dk, dv, dA)``: dq, dk, dv in the inputs' dtype; dA a list of float32
    ``[B, L, H]``, one per order (empty without decay)."""
    if cfg.mosaic:
        return dense_backward_mosaic(
            q, k, v, a, y, den, y_low, dy, positions=cfg.positions, normalize=cfg.normalize,
            eps=cfg.eps, split=cfg.split,
            interpret=plgpu.InterpretGPUParams() if cfg.interpret else None)
    qk, vs, row = cfg.specs()
    decay, normalize = cfg.decay, cfg.normalize
    rows = (q.shape[:3], jnp.float32, row)
    tables = [jnp.broadcast_to(jnp.asarray(p, jnp.int32)[None, :, None], q.shape[:3])
              for p in (cfg.positions if decay else ())]
    ins = [q, k, v, dy, *a, *tables]
    in_specs = [qk, qk, vs, vs] + [row] * (len(a) + len(tables))
    das = cfg.orders if decay else 0
    extra, extra_specs = ([y, den], [vs, row]) if normalize else ([], [])
    if cfg.split:
        extra, extra_specs = extra + [y_low], extra_specs + [vs]
    res = list(cfg.call(
        _dq_kernel, "lion_dense_dq", ins + extra, in_specs + extra_specs,
        [(q.shape, q.dtype, qk)] + [rows] * (normalize + das), cfg.backward_warps,
        split=cfg.split))
    dq = res.pop(0)
    dden = res.pop(0) if normalize else None
    if cfg.orders > 1:  # the dk/dv kernel's own block (ORDERS_DKV_BLOCK); same arrays
        cfg = dataclasses.replace(cfg, block=min(cfg.block, ORDERS_DKV_BLOCK))
        qk, vs, row = cfg.specs()
        rows = (q.shape[:3], jnp.float32, row)
        in_specs = [qk, qk, vs, vs] + [row] * (len(a) + len(tables))
    extra, extra_specs = ([den, dden], [row, row]) if normalize else ([], [])
    dk, dv, *da = cfg.call(
        _dkv_kernel, "lion_dense_dkv", ins + extra, in_specs + extra_specs,
        [(k.shape, k.dtype, qk), (v.shape, v.dtype, vs)] + [rows] * das,
        cfg.backward_warps, split=cfg.split)
    return dq, dk, dv, [row_part + col_part for row_part, col_part in zip(res, da)]


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _dense(q, k, v, a, cfg):
    return _forward(q, k, v, a, cfg, differentiated=False)[0]


def _dense_fwd(q, k, v, a, cfg):
    y, den, y_low = _forward(q, k, v, a, cfg, differentiated=True)
    return y, (q, k, v, a, y if cfg.normalize else None, den, y_low)


def _dense_bwd(cfg, residuals, dy):
    q, k, v, a, y, den, y_low = residuals
    dq, dk, dv, da = _backward(q, k, v, a, y, den, y_low, dy.astype(v.dtype), cfg)
    per_order = len(a) // cfg.orders if a else 0  # A = H + R: the same cotangent for both
    return dq, dk, dv, tuple(d for d in da for _ in range(per_order))


_dense.defvjp(_dense_fwd, _dense_bwd)
# jitted with its static layout, so that a model's layers of one shape share one trace and
# one lowering of the kernels (pallas_kernels/__init__.py, "Lowered once")
_dense_once = jax.jit(_dense, static_argnums=(4,))


def _cumulative(log_decay, exact):
    """A = cumsum(log_decay) over L in float32, as a tuple of ``[B, L, H]`` arrays (``()``
    without decay): ``(A,)``, or with ``exact`` ``(H, R)``, ``A = H + R``: H the cumsum of
    the log-decays rounded to multiples of 2^-8 (exact in float32 while ``|A| < 2^16``), R the
    cumsum of what that rounding left (``|R| <= L 2^-9``). ``H_i - H_j`` is then exact and
    the kernels' exponents ``(H_i - H_j) + (R_i - R_j)`` are off by ~ulp(|A_i - A_j|), where
    ``A_i - A_j`` of one float32 A is off by ~ulp(|A|): float32, L = 197 at -20 per token,
    d log_decay's relative error was 6.7e-5 with one array, 4.0e-7 with two. 16-bit inputs
    take one array (its error is far below theirs)."""
    if log_decay is None:
        return ()
    a = log_decay.astype(jnp.float32)
    if not exact:
        return (jnp.cumsum(a, axis=1),)
    coarse = jax.lax.stop_gradient(jnp.round(a * 256.0) / 256.0)
    return jnp.cumsum(coarse, axis=1), jnp.cumsum(a - coarse, axis=1)


def _cumulative_in_orders(log_decay, exact, orders):
    """Each order's A (:func:`_cumulative` of the log-decays taken in that order), read back in
    token order: the arrays of all orders, concatenated in a tuple. The permutations are
    ``lion_jax.ops.orders.permute_tokens`` (a gather whose gradient is the inverse gather)."""
    from lion_jax.ops.orders import permute_tokens

    arrays = ()
    for order in orders:
        parts = _cumulative(permute_tokens(log_decay, order), exact)
        arrays += tuple(permute_tokens(part, np.argsort(order)) for part in parts)
    return arrays


def default_backend(q, k, v, log_decay=None, orders=None, interpret=False):
    """``lion_dense(backend=None)``'s kernels: ``"mosaic"`` when compiling for a Hopper GPU
    (not ``interpret``), with a decay, at a length that is a multiple of 8 (no padding copies)
    and inputs the Mosaic kernels take (``mosaic_dense.supported``); else ``"triton"``.

    Measured on one H200 (2026-12-02, ViT-T's train step at 224 px, batch 256, one process,
    docs/benchmarks.md "`lion_dense` on Mosaic GPU against Triton"): LION-S 18.57 ms with
    Mosaic at 200 tokens against 19.11 with Triton at 197; LION-S (v2) 19.90 against 21.12.
    Without a decay (LION-LIT) the Mosaic kernels were no faster (0.251 against 0.243 ms per
    layer, 2026-12-01), and at a length not a multiple of 8 their copies cost what they save.
    """
    if log_decay is None or interpret or q.shape[1] % 8 or not hopper():
        return "triton"
    n = 1 if orders is None else len(orders)
    return "mosaic" if mosaic_forward_reason(q, k, v, n) is None else "triton"


def lion_dense(q, k, v, log_decay=None, *, normalize=True, eps=1e-6, orders=None,
               interpret=None, block=None, two_parts=True, num_warps=None,
               backward_warps=None, num_stages=None, backend=None):
    """LION attention for L <= ``MAX_LEN``, flash-attention style (see the module docstring).

    Args:
      q, k: ``[B, L, H, K]``; v: ``[B, L, H, V]``; one dtype (float32, bfloat16 or float16);
        L <= 256, K, V <= 128.
      log_decay: None (``M = 1``) or ``[B, L, H]``, entries ``<= 0`` (any float dtype; its
        cumsum over L is taken in float32).
      normalize: divide each row by ``sum_j P_ij + eps`` (SCALE).
      orders: None, or a sequence of token permutations (int arrays ``[L]``; LION-S v2's patch
        orders): ``M`` is then the mean of the masks of the decays accumulated along each
        order, as ``lion_jax.ops.lion_attention(orders=...)`` defines it, in one launch.
      interpret: run the Pallas interpreter; None means "when the default backend is CPU".
      block: rows per program and per loop step, a power of two >= 16 (None: ``BLOCK``,
        fewer for shorter sequences; the dk/dv kernel with several orders takes at most
        ``ORDERS_DKV_BLOCK``).
      two_parts: normalised 16-bit inputs under differentiation: the forward's weights and
        dq's dS in two 16-bit parts and y's low part saved, for gradients to ~16 bits of
        ``delta`` (two matmuls and one ``[B, L, H, V]`` residual more; module docstring).
      num_warps, backward_warps, num_stages: Triton launch settings of the forward kernel,
        of the two backward kernels, and of all three (None: ``NUM_WARPS``, ``NUM_WARPS``,
        ``NUM_STAGES``); ``python -m experiments.profile_kernels --dense`` times them.
      backend: the kernels: ``"triton"`` (Triton), ``"mosaic"``: the Mosaic GPU kernels of
        ``mosaic_dense.py`` for Hopper, forward and backward (16-bit, head dims 64 or 128; a
        ValueError with the reason for inputs they cannot take; with ``interpret``, the
        Mosaic GPU interpreter), or None: :func:`default_backend`'s choice.
    Returns:
      ``[B, L, H, V]`` in v.dtype; differentiable in q, k, v and log_decay (gradients in
      their dtypes).
    Raises:
      ValueError: for the inputs :func:`unsupported_reason` names.
    """
    reason = unsupported_reason(q, k, v, log_decay)
    if reason is not None:
        raise ValueError(f"lion_dense: {reason}")
    if interpret is None:
        interpret = jax.default_backend() == "cpu"
    f32 = q.dtype == jnp.float32
    B, L, H, K = q.shape
    positions = ()
    if orders is None:
        a = _cumulative(log_decay, exact=f32)
    else:
        from lion_jax.ops.orders import check_orders  # one check for the op and the kernel

        orders = check_orders("lion_dense", orders, L)
        positions = tuple(tuple(int(i) for i in np.argsort(p)) for p in orders)
        a = () if log_decay is None else _cumulative_in_orders(log_decay, f32, orders)
    settings = (num_warps, backward_warps, num_stages)
    if any(x is not None and (not isinstance(x, int) or x < 1) for x in settings):
        raise ValueError(f"lion_dense: num_warps, backward_warps and num_stages must be "
                         f"positive ints or None; got {settings}")
    if backend not in (None, "mosaic", "triton"):
        raise ValueError(f"lion_dense: backend must be None, 'mosaic' or 'triton'; got "
                         f"{backend!r}")
    mosaic = backend == "mosaic" or (
        backend is None and default_backend(q, k, v, log_decay, orders, interpret) == "mosaic")
    if mosaic and (reason := mosaic_forward_reason(q, k, v, max(len(a), 1))) is not None:
        raise ValueError(f"lion_dense: backend='mosaic': {reason}; use backend=None")
    cfg = _Config(B, L, H, (K, v.shape[-1]), _block(L, block), len(a),
                  (len(positions) or 1) if a else 1, positions if a else (), bool(normalize),
                  float(eps), f32, bool(two_parts and normalize and not f32), bool(interpret),
                  mosaic, num_warps or NUM_WARPS, backward_warps or NUM_WARPS,
                  num_stages or NUM_STAGES)
    return _dense_once(q, k, v, a, cfg)
