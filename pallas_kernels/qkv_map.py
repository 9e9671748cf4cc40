"""LION-S's inputs from one merged projection: the biases and the L2-normalised SiLU map of
q and k (``pallas_kernels.feature_map``) applied to ``p = x [W_q | W_k | W_v]`` in one pass
each way, as Pallas kernels (Triton lowering).

With the three projections as separate arrays, XLA multiplies by the three kernels as one
GEMM anyway, then copies each third out with its bias (three passes over the tokens), the map
reads q and k again, and the backward's weight gradient concatenates the three cotangents
inside a Triton GEMM fusion (split-K): in a profile of ViT-T's LION-S train step at 224 px
(one H100, 2026-12-06) the maps' kernels and XLA's work around q, k, v took 3.29 ms of a
19.50 ms device step, that GEMM fusion 0.68 of it, and with this kernel 1.50 of 18.14
(docs/benchmarks.md, "Where LION-S's train step loses to ViT's"). Here the forward reads
``p`` once and writes q, k and v; the backward reads ``p`` and the three cotangents once and
writes ``dp`` as one ``[N, 3 H K]`` array, whose weight and input gradients are then plain
cuBLAS GEMMs, and each program's column sums of ``dp`` for the biases' gradient. Per row
and head, in float32::

    x = round(p + round(b)),    q = silu_l2(x_q),  k = keep * silu_l2(x_k),  v = x_v

(``round``: to p's dtype, so ``x`` is what a Dense layer of that compute dtype gives), with
the map's exact gradient (``feature_map``'s module docstring) for ``dp_q``, ``dp_k`` and
``dp_v = g_v``; rows where ``keep`` is False have ``k = 0`` and ``dp_k = 0``.

Grid: ``(row blocks, 3, H)``; program ``(i, part, h)`` handles rows ``[i R, (i + 1) R)`` of
head ``h``'s columns of q (part 0), k (1) or v (2). Triton's refs are pointers, so a program
reads only the arrays of its part.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.chunk_scan import _next_pow2
from pallas_kernels.feature_map import (MAX_DIM, _features, _gradient, _valid,
                                        launch_settings)

_FLOATS = (jnp.float32, jnp.bfloat16, jnp.float16)


def unsupported_reason(p, heads):
    """Why :func:`silu_l2_qkv` cannot take ``p`` with ``heads`` heads (one line), or None."""
    if p.ndim < 2 or p.dtype not in _FLOATS:
        return f"p must be [..., 3 H K] of float32, bfloat16 or float16; got {p.dtype} {p.shape}"
    if heads < 1 or p.shape[-1] % (3 * heads):
        return (f"p's last axis ({p.shape[-1]}) must be 3 * heads * K for heads={heads} "
                "(queries, keys and values of one width)")
    if p.shape[-1] // (3 * heads) > MAX_DIM:
        return f"the head dim must be at most {MAX_DIM}; got {p.shape[-1] // (3 * heads)}"
    return None


@dataclasses.dataclass(frozen=True)
class _Config:
    rows: int  # N, the tokens
    heads: int
    dim: int  # K
    shift: float
    eps: float
    interpret: bool
    block: int
    warps: int

    def call(self, kernel, name, args, specs, outs):
        """One launch on the ``(row blocks, 3, H)`` grid; ``outs``: ``(shape, dtype, spec)``."""
        kernel = functools.partial(kernel, rows=self.rows, dim=self.dim, shift=self.shift,
                                   eps=self.eps)
        return pl.pallas_call(
            kernel, grid=(-(-self.rows // self.block), 3, self.heads), in_specs=specs,
            out_specs=[spec for _, _, spec in outs],
            out_shape=[jax.ShapeDtypeStruct(shape, dtype) for shape, dtype, _ in outs],
            compiler_params=pltriton.CompilerParams(num_warps=self.warps, num_stages=1),
            interpret=self.interpret, name=name)(*args)

    def specs(self):
        """Blocks of ``[N, 3, H, K]`` (this program's part), ``[3, H, K]`` (its bias),
        ``[N, H, K]`` (a head's rows of q, k or v) and ``[N]`` (keep)."""
        width = _next_pow2(max(self.dim, 16))
        part = pl.BlockSpec((self.block, None, None, width), lambda i, c, h: (i, c, h, 0))
        bias = pl.BlockSpec((None, None, width), lambda i, c, h: (c, h, 0))
        head = pl.BlockSpec((self.block, None, width), lambda i, c, h: (i, h, 0))
        row = pl.BlockSpec((self.block,), lambda i, c, h: (i,))
        return part, bias, head, row


def _masks(p_ref, keep_ref, rows, dim):
    """``(store, kept)``: ``[R, width]`` masks of this program's block inside ``[N, K]``, and
    of those rows that ``keep`` keeps. Taken outside the ``pl.when`` branches (the Pallas
    interpreter resolves ``program_id`` only at the kernel's top level)."""
    return _valid(p_ref, rows, dim), _valid(p_ref, rows, dim, keep_ref)


def _inputs(p_ref, b_ref, valid, dim):
    """``round(p + round(b))`` of this program's block in float32, zero outside ``valid``."""
    p = pltriton.load(p_ref, mask=valid, other=0)
    b = pltriton.load(b_ref, mask=_columns(b_ref, dim), other=0).astype(p.dtype)
    x = (p.astype(jnp.float32) + b.astype(jnp.float32)[None, :]).astype(p.dtype)
    return jnp.where(valid, x.astype(jnp.float32), 0.0)


def _columns(ref, dim):
    """The columns of a block's last axis that lie inside the head dim."""
    return jnp.arange(ref.shape[-1]) < dim


def _forward_kernel(p_ref, b_ref, keep_ref, q_ref, k_ref, v_ref, *, rows, dim, shift, eps):
    part = pl.program_id(1)
    store, kept = _masks(p_ref, keep_ref, rows, dim)
    for n, (out_ref, valid) in enumerate(((q_ref, store), (k_ref, kept))):
        @pl.when(part == n)
        def _(out_ref=out_ref, valid=valid):
            f = _features(_inputs(p_ref, b_ref, valid, dim), valid, shift, eps)[0]
            pltriton.store(out_ref, f.astype(out_ref.dtype), mask=store)

    @pl.when(part == 2)
    def _():
        pltriton.store(v_ref, _inputs(p_ref, b_ref, store, dim).astype(v_ref.dtype), mask=store)


def _backward_kernel(p_ref, b_ref, keep_ref, gq_ref, gk_ref, gv_ref, dp_ref, db_ref, *, rows,
                     dim, shift, eps):
    part = pl.program_id(1)
    store, kept = _masks(p_ref, keep_ref, rows, dim)

    def write(dp):
        """Stores ``dp`` rounded to p's dtype, and its column sums (the rounded values', as
        the biases' gradient sums the cotangent a Dense layer sees) for the biases."""
        dp = dp.astype(dp_ref.dtype)
        pltriton.store(dp_ref, dp, mask=store)
        pltriton.store(db_ref, jnp.sum(dp.astype(jnp.float32), axis=0),
                       mask=_columns(db_ref, dim))

    for n, (g_ref, valid) in enumerate(((gq_ref, store), (gk_ref, kept))):
        @pl.when(part == n)
        def _(g_ref=g_ref, valid=valid):
            x = _inputs(p_ref, b_ref, valid, dim)
            g = pltriton.load(g_ref, mask=valid, other=0).astype(jnp.float32)
            write(_gradient(x, g, valid, shift, eps))

    @pl.when(part == 2)
    def _():
        write(pltriton.load(gv_ref, mask=store, other=0))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _qkv(p, bias, keep, cfg):
    """``p [N, 3, H, K]``, ``bias [3, H, K]`` float32, ``keep [N]`` int8 -> q, k, v
    ``[N, H, K]`` in p's dtype."""
    part, b_spec, head, row = cfg.specs()
    out = [((cfg.rows, cfg.heads, cfg.dim), p.dtype, head)] * 3
    return tuple(cfg.call(_forward_kernel, "silu_l2_qkv_forward", [p, bias, keep],
                          [part, b_spec, row], out))


def _qkv_fwd(p, bias, keep, cfg):
    return _qkv(p, bias, keep, cfg), (p, bias, keep)


def _qkv_bwd(cfg, residuals, g):
    p, bias, keep = residuals
    part, b_spec, head, row = cfg.specs()
    blocks = -(-cfg.rows // cfg.block)
    sums = pl.BlockSpec((None, None, None, b_spec.block_shape[-1]),
                        lambda i, c, h: (i, c, h, 0))
    dp, db = cfg.call(_backward_kernel, "silu_l2_qkv_backward", [p, bias, keep, *g],
                      [part, b_spec, row, head, head, head],
                      [(p.shape, p.dtype, part), ((blocks, *bias.shape), jnp.float32, sums)])
    return dp, db.sum(axis=0), None


_qkv.defvjp(_qkv_fwd, _qkv_bwd)
# jitted with its static layout: a model's layers of one shape share one trace and lowering
_qkv_once = jax.jit(_qkv, static_argnums=(3,))


def silu_l2_qkv(p, bias, heads, *, shift=0.5, eps=1e-6, keep=None, interpret=None,
                block_rows=None, num_warps=None):
    """LION-S's q, k and v from the merged projection ``p`` (module docstring).

    Args:
      p: ``[..., 3 * heads * K]``: each token's query, key and value projections side by side
        (``x @ [W_q | W_k | W_v]``, no bias), float32, bfloat16 or float16; K <= ``MAX_DIM``.
      bias: ``[3 * heads * K]``, the three biases side by side (any float dtype; added in p's
        dtype, as a Dense layer computing in it adds its bias); its gradient: float32 sums
        of the rounded ``dp`` over the tokens, in its dtype.
      heads: H.
      shift, eps: the map's (``feature_map.silu_l2``).
      keep: None, or a bool array broadcastable to ``p.shape[:-1]``: rows where it is False
        get ``k = 0`` (and no gradient through k).
      interpret: run the Pallas interpreter; None means "when the default backend is CPU".
      block_rows, num_warps: rows per program (a power of two >= 16) and Triton warps (None:
        ``feature_map.ROWS``, ``feature_map.NUM_WARPS``; :func:`feature_map.launch_settings`).
    Returns:
      ``(q, k, v)``, each ``[..., heads, K]`` in p's dtype, differentiable in p and bias.
    Raises:
      ValueError: for the inputs :func:`unsupported_reason` names, or a bias of another size.
    """
    reason = unsupported_reason(p, heads)
    if reason is None and jnp.size(bias) != p.shape[-1]:
        reason = f"bias must have p's last axis' {p.shape[-1]} entries; got {jnp.shape(bias)}"
    if reason is not None:
        raise ValueError(f"silu_l2_qkv: {reason}")
    lead = p.shape[:-1]
    dim = p.shape[-1] // (3 * heads)
    cfg = _Config(int(p.size // p.shape[-1]), int(heads), dim, float(shift), float(eps),
                  *launch_settings("silu_l2_qkv", interpret, block_rows, num_warps))
    if keep is None:
        keep = jnp.ones((), bool)
    try:
        keep = jnp.broadcast_to(jnp.asarray(keep), lead)
    except ValueError:
        raise ValueError(f"silu_l2_qkv: keep must broadcast to p.shape[:-1] = {lead}; got "
                         f"{jnp.shape(keep)}") from None
    q, k, v = _qkv_once(p.reshape(cfg.rows, 3, heads, dim),
                        jnp.asarray(bias, jnp.float32).reshape(3, heads, dim),
                        keep.astype(jnp.int8).reshape(cfg.rows), cfg)
    return tuple(t.reshape(*lead, heads, dim) for t in (q, k, v))
