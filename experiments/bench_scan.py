r"""One scan against two: LightNet's non-causal attention, a decayed causal linear attention run
forward and reversed, and LION's one fused bidirectional kernel, by sequence length (LightNet
paper Figure 1, which prints no numbers; these are ours).

    python -m experiments.bench_scan [--out DIR] [--lengths 1024,2048,...,65536] [--batch 4]
        [--heads 16] [--head_dim 64] [--calls 10]

Sides, all on ``[B, L, H, K]`` bf16 inputs, ``impl="auto"`` (our Pallas kernels on a GPU):

* ``LNA, one scan``: :func:`lion_jax.layers.lightnet.one_scan`, ``phi(Q) (softmax_seq(K)^T V)``
  (softmax and state in float32, the weights and V entering the matmul in bf16, as the layer
  runs it): one reduction over the sequence and two matmuls.
* ``two scans``: :func:`lion_jax.ops.causal_linear_attention` with a scalar decay per token and
  head (Lightning Attention's form) forward, plus the same on the reversed sequence (how Vim and
  Vision-RWKV make a causal recurrence bidirectional).
* ``LION-S``: :func:`lion_jax.ops.lion_attention` with the same decay (normalized, LION's
  default): the bidirectional decayed form in one fused call.

For each side and length: the forward, and the forward + backward (the gradient of a weighted
sum of the output with respect to every input), each timed as the median of 5 samples
of ``--calls`` calls back to back with one sync each, after a warm-up call
(``bench_value_decay.timed``); memory is XLA's
compiled arguments + outputs + temporaries. A side that cannot run is a cell with the reason.
Prints a Markdown table; with ``--out`` writes ``table.md`` and ``plot.png``. Needs a GPU.
"""

import os
import sys

import jax
import jax.numpy as jnp
from absl import app, flags

from experiments.bench_mlm import compiled_mib
from experiments.bench_value_decay import timed, timing
from experiments.bench_vision import failure, two_panels
from lion_jax import ops
from lion_jax.layers.lightnet import one_scan, softmax_over_sequence

FLAGS = flags.FLAGS
SIDES = ("LNA, one scan", "two scans", "LION-S")
PASSES = ("fwd", "fwd+bwd")


def define_flags():
    flags.DEFINE_string("out", None, "Directory for table.md and plot.png.")
    flags.DEFINE_list("lengths", ["1024", "2048", "4096", "8192", "16384", "32768", "65536"],
                      "Sequence lengths.")
    flags.DEFINE_integer("batch", 4, "Batch size B.")
    flags.DEFINE_integer("heads", 16, "Heads H.")
    flags.DEFINE_integer("head_dim", 64, "Head width K (= V).")
    flags.DEFINE_integer("calls", 10, "Calls timed back to back.")


def _lna(q, k, v, log_decay):
    del log_decay  # the additive decay comes from the keys themselves
    f32 = jnp.float32
    kbar = softmax_over_sequence(k.astype(f32)).astype(v.dtype)  # as LightNetAttention does
    return one_scan(jax.nn.silu(q.astype(f32)), kbar, v).astype(v.dtype)


def _two_scans(q, k, v, log_decay):
    def flip(x):
        return jnp.flip(x, axis=1)
    forward = ops.causal_linear_attention(q, k, v, log_decay)
    backward = ops.causal_linear_attention(flip(q), flip(k), flip(v), flip(log_decay))
    return forward + flip(backward)


def _lion(q, k, v, log_decay):
    return ops.lion_attention(q, k, v, log_decay)


FUNCTIONS = {"LNA, one scan": _lna, "two scans": _two_scans, "LION-S": _lion}


def inputs(batch, length, heads, dim, dtype=jnp.bfloat16, seed=0):
    """``(q, k, v, log_decay [B, L, H] in [-0.1, -0.001])`` and a cotangent ``[B, L, H, K]``."""
    keys = jax.random.split(jax.random.PRNGKey(seed), 5)
    q, k, v, dy = (jax.random.normal(key, (batch, length, heads, dim), dtype)
                   for key in keys[:4])
    log_decay = -jax.random.uniform(keys[4], (batch, length, heads), jnp.float32, 1e-3, 0.1)
    return (q, k, v, log_decay), dy


