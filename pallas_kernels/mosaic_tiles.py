"""Register-tile helpers shared by the Mosaic GPU kernels (``mosaic_outputs.py``,
``mosaic_causal.py``, ``mosaic_causal_warps.py``): one warpgroup's tiles in the WGMMA layout,
and vectors broadcast along their rows or columns."""

from jax import lax
from jax.experimental.pallas import mosaic_gpu as plgpu

WGMMA = plgpu.Layout.WGMMA
ROWS = WGMMA.reduce(1)  # a vector with one entry per row of a WGMMA tile
COLS = WGMMA.reduce(0)  # a vector with one entry per column


def rows_of(x, shape):
    """``x [R]`` (ROWS layout) on the rows of a tile of ``shape``: entry ``(i, j)`` is x_i."""
    return lax.broadcast_in_dim(x, shape, [0])


def cols_of(x, shape):
    """``x [C]`` (COLS layout) on the columns of a tile of ``shape``: entry ``(i, j)`` is x_j."""
    return lax.broadcast_in_dim(x, shape, [1])

