"""Register-tile helpers shared by the Mosaic GPU chunk kernels (``mosaic_outputs.py``,
``mosaic_causal.py``, ``mosaic_causal_warps.py``, ``mosaic_causal_backward.py``,
``mosaic_lion_backward.py``): one warpgroup's tiles in the WGMMA layout, vectors broadcast
along their rows or columns, the decay rows the kernels read per chunk, the two masks built
from them (causal, LION), and the kernels' compiler parameters."""

import jax.numpy as jnp
from jax import lax
from jax.experimental.pallas import mosaic_gpu as plgpu

WGMMA = plgpu.Layout.WGMMA
ROWS = WGMMA.reduce(1)  # a vector with one entry per row of a WGMMA tile
COLS = WGMMA.reduce(0)  # a vector with one entry per column
# The rows of ``chunk_scan.mask_rows`` a kernel reads per chunk: A, e^A, e^tail, and A again,
# read in the columns' layout (:func:`rows_and_columns`).
DECAY_ROWS = (0, 1, 2, 0)
# exp in the compiled chunk kernels as ex2.approx.ftz of x log2(e) (two instructions; relative
# error about 2^-22 plus x's rounding, |x| 2^-24) instead of libdevice's expf, as
# mosaic_dense.py does. Read when a kernel is traced; the interpreter's exp is exact either way.
# Off: in an interleaved A/B (one H100, 2026-12-07, experiments/ab_settings.py) it took 2.6 %
# (causal) and 3.1 % (LION) off forward + backward at D 64 and added 1.4 % at D 128.
APPROX_MATH = False


def rows_of(x, shape):
    """``x [R]`` (ROWS layout) on the rows of a tile of ``shape``: entry ``(i, j)`` is x_i."""
    return lax.broadcast_in_dim(x, shape, [0])


def cols_of(x, shape):
    """``x [C]`` (COLS layout) on the columns of a tile of ``shape``: entry ``(i, j)`` is x_j."""
    return lax.broadcast_in_dim(x, shape, [1])


def rows_and_columns(x_s, x_cols_s, shape):
    """``(x_i, x_j)``: a ``[C]`` shared-memory vector on the rows and on the columns of a tile
    of ``shape``, the columns' from a second copy ``x_cols_s`` read in the COLS layout (Mosaic
    GPU, jax 0.11.2, takes no row- and column-indexed broadcasts of one load)."""
    return (rows_of(plgpu.load(x_s, layout=ROWS), shape),
            cols_of(plgpu.load(x_cols_s, layout=COLS), shape))


def causal_mask(a_s, a_cols_s, causal):
    """A chunk's per-token causal decays ``exp(A_i - A_j)`` where ``causal`` (a bool tile,
    ``i >= j`` or ``i > j``) keeps them, else 0, from its cumulative log-decays A on the rows
    (``a_s``) and the columns (``a_cols_s``, :func:`rows_and_columns`). Every kept exponent is
    at most 0: no overflow at any decay."""
    a_i, a_j = rows_and_columns(a_s, a_cols_s, causal.shape)
    return jnp.where(causal, jnp.exp(jnp.minimum(a_i - a_j, 0.0)), 0.0)


def lion_mask(a_s, a_cols_s, shape):
    """A chunk's LION decays ``exp(-|A_i - A_j|)`` (both orders), ``shape`` ``[C, C]``."""
    a_i, a_j = rows_and_columns(a_s, a_cols_s, shape)
    return jnp.exp(-jnp.abs(a_i - a_j))


def compiler_params(**kw):
    """The chunk kernels' ``plgpu.CompilerParams``: ``approx_math=APPROX_MATH`` and ``kw``."""
    return plgpu.CompilerParams(approx_math=APPROX_MATH, **kw)


def tile_iota(shape, axis):
    """The row (``axis`` 0) or column (1) index of every entry of a tile, int32, WGMMA layout."""
    return plgpu.layout_cast(lax.broadcasted_iota(jnp.int32, shape, axis), WGMMA)
