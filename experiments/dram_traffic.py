"""HBM bytes and time of each GPU kernel of one op, from Nsight Compute: is a kernel at the
memory's rate, and does a second read of the same tile come from L2?

    python -m experiments.dram_traffic --op pallas_causal_2pass --length 16384 --dim 128 \
        [--pass fwd|fwd+bwd] [--batch 4] [--heads 16] [--out DIR]

Runs itself under ``ncu`` (Nsight Compute, on the GPU machine) with the metrics
``dram__bytes_read.sum``, ``dram__bytes_write.sum`` and ``gpu__time_duration.sum``: the child
compiles the op (one of ``bench_kernels.jax_cases``, bf16 inputs as ``bench_kernels.inputs``
draws them), runs it once to warm up and once inside ``cudaProfilerStart`` / ``Stop``, so
``ncu --profile-from-start off`` measures the kernels of that one call. The table gives per
kernel its HBM bytes read and written, its time (ncu replays each kernel, so the times are of
a kernel alone, clocks left as they are) and the rate ``(read + written) / time``, and the
sums; written to ``dram_traffic.md`` and the raw CSV under --out. A kernel moving
``read + written`` near what its inputs and outputs weigh, at a rate near the device's (about
3.35 TB/s on an H100), is bound by HBM; fewer bytes than the inputs it reads twice say L2
served the second read.
"""

import argparse
import csv
import ctypes
import io
import os
import shutil
import subprocess
import sys
from collections import OrderedDict

METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "gpu__time_duration.sum")


def ncu_command(args):
    """The ``ncu`` command line that runs this module's child for ``args``."""
    # clocks left as they are (the device notes ask it): times comparable with bench_kernels'
    return ["ncu", "--csv", "--print-units", "base", "--profile-from-start", "off",
            "--clock-control", "none",
            "--metrics", ",".join(METRICS), sys.executable, "-m", "experiments.dram_traffic",
            "--child", "--op", args.op, "--length", str(args.length), "--dim", str(args.dim),
            "--pass", args.kind, "--batch", str(args.batch), "--heads", str(args.heads)]


def kernel_rows(text):
    """``[{"kernel", "read", "written", "ns"}]``, one per profiled kernel launch in order, from
    ncu's ``--csv --print-units base`` output (the lines before the CSV header are the
    program's own and ncu's notes)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return []
    launches = OrderedDict()
    for rec in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        if rec.get("Metric Name") not in METRICS:
            continue
        row = launches.setdefault(rec["ID"], {"kernel": rec["Kernel Name"]})
        value = float(rec["Metric Value"].replace(",", ""))
        key = {"dram__bytes_read.sum": "read", "dram__bytes_write.sum": "written",
               "gpu__time_duration.sum": "ns"}[rec["Metric Name"]]
        row[key] = value
    return [r for r in launches.values() if {"read", "written", "ns"} <= r.keys()]


def markdown(rows, header):
    """A table of the kernels' bytes, times and rates, and their sums."""
    lines = [header, "", "| kernel | read MB | written MB | us | TB/s |",
             "| --- | --- | --- | --- | --- |"]
    total = {"read": 0.0, "written": 0.0, "ns": 0.0}
    for r in rows:
        for key in total:
            total[key] += r[key]
        name = r["kernel"] if len(r["kernel"]) <= 60 else r["kernel"][:57] + "..."
        lines.append(f"| {name} | {r['read'] / 1e6:.1f} | {r['written'] / 1e6:.1f} | "
                     f"{r['ns'] / 1e3:.1f} | {rate(r):.2f} |")
    lines.append(f"| all {len(rows)} kernels | {total['read'] / 1e6:.1f} | "
                 f"{total['written'] / 1e6:.1f} | {total['ns'] / 1e3:.1f} | {rate(total):.2f} |")
    return "\n".join(lines) + "\n"


def rate(r):
    """HBM bytes read and written per second, in TB/s."""
    return (r["read"] + r["written"]) / r["ns"] / 1e3 if r["ns"] else 0.0


def child(args):
    """Compiles the op, warms it up, runs it once between cudaProfilerStart and Stop."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from experiments.bench_kernels import inputs, jax_cases, with_grads
    cases = jax_cases(quick=False)
    if args.op not in cases:
        sys.exit(f"dram_traffic: --op {args.op!r} is not an op of bench_kernels.jax_cases")
    q, k, v, dy, g = inputs(args.batch, args.length, args.heads, args.dim,
                            np.random.default_rng(0))
    q, k, v, dy = (jnp.asarray(x, jnp.bfloat16) for x in (q, k, v, dy))
    fn = cases[args.op] if args.kind == "fwd" else with_grads(cases[args.op], dy)
    exe = jax.jit(fn).lower(q, k, v, jnp.asarray(g)).compile()
    operands = (q, k, v, jnp.asarray(g))
    jax.block_until_ready(exe(*operands))
    runtime = ctypes.CDLL(cuda_runtime())
    runtime.cudaProfilerStart()
    jax.block_until_ready(exe(*operands))
    runtime.cudaProfilerStop()


def cuda_runtime():
    """The path of a loadable CUDA runtime library (``libcudart``): one that JAX's CUDA plugin
    or torch brought (under a ``nvidia`` package folder), else the system's."""
    import glob
    import site
    for root in site.getsitepackages() + [site.getusersitepackages()] + sys.path:
        found = sorted(glob.glob(os.path.join(root, "nvidia", "**", "libcudart.so*"),
                                 recursive=True))
        if found:
            return found[-1]
    return "libcudart.so"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--op", default="pallas_causal_2pass")
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--pass", dest="kind", choices=("fwd", "fwd+bwd"), default="fwd")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--out", default="workdir/dram_traffic")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    if shutil.which("ncu") is None:
        parser.error("ncu (Nsight Compute) not found on PATH: run this on the GPU machine, "
                     "where it is installed")
    done = subprocess.run(ncu_command(args), capture_output=True, text=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "ncu.csv"), "w") as f:
        f.write(done.stdout)
    rows = kernel_rows(done.stdout)
    if done.returncode or not rows:
        sys.exit(f"dram_traffic: ncu gave no kernel rows (exit {done.returncode}); its "
                 f"output is in {args.out}/ncu.csv; last lines of its stderr:\n"
                 + "\n".join(done.stderr.splitlines()[-5:]))
    header = (f"{args.op}, {args.kind}, B {args.batch}, L {args.length}, H {args.heads}, "
              f"D {args.dim}, bf16; HBM bytes and kernel times from Nsight Compute")
    table = markdown(rows, header)
    with open(os.path.join(args.out, "dram_traffic.md"), "w") as f:
        f.write(table)
    print(table)


if __name__ == "__main__":
    main()
