"""Relative RMS errors of the Pallas kernels in bf16 / fp16 (and float32 for per-feature decay)
against float64, over seeds.

    python -m experiments.kernel_precision [--seeds 4] [--length 100] [--decay mild]
        [--ops causal,bidirectional,per_feature]

The inputs of ``tests/test_pallas_kernels.py::test_half_precision`` (B=1, H=2, chunk 32; q, k,
v drawn in float64, scaled, then rounded to the dtype; LION with positive q, k), for several
seeds: prints, per dtype, op, head dims and output or gradient, the largest
``||kernel - reference|| / ||reference||`` over the seeds, the reference being
``lion_jax.ops`` (impl="attention") in float64 on the same rounded inputs. Runs wherever the
kernels run (interpret mode on CPU).
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import pallas_kernels
from lion_jax import ops

CASES = [  # dtype, op, K, V
    (jnp.bfloat16, "causal", 32, 16), (jnp.bfloat16, "bidirectional", 32, 16),
    (jnp.bfloat16, "per_feature", 32, 16), (jnp.bfloat16, "causal", 96, 80),
    (jnp.bfloat16, "bidirectional", 80, 96), (jnp.float16, "causal", 32, 16),
    (jnp.float16, "bidirectional", 32, 16), (jnp.float32, "per_feature", 16, 16)]
OPS = ("causal", "bidirectional", "per_feature")
LOW = {"mild": -0.5, "strong": -20.0}


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def kernel_and_reference(op, chunk_size=32, algorithm=None, **options):
    """``(kernel, reference)`` of ``op`` (LION normalised if "bidirectional", else the causal
    op), both ``f(q, k, v, log_decay)``: the Pallas kernel (with ``algorithm`` and the keyword
    ``options`` of the pallas_kernels function) and ``lion_jax.ops``' materialised form
    (impl="attention")."""
    if op == "bidirectional":
        return (lambda *a: pallas_kernels.bidirectional_linear_attention(
                    *a, chunk_size=chunk_size, algorithm=algorithm, **options),
                lambda *a: ops.lion_attention(*a, impl="attention"))
    return (lambda *a: pallas_kernels.causal_linear_attention(*a, chunk_size=chunk_size,
                                                              algorithm=algorithm, **options),
            lambda *a: ops.causal_linear_attention(*a, impl="attention"))


def errors(rng, dtype, op, K, V, L, decay):
    """``{name: error}`` for y, dq, dk, dv, dlog_decay of one random case."""
    B, H = 1, 2
    bidirectional = op == "bidirectional"

    def draw(*shape, scale=1.0):
        x = rng.standard_normal(shape) * scale
        return jnp.asarray(np.abs(x) if bidirectional else x, dtype)

    q, k, v = draw(B, L, H, K, scale=K ** -0.5), draw(B, L, H, K), draw(B, L, H, V)
    g_shape = (B, L, H, K) if op == "per_feature" else (B, L, H)
    g = jnp.asarray(rng.uniform(LOW[decay], 0.0, g_shape), jnp.float32)
    dy = jnp.asarray(rng.standard_normal((B, L, H, V)), dtype)
    kernel, reference = kernel_and_reference(op)

    def value_and_grads(fn, args, cotangent):
        y, vjp = jax.vjp(fn, *args)
        return [y, *vjp(cotangent.astype(y.dtype))]

    got = value_and_grads(kernel, (q, k, v, g), dy)
    with jax.enable_x64(True):
        args64 = [jnp.asarray(np.asarray(x, np.float64)) for x in (q, k, v, g)]
        want = value_and_grads(reference, args64, jnp.asarray(np.asarray(dy, np.float64)))
    names = ["y", "dq", "dk", "dv", "dlog_decay"]
    return {name: rel_err(a, b) for name, a, b in zip(names, got, want)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--length", type=int, default=100)
    parser.add_argument("--decay", choices=sorted(LOW), default="mild")
    parser.add_argument("--ops", default=",".join(OPS), help="which ops, of " + ", ".join(OPS))
    args = parser.parse_args()
    chosen = args.ops.split(",")
    if set(chosen) - set(OPS):
        parser.error(f"unknown --ops {sorted(set(chosen) - set(OPS))}; choose from {list(OPS)}")
    cases = [case for case in CASES if case[1] in chosen]
    worst = {}
    for seed in range(args.seeds):
        rng = np.random.default_rng(seed)
        for dtype, op, K, V in cases:
            for name, err in errors(rng, dtype, op, K, V, args.length, args.decay).items():
                key = (jnp.dtype(dtype).name, op, f"{K}x{V}", name)
                worst[key] = max(worst.get(key, 0.0), err)
    print(f"device: {jax.devices()[0].device_kind}; L={args.length}, decay {args.decay}, "
          f"largest relative RMS error over {args.seeds} seeds")
    print("| dtype | op | K x V | y | dq | dk | dv | dlog_decay |")
    print("|---|---|---|---|---|---|---|---|")
    for dtype, op, K, V in cases:
        row = [worst[(jnp.dtype(dtype).name, op, f"{K}x{V}", n)]
               for n in ("y", "dq", "dk", "dv", "dlog_decay")]
        print(f"| {jnp.dtype(dtype).name} | {op} | {K}x{V} | "
              + " | ".join(f"{e:.2e}" for e in row) + " |")


if __name__ == "__main__":
    main()
