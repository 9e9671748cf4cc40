"""The L2-normalised SiLU feature map of LION-S, ``(silu(x) + shift) / ||silu(x) + shift||``
over the last axis, as one-pass Pallas kernels (Triton lowering), forward and backward.

XLA computes this map as a row reduction (the squared norm) and an elementwise pass that reads
the input again, and its gradient likewise (``f . g``, then the elementwise rest): four
reductions per layer for q and k, 0.90 ms of ViT-T's 23 ms train step at 224 px on one H100
(docs/benchmarks.md, "Where the train step's time goes"). Here each program holds ``ROWS``
(``block_rows``) whole rows, so the forward reads ``x`` once and writes ``f``, and the backward
reads ``x`` and ``g`` once and writes ``dx``. Every row is computed in float32 whatever the dtypes::

    u = silu(x) + shift,   r = (||u||^2 + eps)^(-1/2),   f = u r
    dx = r (g - f (f . g)) silu'(x),   silu'(x) = sigmoid(x) (1 + x (1 - sigmoid(x)))

(the exact derivative of the map, ``eps`` included), so the result is
:func:`lion_jax.layers.feature_maps.silu_l2` (``shift=0.5``) or ``silu_l2_noshift``
(``shift=0``) to float32 rounding. Columns past the head dim are masked out of the norm.

``keep`` (a bool per row) zeroes the rows it marks False, and their gradient: a padded
token's key in ``LionAttention``, where XLA would otherwise take a select over the whole
output forward and over its cotangent backward.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.chunk_scan import _next_pow2

# Rows per program (default). `python -m experiments.profile_kernels --feature_map` on one H100
# (2026-12-06) at [256, 200, 3, 64] bf16, forward / forward + backward in ms: 64 rows at 4 warps
# 0.048 / 0.057, 128 rows at 4 warps 0.094 / 0.123, 128 at 8 warps 0.062 / 0.082
# (docs/benchmarks.md, "Measurements behind the kernels' defaults").
ROWS = 64
MAX_DIM = 256
NUM_WARPS = 4
_FLOATS = (jnp.float32, jnp.bfloat16, jnp.float16)


def unsupported_reason(x):
    """Why :func:`silu_l2` cannot take ``x`` (one line), or None when it can."""
    if x.ndim < 1 or x.dtype not in _FLOATS:
        return f"x must be [..., K] of float32, bfloat16 or float16; got {x.dtype} {x.shape}"
    if not 1 <= x.shape[-1] <= MAX_DIM:
        return f"the last axis must be in [1, {MAX_DIM}]; got {x.shape[-1]}"
    return None


@dataclasses.dataclass(frozen=True)
class _Config:
    rows: int  # of the flattened input [N, K]
    dim: int  # K
    shift: float
    eps: float
    out_dtype: object
    interpret: bool
    block: int  # rows per program
    warps: int

    def call(self, kernel, name, args, keep, out_dtype):
        """One launch over ``[N, K]`` arrays, ``block`` rows per program, one output;
        ``keep``: None or the rows' ``[N]`` int8 flags."""
        width = _next_pow2(max(self.dim, 16))
        spec = pl.BlockSpec((self.block, width), lambda i: (i, 0))
        in_specs = [spec] * len(args)
        if keep is not None:
            args = [*args, keep]
            in_specs = in_specs + [pl.BlockSpec((self.block,), lambda i: (i,))]
        kernel = functools.partial(kernel, rows=self.rows, dim=self.dim, shift=self.shift,
                                   eps=self.eps)
        return pl.pallas_call(
            kernel, grid=(-(-self.rows // self.block),), in_specs=in_specs,
            out_specs=spec, out_shape=jax.ShapeDtypeStruct((self.rows, self.dim), out_dtype),
            compiler_params=pltriton.CompilerParams(num_warps=self.warps, num_stages=1),
            interpret=self.interpret, name=name)(*args)


def _valid(ref, rows, dim, keep_ref=None):
    """``[block, width]`` mask of this program's entries inside ``[rows, dim]`` (and in the
    rows ``keep_ref`` flags, when given)."""
    block = ref.shape[0]
    row = pl.program_id(0) * block + jnp.arange(block)
    ok = row < rows
    if keep_ref is not None:
        ok = ok & (pltriton.load(keep_ref, mask=ok, other=0) != 0)
    return ok[:, None] & (jnp.arange(ref.shape[-1]) < dim)[None, :]


def _load(ref, valid):
    return pltriton.load(ref, mask=valid, other=0).astype(jnp.float32)


def _features(x, valid, shift, eps):
    """``(f, r, sigmoid(x))`` of a block (module docstring); zero outside ``valid``."""
    sig = jax.nn.sigmoid(x)
    u = jnp.where(valid, x * sig + shift, 0.0)
    r = jax.lax.rsqrt(jnp.sum(u * u, axis=1, keepdims=True) + eps)
    return u * r, r, sig


def _forward_kernel(x_ref, *refs, rows, dim, shift, eps):
    keep_ref, f_ref = refs if len(refs) == 2 else (None, refs[0])
    valid = _valid(x_ref, rows, dim, keep_ref)
    f, _, _ = _features(_load(x_ref, valid), valid, shift, eps)
    pltriton.store(f_ref, f.astype(f_ref.dtype), mask=_valid(x_ref, rows, dim))  # dropped: 0


def _gradient(x, g, valid, shift, eps):
    """``dx`` of a block for the map's cotangent ``g`` (module docstring); zero where ``x``
    and ``g`` are (rows outside ``valid``, which load as zeros)."""
    f, r, sig = _features(x, valid, shift, eps)
    du = r * (g - f * jnp.sum(f * g, axis=1, keepdims=True))
    return du * sig * (1.0 + x * (1.0 - sig))


def _backward_kernel(x_ref, g_ref, *refs, rows, dim, shift, eps):
    keep_ref, dx_ref = refs if len(refs) == 2 else (None, refs[0])
    valid = _valid(x_ref, rows, dim, keep_ref)
    dx = _gradient(_load(x_ref, valid), _load(g_ref, valid), valid, shift, eps)
    pltriton.store(dx_ref, dx.astype(dx_ref.dtype), mask=_valid(x_ref, rows, dim))


def launch_settings(name, interpret, block_rows, num_warps):
    """``(interpret, block_rows, num_warps)`` of a call of kernel ``name``: None means the
    Pallas interpreter when the default backend is CPU, ``ROWS`` and ``NUM_WARPS``; a bad
    setting is one error line."""
    if interpret is None:
        interpret = jax.default_backend() == "cpu"
    block_rows, num_warps = block_rows or ROWS, num_warps or NUM_WARPS
    if block_rows < 16 or block_rows & (block_rows - 1) or num_warps < 1:
        raise ValueError(f"{name}: block_rows must be a power of two >= 16 and num_warps >= 1; "
                         f"got {block_rows}, {num_warps}")
    return bool(interpret), int(block_rows), int(num_warps)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _map(x, keep, cfg):
    return cfg.call(_forward_kernel, "silu_l2_forward", [x], keep, cfg.out_dtype)


def _map_fwd(x, keep, cfg):
    return _map(x, keep, cfg), (x, keep)


def _map_bwd(cfg, residuals, g):
    x, keep = residuals
    return cfg.call(_backward_kernel, "silu_l2_backward", [x, g], keep, x.dtype), None


_map.defvjp(_map_fwd, _map_bwd)
# jitted with its static layout, so that a model's layers of one shape share one trace and
# one lowering of the kernels (pallas_kernels/__init__.py, "Lowered once")
_map_once = jax.jit(_map, static_argnums=(2,))


def silu_l2(x, *, shift=0.5, eps=1e-6, out_dtype=None, keep=None, interpret=None,
            block_rows=None, num_warps=None):
    """``(silu(x) + shift) / sqrt(||silu(x) + shift||^2 + eps)`` over the last axis, computed
    in float32 (module docstring).

    Args:
      x: ``[..., K]``, float32, bfloat16 or float16; K <= ``MAX_DIM``.
      shift: 0.5 for ``silu_l2``, 0 for ``silu_l2_noshift``.
      eps: added to the squared norm (``lion_jax.layers.feature_maps``' value by default).
      out_dtype: the output's dtype (None: x's); the gradient is in x's.
      keep: None, or a bool array broadcastable to ``x.shape[:-1]``: rows where it is False
        come out as zeros, with zero gradient.
      interpret: run the Pallas interpreter; None means "when the default backend is CPU".
      block_rows, num_warps: rows per program (a power of two >= 16) and Triton warps (None:
        ``ROWS``, ``NUM_WARPS``); ``python -m experiments.profile_kernels --feature_map``
        times them.
    Returns:
      ``[..., K]`` in ``out_dtype``, differentiable in x.
    Raises:
      ValueError: for the inputs :func:`unsupported_reason` names.
    """
    reason = unsupported_reason(x)
    if reason is not None:
        raise ValueError(f"silu_l2: {reason}")
    cfg = _Config(x.size // x.shape[-1], x.shape[-1], float(shift), float(eps),
                  jnp.dtype(out_dtype or x.dtype),
                  *launch_settings("silu_l2", interpret, block_rows, num_warps))
    if keep is not None:
        try:
            keep = jnp.broadcast_to(jnp.asarray(keep), x.shape[:-1])
        except ValueError:
            raise ValueError(f"silu_l2: keep must broadcast to x.shape[:-1] = {x.shape[:-1]}; "
                             f"got {jnp.shape(keep)}") from None
        keep = keep.astype(jnp.int8).reshape(cfg.rows)
    return _map_once(x.reshape(cfg.rows, cfg.dim), keep, cfg).reshape(x.shape)
