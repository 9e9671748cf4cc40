"""pallas_kernels.lion_walk (LION's recurrence as a forward-only kernel) against the
materialized float64 reference, and lion_attention(impl="recurrent"), which runs it on a GPU
when no gradient is taken and the XLA recurrence when one is.

CPU (default): the Pallas interpreter. GPU: ``LION_TEST_GPU=1 pytest tests/test_lion_walk.py``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels
from lion_jax import ops
from lion_jax.ops import api

ON_GPU = jax.default_backend() == "gpu"
TOL = {jnp.float32: 1e-3 if ON_GPU else 1e-5, jnp.bfloat16: 5e-3}


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.all(np.isfinite(a)), "non-finite values in the kernel's result"
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def make_inputs(rng, B, L, H, K, V, dtype, decay, low=-2.0):
    q = jnp.asarray(np.abs(rng.standard_normal((B, L, H, K))) * K ** -0.5, dtype)
    k = jnp.asarray(np.abs(rng.standard_normal((B, L, H, K))), dtype)
    v = jnp.asarray(rng.standard_normal((B, L, H, V)), dtype)
    shape = {"head": (B, L, H), "value": (B, L, H, V)}.get(decay)
    g = None if shape is None else jnp.asarray(rng.uniform(low, 0.0, shape), jnp.float32)
    return q, k, v, g


def reference(q, k, v, g, **kwargs):
    with jax.enable_x64(True):
        f64 = lambda x: None if x is None else jnp.asarray(np.asarray(x, np.float64))  # noqa
        return np.asarray(ops.lion_attention(f64(q), f64(k), f64(v), f64(g), impl="attention",
                                             **kwargs))


CASES = [  # L, K, V, decay, normalize
    (1, 16, 16, "head", True),
    (37, 16, 16, "head", True),  # L not a multiple of the unroll
    (45, 6, 20, "value", True),  # small head dims, two V-blocks of 16
    (9, 16, 32, None, True),  # LION-LIT
    (50, 64, 64, "head", False),  # LION-RETNET-like, ViT head dims
    (23, 8, 8, "value", False),
]


@pytest.mark.parametrize("L,K,V,decay,normalize", CASES)
def test_matches_reference(rng, L, K, V, decay, normalize):
    q, k, v, g = make_inputs(rng, 2, L, 2, K, V, jnp.float32, decay)
    y = pallas_kernels.lion_walk(q, k, v, g, normalize=normalize)
    assert y.shape == v.shape and y.dtype == v.dtype
    err = rel_err(y, reference(q, k, v, g, normalize=normalize))
    assert err <= TOL[jnp.float32], err


def test_bf16_and_strongest_decay(rng):
    """bf16 in and out; log-decay -20 per token (every factor in [0, 1], nothing overflows)."""
    q, k, v, g = make_inputs(rng, 2, 70, 3, 16, 16, jnp.bfloat16, "head", low=-20.0)
    y = pallas_kernels.lion_walk(q, k, v, g)
    assert y.dtype == jnp.bfloat16
    assert rel_err(y, reference(q, k, v, g)) <= TOL[jnp.bfloat16]


def test_has_no_gradient(rng):
    q, k, v, g = make_inputs(rng, 1, 8, 1, 16, 16, jnp.float32, "head")
    with pytest.raises(ValueError, match="lion_walk has no gradient"):
        jax.grad(lambda q: jnp.sum(pallas_kernels.lion_walk(q, k, v, g)))(q)


def test_bad_inputs():
    q = jnp.zeros((1, 8, 2, 16), jnp.float32)
    with pytest.raises(ValueError, match=r"lion_walk: log_decay must be None, \[B, L, H\]"):
        pallas_kernels.lion_walk(q, q, q, jnp.zeros((1, 8, 3), jnp.float32))
    with pytest.raises(ValueError, match="head dim must be in"):
        big = jnp.zeros((1, 8, 2, 512), jnp.float32)
        pallas_kernels.lion_walk(big, big, q)


@pytest.mark.parametrize("decay", ["head", "value"])
def test_recurrent_impl_walks_without_gradient_and_scans_with(rng, monkeypatch, decay):
    """impl="recurrent" through the kernel (forced here on CPU, in the interpreter): its output
    is the walk's, its gradients the XLA recurrence's."""
    if not ON_GPU:
        monkeypatch.setattr(api, "_walk_kernel", lambda *a: pallas_kernels.lion_walk)
    q, k, v, g = make_inputs(rng, 2, 29, 2, 16, 16, jnp.float32, decay)
    fn = lambda *a: ops.lion_attention(*a, impl="recurrent")  # noqa: E731
    jaxpr = str(jax.make_jaxpr(fn)(q, k, v, g))
    assert "lion_walk_forward" in jaxpr
    want = reference(q, k, v, g)
    assert rel_err(fn(q, k, v, g), want) <= TOL[jnp.float32]
    dy = jnp.asarray(rng.standard_normal(v.shape), jnp.float32)
    grads = jax.vjp(fn, q, k, v, g)[1](dy)
    xla = jax.vjp(lambda *a: api._xla_lion(*a, "recurrent", True, 1e-6), q, k, v, g)[1](dy)
    for a, b in zip(grads, xla):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_recurrent_impl_stays_in_xla_on_cpu(rng):
    q, k, v, g = make_inputs(rng, 1, 16, 1, 16, 16, jnp.float32, "head")
    jaxpr = str(jax.make_jaxpr(lambda *a: ops.lion_attention(*a, impl="recurrent"))(q, k, v, g))
    assert ("lion_walk_forward" in jaxpr) == ON_GPU


@pytest.mark.skipif(not ON_GPU, reason="XLA's compiled memory of the GPU kernels")
def test_inference_memory_is_input_output_and_one_numerator(rng):
    """ViT-T's mixer at 1248 px with a smaller batch: the compiled temporaries of
    impl="recurrent" are the float32 numerator and denominators (no copies of the inputs),
    far below impl="pallas"'s per-chunk states."""
    q, k, v, g = make_inputs(rng, 8, 6085, 3, 64, 64, jnp.bfloat16, "head")

    def temp_bytes(impl):
        fn = jax.jit(lambda *a: ops.lion_attention(*a, impl=impl))
        return fn.lower(q, k, v, g).compile().memory_analysis().temp_size_in_bytes

    numerator = 8 * 6085 * 3 * 64 * 4
    walk = temp_bytes("recurrent")
    assert walk <= 1.3 * numerator, (walk, numerator)
    assert walk < temp_bytes("pallas") / 2
