"""pallas_kernels.lion_value_decay (LION with a decay per value feature, paper C.7) against the
materialized reference (lion_jax.ops, impl="attention", float64): outputs and the gradients of
a random linear loss in q, k, v and log_decay.

CPU (default): the Pallas interpreter. GPU: ``LION_TEST_GPU=1 pytest
tests/test_value_decay_kernel.py`` compiles the kernels with Triton.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels
from lion_jax import ops

ON_GPU = jax.default_backend() == "gpu"
# as tests/test_pallas_kernels.py: float32 dots are exact (no TF32); the GPU reorders sums
TOL = {jnp.float32: 1e-3 if ON_GPU else 1e-5, jnp.bfloat16: 5e-3}


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.all(np.isfinite(a)), "non-finite values in the kernel's result"
    norm = np.linalg.norm(b)
    if norm == 0:  # dlog_decay at L = 1: compare the absolute RMS error instead
        return float(np.linalg.norm(a) / np.sqrt(a.size))
    return float(np.linalg.norm(a - b) / norm)


def make_inputs(rng, B, L, H, K, V, dtype, low):
    """Positive q, k (SCALE-able), normal v, log-decays uniform in [low, 0], a cotangent."""
    q = jnp.asarray(np.abs(rng.standard_normal((B, L, H, K))) * K ** -0.5, dtype)
    k = jnp.asarray(np.abs(rng.standard_normal((B, L, H, K))), dtype)
    v = jnp.asarray(rng.standard_normal((B, L, H, V)), dtype)
    g = jnp.asarray(rng.uniform(low, 0.0, (B, L, H, V)), jnp.float32)
    dy = jnp.asarray(rng.standard_normal((B, L, H, V)), jnp.float32)
    return q, k, v, g, dy


def value_and_grads(fn, args, dy):
    """Under one jax.jit: called eagerly, every op around the kernel and in the reference
    compiled on its own."""
    @jax.jit
    def run(args, dy):
        y, vjp = jax.vjp(fn, *args)
        return [y, *vjp(dy.astype(y.dtype))]
    return run(tuple(args), dy)


def reference(args, dy, **kwargs):
    with jax.enable_x64(True):
        args64 = [jnp.asarray(np.asarray(x, np.float64)) for x in args]
        fn = lambda *a: ops.lion_attention(*a, impl="attention", **kwargs)  # noqa: E731
        return [np.asarray(x) for x in value_and_grads(fn, args64,
                                                       jnp.asarray(np.asarray(dy, np.float64)))]


CASES = [  # L, K, V, low log-decay
    (1, 16, 16, -0.5),
    (45, 16, 32, -0.5),  # L not a multiple of the chunk of 16
    (37, 6, 5, -20.0),  # small head dims (zero-padded), strongest decay
    (70, 24, 48, -20.0),  # V = 48: three V-blocks of 16
    (33, 32, 16, 0.0),  # no decay
]


@pytest.mark.parametrize("L,K,V,low", CASES)
def test_numerator_matches_reference(rng, L, K, V, low):
    """float32, the non-normalised numerator and its four gradients."""
    q, k, v, g, dy = make_inputs(rng, 2, L, 2, K, V, jnp.float32, low)
    got = value_and_grads(pallas_kernels.lion_value_decay, (q, k, v, g), dy)
    want = reference((q, k, v, g), dy, normalize=False)
    for name, a, b in zip(["y", "dq", "dk", "dv", "dlog_decay"], got, want):
        err = rel_err(a, b)
        print(f"{name}: {err:.2e}")
        assert err <= TOL[jnp.float32], f"{name}: {err:.3e}"


SEGMENT_CASES = [  # L, K, V, low log-decay, tokens per segment
    (45, 16, 32, -0.5, 8),  # 6 segments, the last one part padding
    (70, 24, 48, -20.0, 16),  # strongest decay: the entering states decay to zero
    (61, 8, 16, 0.0, 4),  # no decay, one loop step per segment
]


@pytest.mark.parametrize("L,K,V,low,segment", SEGMENT_CASES)
def test_segments_match_reference(rng, L, K, V, low, segment):
    """float32, the walks cut into segments (module docstring): outputs and gradients against
    float64, and against one walk over all L."""
    q, k, v, g, dy = make_inputs(rng, 2, L, 2, K, V, jnp.float32, low)
    got = value_and_grads(
        lambda *a: pallas_kernels.lion_value_decay(*a, segment=segment), (q, k, v, g), dy)
    one = value_and_grads(
        lambda *a: pallas_kernels.lion_value_decay(*a, segment=0), (q, k, v, g), dy)
    want = reference((q, k, v, g), dy, normalize=False)
    for name, a, b, c in zip(["y", "dq", "dk", "dv", "dlog_decay"], got, want, one):
        err, to_one = rel_err(a, b), rel_err(a, c)
        print(f"{name}: {err:.2e} (against one walk {to_one:.2e})")
        assert err <= TOL[jnp.float32] and to_one <= TOL[jnp.float32], name


def test_segment_layout():
    from pallas_kernels.value_decay import UNROLL, segment_layout
    for length in (1, 3, 45, 1024, 1180, 2000, 65536):
        for segment in (0, 4, 16, 256):
            count, per = segment_layout(length, segment)
            assert per % UNROLL == 0 and count * per >= length
            assert count == 1 if segment <= 0 else per <= max(segment, UNROLL) and (
                (count - 1) * per < length)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("normalize", [True, False])
def test_lion_attention_pallas_impl(rng, dtype, normalize):
    """lion_attention(impl="pallas") with a [B, L, H, V] decay: SCALE per value column."""
    q, k, v, g, dy = make_inputs(rng, 2, 53, 2, 16, 16, dtype, -1.0)
    fn = lambda *a: ops.lion_attention(*a, impl="pallas", normalize=normalize)  # noqa: E731
    got = value_and_grads(fn, (q, k, v, g), dy)
    assert got[0].dtype == dtype
    want = reference((q, k, v, g), dy, normalize=normalize)
    for name, a, b in zip(["y", "dq", "dk", "dv", "dlog_decay"], got, want):
        err = rel_err(a, b)
        print(f"{name}: {err:.2e}")
        assert err <= TOL[dtype], f"{name}: {err:.3e}"


def test_auto_uses_the_kernel_on_gpu_only(rng):
    """impl="auto": the kernel on a GPU, the XLA forms on CPU; the same result either way."""
    q, k, v, g, _ = make_inputs(rng, 1, 300, 2, 16, 16, jnp.float32, -1.0)
    jaxpr = str(jax.make_jaxpr(lambda *a: ops.lion_attention(*a))(q, k, v, g))
    assert ("lion_value_decay_scan" in jaxpr) == ON_GPU
    want = ops.lion_attention(q, k, v, g, impl="chunk")
    assert rel_err(ops.lion_attention(q, k, v, g), want) <= TOL[jnp.float32]


def test_bad_inputs():
    q = jnp.zeros((1, 8, 2, 16), jnp.float32)
    with pytest.raises(ValueError, match=r"log_decay must be \[B, L, H, V\]"):
        pallas_kernels.lion_value_decay(q, q, q, jnp.zeros((1, 8, 2), jnp.float32))
    with pytest.raises(ValueError, match="head dim must be in"):
        big = jnp.zeros((1, 8, 2, 256), jnp.float32)
        pallas_kernels.lion_value_decay(big, big, q, jnp.zeros(q.shape))
    with pytest.raises(ValueError, match="impl='pallas' cannot run these inputs"):
        ops.lion_attention(big, big, q, jnp.zeros(q.shape), impl="pallas")


@pytest.mark.skipif(not ON_GPU, reason="L = 65536 takes minutes in the interpreter")
def test_long_sequence_strongest_decay_is_finite(rng):
    B, L, H, K, V = 1, 65536, 2, 16, 32
    q, k, v, _, _ = make_inputs(rng, B, L, H, K, V, jnp.bfloat16, 0.0)
    g = jnp.full((B, L, H, V), -20.0, jnp.float32)
    y, grads = jax.value_and_grad(
        lambda *a: jnp.sum(pallas_kernels.lion_value_decay(*a)), (0, 1, 2, 3))(q, k, v, g)
    assert np.isfinite(float(y))
    for x in grads:
        assert np.all(np.isfinite(np.asarray(x, np.float32)))
