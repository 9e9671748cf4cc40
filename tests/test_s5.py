"""The S5 reference mixer (lion_jax/layers/s5.py) against its recurrence written out in
float64 numpy, its HiPPO-N initialisation, padding and bad arguments."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lion_jax.layers.hippo import hippo_normal
from lion_jax.layers.s5 import S5Mixer

B, L, D, H, N = 2, 11, 6, 2, 4  # odd length; P = H * N = 8 state channels


def _params(layer, x, rng):
    return layer.init(jax.random.key(int(rng.integers(2 ** 31))), x)


def _reference(p, u):
    """The two walks and the readout token by token, complex128."""
    def c(name):
        return np.asarray(p[name], np.float64) @ np.array([1, 1j])
    lam = -np.exp(np.asarray(p["lambda_log_re"], np.float64)) + 1j * np.asarray(
        p.get("lambda_im", 0.0), np.float64)
    step = np.exp(np.asarray(p["log_step"], np.float64))
    lam_bar = np.exp(lam * step)
    b_bar = ((lam_bar - 1) / lam)[:, None] * c("B")
    y = np.zeros(u.shape)
    backward = c("C_backward") if "C_backward" in p else c("C_forward")
    for order, cw in ((range(L), c("C_forward")), (range(L - 1, -1, -1), backward)):
        state = np.zeros((u.shape[0], lam.size), complex)
        for t in order:
            state = lam_bar * state + u[:, t] @ b_bar.T
            y[:, t] += (state @ cw.T).real
    return y + np.asarray(p.get("D", 0.0), np.float64) * u


@pytest.mark.parametrize("real_eigenvalues,tied_readout,feedthrough", [
    (False, False, True), (False, True, True), (True, False, True), (True, True, True),
    (False, True, False)])
def test_matches_the_recurrence(rng, real_eigenvalues, tied_readout, feedthrough):
    x = jnp.asarray(rng.standard_normal((B, L, D)), jnp.float32)
    layer = S5Mixer(num_heads=H, head_dim=N, real_eigenvalues=real_eigenvalues,
                    tied_readout=tied_readout, feedthrough=feedthrough)
    p = nn.unbox(_params(layer, x, rng))["params"]
    assert ("lambda_im" in p) != real_eigenvalues and ("C_backward" in p) != tied_readout
    assert ("D" in p) == feedthrough
    y = layer.apply({"params": p}, x)
    assert y.shape == x.shape and y.dtype == jnp.float32
    expected = _reference(p, np.asarray(x, np.float64))
    assert np.linalg.norm(y - expected) / np.linalg.norm(expected) < 1e-5
    if real_eigenvalues and tied_readout:  # a symmetric filter: reversing commutes with it
        flipped = layer.apply({"params": p}, x[:, ::-1])
        np.testing.assert_allclose(flipped[:, ::-1], y, rtol=1e-4, atol=1e-5)


def test_init_is_block_diagonal_hippo_normal(rng):
    x = jnp.zeros((1, L, D))
    layer = S5Mixer(num_heads=H, head_dim=N, dt_range=(0.01, 0.05))
    p = nn.unbox(_params(layer, x, rng))["params"]
    values, vectors = hippo_normal(N)
    np.testing.assert_allclose(values.real, -0.5, atol=1e-12)
    np.testing.assert_allclose(vectors.conj().T @ vectors, np.eye(N), atol=1e-12)
    k = np.arange(N)
    legs = np.where(k[:, None] > k[None, :], -np.sqrt(np.outer(2 * k + 1, 2 * k + 1)),
                    np.where(k[:, None] == k[None, :], -(k[:, None] + 1.0), 0.0))
    normal = legs + np.outer(np.sqrt(k + 0.5), np.sqrt(k + 0.5))  # HiPPO-LegS + p p^T
    np.testing.assert_allclose(vectors @ np.diag(values) @ vectors.conj().T, normal, atol=1e-10)
    np.testing.assert_allclose(-np.exp(p["lambda_log_re"]), np.tile(values.real, H), rtol=1e-6)
    np.testing.assert_allclose(p["lambda_im"], np.tile(values.imag, H), rtol=1e-5, atol=1e-6)
    step = np.exp(np.asarray(p["log_step"]))
    assert np.all((step >= 0.01 * (1 - 1e-6)) & (step <= 0.05 * (1 + 1e-6)))
    assert p["B"].shape == (H * N, D, 2) and p["C_forward"].shape == (D, H * N, 2)


def test_padding_does_not_reach_real_tokens(rng):
    x = jnp.asarray(rng.standard_normal((B, L, D)), jnp.float32)
    mask = jnp.arange(L)[None, :] < jnp.array([[L], [L - 4]])
    layer = S5Mixer(num_heads=H, head_dim=N)
    params = _params(layer, x, rng)
    noisy = jnp.where(mask[..., None], x, 100.0)
    y1, y2 = (layer.apply(params, t, mask) for t in (x, noisy))
    np.testing.assert_allclose(np.where(mask[..., None], y1, 0), np.where(mask[..., None], y2, 0),
                               rtol=1e-5, atol=1e-5)
    short = layer.apply(params, x[1:, :L - 4])
    np.testing.assert_allclose(y1[1, :L - 4], short[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_heads=0), "num_heads must be positive"),
    (dict(dt_range=(0.1, 0.01)), "dt_range"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        S5Mixer(**dict(dict(num_heads=H, head_dim=N), **kwargs))
