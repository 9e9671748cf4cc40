"""Tests for lion_jax.layers.hgrn2: HGRN2's token mixer and its layer-wise lower bounds
(digest scaling-laws-linear-lms.md sections 1.3, 1.5 and 2.2).

Layers run jitted, one compiled function per configuration (:func:`compiled`): on CPU one
compile per shape is cheaper than eager dispatch, which compiles every primitive anew.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lion_jax.layers.hgrn2 import (Hgrn2Attention, Hgrn2LowerBounds, forget_gate,
                                   lower_bounds_from_logits)

B, L, D, K = 2, 37, 16, 8  # two heads of 8; L not a multiple of the chunk
H = D // K
CHUNK = 16
NUM_LAYERS = 3


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300)


def make(layer_index=2, **kwargs):
    config = dict(head_dim=K, layer_index=layer_index, num_layers=NUM_LAYERS,
                  chunk_size=CHUNK) | kwargs
    return Hgrn2Attention(**config)


@functools.cache
def compiled(layer_index=2, **kwargs):
    """``(init, apply)`` of ``make(layer_index, **kwargs)``, jitted once per configuration."""
    layer = make(layer_index, **kwargs)
    return jax.jit(layer.init), jax.jit(layer.apply, static_argnames=("return_state",))


def apply(params, x, bounds, layer_index=2, **kwargs):
    """The layer's output (``return_state`` and ``state`` may be passed in ``kwargs``)."""
    config = {k: v for k, v in kwargs.items() if k not in ("state", "return_state")}
    call = {k: v for k, v in kwargs.items() if k in ("state", "return_state")}
    return compiled(layer_index, **config)[1](params, x, lower_bounds=bounds, **call)


def setup(rng, layer_index=2, mode="fla", **kwargs):
    """``(params, x, bounds)`` with random bound logits."""
    x = jnp.asarray(rng.standard_normal((B, L, D)), jnp.float32)
    bounds = lower_bounds_from_logits(jnp.asarray(rng.standard_normal((NUM_LAYERS, D))), mode)
    params = compiled(layer_index, **kwargs)[0](jax.random.key(int(rng.integers(2 ** 31))), x,
                                                lower_bounds=bounds)
    return params, x, bounds


def kernels(params):
    p = params["params"]
    get = lambda name: np.asarray(p[name]["kernel"].value, np.float64)  # noqa: E731
    scale = p["output_norm"]["scale"].value if "output_norm" in p else 1.0
    return get("query"), get("forget_gate"), get("value"), get("out"), np.asarray(
        scale, np.float64)


def numpy_oracle(params, x, lb, eps=1e-6, srms=False):
    """Digest 1.3 / 1.5 as a plain loop in float64:
    ``S_t = diag(f_t) S_{t-1} + (1 - f_t)^T h_t``, ``o_t = swish(og_t) S_t``, then
    ``RMSNorm(concat) W_o`` (``srms``: TNL's SRMSNorm, ``o / (rms(o) + 1e-8)``)."""
    w_q, w_f, w_h, w_o, scale = kernels(params)
    x = np.asarray(x, np.float64)
    sigmoid = lambda t: 1.0 / (1.0 + np.exp(-t))  # noqa: E731
    og = x @ w_q
    q = og * sigmoid(og)
    f = lb + (1.0 - lb) * sigmoid(x @ w_f)
    h = x @ w_h
    out = np.zeros_like(q)
    for b in range(B):
        for i in range(H):
            cols = slice(i * K, (i + 1) * K)
            S = np.zeros((K, K))
            for t in range(L):
                S = f[b, t, cols][:, None] * S + np.outer(1.0 - f[b, t, cols], h[b, t, cols])
                out[b, t, cols] = q[b, t, cols] @ S
    ms = np.mean(out ** 2, axis=-1, keepdims=True)
    normed = out / (np.sqrt(ms) + 1e-8) if srms else out / np.sqrt(ms + eps) * scale
    return normed @ w_o


