"""LLaMA's token mixer (lion_jax.layers.llama): RoPE, causality, the KV cache."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lion_jax.layers.llama import LlamaAttention
from lion_jax.layers.rotary import rope


def test_rope_is_a_rotation_by_relative_position(rng):
    K = 8
    q = jnp.asarray(rng.normal(size=(1, 1, 1, K)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(1, 1, 1, K)), jnp.float32)
    shift = int(rng.integers(1, 50))

    def score(i, j):
        return float(jnp.sum(rope(q, jnp.array([i])) * rope(k, jnp.array([j]))))

    np.testing.assert_allclose(score(7, 3), score(7 + shift, 3 + shift), rtol=1e-4)
    np.testing.assert_allclose(jnp.linalg.norm(rope(q, jnp.array([shift]))),
                               jnp.linalg.norm(q), rtol=1e-5)
    np.testing.assert_array_equal(rope(q, jnp.array([0])), q)  # position 0: no rotation
    # feature j pairs with j + K/2 at frequency 10000^(-2j/K)
    j, pos = 1, 5
    angle = pos * 10000.0 ** (-2 * j / K)
    out = rope(q, jnp.array([pos]))[0, 0, 0]
    x1, x2 = float(q[0, 0, 0, j]), float(q[0, 0, 0, j + K // 2])
    # each output is a sum of two products that may cancel: float32 rounding is bounded by the
    # products' size, not the sum's (seed 1349250860: 4.8e-9 off a sum of 4.5e-4)
    tol = dict(rtol=1e-5, atol=1e-6 * (abs(x1) + abs(x2)))
    np.testing.assert_allclose(out[j], x1 * np.cos(angle) - x2 * np.sin(angle), **tol)
    np.testing.assert_allclose(out[j + K // 2], x2 * np.cos(angle) + x1 * np.sin(angle), **tol)


def _layer(max_len=64):
    return LlamaAttention(num_heads=2, head_dim=8, max_len=max_len, impl="xla")


def _init(layer, x):
    return layer.init(jax.random.PRNGKey(0), x)


def test_causal(rng):
    x = jnp.asarray(rng.normal(size=(2, 13, 16)), jnp.float32)
    layer = _layer()
    params = _init(layer, x)
    y = layer.apply(params, x)
    t = int(rng.integers(1, 12))
    x2 = x.at[:, t:].set(jnp.asarray(rng.normal(size=(2, 13 - t, 16)), jnp.float32))
    np.testing.assert_allclose(layer.apply(params, x2)[:, :t], y[:, :t], atol=1e-6)
    assert not np.allclose(layer.apply(params, x2)[:, t:], y[:, t:])


@pytest.mark.parametrize("split", [1, 6, 12])
def test_prefill_then_steps_equal_the_full_forward(rng, split):
    L = 13
    x = jnp.asarray(rng.normal(size=(2, L, 16)), jnp.float32)
    layer = _layer()
    params = _init(layer, x)
    full = layer.apply(params, x)
    y, cache = layer.apply(params, x[:, :split], return_state=True)
    outs = [y]
    pos = split
    while pos < L:  # one token, then the rest in one call
        n = 1 if pos == split else L - pos
        y, cache = layer.apply(params, x[:, pos:pos + n], state=cache, offset=pos,
                               return_state=True)
        outs.append(y)
        pos += n
    np.testing.assert_allclose(jnp.concatenate(outs, axis=1), full, atol=2e-5, rtol=2e-5)


def test_traced_offset_in_a_decode_loop(rng):
    L = 9
    x = jnp.asarray(rng.normal(size=(1, L, 16)), jnp.float32)
    layer = _layer(max_len=16)
    params = _init(layer, x)
    full = layer.apply(params, x)
    _, cache = layer.apply(params, x[:, :4], return_state=True)

    @jax.jit
    def step(cache, token, offset):
        return layer.apply(params, token, state=cache, offset=offset, return_state=True)

    for t in range(4, L):
        y, cache = step(cache, x[:, t:t + 1], jnp.int32(t))
        np.testing.assert_allclose(y[:, 0], full[:, t], atol=2e-5, rtol=2e-5)


def test_cache_capacity_and_bad_settings(rng):
    x = jnp.zeros((1, 9, 16), jnp.float32)
    layer = _layer(max_len=8)
    params = _init(layer, x)  # the cache-free forward has no capacity limit
    with pytest.raises(ValueError, match="pass the KV cache's capacity max_len=8"):
        layer.apply(params, x, return_state=True)
    with pytest.raises(ValueError, match="head_dim must be even"):
        LlamaAttention(num_heads=2, head_dim=7)


def test_parameters_are_four_d_squared():
    """LLaMA's token mixer: W_q, W_k, W_v, W_o without biases, 4 d^2 (digest section 2.2)."""
    d = 32
    params = LlamaAttention(num_heads=4, head_dim=8).init(jax.random.PRNGKey(0),
                                                           jnp.zeros((1, 3, d)))
    assert sum(p.size for p in jax.tree.leaves(params)) == 4 * d * d


def test_bf16_is_finite(rng):
    x = jnp.asarray(rng.normal(size=(2, 11, 16)), jnp.bfloat16)
    layer = LlamaAttention(num_heads=2, head_dim=8, dtype=jnp.bfloat16)
    params = layer.init(jax.random.PRNGKey(1), x)
    y = layer.apply(params, x)
    assert y.dtype == jnp.bfloat16 and bool(jnp.all(jnp.isfinite(y)))
