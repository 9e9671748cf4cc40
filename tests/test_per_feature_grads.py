"""pallas_kernels.per_feature_grads (the per-feature causal op's gradients on bf16 operands,
chunk-parallel, d log_decay decomposed) against float64 autodiff of lion_jax.ops' materialised
form, alone and through causal_linear_attention with ``PER_FEATURE_BACKWARD = "chunks"``.
CPU (default): the Pallas interpreter. GPU: ``LION_TEST_GPU=1 pytest
tests/test_per_feature_grads.py``."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

import pallas_kernels
from lion_jax import ops
from pallas_kernels import linear_attention
from pallas_kernels.per_feature import mild_chunks
from pallas_kernels.per_feature_grads import per_feature_grads

TOL = 5e-3  # 16-bit inputs (ARCHITECTURE.md section 6)
ON_GPU = jax.default_backend() == "gpu"


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.all(np.isfinite(a)), "non-finite values in the kernel's result"
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def inputs(rng, B, L, H, K, V, dtype, low):
    def normal(*shape, scale=1.0):
        return jnp.asarray(rng.standard_normal(shape) * scale, dtype)
    q, k, v, dy = normal(B, L, H, K, scale=K ** -0.5), normal(B, L, H, K), normal(
        B, L, H, V), normal(B, L, H, V)
    g = jnp.asarray(rng.uniform(low, 0.0, (B, L, H, K)), jnp.float32)
    s0, ds = (jnp.asarray(rng.standard_normal((B, H, K, V)), jnp.float32) for _ in range(2))
    return q, k, v, g, s0, dy, ds


def reference_grads(q, k, v, g, s0, dy, ds):
    """Gradients of ``<y, dy> + <final state, ds>`` in float64 (of the same rounded inputs)."""
    with jax.enable_x64(True):
        f64 = lambda x: jnp.asarray(np.asarray(x, np.float64))  # noqa: E731
        _, vjp = jax.vjp(lambda *a: ops.causal_linear_attention(
            *a[:4], impl="attention", initial_state=a[4], return_final_state=True),
            *(f64(x) for x in (q, k, v, g, s0)))
        return [np.asarray(x) for x in vjp((f64(dy), f64(ds)))]


@pytest.mark.parametrize("K,V,chunk,low", [(24, 40, 32, -0.5), (64, 64, 64, -0.3),
                                           (16, 16, 16, -1.2)])
def test_matches_float64(rng, K, V, chunk, low):
    """Every gradient (q, k, v, log_decay, initial state) against float64 autodiff, random
    inputs, K != V, chunks bounded (their log-decays sum to at least -20)."""
    q, k, v, g, s0, dy, ds = inputs(rng, 2, 4 * chunk, 2, K, V, jnp.bfloat16, low)
    assert bool(mild_chunks(g, chunk))
    got = per_feature_grads(q, k, v, g, s0, dy, ds, chunk=chunk, interpret=not ON_GPU)
    assert [x.dtype for x in got[:3]] == [jnp.bfloat16] * 3
    for name, a, b in zip(["dq", "dk", "dv", "dlog_decay", "ds0"], got,
                          reference_grads(q, k, v, g, s0, dy, ds)):
        assert rel_err(a, b) < TOL, name


@pytest.mark.parametrize("block_k", [16, 32])
def test_k_blocks_match_float64(rng, monkeypatch, spy, block_k):
    """K split into blocks (``BLOCK_K``; K 40 padded to 64: four or two programs per chunk,
    dv summed from their float32 parts): every gradient within the bound against float64."""
    from pallas_kernels import per_feature_grads as module
    monkeypatch.setattr(module, "BLOCK_K", block_k)
    programs = spy(pl, "pallas_call")  # and JAX's caches cleared: the jit keys on shapes
    q, k, v, g, s0, dy, ds = inputs(rng, 1, 96, 2, 40, 24, jnp.bfloat16, -0.4)
    got = per_feature_grads(q, k, v, g, s0, dy, ds, chunk=32, interpret=not ON_GPU)
    assert [p.get("grid") for p in programs if p.get("name") == "per_feature_grads"] == [
        (1, 3, 2, 64 // block_k)]
    assert [x.dtype for x in got[:3]] == [jnp.bfloat16] * 3
    for name, a, b in zip(["dq", "dk", "dv", "dlog_decay", "ds0"], got,
                          reference_grads(q, k, v, g, s0, dy, ds)):
        assert rel_err(a, b) < TOL, name


def test_bad_block_k_is_one_line(monkeypatch):
    from pallas_kernels import per_feature_grads as module
    monkeypatch.setattr(module, "BLOCK_K", 48)
    jax.clear_caches()
    q = jnp.zeros((1, 64, 1, 64), jnp.bfloat16)
    g, ds = jnp.zeros(q.shape, jnp.float32), jnp.zeros((1, 1, 64, 64), jnp.float32)
    with pytest.raises(ValueError, match="BLOCK_K must be a power of two >= 16.*got 48"):
        per_feature_grads(q, q, q, g, None, q, ds, chunk=64, interpret=True)
    jax.clear_caches()


def test_mild_chunks():
    g = jnp.full((1, 64, 1, 2), -0.3, jnp.float32)
    assert bool(mild_chunks(g, 64))  # -19.2 per chunk
    assert not bool(mild_chunks(g.at[0, 5, 0, 1].set(-2.0), 64))  # -20.9 in one feature


@pytest.fixture
def chunks_backward(monkeypatch):
    monkeypatch.setattr(linear_attention, "PER_FEATURE_BACKWARD", "chunks")
    jax.clear_caches()
    yield
    jax.clear_caches()


@pytest.mark.parametrize("low,dtype", [(-0.2, jnp.bfloat16), (-20.0, jnp.bfloat16),
                                       (-0.2, jnp.float16)], ids=["bounded", "strong", "f16"])
def test_the_op_takes_it_where_chunks_are_bounded(rng, chunks_backward, spy, low, dtype):
    """causal_linear_attention's gradients with the switch on, odd L (padded), a head dim
    below 16 (padded), an initial state and the final state's cotangent: within the bound
    against float64 whichever path the inputs pick (strong decay and float16: the scans).
    bf16: the forward keeps its chunk states, so the backward walks only the queries'."""
    from pallas_kernels import per_feature_grads as module
    walks = spy(module, "chunk_states_per_feature")
    q, k, v, g, s0, dy, ds = inputs(rng, 1, 83, 2, 12, 20, dtype, low)

    def op(q, k, v, g, s0):
        return pallas_kernels.causal_linear_attention(q, k, v, g, chunk_size=32,
                                                      initial_state=s0,
                                                      return_final_state=True)
    _, vjp = jax.vjp(op, q, k, v, g, s0)
    got = vjp((dy, ds))
    for name, a, b in zip(["dq", "dk", "dv", "dlog_decay", "ds0"], got,
                          reference_grads(q, k, v, g, s0, dy, ds)):
        assert rel_err(a, b) < TOL, name
    if dtype == jnp.bfloat16:  # traced in both branches of the run-time choice
        assert [w.get("reverse") for w in walks] == [True]


def test_lowers_for_cuda_once_per_shape():
    """The kernel lowers through Triton for a GPU (on the CPU, as experiments.lowering_cost
    does), and a model's layers of one shape lower it once."""
    from experiments import lowering_cost
    B, L, H, K, V = 2, 128, 2, 64, 64
    bf16 = jnp.bfloat16
    shapes = [((B, L, H, K), bf16)] * 2 + [((B, L, H, V), bf16), ((B, L, H, K), jnp.float32),
                                          ((B, H, K, V), jnp.float32), ((B, L, H, V), bf16),
                                          ((B, H, K, V), jnp.float32)]

    def layers(n):
        def run(q, k, v, g, s0, dy, ds):
            for _ in range(n):
                q = per_feature_grads(q, k, v, g, s0, dy, ds, chunk=64, interpret=False)[0]
            return q
        with lowering_cost.triton_lowering_without_a_gpu():
            return lowering_cost.lowered(run, shapes)[1]
    assert layers(3) == layers(1) > 0
