"""LightNet's multi-dimensional positional encodings (digest ``papers/digests/lightnet.md``
sections 3.1, 3.2 and 2.7): MD-TPE and MD-LRPE for tokens laid out on a ``k``-D grid.

Tokens ``x [B, N, ...]`` are ``num_prefix`` extra tokens (a class token, ...), then the
``N_1 x ... x N_k`` grid flattened row-major (``order="C"``, the last axis fastest; the LRPE
helpers also take ``order="F"``, column-major). ``N = num_prefix + prod(grid_shape)``.

**MD-TPE** (:class:`MdTpe`, Eq. 9): the sum over grid axes ``s`` of a causal Toeplitz mixing
along axis ``s``, per channel, each a diagonal SSM with ``e`` states::

    h_{n_s}[c, j] = lambda_s[c, j] h_{n_s - 1}[c, j] + b_s[c, j] x_{.., n_s, ..}[c]
    y[c] = sum_s sum_j c_s[c, j] h_{n_s}[c, j]
    i.e. y_n = sum_s sum_{m_s <= n_s} t^{(s)}_{n_s - m_s} x_{n_1, .., m_s, .., n_k},
         t^{(s)}_r[c] = sum_j c_s[c, j] lambda_s[c, j]^r b_s[c, j]

Each axis term is the 1-D TPE recurrence of cosFormer2
(:func:`lion_jax.layers.cosformer2.toeplitz_ssm`, coefficient ``c * b``) run along that axis of
the un-flattened grid, the other axes folded into the batch. ``toeplitz_ssm`` is a scan over
chunks of ``chunk_size`` tokens of the axis (a ``C x C`` causal block inside a chunk, the ``e``
states between chunks): ``O(N D (C + e))`` per axis, ``O(N e D)`` for ``C <= e``;
``chunk_size=1`` is the plain sequential scan. No ``N_s x N_s`` (let alone ``N x N``) Toeplitz
matrix is formed beyond one chunk.

Choices where the paper is silent (digest 3.1 [UNSPECIFIED]); each is an attribute:

- ``coef_init="eq9"`` (default): ``b = c = 1``, the literal Eq. 9 kernel ``sum_j lambda_j^r``
  (the digest's recommendation); ``"unit"``: ``b = 1 / (k e)``, ``c = 1``, so the summed
  kernel at lag 0 is 1 and the embedding keeps its scale (cosFormer2's ``Tpe`` uses ``1/e``
  in 1-D). ``b`` and ``c`` are both learnable (``output_coef=False`` drops ``c``: only the
  product ``c * b`` enters the kernel, so ``c`` adds no expressivity, only the ETSC/SSM form).
- ``lambda = sigmoid(logit)`` in ``(0, 1)``, real, starting at ``1 - 2^-u`` with ``u`` evenly
  spaced over ``decay_init_exponents`` (timescales 2 to 256 tokens by default);
  ``decay_shape="state"`` (one per state, shared by the channels, as cosFormer2's ``Tpe``) or
  ``"channel"`` (per channel and state).
- ``share_axes=False`` (default): every axis has its own ``lambda, b, c`` (the [REF-CODE]
  xmixers ``MdTpe`` sums one ``Tpe`` per axis; it also tells the axes apart on square grids);
  ``True``: one set for all axes, Eq. 9 read literally (``lambda_j`` has no axis index).
- ``state_dim`` ``e`` = 16 by default.
- Causal (one direction) along every axis, as Eq. 9, also for images.
- ``residual=False`` (default): ``X = MdTpe(X)``, as Fig. 2 (applied once after the input
  embedding) and the [REF-CODE] xmixers code; ``True`` returns ``x + MdTpe(x)`` on the grid.
- Prefix tokens are not on the grid: they are returned unchanged (in both modes).
- The mixing runs in ``promote_types(x.dtype, float32)`` (float64 stays float64).

In 1-D (``grid_shape=(L,)``) with ``output_coef=False`` (or ``c = 1``), :class:`MdTpe` is
cosFormer2's :class:`~lion_jax.layers.cosformer2.Tpe` exactly: the same recurrence, the same
``lambda`` parameterisation; ``Tpe``'s ``coef`` is ``b`` here (its init is ``1/e``, as
``coef_init="unit"`` with ``k = 1``).

**MD-LRPE** (:func:`md_lrpe`, :class:`MdLrpe`, Eq. 12-14 in the real "cosine" form of digest
3.2): the ``K`` features of each head are split into ``k`` contiguous groups of ``K / k``; the
features of group ``s`` rotate with the token's coordinate ``n_s`` on axis ``s``::

    P_n(x) = [x * cos(Theta_n), x * sin(Theta_n)],  Theta_n[h, j] = n_{axis(j)} theta[h, j]
    P_n(q) . P_m(k) = sum_j q_j k_j cos((m - n)_{axis(j)} theta_j)

which depends on the coordinate difference only (per axis), so it is translation invariant and
does not care how the grid was flattened (the coordinates travel with the tokens). Each group
is TNL's 1-D LRPE (:func:`lion_jax.layers.tnl.lrpe`) evaluated at the token's coordinate on
that group's axis. Prefix tokens have coordinate 0 on every axis: no rotation (``[x, 0]``, the
[REF-CODE] ``md_lrpe_cosine`` convention). In 1-D it is plain LRPE.

Frequencies (:func:`md_lrpe_thetas`): ``span="head"`` (default) applies the paper's
``theta_j = base^(-2j/d)`` with ``d`` the head dimension (the paper writes one head), 0-based
``j`` as cosFormer2/TNL, so group ``s`` of every head gets the ``s``-th band (Eq. 12);
``span="width"``: ``d = H*K`` head-major (the [REF-CODE] vector_quants ``MdLrpe``), each head's
slice then split per axis; ``shared_band=True``: every axis reuses the head's first ``K/k``
frequencies (the reference code's variant). ``K`` must be divisible by ``k`` (a ``ValueError``
otherwise; the reference code's ``ceil`` + truncation is not reproduced). ``theta`` is fixed
by default (the paper's constant ``10000^(-2j/d)``); ``MdLrpe(learnable=True)`` makes it a
float32 parameter.
"""

