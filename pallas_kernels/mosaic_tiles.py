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


def row_and_column_tiles(x_s, t_buf, shape):
    """``(x_i, x_j)``: the ``[C, C]`` tiles (WGMMA layout) of a ``[C]`` shared-memory vector on
    the rows and on the columns, the second as the first transposed through ``t_buf`` (``[C, C]``
    float32 shared memory): Mosaic GPU (jax 0.11.2) takes no row- and column-indexed
    broadcasts of one vector in one expression."""
    x_i = rows_of(plgpu.load(x_s, layout=ROWS), shape)
    t_buf[...] = x_i
    plgpu.commit_smem()
    x_j = plgpu.layout_cast(plgpu.load(t_buf.T, layout=plgpu.Layout.WGMMA_TRANSPOSED), WGMMA)
    return x_i, x_j