def measure(side, args, cotangent, calls):
    """``{"fwd": (ms, MiB), "fwd+bwd": (ms, MiB)}`` of one side (or failure strings)."""
    fn = FUNCTIONS[side]

    def loss(*a):
        return jnp.sum(fn(*a).astype(jnp.float32) * cotangent.astype(jnp.float32))

    out = {}
    for name, jitted in (("fwd", jax.jit(fn)),
                         ("fwd+bwd", jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))))):
        try:
            compiled = jitted.lower(*args).compile()
            out[name] = (timed(compiled, *args, calls=calls), compiled_mib(compiled))
        except Exception as e:  # noqa: BLE001  OOM / refused: reported, not fatal
            out[name] = failure(e)
    return out


def rows(lengths, batch, heads, dim, calls, dtype=jnp.bfloat16):
    """``{(f"{side}, {pass}", L): (ms, MiB) or reason}``."""
    results = {}
    for length in lengths:
        args, cotangent = inputs(batch, length, heads, dim, dtype)
        for side in SIDES:
            for name, value in measure(side, args, cotangent, calls).items():
                results[f"{side}, {name}", length] = value
                print(f"  {side}, {name} at L={length}: {value}", flush=True)
    return results


def names():
    return [f"{side}, {name}" for name in PASSES for side in SIDES]


def markdown(device, batch, heads, dim, calls, results, lengths):
    lines = [f"{device}, jax {jax.__version__}, B={batch}, H={heads}, K=V={dim}, bf16 inputs; "
             f"{timing(calls)}", "",
             "ms per call (compiled memory, MiB), by sequence length:", "",
             "| side | " + " | ".join(f"{n:,}" for n in lengths) + " |",
             "| --- |" + " --- |" * len(lengths)]
    for name in names():
        cells = [results[name, n] if isinstance(results[name, n], str)
                 else f"{results[name, n][0]:.3f} ({results[name, n][1]:,.0f})" for n in lengths]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Time of each side over the one scan's (same pass):", "",
              "| side | " + " | ".join(f"{n:,}" for n in lengths) + " |",
              "| --- |" + " --- |" * len(lengths)]
    for name in PASSES:
        base = [results[f"{SIDES[0]}, {name}", n] for n in lengths]
        for side in SIDES[1:]:
            cells = []
            for b, n in zip(base, lengths):
                r = results[f"{side}, {name}", n]
                cells.append("" if isinstance(r, str) or isinstance(b, str)
                             else f"{r[0] / b[0]:.2f}x")
            lines.append(f"| {side}, {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv):
    del argv
    try:
        lengths = [int(n) for n in FLAGS.lengths]
    except ValueError as e:
        sys.exit(f"error: --lengths must be integers: {e}")
    if min(lengths + [FLAGS.batch, FLAGS.heads, FLAGS.head_dim, FLAGS.calls]) < 1:
        sys.exit("error: --lengths, --batch, --heads, --head_dim and --calls must be positive")
    if jax.default_backend() != "gpu":
        sys.exit("error: bench_scan needs a GPU")
    device = jax.devices()[0].device_kind
    results = rows(lengths, FLAGS.batch, FLAGS.heads, FLAGS.head_dim, FLAGS.calls)
    table = markdown(device, FLAGS.batch, FLAGS.heads, FLAGS.head_dim, FLAGS.calls, results,
                     lengths)
    print(table)
    if FLAGS.out:
        os.makedirs(FLAGS.out, exist_ok=True)
        with open(os.path.join(FLAGS.out, "table.md"), "w") as f:
            f.write(table)
        two_panels(os.path.join(FLAGS.out, "plot.png"), names(), results, lengths,
                   xlabel="sequence length", speed_label="ms per call", xscale="log")


if __name__ == "__main__":
    define_flags()
    app.run(main)
