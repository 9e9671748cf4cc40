"""Where the warp-specialized causal forward's time goes, per warpgroup and named region.

    python -m experiments.profile_warps [--length 4096] [--dims 64,128] [--out DIR]

Runs ``pallas_kernels.mosaic_causal_warps.causal_forward_warps`` (B 4, H 16, bf16, log-decays
U[-0.1, 0]) with Mosaic GPU's profiler on: every warpgroup of every program records the SM
clock when it enters and leaves each region the kernel names (``jax.named_scope``), into
shared memory the kernel leaves free, then a trace file (Chrome trace JSON). The table gives,
per warpgroup and region, the mean clock cycles per call (one call per chunk) and the region's
share of the warpgroup's span (first entry to last exit), averaged over the programs, so
it says which warpgroup is the bottleneck and what it waits on. At Kp 128 the kernel runs with
2 stages to leave the trace room (its default is 3); regions past the room are dropped, so the
table covers the first chunks of each program. Needs a Hopper GPU; writes ``profile.md`` and
the traces under ``--out``.
"""

import argparse
import collections
import glob
import json
import os
import statistics
import tempfile

import numpy as np

WARPGROUPS = ("chain", "outputs", "memory")  # warpgroup index 0, 1, 2 of each program


def warpgroup_names(outputs):
    """The names of one program's warpgroups by index, with ``outputs`` output warpgroups."""
    if outputs == 1:
        return WARPGROUPS
    return ("chain",) + tuple(f"outputs {o + 1}" for o in range(outputs)) + ("memory",)


def region_cycles(trace, names=WARPGROUPS):
    """{(warpgroup, region): [cycles of each call]} and {warpgroup: [span of each program]}
    from a Mosaic GPU profiler trace (``ts`` in clock cycles / 1e3 within one program);
    ``names``: the warpgroups' names by index (:func:`warpgroup_names`)."""
    calls, spans = collections.defaultdict(list), collections.defaultdict(list)
    by_thread = collections.defaultdict(list)
    for event in trace["traceEvents"]:
        by_thread[event["tid"]].append(event)
    for tid, events in by_thread.items():
        wg = names[(tid - 1) % len(names)]
        open_at = {}
        for event in events:
            if event["ph"] == "B":
                open_at[event["name"]] = event["ts"]
            elif event["name"] in open_at:
                calls[wg, event["name"]].append(1e3 * (event["ts"] - open_at.pop(event["name"])))
        spans[wg].append(1e3 * (events[-1]["ts"] - events[0]["ts"]))
    return calls, spans


def table(calls, spans):
    """Markdown rows: warpgroup, region, calls per program, cycles per call, share of span."""
    programs = {wg: len(s) for wg, s in spans.items()}
    rows = ["| warpgroup | region | calls per program | cycles per call | share of span |",
            "| --- | --- | --- | --- | --- |"]
    for (wg, name), cycles in sorted(calls.items()):
        share = sum(cycles) / sum(spans[wg])
        rows.append(f"| {wg} | {name.split(': ', 1)[-1]} | {len(cycles) / programs[wg]:.0f} "
                    f"| {statistics.mean(cycles):.0f} | {share:.0%} |")
    return rows


def profile(D, length, out_dir):
    """Runs the kernel once with the profiler at head dim ``D``; returns its markdown rows."""
    import jax
    import jax.numpy as jnp

    from pallas_kernels.mosaic_causal_warps import OUTPUT_WARPGROUPS, causal_forward_warps
    from pallas_kernels.chunk_scan import runs_until
    from pallas_kernels.two_pass import FUSED_TARGET_PROGRAMS
    rng = np.random.default_rng(0)
    B, H = 4, 16
    q, k = (jnp.asarray(rng.standard_normal((B, length, H, D)) * D ** -0.5, jnp.bfloat16)
            for _ in range(2))
    v = jnp.asarray(rng.standard_normal((B, length, H, D)), jnp.bfloat16)
    g = jnp.asarray(-rng.uniform(0, 0.1, (B, length, H)), jnp.float32)
    splits = runs_until(B * H * (D // 64), length // 64, FUSED_TARGET_PROGRAMS)
    trace_dir = os.path.join(out_dir, f"trace_d{D}")
    os.makedirs(trace_dir, exist_ok=True)
    run = jax.jit(lambda *a: causal_forward_warps(*a, splits=splits, profile_dir=trace_dir,
                                                  stages=2 if D > 64 else None))
    jax.block_until_ready(run(q, k, v, g))
    jax.effects_barrier()  # the trace is written by a host callback
    newest = max(glob.glob(os.path.join(trace_dir, "*-trace.json")), key=os.path.getmtime)
    with open(newest) as f:
        names = warpgroup_names(OUTPUT_WARPGROUPS.get(D, 1))
        calls, spans = region_cycles(json.load(f), names)
    head = [f"### D = {D}, L = {length}, {splits} run(s), {length // 64 // splits} chunks per "
            f"program; span per program (cycles): "
            + ", ".join(f"{wg} {statistics.mean(spans[wg]):.0f}" for wg in names), ""]
    return head + table(calls, spans) + [""]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--dims", default="64,128")
    parser.add_argument("--out", default=None, help="directory for profile.md and the traces")
    args = parser.parse_args()
    import jax
    if jax.default_backend() != "gpu":
        raise SystemExit("profile_warps needs a Hopper GPU (the trace is the kernel's own)")
    out = args.out or tempfile.mkdtemp(prefix="profile_warps_")
    os.makedirs(out, exist_ok=True)
    lines = [f"Device {jax.devices()[0].device_kind}, jax {jax.__version__}, B4 H16 bf16; "
             "cycles of the SM clock (Mosaic GPU profiler).", ""]
    print("\n".join(lines), flush=True)
    for D in (int(d) for d in args.dims.split(",")):
        section = profile(D, args.length, out)
        print("\n".join(section), flush=True)
        lines += section
    with open(os.path.join(out, "profile.md"), "w") as f:
        f.write("\n".join(lines))
    print(f"wrote {out}/profile.md and the traces")


if __name__ == "__main__":
    main()
