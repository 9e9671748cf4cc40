"""Tests for lion_jax.layers.cosformer2: cosFormer2's token mixer (LRPE, norm, low-rank gate,
no decay) and its TPE (digest scaling-laws-linear-lms.md sections 1.4, 1.5, 2.2; LightNet
digest 3.1).

Layers run jitted, one compiled function per configuration (:func:`compiled`): on CPU one
compile per shape is cheaper than eager dispatch. ``offset`` is passed as a traced int32
scalar throughout (one compile serves every offset).
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lion_jax.layers.cosformer2 import CosFormer2Attention, Tpe, lrpe_thetas

B, L, D, K = 2, 37, 16, 8  # two heads of 8; L not a multiple of the chunk
H = D // K
E = 8  # TPE states
CHUNK = 16


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300)


def make(**kwargs):
    return CosFormer2Attention(**(dict(head_dim=K, chunk_size=CHUNK) | kwargs))


def make_tpe(**kwargs):
    return Tpe(**(dict(state_dim=E, chunk_size=CHUNK) | kwargs))


@functools.cache
def compiled(kind="mixer", **kwargs):
    """``(init, apply)`` of the mixer or the TPE, jitted once per configuration."""
    module = make(**kwargs) if kind == "mixer" else make_tpe(**kwargs)
    return jax.jit(module.init), jax.jit(module.apply, static_argnames=("return_state",))


def offset32(offset):
    return jnp.asarray(offset, jnp.int32)


def apply(params, x, kind="mixer", *, state=None, offset=0, return_state=False, **kwargs):
    return compiled(kind, **kwargs)[1](params, x, state=state, offset=offset32(offset),
                                       return_state=return_state)


def random_input(rng, length=L):
    return jnp.asarray(rng.standard_normal((B, length, D)), jnp.float32)


def init(rng, kind="mixer", **kwargs):
    x = random_input(rng)
    params = compiled(kind, **kwargs)[0](jax.random.key(int(rng.integers(2 ** 31))), x)
    return nn.meta.unbox(params), x


def swish(t):
    return t / (1.0 + np.exp(-t))


def numpy_oracle(params, x, offset, eps=1e-6, srms=False):
    """Digest 1.4 / 1.5 in float64: LRPE features with positions ``offset + t``, the linear
    attention recurrence ``kv_t = kv_{t-1} + k~_t v_t^T``, ``o_t = kv_t^T q~_t``, then
    ``(RMSNorm(concat) * sigmoid(x W_gdown W_gup)) W_o``. Also checks the recurrence against
    the explicit weighting ``sum_s sum_c q_tc k_sc cos((t - s) theta_c) v_s``."""
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params["params"])
    x = np.asarray(x, np.float64)
    q, k, v = swish(x @ p["query"]["kernel"]), swish(x @ p["key"]["kernel"]), x @ p["value"][
        "kernel"]
    theta = p["lrpe_theta"]
    pos = offset + np.arange(L, dtype=np.float64)
    out = np.zeros_like(v)
    for i in range(H):
        cols = slice(i * K, (i + 1) * K)
        angle = pos[:, None] * theta[cols][None]
        feats = lambda t: np.concatenate([t[..., cols] * np.cos(angle),  # noqa: E731
                                          t[..., cols] * np.sin(angle)], axis=-1)
        qf, kf = feats(q), feats(k)
        for b in range(B):
            kv = np.zeros((2 * K, K))
            for t in range(L):
                kv = kv + np.outer(kf[b, t], v[b, t, cols])
                out[b, t, cols] = kv.T @ qf[b, t]
            weights = np.einsum("tc,sc,tsc->ts", q[b, :, cols], k[b, :, cols],
                                np.cos(angle[:, None] - angle[None, :])) * np.tri(L)
            np.testing.assert_allclose(out[b, :, cols], weights @ v[b, :, cols], atol=1e-9)
    ms = np.mean(out ** 2, axis=-1, keepdims=True)
    if srms:  # TNL's SRMSNorm
        normed = out / (np.sqrt(ms) + 1e-8)
    else:
        normed = out / np.sqrt(ms + eps) * p["output_norm"]["scale"]
    gate = 1 / (1 + np.exp(-(x @ p["gate_down"]["kernel"] @ p["gate_up"]["kernel"])))
    return (normed * gate) @ p["out"]["kernel"]


@pytest.mark.parametrize("norm", ["rmsnorm", "srmsnorm"])
def test_matches_numpy_recurrence(rng, norm):
    params, x = init(rng, output_norm=norm)
    offset = int(rng.integers(0, 100))
    y = apply(params, x, offset=offset, output_norm=norm)
    assert y.shape == x.shape and y.dtype == jnp.float32
    assert rel_err(y, numpy_oracle(params, x, offset, srms=norm == "srmsnorm")) < 1e-5


def test_impls_agree(rng):
    """float32 "chunk" and "recurrent" outputs match "attention" to 1e-5."""
    params, x = init(rng)
    ys = {impl: apply(params, x, offset=7, impl=impl)
          for impl in ("attention", "chunk", "recurrent")}
    for impl in ("chunk", "recurrent"):
        assert rel_err(ys[impl], ys["attention"]) < 1e-5, impl


def test_prefill_then_continue_equals_full_forward(rng):
    """Prefill (return_state), then the rest with state=..., offset=P, for several splits and
    one-token steps, equals the full forward (chunk 16, L = 37, a nonzero start offset)."""
    params, x = init(rng)
    start = int(rng.integers(0, 50))
    run = functools.partial(apply, params, impl="chunk", return_state=True)
    full, _ = run(x, offset=start)
    for split in (1, 16, 21):
        y1, state = run(x[:, :split], offset=start)
        assert state.shape == (B, H, 2 * K, K) and state.dtype == jnp.float32
        y2, _ = run(x[:, split:], state=state, offset=start + split)
        assert rel_err(jnp.concatenate([y1, y2], axis=1), full) < 1e-5, split
    ys, state = run(x[:, :21], offset=start)
    ys = [ys]
    for t in range(21, L):
        y, state = run(x[:, t:t + 1], state=state, offset=start + t)
        ys.append(y)
    assert rel_err(jnp.concatenate(ys, axis=1), full) < 1e-5


def test_causal_and_relative(rng):
    """Changing tokens from t on never changes earlier outputs; without a state the output
    does not depend on the offset (LRPE sees only t - s)."""
    params, x = init(rng)
    y = apply(params, x)
    t = int(rng.integers(1, L))
    x2 = x.at[:, t:].set(random_input(rng, L - t) * 3)
    y2 = apply(params, x2)
    np.testing.assert_allclose(y2[:, :t], y[:, :t], rtol=1e-6, atol=1e-6)
    assert not np.allclose(y2[:, t:], y[:, t:])
    assert rel_err(apply(params, x, offset=int(rng.integers(1, 60))), y) < 1e-4


def count(tree):
    return sum(int(np.prod(a.shape)) for a in jax.tree.leaves(tree))


def shapes(module):
    return jax.eval_shape(module.init, jax.random.key(0),
                          jax.ShapeDtypeStruct((1, 3, D), jnp.float32))


def test_parameter_count():
    """Digest 2.2: token mixer 4 d^2 + 2 d t (t = d/h = K), plus theta (d) and the norm scale
    (d), which the paper does not count; TPE d e (plus e decays, or d e per channel)."""
    d, t = D, K
    assert count(shapes(make())) == 4 * d * d + 2 * d * t + d + d
    assert count(shapes(make(lrpe_learnable=False, output_norm="srmsnorm"))) == (
        4 * d * d + 2 * d * t)
    assert count(shapes(make(gate_rank=3))) == 4 * d * d + 2 * d * 3 + 2 * d
    assert count(shapes(make_tpe())) == d * E + E
    assert count(shapes(make_tpe(decay_shape="channel"))) == 2 * d * E


def test_lrpe_thetas():
    width = lrpe_thetas(H, K, "width")
    np.testing.assert_allclose(width, 10000.0 ** (-2 * np.arange(H * K) / (H * K)))
    head = lrpe_thetas(H, K, "head").reshape(H, K)
    np.testing.assert_allclose(head[1], 10000.0 ** (-2 * np.arange(K) / K))
    np.testing.assert_array_equal(head[0], head[1])


def random_tpe_params(rng, decay_shape):
    params, x = init(rng, "tpe", decay_shape=decay_shape)
    p = params["params"]
    p["coef"] = jnp.asarray(rng.standard_normal(p["coef"].shape) / E, jnp.float32)
    p["decay_logit"] = jnp.asarray(rng.uniform(-1.0, 4.5, p["decay_logit"].shape), jnp.float32)
    return params, x


@pytest.mark.parametrize("decay_shape", ["state", "channel"])
def test_tpe_matches_numpy_recurrence(rng, decay_shape):
    """``h_t = lambda h_{t-1} + b x_t``, ``y_t = sum_j h_t[:, j]`` as a loop, and as the
    explicit Toeplitz product ``T_r[c] = sum_j b[c, j] lambda_j^r``."""
    params, x = random_tpe_params(rng, decay_shape)
    y = apply(params, x, "tpe", offset=5, decay_shape=decay_shape)
    coef = np.asarray(params["params"]["coef"], np.float64)
    lam = 1 / (1 + np.exp(-np.asarray(params["params"]["decay_logit"], np.float64)))
    xn = np.asarray(x, np.float64)
    h = np.zeros((B, D, E))
    want = np.zeros((B, L, D))
    for t in range(L):
        h = lam * h + coef * xn[:, t, :, None]
        want[:, t] = h.sum(-1)
    kernel = np.sum(lam[None] ** np.arange(L)[:, None, None] * coef, axis=-1)  # [L, D]
    lag = np.subtract.outer(np.arange(L), np.arange(L))
    toeplitz = np.where((lag >= 0)[..., None], kernel[np.maximum(lag, 0)], 0.0)
    np.testing.assert_allclose(np.einsum("ijd,bjd->bid", toeplitz, xn), want, atol=1e-9)
    assert y.dtype == jnp.float32 and rel_err(y, want) < 1e-5


def test_tpe_prefill_then_continue(rng):
    """TPE: prefill + continuation (splits and one-token steps) equals the full forward, and
    the chunk size does not change the output."""
    params, x = random_tpe_params(rng, "state")
    run = functools.partial(apply, params, kind="tpe", return_state=True)
    full, _ = run(x)
    for split in (1, 16, 21):
        y1, state = run(x[:, :split])
        assert state.shape == (B, D, E) and state.dtype == jnp.float32
        y2, _ = run(x[:, split:], state=state, offset=split)
        assert rel_err(jnp.concatenate([y1, y2], axis=1), full) < 1e-5, split
    ys, state = run(x[:, :21])
    ys = [ys]
    for t in range(21, L):
        y, state = run(x[:, t:t + 1], state=state, offset=t)
        ys.append(y)
    assert rel_err(jnp.concatenate(ys, axis=1), full) < 1e-5
    assert rel_err(apply(params, x, "tpe", chunk_size=5), full) < 1e-5


@pytest.mark.parametrize("make_bad,match", [
    (lambda: make(impl="triton"), "unknown impl"),
    (lambda: make(layer_index=1, num_layers=1), "layer_index must be in"),
    (lambda: make(lrpe_span="model"), "unknown lrpe_span"),
    (lambda: make(output_norm="layernorm"), "unknown output_norm"),
    (lambda: make(gate_rank=0), "gate_rank must be positive"),
    (lambda: make_tpe(decay_shape="head"), "unknown decay_shape"),
    (lambda: make_tpe(state_dim=0), "state_dim must be positive"),
    (lambda: make(head_dim=5).init(jax.random.key(0), jnp.zeros((1, 3, D))),
     "not a multiple of head_dim"),
    (lambda: make().init(jax.random.key(0), jnp.zeros((1, 3, D)), offset=1.5),
     "offset must be an integer"),
])
def test_bad_settings(make_bad, match):
    with pytest.raises(ValueError, match=match) as info:
        make_bad()
    assert "\n" not in str(info.value)


def test_bfloat16_is_finite_and_close(rng):
    params, x = init(rng)
    y32 = apply(params, x, offset=3)
    y16, state = apply(params, x.astype(jnp.bfloat16), offset=3, return_state=True,
                       dtype=jnp.bfloat16)
    assert y16.dtype == jnp.bfloat16 and state.dtype == jnp.float32
    assert np.all(np.isfinite(np.asarray(y16, np.float32))) and rel_err(y16, y32) < 3e-2
    tpe_params, _ = init(rng, "tpe")
    t16 = apply(tpe_params, x.astype(jnp.bfloat16), "tpe")
    assert t16.dtype == jnp.bfloat16 and np.all(np.isfinite(np.asarray(t16, np.float32)))
    assert rel_err(t16, apply(tpe_params, x, "tpe")) < 3e-2
