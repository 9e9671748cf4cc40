r"""What lowering an op's kernels costs: seconds and kernel calls of the CUDA lowering, on any
machine (no GPU needed), of ``--layers`` calls of each op under ``jax.grad``.

    python -m experiments.lowering_cost [--ops lion_dense_mosaic,lion_value_decay,...]
        [--layers 1,12]

Each op is called ``n`` times in a row (each call's output is the next one's first input), as
a model's layers call it, and the gradient is lowered for CUDA (``jit(...).trace(...).lower(
lowering_platforms=("cuda",))``): the trace and the Pallas lowering, no XLA compilation.
Triton's lowering asks the local GPU for its compute capability; without one it is told
Hopper's (9.0). ``pallas_kernels/__init__.py``, "Lowered once", says why the counts should not
grow with the layers; ``tests/test_lowered_once.py`` checks it.
"""

import argparse
import contextlib
import time
import types

import jax
import jax.numpy as jnp

import pallas_kernels
from pallas_kernels.feature_map import silu_l2
from pallas_kernels.qkv_map import silu_l2_qkv

BF16, F32 = jnp.bfloat16, jnp.float32
KERNEL_CALLS = ("custom_call @__gpu$xla.gpu.triton", "custom_call @mosaic_gpu")


def shapes(B, L, H, K, decay_shape):
    """The argument shapes of q, k, v ([B, L, H, K] bf16) and the log-decays (float32)."""
    return [((B, L, H, K), BF16)] * 3 + [((B, L, H) + decay_shape, F32)]


# name -> (op, [(shape, dtype)] of its arguments); shapes of the models that call them
OPS = {
    "lion_dense_mosaic": (lambda *a: pallas_kernels.lion_dense(
        *a, backend="mosaic", interpret=False), shapes(256, 200, 3, 64, ())),  # ViT-T
    "lion_dense_triton": (lambda *a: pallas_kernels.lion_dense(
        *a, backend="triton", interpret=False), shapes(256, 197, 3, 64, ())),
    "lion_value_decay": (lambda *a: pallas_kernels.lion_value_decay(*a, interpret=False),
                         shapes(50, 1024, 8, 16, (16,))),  # ListOps, one length bucket
    "silu_l2": (lambda x: silu_l2(x, interpret=False), [((256, 200, 3, 64), BF16)]),
    "silu_l2_qkv": (lambda p, bias: qkv_layer(p, bias, heads=3),
                    [((256, 200, 3 * 3 * 64), BF16), ((3 * 3 * 64,), F32)]),
    "causal": (lambda *a: pallas_kernels.causal_linear_attention(
        *a, interpret=False, backend="triton"), shapes(4, 4096, 16, 64, ())),
    "causal_per_feature": (lambda *a: pallas_kernels.causal_linear_attention(
        *a, interpret=False), shapes(4, 4096, 16, 64, (64,))),
    "lion": (lambda *a: pallas_kernels.bidirectional_linear_attention(
        *a, interpret=False, backend="triton"), shapes(4, 4096, 16, 64, ())),
}


def qkv_layer(p, bias, heads):
    """``silu_l2_qkv``'s q, k and v side by side again, in p's shape (a layer to chain)."""
    out = jnp.concatenate(silu_l2_qkv(p, bias, heads, interpret=False), axis=-2)
    return out.reshape(p.shape)


@contextlib.contextmanager
def triton_lowering_without_a_gpu():
    """Triton's lowering with a compute capability of 9.0 when no GPU is there to ask."""
    from jax._src.pallas.triton import gpu_info
    default = gpu_info.get_gpu_info
    gpu_info.get_gpu_info = lambda *a, **k: types.SimpleNamespace(compute_capability=90)
    try:
        yield
    finally:
        gpu_info.get_gpu_info = default


def kernel_calls(text):
    """Kernel (Triton and Mosaic GPU) custom calls in a lowered module's text."""
    return sum(text.count(call) for call in KERNEL_CALLS)


def lowered(fn, shapes):
    """``(seconds, kernel calls)`` of the CUDA lowering of ``fn`` at ``shapes``."""
    args = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in shapes]
    start = time.perf_counter()
    text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    return time.perf_counter() - start, kernel_calls(text)


def layers_grad(op, layers):
    """The gradient (in every argument) of the sum of ``layers`` calls of ``op`` in a row."""
    def loss(x, *rest):
        for _ in range(layers):
            x = op(x, *rest).astype(x.dtype)
        return jnp.sum(x.astype(F32))
    return lambda *args: jax.grad(loss, tuple(range(len(args))))(*args)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default=",".join(OPS), help="of " + ", ".join(OPS))
    parser.add_argument("--layers", default="1,12", help="numbers of calls, comma-separated")
    args = parser.parse_args()
    ops = args.ops.split(",")
    if set(ops) - set(OPS):
        parser.error(f"unknown --ops {sorted(set(ops) - set(OPS))}; choose from {list(OPS)}")
    try:
        layers = [int(n) for n in args.layers.split(",")]
    except ValueError:
        parser.error(f"--layers takes ints; got {args.layers!r}")
    print(f"jax {jax.__version__}; CUDA lowering of the gradient of n calls in a row on "
          f"{jax.devices()[0].device_kind}")
    print("| op | n | seconds | kernel calls |")
    print("|---|---|---|---|")
    with triton_lowering_without_a_gpu():
        for name in ops:
            op, shapes = OPS[name]
            for n in layers:
                seconds, calls = lowered(layers_grad(op, n), shapes)
                print(f"| {name} | {n} | {seconds:.2f} | {calls} |", flush=True)


if __name__ == "__main__":
    main()
