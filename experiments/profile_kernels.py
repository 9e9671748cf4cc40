"""Per-kernel GPU times of our ops' forward + backward, to see where the time goes.

    python -m experiments.profile_kernels [--lengths 16384] [--dims 128,64]
        [--ops causal,lion,per_feature] [--pass fwd+bwd] [--reps 5]
        [--settings | --dense | --feature_map]

For each op (``causal``: ``pallas_kernels.causal_linear_attention``, ``lion``:
``pallas_kernels.bidirectional_linear_attention``, normalised; ``per_feature``:
``bench_kernels.causal_per_feature``, the causal op with the decay copied to every key feature;
per-token decay, bf16, B = 4, H = 16, the inputs of ``experiments.bench_kernels``) it jits
forward + backward (output kept live; ``--pass fwd``: the forward alone), times it as
``bench_kernels`` does (the gap between that time and the kernels' sum is what the device
spends between kernels, or waiting for the host to launch them), then runs it
``--reps`` times under ``torch.profiler``, whose CUPTI tracing records every CUDA kernel of the
process, JAX's included, and prints each kernel's time per call, largest first: the Pallas
kernels by name (``chunk_outputs``, ``causal_backward``, ``bidirectional_outputs``,
``lion_backward_*``, ``chunk_outputs_per_feature``, the Mosaic GPU gradients kernels
``causal_grads_mosaic`` and ``lion_grads_mosaic``; the Mosaic GPU states walks as
``anonymous_mosaic_gpu_kernel``) and XLA's fusions by theirs. Needs a GPU and torch.

``--settings`` instead times the Triton output and gradients kernels of both ops under each
launch setting (``num_warps`` 4 / 8, ``num_stages`` 1-3, output ``block_v`` 64 / 128; LION's
backward as its dq and dk, dv kernels, or one kernel where the head dim allows), the kernels'
own times only: the sweep behind the defaults of ``pallas_kernels.two_pass`` on this device.

``--dense`` times ``pallas_kernels.lion_dense`` (the one-block kernels of short sequences) at
ViT-T's shape (B = 256, L = 197, H = 3, K = V = 64, bf16, normalised), without decay (LION-LIT)
with one per token and head (LION-S), and with it along ViT's row- and column-snake orders
(LION-S (v2), one launch for both; ``--dense_cases`` picks among ``lit``, ``s``, ``s_v2``),
under each block (32 / 64 rows), forward and backward ``num_warps`` (4 / 8) and
``num_stages`` (1-3): its forward, dq and dk/dv kernels' own times. ``--dense_defaults`` times
only the kernel's default setting (``lion_dense.BLOCK``, ``NUM_WARPS``, ``NUM_STAGES``), one
compilation per case and backend instead of 24. ``--dense_backends`` names the forward
kernels to time (``lion_dense``'s ``backend``: ``triton``, ``mosaic``; the Mosaic GPU kernels'
times show in the same columns) and ``--dense_length`` the tokens (197; the Mosaic GPU kernels
take multiples of 8, and ``s_v2`` a square grid of patches + CLS).

``--feature_map`` times ``pallas_kernels.feature_map.silu_l2`` (LION-S's q and k map) at
ViT-T's shape with the tokens padded to 200 (``[256, 200, 3, 64]`` bf16, the padded tokens'
rows dropped by ``keep`` as ``LionAttention`` does), forward and forward + backward, under
each ``block_rows`` (32-256) and ``num_warps`` (1-8), beside XLA's map with its select, then
``pallas_kernels.qkv_map.silu_l2_qkv`` (the biases and the map from the merged q/k/v
projection ``[256, 200, 576]``) beside XLA's bias adds and map: the jitted calls timed as
``bench_kernels`` times ops (10 back to back, one sync, median of ``--reps``), no torch
needed.
"""

