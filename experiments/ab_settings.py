"""Interleaved A/B of ``pallas_kernels`` settings: is a variant faster than the default, by more
than the default differs from itself?

    python -m experiments.ab_settings --op pallas_causal_2pass --dims 64,128 \
        --variant approx:mosaic_tiles.APPROX_MATH=True \
        --variant 'both:mosaic_tiles.APPROX_MATH=True,GRADS_KERNEL="triton"' \
        [--length 16384] [--batch 4] [--heads 16] [--rounds 15] [--pass both]
        [--out workdir/ab_settings]
    python -m experiments.ab_settings --op pallas_causal_per_feature --length 4096 \
        --base f92ac06        # this checkout's kernels against a revision's


Any settings of one op, given on the command line (``bench_kernels`` has a fixed row per
setting), timed beside the default twice: "default" and "default again", traced and compiled
separately, whose ratio is the spread a difference must beat (two rows running the same
kernels, timed one after the other, have differed by 10%: one H100, 2026-12-07). Each variant
is compiled first under its settings (``bench_kernels.prepared_jax`` inside
:func:`traced_under`); then ``--rounds`` rounds each time every variant once, in turn (a
sample: 5 calls back to back and one wait for the device), as ``bench_kernels`` times the ops
of a shape. The table gives each variant's median and interquartile range over the rounds and
its median over the default's. A variant is ``NAME:SETTING=VALUE[,SETTING=VALUE...]``, settings
as ``bench_kernels.setting_place`` names them (``NAME`` of ``linear_attention`` or
``module.NAME``), values Python literals (commas inside brackets belong to the value:
``STAGES=(4, 2)``). The op is one of ``bench_kernels.jax_cases``'
(per-token log-decays ``[B, L, H]``; the per-feature op draws its own), forward and forward +
backward. Writes results.json, results.md and results.png (each variant's ratio with the
spread) under --out.

``--base REV`` adds the variant "base REV": ``pallas_kernels`` as it is at that git revision
(or in the directory REV, holding a copy of the package, for a machine without the
repository's history: ``git archive REV pallas_kernels | tar -x -C DIR``), imported beside
this checkout's as a second package (:func:`revision_kernels`) and timed at its own defaults
in the same rounds: a change's A/B in one process, with no setting to switch it.
"""

import argparse
import ast
import contextlib
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile

import jax.numpy as jnp
import numpy as np