import math
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from lion_jax.layers.cosformer2 import check_tpe_settings, lrpe_thetas, toeplitz_ssm
from lion_jax.layers.lion import decay_logits
from lion_jax.layers.tnl import lrpe

COEF_INITS = ("eq9", "unit")
GRID_ORDERS = ("C", "F")


def _check_grid(grid_shape: Sequence[int], num_prefix: int) -> tuple[int, ...]:
    grid = tuple(int(n) for n in grid_shape)
    if not grid or min(grid) <= 0:
        raise ValueError(f"grid_shape must be a non-empty tuple of positive sizes, got "
                         f"{tuple(grid_shape)}")
    if num_prefix < 0:
        raise ValueError(f"num_prefix must be >= 0, got {num_prefix}")
    return grid


def _check_tokens(n_tokens: int, grid: tuple[int, ...], num_prefix: int, who: str) -> None:
    want = num_prefix + math.prod(grid)
    if n_tokens != want:
        raise ValueError(f"{who}: {n_tokens} tokens, but num_prefix + prod(grid_shape) = "
                         f"{num_prefix} + {math.prod(grid)} = {want}")


def grid_positions(grid_shape: Sequence[int], num_prefix: int = 0,
                   order: str = "C") -> np.ndarray:
    """Integer coordinates ``[num_prefix + prod(grid_shape), k]`` of the flattened tokens:
    zeros for the prefix tokens, then the grid flattened row-major (``order="C"``, the last
    axis fastest) or column-major (``"F"``, the first axis fastest)."""
    grid = _check_grid(grid_shape, num_prefix)
    if order not in GRID_ORDERS:
        raise ValueError(f"unknown order {order!r}; valid: {list(GRID_ORDERS)}")
    coords = np.stack(np.unravel_index(np.arange(math.prod(grid)), grid, order=order), -1)
    return np.concatenate([np.zeros((num_prefix, len(grid)), coords.dtype), coords]).astype(
        np.int32)


