"""LightNet's MD-TPE and MD-LRPE (lion_jax.layers.md_pe; digest papers/digests/lightnet.md
sections 3.1, 3.2, 2.7 and 6.2 checks 5-7): the per-axis scans against an explicit Toeplitz
product in 1-D, 2-D and 3-D, the 1-D reduction to cosFormer2's Tpe, MD-LRPE's relative and
translation-invariant scores, flatten-order invariance of the non-causal linear attention,
prefix tokens and argument checks."""

import math

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lion_jax.layers.cosformer2 import Tpe
from lion_jax.layers.md_pe import (MdLrpe, MdTpe, grid_positions, md_lrpe,
                                   md_lrpe_thetas)

B, D, E = 2, 5, 3


def _init(module, x, rng):
    return flax.linen.meta.unbox(module.init(jax.random.PRNGKey(int(rng.integers(2**31))), x))


def _random_tpe_params(rng, params):
    """Random ``lambda`` in about (0.27, 0.99), ``b`` and ``c`` around 1, float64."""
    p = dict(params["params"])
    p["decay_logit"] = rng.uniform(-1.0, 4.5, p["decay_logit"].shape)
    p["b"] = rng.normal(size=p["b"].shape)
    if "c" in p:
        p["c"] = rng.normal(size=p["c"].shape)
    return {"params": jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), p)}


def _toeplitz_oracle(x, p, grid, num_prefix, share_axes, residual):
    """``y = sum_s T^{(s)} x`` along each axis, with the explicit lower-triangular Toeplitz
    kernel ``t_r[d] = sum_j c_j lambda_j^r b_j`` (numpy, float64)."""
    lam = 1 / (1 + np.exp(-np.asarray(p["decay_logit"], np.float64)))  # [A, P, E]
    coef = np.asarray(p["b"], np.float64)
    if "c" in p:
        coef = coef * np.asarray(p["c"], np.float64)
    xg = np.asarray(x, np.float64)[:, num_prefix:].reshape(x.shape[0], *grid, x.shape[-1])
    y = xg.copy() if residual else np.zeros_like(xg)
    for s, n in enumerate(grid):
        a = 0 if share_axes else s
        r = np.arange(n)
        kernel = np.sum(lam[a][None] ** r[:, None, None] * coef[a][None], -1)  # [n, D]
        lag = np.subtract.outer(r, r)
        toep = np.where((lag >= 0)[..., None], kernel[np.maximum(lag, 0)], 0.0)  # [n, n, D]
        xs = np.moveaxis(xg, 1 + s, -2)
        ys = np.einsum("ijd,...jd->...id", toep, xs)
        y = y + np.moveaxis(ys, -2, 1 + s)
    out = np.asarray(x, np.float64).copy()
    out[:, num_prefix:] = y.reshape(x.shape[0], -1, x.shape[-1])
    return out


@pytest.mark.parametrize("grid,num_prefix,kw", [
    ((23,), 0, dict(chunk_size=4)),
    ((23,), 2, dict(chunk_size=1, decay_shape="channel")),
    ((5, 7), 1, dict(chunk_size=3)),
    ((5, 7), 0, dict(decay_shape="channel", share_axes=True, residual=True)),
    ((3, 4, 5), 1, dict(chunk_size=2, output_coef=False)),
    ((3, 4, 5), 0, dict(decay_shape="channel", residual=True, chunk_size=16)),
])
def test_md_tpe_scan_matches_explicit_toeplitz(rng, grid, num_prefix, kw):
    """MD-TPE (Eq. 9) per-axis scans == the explicit Toeplitz matmul along each axis, summed,
    in float64; prefix tokens unchanged."""
    N = num_prefix + math.prod(grid)
    module = MdTpe(grid_shape=grid, num_prefix=num_prefix, state_dim=E, **kw)
    with jax.enable_x64(True):
        x = jnp.asarray(rng.normal(size=(B, N, D)), jnp.float64)
        params = _random_tpe_params(rng, _init(module, x, rng))
        y = jax.jit(module.apply)(params, x)
        assert y.shape == x.shape and y.dtype == jnp.float64
        assert np.isfinite(np.asarray(y)).all()
        want = _toeplitz_oracle(x, params["params"], grid, num_prefix,
                                kw.get("share_axes", False), kw.get("residual", False))
        np.testing.assert_allclose(np.asarray(y), want, rtol=1e-10, atol=1e-10)
        np.testing.assert_array_equal(np.asarray(y[:, :num_prefix]),
                                      np.asarray(x[:, :num_prefix]))