from experiments import bench_kernels
from experiments.bench_kernels import (inputs, interleaved, jax_cases, machine, prepared_jax,
                                       quartiles, setting_place, traced_under, with_grads)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_variant(text):
    """``"NAME:SETTING=VALUE,..."`` -> ``(name, {setting: value})``; a ValueError names what
    is wrong."""
    name, sep, body = text.partition(":")
    if not sep or not name or not body:
        raise ValueError(f"--variant {text!r}: write NAME:SETTING=VALUE[,SETTING=VALUE...]")
    settings = {}
    for item in top_level_items(body):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"--variant {text!r}: {item!r} is not SETTING=VALUE")
        try:
            module, attr = setting_place(key.strip())
        except ImportError as e:
            raise ValueError(f"--variant {text!r}: no module for {key!r} ({e})") from None
        if not hasattr(module, attr):
            raise ValueError(f"--variant {text!r}: {module.__name__} has no setting {attr!r}")
        try:
            settings[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            raise ValueError(f"--variant {text!r}: {value!r} is not a Python literal (quote "
                             "strings: LAYOUT=\"wide\")") from None
    return name, settings


def top_level_items(body):
    """``body`` split at the commas outside brackets: ``"A=(4, 2),B=1"`` -> ``["A=(4, 2)",
    "B=1"]``."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(body):
        depth += (ch in "([{") - (ch in ")]}")
        if ch == "," and depth == 0:
            items.append(body[start:i])
            start = i + 1
    return items + [body[start:]]


def revision_kernels(base):
    """``pallas_kernels`` at the git revision ``base`` of this repository, or in the directory
    ``base`` (which holds ``pallas_kernels/``), imported as a second package
    (``pallas_kernels_<sha>`` or ``pallas_kernels_base``): its modules written into a temporary
    directory with their imports of the package renamed. A ValueError says what is wrong."""
    folder = tempfile.mkdtemp(prefix="ab_settings_")
    package_dir = os.path.join(base, "pallas_kernels")
    if os.path.isdir(package_dir):
        name = "pallas_kernels_base"
        sources = {}
        for filename in (f for f in os.listdir(package_dir) if f.endswith(".py")):
            with open(os.path.join(package_dir, filename)) as f:
                sources[filename] = f.read()
    else:
        def git(*args):
            return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT)
        try:
            found = git("rev-parse", "--short", f"{base}^{{commit}}")
        except OSError as e:
            raise ValueError(f"--base {base!r}: no such directory, and git cannot run ({e})")
        if found.returncode:
            raise ValueError(f"--base {base!r}: neither a directory holding pallas_kernels/ "
                             "nor a commit of this repository")
        sha = found.stdout.strip()
        name = f"pallas_kernels_{sha}"
        sources = {os.path.basename(path): git("show", f"{sha}:{path}").stdout
                   for path in git("ls-tree", "--name-only", sha, "pallas_kernels/").stdout.split()
                   if path.endswith(".py")}
    if "__init__.py" not in sources:
        raise ValueError(f"--base {base!r}: no pallas_kernels/__init__.py there")
    os.makedirs(os.path.join(folder, name))
    for filename, text in sources.items():
        with open(os.path.join(folder, name, filename), "w") as f:
            f.write(re.sub(r"\bpallas_kernels\b", name, text))
    sys.path.insert(0, folder)
    return importlib.import_module(name)


@contextlib.contextmanager
def bound_package(package):
    """``bench_kernels``' ops (which call the module global ``pallas_kernels`` when traced)
    calling ``package`` instead, for the duration; None leaves them as they are."""
    saved = bench_kernels.pallas_kernels
    bench_kernels.pallas_kernels = package or saved
    try:
        yield
    finally:
        bench_kernels.pallas_kernels = saved


def prepared(fn, args, settings, package=None):
    """``bench_kernels.prepared_jax``'s sample of ``fn`` compiled under ``settings`` (with the
    kernels of ``package``, :func:`bound_package`)."""
    with traced_under(settings), bound_package(package):
        return prepared_jax(fn, args)[0]


def summary(times, **keys):
    """Rows of one A/B: median, quartiles and the ratio of medians to "default"."""
    base = quartiles(times["default"])[1]
    rows = []
    for name, ts in times.items():
        q25, med, q75 = quartiles(ts)
        rows.append(dict(keys, variant=name, ms=med, q25=q25, q75=q75, ratio=med / base,
                         rounds=len(ts)))
    return rows


def markdown(rows, header):
    lines = [header, "", "| op | D | pass | variant | median ms | IQR ms | / default |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['op']} | {r['D']} | {r['kind']} | {r['variant']} | {r['ms']:.3f} "
                     f"| {r['q25']:.3f} to {r['q75']:.3f} | {r['ratio']:.3f} |")
    return "\n".join(lines) + "\n"


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    groups = sorted({(r["D"], r["kind"]) for r in rows})
    fig, axes = plt.subplots(1, len(groups), figsize=(4.5 * len(groups), 4), squeeze=False)
    for ax, (D, kind) in zip(axes[0], groups):
        sel = [r for r in rows if (r["D"], r["kind"]) == (D, kind)]
        spread = max(abs(r["ratio"] - 1) for r in sel if r["variant"] == "default again")
        ax.axhspan(1 - spread, 1 + spread, color="grey", alpha=0.3, label="default's spread")
        ax.bar([r["variant"] for r in sel], [r["ratio"] for r in sel])
        ax.set(title=f"{sel[0]['op']}, D={D}, {kind}", ylabel="median / default")
        ax.tick_params(axis="x", rotation=45)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--op", default="pallas_causal_2pass")
    parser.add_argument("--variant", action="append", default=[])
    parser.add_argument("--dims", default="64")
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--pass", dest="kinds", choices=("fwd", "fwd+bwd", "both"),
                        default="both", help="time the forward, forward + backward, or both")
    parser.add_argument("--out", default="workdir/ab_settings")
    parser.add_argument("--base", default=None, metavar="REV",
                        help="also time pallas_kernels at this git revision (or in this "
                             "directory) beside this checkout's")
    args = parser.parse_args(argv)
    packages = {}
    try:
        variants = dict([("default", {}), ("default again", {})]
                        + [parse_variant(v) for v in args.variant])
        if args.base:  # named by the revision or the directory's name
            name = f"base {os.path.basename(os.path.normpath(args.base))}"
            packages[name], variants[name] = revision_kernels(args.base), {}
    except ValueError as e:
        parser.error(str(e))
    if len(variants) < 2 + len(args.variant) + len(packages):
        parser.error("--variant: two variants share a name (or use 'default')")
    cases = jax_cases(quick=False)
    if args.op not in cases:
        parser.error(f"--op {args.op!r}: not an op of bench_kernels.jax_cases; one of "
                     + ", ".join(sorted(n for n in cases if n.startswith("pallas"))))
    fn = cases[args.op]
    os.makedirs(args.out, exist_ok=True)
    rows, rng = [], np.random.default_rng()
    for D in (int(d) for d in args.dims.split(",")):
        q, k, v, dy, g = inputs(args.batch, args.length, args.heads, D, rng)
        q, k, v, dy = (jnp.asarray(x, jnp.bfloat16) for x in (q, k, v, dy))
        operands = (q, k, v, jnp.asarray(g))
        for kind, f in (("fwd", fn), ("fwd+bwd", with_grads(fn, dy))):
            if args.kinds not in ("both", kind):
                continue
            samples = {name: prepared(f, operands, s, packages.get(name))
                       for name, s in variants.items()}
            times = interleaved(samples, args.rounds)
            for r in summary(times, op=args.op, D=D, kind=kind, L=args.length):
                rows.append(r)
                print(f"{r['op']} D={D} {kind:7s} {r['variant']:16s} {r['ms']:8.3f} ms "
                      f"(IQR {r['q25']:.3f} to {r['q75']:.3f})  x{r['ratio']:.3f}", flush=True)
    header = (f"{machine()}, B {args.batch}, L {args.length}, H {args.heads}, bf16, "
              f"{args.rounds} interleaved rounds; variants: "
              + "; ".join(f"{n} {s}" for n, s in variants.items() if s)
              + "".join(f"; {n}: {p.__name__} at its defaults" for n, p in packages.items()))
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(dict(header=header, rows=rows), f, indent=1)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(markdown(rows, header))
    plot(rows, os.path.join(args.out, "results.png"))
    print(markdown(rows, header))


if __name__ == "__main__":
    main()