def md_lrpe_thetas(num_heads: int, head_dim: int, num_axes: int, span: str = "head",
                   shared_band: bool = False, base: float = 10000.0) -> np.ndarray:
    """MD-LRPE frequencies ``[H, K]`` (float32); feature ``j`` of a head belongs to axis
    ``j // (K / k)``. ``span`` as :func:`lion_jax.layers.cosformer2.lrpe_thetas` (``"head"``:
    ``base^(-2j/K)``, ``"width"``: ``base^(-2j/(H*K))`` head-major); ``shared_band``: every
    axis group repeats the head's first ``K/k`` frequencies."""
    if num_axes <= 0 or head_dim % num_axes:
        raise ValueError(f"head_dim={head_dim} is not divisible into {num_axes} axis groups")
    theta = lrpe_thetas(num_heads, head_dim, span, base).reshape(num_heads, head_dim)
    if shared_band:
        theta = np.tile(theta[:, :head_dim // num_axes], (1, num_axes))
    return theta.astype(np.float32)


def md_lrpe(x: jnp.ndarray, theta: jnp.ndarray, positions) -> jnp.ndarray:
    """MD-LRPE ``x [B, N, H, K] -> [B, N, H, 2K]``: ``[x cos(Theta), x sin(Theta)]`` with
    ``Theta[n, h, j] = positions[n, axis(j)] theta[h, j]``, ``axis(j) = j // (K/k)``.

    Args:
      x: queries (after the feature map) or keys (after normalisation).
      theta: ``[H, K]`` (or ``[K]``) frequencies, e.g. :func:`md_lrpe_thetas`.
      positions: integer ``[N, k]`` token coordinates, e.g. :func:`grid_positions` (prefix
        tokens at 0: no rotation); shifting them all by one vector leaves every
        ``P_n(q) . P_m(k)`` unchanged.
    Returns:
      ``[B, N, H, 2K]`` in ``promote_types(x.dtype, float32)``.
    """
    B, N, H, K = x.shape
    positions = jnp.asarray(positions)
    if positions.ndim != 2 or positions.shape[0] != N:
        raise ValueError(f"positions must have shape [N, k] with N={N}, got "
                         f"{tuple(positions.shape)}")
    if not jnp.issubdtype(positions.dtype, jnp.integer):
        raise ValueError(f"positions must be integers, got {positions.dtype}")
    k = positions.shape[1]
    if K % k:
        raise ValueError(f"head_dim K={K} is not divisible into {k} axis groups")
    theta = jnp.broadcast_to(jnp.asarray(theta), (H, K))
    G = K // k

    def rotate_at(x_t, p_t, theta_s):  # one token: the 1-D LRPE with offset = its coordinate
        return lrpe(x_t[:, None], theta_s, p_t)[:, 0]

    cos_parts, sin_parts = [], []
    for s in range(k):
        group = slice(s * G, (s + 1) * G)
        out = jax.vmap(rotate_at, in_axes=(1, 0, None), out_axes=1)(
            x[..., group], positions[:, s], theta[:, group])  # [B, N, H, 2G]
        cos_parts.append(out[..., :G])
        sin_parts.append(out[..., G:])
    return jnp.concatenate(cos_parts + sin_parts, axis=-1)


class MdLrpe(nn.Module):
    """MD-LRPE of queries or keys on a grid, ``[B, N, H, K] -> [B, N, H, 2K]`` (see the module
    docstring and :func:`md_lrpe`). Call the same instance on q and on k so that they share
    ``theta``.

    Call: ``pe(x, order="C")``: ``order`` is the flattening of ``x``'s grid tokens.

    Attributes:
      num_heads, head_dim: ``H``, ``K`` (``K`` divisible by ``len(grid_shape)``).
      grid_shape: ``(N_1, ..., N_k)``. num_prefix: tokens before the grid (no rotation).
      span, shared_band, base: the frequencies (:func:`md_lrpe_thetas`).
      learnable: ``theta`` is a float32 parameter ``"theta" [H, K]`` (False: the constant).
    """

    num_heads: int
    head_dim: int
    grid_shape: tuple[int, ...]
    num_prefix: int = 0
    span: str = "head"
    shared_band: bool = False
    base: float = 10000.0
    learnable: bool = False

    def __post_init__(self):
        _check_grid(self.grid_shape, self.num_prefix)
        md_lrpe_thetas(self.num_heads, self.head_dim, len(self.grid_shape), self.span,
                       self.shared_band, self.base)  # validates span and divisibility
        super().__post_init__()

    @nn.compact
    def __call__(self, x: jnp.ndarray, order: str = "C") -> jnp.ndarray:
        grid = tuple(self.grid_shape)
        B, N, H, K = x.shape
        if (H, K) != (self.num_heads, self.head_dim):
            raise ValueError(f"MdLrpe: x has heads x dim {H} x {K}, expected "
                             f"{self.num_heads} x {self.head_dim}")
        _check_tokens(N, grid, self.num_prefix, "MdLrpe")
        values = md_lrpe_thetas(H, K, len(grid), self.span, self.shared_band, self.base)
        if self.learnable:
            theta = self.param("theta", lambda key, shape, dtype=jnp.float32:
                               jnp.asarray(values, dtype), (H, K), jnp.float32)
        else:
            theta = jnp.asarray(values)
        return md_lrpe(x, theta, grid_positions(grid, self.num_prefix, order))


class MdTpe(nn.Module):
    """MD-TPE ``x [B, N, D] -> [B, N, D]`` on a grid, applied once after the embedding (see
    the module docstring for the recurrence and the defaults).

    Parameters (``A = 1`` with ``share_axes``, else ``k``; ``P = 1`` for
    ``decay_shape="state"``, else ``D``): ``decay_logit [A, P, E]`` (``lambda = sigmoid``),
    ``b [A, D, E]``, and ``c [A, D, E]`` when ``output_coef``.

    Attributes:
      grid_shape: ``(N_1, ..., N_k)``, row-major flattening. num_prefix: tokens before the
        grid, returned unchanged.
      state_dim: ``e``. decay_shape: ``"state"`` or ``"channel"``.
      decay_init_exponents: ``lambda`` starts at ``1 - 2^-u``, ``u`` spaced over this range.
      share_axes: one parameter set for all axes (False: one per axis).
      output_coef: learn ``c`` (True) or fix it to 1.
      coef_init: ``"eq9"`` (``b = c = 1``) or ``"unit"`` (``b = 1/(k e)``, ``c = 1``).
      residual: return ``x + MdTpe(x)`` on the grid tokens.
      chunk_size: tokens per chunk of :func:`~lion_jax.layers.cosformer2.toeplitz_ssm` along
        each axis (1 = sequential scan).
      dtype: output dtype (None = ``x.dtype``). param_dtype: parameter dtype.
    """

    grid_shape: tuple[int, ...]
    num_prefix: int = 0
    state_dim: int = 16
    decay_shape: str = "state"
    decay_init_exponents: tuple[float, float] = (1.0, 8.0)
    share_axes: bool = False
    output_coef: bool = True
    coef_init: str = "eq9"
    residual: bool = False
    chunk_size: int = 16
    dtype: Any = None
    param_dtype: Any = jnp.float32

    def __post_init__(self):
        _check_grid(self.grid_shape, self.num_prefix)
        check_tpe_settings(self)
        if self.coef_init not in COEF_INITS:
            raise ValueError(f"unknown coef_init {self.coef_init!r}; valid: {list(COEF_INITS)}")
        super().__post_init__()

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        grid = tuple(self.grid_shape)
        B, N, D = x.shape
        _check_tokens(N, grid, self.num_prefix, "MdTpe")
        k, E = len(grid), self.state_dim
        A = 1 if self.share_axes else k
        P = 1 if self.decay_shape == "state" else D
        logits = np.broadcast_to(decay_logits(E, self.decay_init_exponents), (A, P, E))
        b_value = 1.0 if self.coef_init == "eq9" else 1.0 / (k * E)

        def constant(values, names):
            def init(key, shape, dtype=jnp.float32):
                del key
                return jnp.broadcast_to(jnp.asarray(values, dtype), shape)
            return nn.with_logical_partitioning(init, names)

        logit = self.param("decay_logit", constant(logits, (None, None, None)), (A, P, E),
                           self.param_dtype)
        b = self.param("b", constant(b_value, (None, "embed", None)), (A, D, E),
                       self.param_dtype)
        cdt = jnp.promote_types(x.dtype, jnp.float32)
        coef = b.astype(cdt)
        if self.output_coef:
            c = self.param("c", constant(1.0, (None, "embed", None)), (A, D, E),
                           self.param_dtype)
            coef = coef * c.astype(cdt)
        log_lam = jax.nn.log_sigmoid(logit.astype(cdt))

        prefix, xg = x[:, :self.num_prefix], x[:, self.num_prefix:].astype(cdt)
        xg = xg.reshape(B, *grid, D)
        y = jnp.zeros_like(xg)
        for s in range(k):
            a = 0 if self.share_axes else s
            xs = jnp.moveaxis(xg, 1 + s, -2)  # [B, ..., N_s, D]
            lead = xs.shape[:-2]
            ys, _ = toeplitz_ssm(xs.reshape(-1, grid[s], D), log_lam[a], coef[a],
                                 chunk_size=self.chunk_size)
            y = y + jnp.moveaxis(ys.reshape(*lead, grid[s], D), -2, 1 + s)
        if self.residual:
            y = y + xg
        out_dtype = self.dtype or x.dtype
        y = y.reshape(B, N - self.num_prefix, D).astype(out_dtype)
        return jnp.concatenate([prefix.astype(out_dtype), y], axis=1)
