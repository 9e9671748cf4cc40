"""Every op's kernels are traced and lowered once per shape: a model whose layers call an op
with one shape emits each kernel once, however many layers (pallas_kernels/__init__.py,
"Lowered once"). Checked by lowering for CUDA on the CPU and counting the kernel calls."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels
from pallas_kernels.feature_map import silu_l2

BF16, F32 = jnp.bfloat16, jnp.float32
KERNEL_CALLS = ("custom_call @__gpu$xla.gpu.triton", "custom_call @mosaic_gpu")


@pytest.fixture(autouse=True)
def triton_lowering_without_a_gpu(monkeypatch):
    """Triton's lowering asks the local GPU for its compute capability; say Hopper's."""
    from jax._src.pallas.triton import gpu_info
    monkeypatch.setattr(gpu_info, "get_gpu_info",
                        lambda *a, **k: types.SimpleNamespace(compute_capability=90))


def kernel_calls(op, shapes, layers):
    """Kernel calls in the CUDA lowering of ``layers`` calls of ``op`` (each layer's output is
    the next one's first input) under ``jax.grad``."""
    def loss(x, *rest):
        for _ in range(layers):
            x = op(x, *rest).astype(x.dtype)
        return jnp.sum(x.astype(F32))
    args = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in shapes]
    text = jax.jit(jax.grad(loss, tuple(range(len(args))))).trace(*args).lower(
        lowering_platforms=("cuda",)).as_text()
    return sum(text.count(call) for call in KERNEL_CALLS)


def shapes(B, L, H, K, decay_shape):
    return [((B, L, H, K), BF16)] * 3 + [((B, L, H) + decay_shape, F32)]


CASES = {
    "lion_dense (Mosaic GPU)": (lambda *a: pallas_kernels.lion_dense(
        *a, backend="mosaic", interpret=False), shapes(2, 40, 2, 64, ())),
    "lion_dense (Triton)": (lambda *a: pallas_kernels.lion_dense(
        *a, backend="triton", interpret=False), shapes(2, 37, 2, 32, ())),
    "lion_value_decay": (lambda *a: pallas_kernels.lion_value_decay(*a, interpret=False),
                         shapes(2, 50, 2, 16, (16,))),
    "silu_l2": (lambda x: silu_l2(x, interpret=False), [((2, 50, 2, 64), BF16)]),
    "causal_linear_attention": (lambda *a: pallas_kernels.causal_linear_attention(
        *a, interpret=False, backend="triton"), shapes(2, 100, 2, 32, ())),
    "causal_linear_attention, a decay per key feature": (
        lambda *a: pallas_kernels.causal_linear_attention(*a, interpret=False),
        shapes(2, 100, 2, 32, (32,))),
    "bidirectional_linear_attention": (lambda *a: pallas_kernels.bidirectional_linear_attention(
        *a, interpret=False, backend="triton"), shapes(2, 100, 2, 32, ())),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_layers_of_one_shape_lower_the_kernels_once(name):
    op, arg_shapes = CASES[name]
    two = kernel_calls(op, arg_shapes, 2)  # with one layer the forward may be dead code
    assert two > 0
    assert kernel_calls(op, arg_shapes, 4) == two


def test_lion_walk_lowers_once_forward():
    x = jax.ShapeDtypeStruct((2, 50, 2, 32), BF16)
    g = jax.ShapeDtypeStruct((2, 50, 2), F32)

    def layers(n):
        def run(q, k, v, a):
            for _ in range(n):
                q = pallas_kernels.lion_walk(q, k, v, a, interpret=False).astype(BF16)
            return q
        text = jax.jit(run).trace(x, x, x, g).lower(lowering_platforms=("cuda",)).as_text()
        return sum(text.count(call) for call in KERNEL_CALLS)
    assert layers(3) == layers(1) > 0


def test_the_lowering_check_sees_repeated_kernels():
    """The counter itself: an op lowered per call (a plain pallas_call, not jitted) shows one
    kernel per layer, so the equalities above are not vacuous."""
    from jax.experimental import pallas as pl

    def add_one(x):
        def kernel(x_ref, o_ref):
            o_ref[...] = x_ref[...] + np.float32(1)
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    def run(x):
        for _ in range(3):
            x = add_one(x)
        return x
    text = jax.jit(run).trace(jax.ShapeDtypeStruct((16, 16), F32)).lower(
        lowering_platforms=("cuda",)).as_text()
    assert sum(text.count(call) for call in KERNEL_CALLS) == 3