import argparse
import collections
import functools
import itertools
import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave memory for torch

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import pallas_kernels  # noqa: E402
from experiments.bench_kernels import causal_per_feature, inputs, time_jax  # noqa: E402
from pallas_kernels.bidirectional import (MAX_ONE_KERNEL_DIM, bidirectional_scan,  # noqa: E402
                                          lion_backward)
from pallas_kernels.causal_backward import causal_backward  # noqa: E402
from pallas_kernels.lion_dense import BLOCK as DENSE_BLOCK  # noqa: E402
from pallas_kernels.lion_dense import NUM_STAGES as DENSE_STAGES  # noqa: E402
from pallas_kernels.lion_dense import NUM_WARPS as DENSE_WARPS  # noqa: E402
from pallas_kernels.two_pass import chunk_scan_two_pass  # noqa: E402

OPS = {"causal": pallas_kernels.causal_linear_attention,
       "lion": pallas_kernels.bidirectional_linear_attention,
       "per_feature": causal_per_feature}


def kernel_times(fn, args, reps):
    """``{kernel name: (ms per call, launches per call)}`` of ``reps`` calls of jitted fn."""
    import torch
    jax.block_until_ready(fn(*args))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        jax.block_until_ready([fn(*args) for _ in range(reps)])
    total, count = collections.defaultdict(float), collections.Counter()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            total[event.name] += event.device_time_total
            count[event.name] += 1
    return {name: (us / reps / 1e3, count[name] // reps) for name, us in total.items()}


def launch_settings(q, k, v, dy, g, ops, reps):
    """Prints each Triton output / gradients kernel's time (ms) under every launch setting."""
    D = q.shape[-1]
    B, _, H = g.shape
    y, low, den, lion_states = bidirectional_scan(q, k, v, g, normalize=True, low_part=True,
                                                  return_states=True)
    causal_states = chunk_scan_two_pass(q, k, v, g, out_dtype=q.dtype, return_states=True)[-1]
    zero = jnp.zeros((B, H, D, D), jnp.float32)
    runs = []  # (op, label, fn of (q, k, v, g, dy), kernel names)
    for w, st in itertools.product((4, 8), (1, 2, 3)):
        for one in (False, True) if D <= MAX_ONE_KERNEL_DIM else (False,):
            runs.append(("lion", f"backward, {'one kernel' if one else 'two kernels'}, "
                         f"num_warps={w} num_stages={st}",
                         lambda q, k, v, g, dy, w=w, st=st, one=one: lion_backward(
                             q, k, v, g, dy, lion_states, y=y, y_low=low, den=den,
                             normalize=True, one_kernel=one, num_warps=w, num_stages=st,
                             grads="triton"),
                         ["lion_backward_all"] if one else ["lion_backward_dq",
                                                            "lion_backward_dkv"]))
        runs.append(("causal", f"backward, num_warps={w} num_stages={st}",
                     lambda q, k, v, g, dy, w=w, st=st: causal_backward(
                         q, k, v, g, None, dy, zero, causal_states, num_warps=w,
                         num_stages=st, grads="triton"), ["causal_backward"]))
    for bv, w, st in itertools.product((64, 128), (4, 8), (1, 2, 3)):
        label = f"output, block_v={bv} num_warps={w} num_stages={st}"
        runs.append(("lion", label, lambda q, k, v, g, dy, bv=bv, w=w, st=st:
                     bidirectional_scan(q, k, v, g, normalize=True, low_part=True, block_v=bv,
                                        num_warps=w, num_stages=st), ["bidirectional_outputs"]))
        runs.append(("causal", label, lambda q, k, v, g, dy, bv=bv, w=w, st=st:
                     chunk_scan_two_pass(q, k, v, g, out_dtype=q.dtype, block_v=bv,
                                         num_warps=w, num_stages=st), ["chunk_outputs"]))
    for op, label, fn, names in runs:
        if op not in ops:
            continue
        try:
            times = kernel_times(jax.jit(fn), (q, k, v, g, dy), reps)
        except Exception as e:  # a setting the kernel cannot take (shared memory, registers)
            print(f"   {op} D={D} {label}: failed: {type(e).__name__}: {e}"[:200], flush=True)
            continue
        found = "  ".join(f"{name} {times[name][0]:.3f}" for name in names if name in times)
        print(f"   {op} D={D} {label}: {found}", flush=True)


def dense_line(times, names):
    """One setting's kernel times: each of ``names`` (``lion_dense_*``) with the summed times of
    the events whose names start with it, ``?`` when none did, then the sum and the trace's
    three longest other events (where a kernel under another name would show), so no time is
    put under the wrong kernel."""
    cells, total, other = [], 0.0, dict(times)
    for name in names:
        hits = [event for event in times if event.startswith(name)]
        ms = sum(times[event][0] for event in hits)
        cells.append(f"{name[11:]} {ms:.3f}" if hits else f"{name[11:]} ?")
        total += ms
        for event in hits:
            other.pop(event)
    line = "  ".join(cells) + f"  sum {total:.3f}"
    longest = sorted(other.items(), key=lambda item: -item[1][0])[:3]
    if longest:
        line += "  (other: " + ", ".join(f"{e[:40]} {t:.3f}" for e, (t, _) in longest) + ")"
    return line


DENSE_CASES = {
    "lit": "LIT, no decay",
    "s": "S, a decay per token and head",
    "s_v2": "S (v2), the row- and column-snake orders of ViT's 14 x 14 patches + CLS",
}


def dense_settings(reps, cases=tuple(DENSE_CASES), batch=256, length=197, heads=3, dim=64,
                   sweep=True, backends=("triton",)):
    """Prints lion_dense's kernel times (ms) at ViT-T's shape under every launch setting
    (``sweep=False``: the default one) and forward ``backends``, for each of ``cases`` (keys of
    :data:`DENSE_CASES`)."""
    from lion_jax.models.vit import token_orders

    keys = jax.random.split(jax.random.PRNGKey(0), 5)
    q, k, v, dy = (jax.random.normal(key, (batch, length, heads, dim), jnp.bfloat16)
                   for key in keys[:4])
    log_decay = -jax.nn.softplus(jax.random.normal(keys[4], (batch, length, heads)))
    side = int(round((length - 1) ** 0.5))
    snakes = (token_orders(side, side, ("row_snake", "col_snake"))
              if side * side + 1 == length else None)
    names = ("lion_dense_forward", "lion_dense_dq", "lion_dense_dkv")
    inputs_of = {"lit": (None, None), "s": (log_decay, None), "s_v2": (log_decay, snakes)}
    for case in cases:
        g, orders = inputs_of[case]
        print(f"== lion_dense at B={batch} L={length} H={heads} K=V={dim}, {DENSE_CASES[case]} "
              "(ms per call of each kernel)")
        settings = (itertools.product((32, 64), (4, 8), (4, 8), (1, 2, 3)) if sweep else
                    [(DENSE_BLOCK, DENSE_WARPS, DENSE_WARPS, DENSE_STAGES)])
        for backend, (block, fw, bw, st) in itertools.product(backends, settings):
            def fwd_bwd(q, k, v, g, settings=dict(block=block, num_warps=fw, backward_warps=bw,
                                                   num_stages=st, orders=orders,
                                                   backend=backend)):
                out, vjp = jax.vjp(lambda *a: pallas_kernels.lion_dense(*a, **settings), q, k,
                                   v, *([] if g is None else [g]))
                return out, vjp(dy)
            setting = f"{backend} block={block} warps={fw}/{bw} stages={st}"
            try:
                times = kernel_times(jax.jit(fwd_bwd), (q, k, v, g), reps)
            except Exception as e:  # a setting the kernel cannot take (shared memory)
                print(f"   {setting}: failed: {type(e).__name__}: {e}"[:200], flush=True)
                continue
            print(f"   {setting}: {dense_line(times, names)}", flush=True)


def feature_map_settings(reps, batch=256, length=200, real=197, heads=3, dim=64):
    """Prints silu_l2's forward and forward + backward times (ms) under each launch setting,
    and XLA's map with a select, at ``[batch, length, heads, dim]`` bf16 with the tokens past
    ``real`` dropped; then silu_l2_qkv's (the biases and the map of q and k from a merged
    ``[batch, length, 3 heads dim]`` projection) beside XLA's bias adds and map."""
    from lion_jax.layers.feature_maps import silu_l2 as xla_map
    from pallas_kernels.feature_map import NUM_WARPS, ROWS, silu_l2
    from pallas_kernels.qkv_map import silu_l2_qkv

    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    x, g = (jax.random.normal(key, (batch, length, heads, dim), jnp.bfloat16)
            for key in keys[:2])
    real_rows = (jnp.arange(length) < real)[None, :]
    keep = jnp.broadcast_to(real_rows[..., None], x.shape[:-1])

    def xla(x):
        return jnp.where(keep[..., None], xla_map(x.astype(jnp.float32)), 0.0).astype(x.dtype)

    sides = {"XLA map + select": xla}
    for block_rows, warps in itertools.product((32, 64, 128, 256), (1, 2, 4, 8)):
        default = " (default)" if (block_rows, warps) == (ROWS, NUM_WARPS) else ""
        sides[f"silu_l2 block_rows={block_rows} warps={warps}{default}"] = functools.partial(
            silu_l2, keep=keep, block_rows=block_rows, num_warps=warps)
    print(f"== silu_l2 at [{batch}, {length}, {heads}, {dim}] bf16, tokens past {real} dropped "
          f"(ms per call: forward, forward + backward)")
    _time_sides(sides, x, g, reps)

    p = jax.random.normal(keys[2], (batch, length, 3 * heads * dim), jnp.bfloat16)
    bias = jax.random.normal(keys[3], (3 * heads * dim,), jnp.float32)
    keep_rows = jnp.broadcast_to(real_rows, p.shape[:-1])

    def xla_qkv(p):
        q, k, v = jnp.split((p + bias.astype(p.dtype)).reshape(*p.shape[:-1], 3, heads, dim),
                            3, axis=-3)
        return (xla_map(q[..., 0, :, :].astype(jnp.float32)).astype(p.dtype),
                xla(k[..., 0, :, :]), v[..., 0, :, :])

    sides = {"XLA bias adds + map + select": xla_qkv}
    for block_rows, warps in itertools.product((32, 64, 128), (2, 4, 8)):
        default = " (default)" if (block_rows, warps) == (ROWS, NUM_WARPS) else ""
        sides[f"silu_l2_qkv block_rows={block_rows} warps={warps}{default}"] = (
            lambda p, b=block_rows, w=warps: silu_l2_qkv(p, bias, heads, keep=keep_rows,
                                                         block_rows=b, num_warps=w))
    print(f"== silu_l2_qkv at [{batch}, {length}, {3 * heads * dim}] bf16 (q, k, v of {heads} "
          f"heads of {dim}), tokens past {real} dropped (ms per call: forward, forward + "
          "backward)")
    _time_sides(sides, p, (g, g, g), reps)


def _time_sides(sides, x, g, reps):
    """Prints each side's forward and forward + backward (cotangent ``g``) times in ms."""
    for name, fn in sides.items():
        def fwd_bwd(x, fn=fn):
            y, vjp = jax.vjp(fn, x)
            return y, vjp(g)
        try:
            forward, _ = time_jax(fn, (x,), reps, inner=10)
            both, _ = time_jax(fwd_bwd, (x,), reps, inner=10)
        except Exception as e:  # a setting the kernel cannot take
            print(f"   {name}: failed: {type(e).__name__}: {e}"[:200], flush=True)
            continue
        print(f"   {name}: {forward:.4f}  {both:.4f}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", default="16384")
    parser.add_argument("--dims", default="128,64")
    parser.add_argument("--ops", default="causal,lion")
    parser.add_argument("--pass", dest="kind", choices=("fwd", "fwd+bwd"), default="fwd+bwd",
                        help="profile the forward alone or forward + backward")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--settings", action="store_true",
                        help="time the output / gradients kernels under each launch setting")
    parser.add_argument("--dense", action="store_true",
                        help="time lion_dense's kernels at ViT-T's shape under each setting")
    parser.add_argument("--dense_cases", default=",".join(DENSE_CASES),
                        help="with --dense: which inputs, of " + ", ".join(DENSE_CASES))
    parser.add_argument("--dense_defaults", action="store_true",
                        help="with --dense: only lion_dense's default launch setting")
    parser.add_argument("--dense_backends", default="triton",
                        help="with --dense: the kernels to time, of triton, mosaic")
    parser.add_argument("--dense_length", type=int, default=197,
                        help="with --dense: the tokens per sequence (ViT-T at 224 px: 197)")
    parser.add_argument("--feature_map", action="store_true",
                        help="time silu_l2's kernels at ViT-T's shape under each setting")
    args = parser.parse_args()
    unknown = set(args.ops.split(",")) - set(OPS)
    if unknown:
        parser.error(f"unknown --ops {sorted(unknown)}; choose from {sorted(OPS)}")
    cases = tuple(args.dense_cases.split(","))
    if set(cases) - set(DENSE_CASES):
        parser.error(f"unknown --dense_cases {sorted(set(cases) - set(DENSE_CASES))}; choose "
                     f"from {sorted(DENSE_CASES)}")
    side = int(round((args.dense_length - 1) ** 0.5))
    if args.dense and "s_v2" in cases and side * side + 1 != args.dense_length:
        parser.error("--dense_cases s_v2 needs --dense_length a square + 1 (e.g. 197)")
    if jax.default_backend() != "gpu":
        raise SystemExit("profile_kernels needs a GPU (CUDA kernels are what it times)")
    if args.feature_map:
        print(f"device {jax.devices()[0].device_kind}, jax {jax.__version__}")
        feature_map_settings(args.reps)
        return
    if args.dense:
        print(f"device {jax.devices()[0].device_kind}, jax {jax.__version__}")
        dense_settings(args.reps, cases, length=args.dense_length,
                       sweep=not args.dense_defaults,
                       backends=tuple(args.dense_backends.split(",")))
        return
    rng = np.random.default_rng(0)
    print(f"device {jax.devices()[0].device_kind}, jax {jax.__version__}, B={args.batch} "
          f"H={args.heads}, bf16; per-kernel ms per {args.kind} call (torch.profiler / CUPTI)")
    for L in (int(x) for x in args.lengths.split(",")):
        for D in (int(x) for x in args.dims.split(",")):
            q, k, v, dy, g = inputs(args.batch, L, args.heads, D, rng)
            q, k, v, dy = (jnp.asarray(x, jnp.bfloat16) for x in (q, k, v, dy))
            g = jnp.asarray(g)
            if args.settings:
                print(f"== launch settings, L={L} D={D} (ms per call of each kernel)")
                launch_settings(q, k, v, dy, g, args.ops.split(","), args.reps)
                continue
            for name in args.ops.split(","):
                def fwd_bwd(q, k, v, g, op=OPS[name]):
                    out, vjp = jax.vjp(op, q, k, v, g)
                    return out, vjp(dy)
                fn = OPS[name] if args.kind == "fwd" else fwd_bwd
                ms, _ = time_jax(fn, (q, k, v, g), 10)
                times = kernel_times(jax.jit(fn), (q, k, v, g), args.reps)
                kernels = sum(t for t, _ in times.values())
                print(f"== {name} L={L} D={D}: {ms:.3f} ms per call timed, {kernels:.3f} ms "
                      f"in kernels", flush=True)
                for kernel, (t, n) in sorted(times.items(), key=lambda item: -item[1][0]):
                    print(f"   {t:8.3f} ms  x{n}  {kernel[:100]}")


if __name__ == "__main__":
    main()
