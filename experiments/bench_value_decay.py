r"""Time LION with a decay per value feature against the same op with one decay per head.

    python -m experiments.bench_value_decay [--segments 0,128,256,512] [--out DIR]

Shape of the LRA ListOps mixer: B 50, L 2000, H 8, K = V = 16, bf16, normalised (so the
per-value op sees ``[v | 1]``, 32 columns). Every side is timed the same way (:func:`timed`):
the median of 5 samples of 10 calls back to back with one sync each, after a warm-up call.
Rows: ``lion_attention`` with ``log_decay [B, L, H, V]`` on ``impl="pallas"``
(``pallas_kernels.lion_value_decay``) and on the XLA chunked form (chunk 8), and with
``[B, L, H]`` on the Pallas kernels. ``--segments``: one Pallas row per walk segment length
(``pallas_kernels.value_decay.SEGMENT``; 0: one walk over all L). Prints a table; with
``--out`` also writes it as Markdown and a bar chart (PNG). Needs a GPU.
"""

import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from lion_jax import ops
from pallas_kernels import value_decay

FLAGS = flags.FLAGS
B, L, H, K, V = 50, 2000, 8, 16, 16


def define_flags():
    flags.DEFINE_string("out", None, "Directory for table.md and plot.png.")
    flags.DEFINE_list("segments", [], "Walk segment lengths to time (tokens; 0: one walk); "
                      "default: the kernel's SEGMENT only.")


SAMPLES = 5


def timing(calls):
    """How :func:`timed` times ``calls`` calls, for the benchmarks' table headers."""
    return (f"median of {SAMPLES} samples, each {calls} calls back to back and one sync, after "
            "a warm-up call")


def timed(fn, *args, calls=10):
    """Milliseconds per call: after a warm-up call, :data:`SAMPLES` samples of ``calls`` calls
    back to back with one sync each; the median sample. (One sample swung by up to 1.6x from
    run to run on one H100 on 2026-11-26: ViT-T's train step 16.6 / 20.6 ms, LION-S's 22.4 /
    35.5 ms, ``bench_vision --calls 5`` and ``--calls 20``.)"""
    jax.block_until_ready(fn(*args))
    samples = []
    for _ in range(SAMPLES):
        start = time.perf_counter()
        out = None
        for _ in range(calls):
            out = fn(*args)
        jax.block_until_ready(out)
        samples.append((time.perf_counter() - start) / calls * 1e3)
    return statistics.median(samples)


def sides(impl, chunk):
    forward = jax.jit(lambda q, k, v, a: ops.lion_attention(q, k, v, a, impl=impl,
                                                            chunk_size=chunk))

    def loss(q, k, v, a):
        return jnp.sum(ops.lion_attention(q, k, v, a, impl=impl, chunk_size=chunk)
                       .astype(jnp.float32))
    return forward, jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))


def main(argv):
    del argv
    if jax.default_backend() != "gpu":
        sys.exit("bench_value_decay needs a GPU")
    r = np.random.default_rng(0)
    q, k = (jnp.asarray(r.uniform(0, 1, (B, L, H, K)), jnp.bfloat16) for _ in range(2))
    v = jnp.asarray(r.normal(size=(B, L, H, V)), jnp.bfloat16)
    per_value = jnp.asarray(-r.uniform(0, 0.5, (B, L, H, V)), jnp.float32)
    rows = []
    segments = [int(x) for x in FLAGS.segments] or [value_decay.SEGMENT]
    cases = [(f"per value feature, pallas, segments of {s}" if s > 0 else
              "per value feature, pallas, one walk", "pallas", 16, per_value, s) for s in segments]
    cases += [("per value feature, XLA chunk 8", "chunk", 8, per_value, None),
              ("per head, pallas", "pallas", 64, per_value[..., 0], None)]
    default_segment = value_decay.SEGMENT
    for name, impl, chunk, a, segment in cases:
        value_decay.SEGMENT = default_segment if segment is None else segment
        forward, both = sides(impl, chunk)
        rows.append((name, timed(forward, q, k, v, a), timed(both, q, k, v, a)))
        print(f"{name}: forward {rows[-1][1]:.2f} ms, forward+backward {rows[-1][2]:.2f} ms",
              flush=True)
    table = "\n".join([f"{jax.devices()[0].device_kind}, B{B} L{L} H{H} K{K} V{V} bf16; "
                       f"{timing(10)}", "",
                       "| op | forward (ms) | forward + backward (ms) |", "| --- | --- | --- |"]
                      + [f"| {n} | {f:.2f} | {b:.2f} |" for n, f, b in rows])
    print("\n" + table)
    if FLAGS.out:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        os.makedirs(FLAGS.out, exist_ok=True)
        with open(os.path.join(FLAGS.out, "table.md"), "w") as f:
            f.write(table + "\n")
        x = np.arange(len(rows))
        plt.figure(figsize=(6, 3))
        plt.bar(x - 0.2, [f for _, f, _ in rows], 0.4, label="forward")
        plt.bar(x + 0.2, [b for _, _, b in rows], 0.4, label="forward + backward")
        plt.xticks(x, [n for n, _, _ in rows], fontsize=7)
        plt.ylabel("ms"), plt.legend(), plt.tight_layout()
        plt.savefig(os.path.join(FLAGS.out, "plot.png"), dpi=120)


if __name__ == "__main__":
    define_flags()
    app.run(main)