@pytest.mark.parametrize("layer_index,norm", [(0, "rmsnorm"), (2, "rmsnorm"), (2, "srmsnorm")])
def test_matches_numpy_recurrence(rng, layer_index, norm):
    """The layer equals the digest's recurrence (section 1.5, per-channel decay) in float64."""
    params, x, bounds = setup(rng, layer_index, output_norm=norm)
    y = apply(params, x, bounds, layer_index, output_norm=norm)
    lb = np.asarray(bounds[layer_index], np.float64)
    if layer_index == 0:
        assert np.all(lb == 0.0)  # FLA's bound: none on the first layer
    assert y.shape == x.shape and y.dtype == jnp.float32
    assert rel_err(y, numpy_oracle(params, x, lb, srms=norm == "srmsnorm")) < 1e-5


def test_impls_agree(rng):
    """float32 "chunk" and "recurrent" outputs match "attention" to 1e-5."""
    params, x, bounds = setup(rng)
    ys = {impl: apply(params, x, bounds, impl=impl) for impl in ("attention", "chunk",
                                                                 "recurrent")}
    for impl in ("chunk", "recurrent"):
        assert rel_err(ys[impl], ys["attention"]) < 1e-5, impl


def test_prefill_then_continue_equals_full_forward(rng):
    """Prefill with return_state, then the rest with state=..., for several splits and
    one-token steps, equals the full forward (chunk form, chunk 16, L = 37)."""
    params, x, bounds = setup(rng)
    run = functools.partial(apply, params, bounds=bounds, impl="chunk", return_state=True)
    full, _ = run(x)
    for split in (1, 16, 21):
        y1, state = run(x[:, :split])
        assert state.shape == (B, H, K, K) and state.dtype == jnp.float32
        y2, _ = run(x[:, split:], state=state)
        assert rel_err(jnp.concatenate([y1, y2], axis=1), full) < 1e-5, split
    ys, state = run(x[:, :21])  # then one token at a time
    ys = [ys]
    for t in range(21, L):
        y, state = run(x[:, t:t + 1], state=state)
        ys.append(y)
    assert rel_err(jnp.concatenate(ys, axis=1), full) < 1e-5


def test_causal(rng):
    """Changing tokens from t on never changes outputs before t."""
    params, x, bounds = setup(rng)
    y = apply(params, x, bounds)
    t = int(rng.integers(1, L))
    x2 = x.at[:, t:].set(jnp.asarray(rng.standard_normal((B, L - t, D)), jnp.float32) * 3)
    y2 = apply(params, x2, bounds)
    np.testing.assert_allclose(y2[:, :t], y[:, :t], rtol=1e-6, atol=1e-6)
    assert not np.allclose(y2[:, t:], y[:, t:])


def count(tree):
    return sum(int(np.prod(a.shape)) for a in jax.tree.leaves(tree))


def test_parameter_count():
    """Digest 2.2: token mixer 4 d^2 per layer (W_og, W_fg, W_h, W_o; plus the output norm's
    scale, d, which the paper does not count) and l d for the lower bounds."""
    x = jax.ShapeDtypeStruct((1, 3, D), jnp.float32)
    key = jax.random.key(0)
    bounds = jax.ShapeDtypeStruct((NUM_LAYERS, D), jnp.float32)
    table = jax.eval_shape(Hgrn2LowerBounds(num_layers=NUM_LAYERS, width=D).init, key)
    assert count(table) == NUM_LAYERS * D
    total = count(table)
    for s in range(NUM_LAYERS):
        params = jax.eval_shape(lambda k, x, b: make(s).init(k, x, lower_bounds=b),
                                key, x, bounds)
        assert count(params) == 4 * D * D + D
        total += count(params) - D
    assert total == 4 * NUM_LAYERS * D ** 2 + NUM_LAYERS * D  # 4 l d^2 + l d
    bare = jax.eval_shape(lambda k, x, b: make(output_norm="srmsnorm").init(
        k, x, lower_bounds=b), key, x, bounds)
    assert count(bare) == 4 * D * D