def test_md_tpe_defaults_and_float32(rng):
    """Defaults: the literal Eq. 9 kernel (b = c = 1, so t_0 = e per axis), per-axis
    parameters; float32 input gives float32 output matching the float64 oracle."""
    grid = (4, 6)
    module = MdTpe(grid_shape=grid, num_prefix=1)
    x = jnp.asarray(rng.normal(size=(B, 1 + 24, D)), jnp.float32)
    params = _init(module, x, rng)
    p = params["params"]
    assert p["decay_logit"].shape == (2, 1, 16) and p["b"].shape == (2, D, 16)
    assert np.all(np.asarray(p["b"]) == 1) and np.all(np.asarray(p["c"]) == 1)
    y = module.apply(params, x)
    assert y.dtype == jnp.float32 and np.isfinite(np.asarray(y)).all()
    want = _toeplitz_oracle(x, p, grid, 1, False, False)
    assert np.abs(np.asarray(y, np.float64) - want).max() <= 1e-5 * np.abs(want).max()
    unit = MdTpe(grid_shape=grid, num_prefix=1, coef_init="unit", state_dim=8)
    pu = _init(unit, x, rng)["params"]
    np.testing.assert_allclose(np.asarray(pu["b"]), 1 / 16)


@pytest.mark.parametrize("decay_shape", ["state", "channel"])
def test_md_tpe_1d_is_cosformer2_tpe(rng, decay_shape):
    """On a 1-D grid with c = 1, MD-TPE is cosFormer2's Tpe (same recurrence and lambda
    parameterisation; Tpe's coef is b)."""
    L = 29
    x = jnp.asarray(rng.normal(size=(B, L, D)), jnp.float32)
    tpe = Tpe(state_dim=E, decay_shape=decay_shape, chunk_size=8)
    tp = _init(tpe, x, rng)
    tp = {"params": {"coef": jnp.asarray(rng.normal(size=(D, E)), jnp.float32),
                     "decay_logit": jnp.asarray(rng.uniform(-1, 4.5, tp["params"][
                         "decay_logit"].shape), jnp.float32)}}
    md = MdTpe(grid_shape=(L,), state_dim=E, decay_shape=decay_shape, chunk_size=8)
    mp = _init(md, x, rng)
    mp["params"]["decay_logit"] = tp["params"]["decay_logit"][None]
    mp["params"]["b"] = tp["params"]["coef"][None]
    want = tpe.apply(tp, x)
    got = md.apply(mp, x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    md_nc = MdTpe(grid_shape=(L,), state_dim=E, decay_shape=decay_shape, chunk_size=8,
                  output_coef=False)
    got = md_nc.apply({"params": {k: v for k, v in mp["params"].items() if k != "c"}}, x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def _scores(qt, kt):
    """``P(q_n) . P(k_m)`` per batch and head: ``[B, H, N, M]``."""
    return np.einsum("bnhk,bmhk->bhnm", np.asarray(qt), np.asarray(kt))


@pytest.mark.parametrize("grid,span,shared", [((5, 7), "head", False),
                                              ((3, 4, 5), "width", False),
                                              ((3, 5, 2), "head", True)])
def test_md_lrpe_relative_and_translation_invariant(rng, grid, span, shared):
    """``P_n(q) . P_m(k) = sum_j q_j k_j cos((m - n)_{axis(j)} theta_j)``, and shifting every
    coordinate by the same grid offset leaves all scores unchanged (float64)."""
    k, H, K = len(grid), 2, 2 * len(grid)
    N = math.prod(grid)
    theta = md_lrpe_thetas(H, K, k, span, shared)
    pos = grid_positions(grid)
    with jax.enable_x64(True):
        q = jnp.asarray(rng.normal(size=(B, N, H, K)))
        kk = jnp.asarray(rng.normal(size=(B, N, H, K)))
        qt, kt = md_lrpe(q, theta, pos), md_lrpe(kk, theta, pos)
        assert qt.shape == (B, N, H, 2 * K) and qt.dtype == jnp.float64
        got = _scores(qt, kt)
        axis = np.repeat(np.arange(k), K // k)
        diff = (pos[None, :, :] - pos[:, None, :])[..., axis]  # [n, m, K]: (m - n)_axis(j)
        th = np.asarray(theta, np.float64)
        want = np.einsum("bnhj,bmhj,nmhj->bhnm", np.asarray(q), np.asarray(kk),
                         np.cos(diff[:, :, None, :] * th[None, None]))
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
        shift = rng.integers(-9, 10, size=k)
        shifted = _scores(md_lrpe(q, theta, pos + shift), md_lrpe(kk, theta, pos + shift))
        np.testing.assert_allclose(shifted, got, rtol=1e-9, atol=1e-9)
        assert np.isfinite(got).all()


@pytest.mark.parametrize("num_prefix", [0, 1])
def test_md_lrpe_flatten_order_invariance(rng, num_prefix):
    """Non-causal linear attention ``Q~ (K~^T V)`` with MD-LRPE: row-major and column-major
    flattening of a 5 x 7 grid (coordinates carried along) give the same outputs once
    un-permuted (float64)."""
    Hg, Wg, H, K, V = 5, 7, 2, 4, 3
    pe = MdLrpe(num_heads=H, head_dim=K, grid_shape=(Hg, Wg), num_prefix=num_prefix)
    with jax.enable_x64(True):
        q, k = (rng.normal(size=(B, Hg, Wg, H, K)) for _ in range(2))
        v = rng.normal(size=(B, Hg, Wg, H, V))
        pre = [rng.normal(size=(B, num_prefix, H, d)) for d in (K, K, V)]

        def flat(a, p, order):
            a = a if order == "C" else np.swapaxes(a, 1, 2)
            return jnp.asarray(np.concatenate([p, a.reshape(B, Hg * Wg, H, -1)], 1))

        def attend(order):
            qt = pe.apply({}, flat(q, pre[0], order), order)
            kt = jax.nn.softmax(flat(k, pre[1], order), axis=1)  # LNA's softmax over tokens
            kt = pe.apply({}, kt, order)
            kv = jnp.einsum("bnhk,bnhv->bhkv", kt, flat(v, pre[2], order))
            return np.asarray(jnp.einsum("bnhk,bhkv->bnhv", qt, kv))

        row, col = attend("C"), attend("F")
        assert np.isfinite(row).all()
        np.testing.assert_allclose(col[:, :num_prefix], row[:, :num_prefix], rtol=1e-10,
                                   atol=1e-10)
        col_grid = np.swapaxes(col[:, num_prefix:].reshape(B, Wg, Hg, H, V), 1, 2)
        np.testing.assert_allclose(col_grid.reshape(B, Hg * Wg, H, V), row[:, num_prefix:],
                                   rtol=1e-10, atol=1e-10)


def test_md_lrpe_prefix_and_module(rng):
    """Prefix tokens get no rotation (``[x, 0]``); grid token 0 (coordinate 0) neither; the
    learnable module holds theta [H, K] = md_lrpe_thetas and matches the function."""
    grid, H, K, P = (3, 4, 2), 2, 6, 2
    N = P + math.prod(grid)
    x = jnp.asarray(rng.normal(size=(B, N, H, K)), jnp.float32)
    pe = MdLrpe(num_heads=H, head_dim=K, grid_shape=grid, num_prefix=P, learnable=True)
    params = _init(pe, x, rng)
    theta = np.asarray(params["params"]["theta"])
    np.testing.assert_array_equal(theta, md_lrpe_thetas(H, K, 3))
    y = np.asarray(pe.apply(params, x))
    assert y.shape == (B, N, H, 2 * K) and np.isfinite(y).all()
    for t in range(P + 1):
        np.testing.assert_array_equal(y[:, t, :, :K], np.asarray(x[:, t]))
        np.testing.assert_array_equal(y[:, t, :, K:], 0.0)
    np.testing.assert_allclose(y, md_lrpe(x, theta, grid_positions(grid, P)), rtol=1e-6)
    pos = grid_positions(grid, P)
    assert pos.shape == (N, 3) and (pos[:P] == 0).all() and tuple(pos[-1]) == (2, 3, 1)
    np.testing.assert_array_equal(pos[P + 1], (0, 0, 1))  # row-major: last axis fastest


def _one_line_error(fn, match):
    with pytest.raises(ValueError, match=match) as info:
        fn()
    assert "\n" not in str(info.value)


def test_errors(rng):
    x = jnp.zeros((1, 13, D))
    _one_line_error(lambda: MdTpe(grid_shape=(3, 4)).init(jax.random.PRNGKey(0), x),
                    "13 tokens")
    _one_line_error(lambda: MdTpe(grid_shape=(3, 4), num_prefix=2).init(
        jax.random.PRNGKey(0), x), "num_prefix")
    _one_line_error(lambda: MdTpe(grid_shape=(3, 0)), "positive")
    _one_line_error(lambda: MdTpe(grid_shape=()), "non-empty")
    _one_line_error(lambda: MdTpe(grid_shape=(3,), coef_init="ones"), "coef_init")
    _one_line_error(lambda: MdTpe(grid_shape=(3,), decay_shape="axis"), "decay_shape")
    q = jnp.zeros((1, 12, 2, 5))
    _one_line_error(lambda: md_lrpe(q, np.ones((2, 5)), grid_positions((3, 4))),
                    "divisible")
    _one_line_error(lambda: MdLrpe(num_heads=2, head_dim=5, grid_shape=(3, 4)), "divisible")
    _one_line_error(lambda: md_lrpe_thetas(2, 6, 4), "divisible")
    pe = MdLrpe(num_heads=2, head_dim=4, grid_shape=(3, 4), num_prefix=1)
    _one_line_error(lambda: pe.apply({}, jnp.zeros((1, 12, 2, 4))), "12 tokens")
    _one_line_error(lambda: pe.apply({}, jnp.zeros((1, 13, 2, 4)), "G"), "order")
    _one_line_error(lambda: md_lrpe(jnp.zeros((1, 12, 2, 4)), np.ones((2, 4)),
                                    grid_positions((3, 4)).astype(np.float32)), "integers")