def test_lower_bounds(rng):
    """FLA's bounds: 0 at layer 0, increasing, below 1 at the top; the paper's literal
    cumsum is exactly 1 at the top, where the mixer's key is 0 (output 0 from a zero state)."""
    logits = jnp.asarray(rng.standard_normal((NUM_LAYERS, D)), jnp.float32)
    fla = np.asarray(lower_bounds_from_logits(logits, "fla"))
    paper = np.asarray(lower_bounds_from_logits(logits, "paper"))
    p = np.exp(logits) / np.exp(logits).sum(0)
    np.testing.assert_allclose(paper, np.cumsum(p, 0), atol=1e-6)
    np.testing.assert_allclose(fla, np.cumsum(p, 0) - p[0], atol=1e-6)
    assert np.all(fla[0] == 0) and np.all(np.diff(fla, axis=0) > 0) and np.all(fla[-1] < 1)
    assert np.all(paper[-1] == 1.0)
    params, x, _ = setup(rng)
    y = apply(params, x, jnp.asarray(paper))  # layer_index 2 = the top layer
    assert np.all(y == 0)


def test_forget_gate_is_stable():
    """log f <= 0 and 1 - f match float64 for logits up to +-200 and bounds 0..1, with
    finite gradients (both where-branches are safe)."""
    z = np.array([-200.0, -90.0, -20.0, -3.0, -0.1, 0.0, 0.1, 3.0, 16.0, 30.0, 200.0])
    gate = jax.jit(forget_gate)
    for lb in (0.0, 1e-30, 0.3, 0.97, 1.0):
        lb = np.float32(lb)
        log_f, key = gate(jnp.asarray(z, jnp.float32), lb)
        zz, lb = np.asarray(jnp.asarray(z, jnp.float32), np.float64), float(lb)
        s, s_minus = 1 / (1 + np.exp(-zz)), 1 / (1 + np.exp(zz))
        want_log = np.log(s + lb * s_minus)  # s + lb (1 - s), without cancellation
        log_f, key = np.asarray(log_f, np.float64), np.asarray(key, np.float64)
        assert np.all(log_f <= 0) and np.all(np.isfinite(log_f)), lb
        np.testing.assert_allclose(key, (1 - lb) * s_minus, rtol=2e-6, atol=1e-37)
        np.testing.assert_allclose(log_f, want_log, rtol=2e-6, atol=1e-12)

    def total(z, lb):
        log_f, key = forget_gate(z, lb)
        return jnp.sum(log_f) + jnp.sum(key)

    grads = jax.jit(jax.grad(total, argnums=(0, 1)))(
        jnp.asarray(z, jnp.float32), jnp.asarray([0.0, 0.5, 1.0])[:, None])
    assert all(np.all(np.isfinite(g)) for g in grads)


@pytest.mark.parametrize("kwargs,match", [
    (dict(impl="triton"), "unknown impl"),
    (dict(layer_index=3), "layer_index must be in"),
    (dict(output_norm="layernorm"), "unknown output_norm"),
    (dict(query_activation="relu"), "unknown query_activation"),
    (dict(head_dim=0), "head_dim must be positive"),
])
def test_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match) as info:
        make(**kwargs)
    assert "\n" not in str(info.value)


def test_bad_call_arguments(rng):
    x = jnp.zeros((B, 3, D))
    bounds = jnp.zeros((NUM_LAYERS, D))
    key = jax.random.key(0)
    for call, match in [
        (lambda: make().init(key, x), "needs lower_bounds"),
        (lambda: make().init(key, x, lower_bounds=bounds[:2]), "lower_bounds must have"),
        (lambda: make(head_dim=5).init(key, x, lower_bounds=bounds),
         "not a multiple of head_dim"),
        (lambda: make(use_lower_bound=False).init(key, x, lower_bounds=bounds),
         "use_lower_bound=False"),
    ]:
        with pytest.raises(ValueError, match=match) as info:
            call()
        assert "\n" not in str(info.value)


def test_bfloat16_is_finite_and_close(rng):
    params, x, bounds = setup(rng)
    y32 = apply(params, x, bounds)
    y16, state = apply(params, x.astype(jnp.bfloat16), bounds, dtype=jnp.bfloat16,
                       return_state=True)
    assert y16.dtype == jnp.bfloat16 and state.dtype == jnp.float32
    assert np.all(np.isfinite(np.asarray(y16, np.float32)))
    assert rel_err(y16, y32) < 3e-2
