r"""A small scaling-law sweep: train a grid of causal LMs, fit ``L(C)``, ``N_opt(C)``,
``D_opt(C)`` per architecture and plot them in the layout of the scaling-laws paper's Figure 1.

    python -m experiments.scaling_sweep --out DIR [--preset default|smoke]
        [--archs llama,tnl,hgrn2,cosformer2] [--widths 64,96,128,192] [--steps N]
        [--seq_len n] [--batch b] [--unit pf-days] [--flops table1|full]
        [--convention non_embedding|table1|with_embedding] [--bracketed]
        [--cache_dir DIR] [--data_dir DIR]

Models: for each architecture and width ``d``, a :class:`lion_jax.models.lm.CausalLM` with
``l = d / 32`` layers (the aspect ratio fixed, as the paper's sizes roughly keep it), heads of
``--head_dim`` (32 by default; ``h = d / head_dim``) and a GLU of ``8/3 d`` rounded up to a
multiple of 16, trained by the library's trainer (``experiments.trainer``, what
``python -m experiments.train`` runs) from ``configs/lm/<arch>.py:small`` with the sweep's
length, batch, steps and learning rate (cosine to 10% after 10% warmup). Data: the embedded
corpus and its BPE (``experiments/data/lm.py``; no download), or ``--data_dir`` text files.

Per logged step after the warmup (every ``--log_every`` steps, the training loss averaged since
the last log; the warmup's points are left out, the paper does not say whether it keeps them):
tokens ``D = step * b * n``, compute ``C = step * C_step`` with ``C_step`` the paper's Table 1
training FLOPs per step (``--flops table1``, :func:`lion_jax.scaling.table1_flops_per_step` at
the run's ``b``, ``n``, ``l``, ``d``, ``h``; ``full``: every App. A.1 term with the actual GLU
width, no embedding) and ``N`` by ``--convention`` (default ``non_embedding``: the actual
non-embedding count; the paper's fits do not say which, digest 2.3). The fits
(:func:`lion_jax.scaling.fit_scaling_laws`) use the lower envelope over the sizes on a
log-spaced compute grid, ``C`` in ``--unit`` (PF-days by default, the digest's reading of the
paper's Table 3); ``--bracketed`` keeps only envelope points with a smaller and a larger run
logged at that ``C`` (needs five or more sizes; off by default for small sweeps, which then
bias ``a`` low, see :mod:`lion_jax.scaling.fit`).

Writes ``DIR/runs/<arch>_d<width>/`` (each run's workdir: ``config.json``, ``metrics.jsonl``,
checkpoints; the same command resumes unfinished runs and skips finished ones; ``--fit_only``
fits the run records already there, e.g. copied from the machine that trained them),
``DIR/points.jsonl`` (one line per logged point), ``DIR/fits.json``, ``DIR/table.md`` (our
exponents beside the paper's Table 3 and the architectures ordered by predicted loss at equal
compute) and ``DIR/figure1.png``.

Presets: ``default``, 4 architectures x 4 widths (64-192, 2-6 layers, 0.1-2.7M non-embedding
parameters), rows of 256 tokens, 32 rows a step, 400 steps (one H200, 2026-11-26: each LLaMA
and TNL run 10-28 s, most of it compiling; HGRN2 and cosFormer2 not yet timed); ``smoke``, 2
architectures x 3 widths of 1 layer, 24 steps of 8 rows of 32 tokens: a CPU check of the whole
path for CI (26 s on this project's 2-core CI machine, 2026-11-26).
"""

import json
import os
import sys
import time

import jax
import numpy as np
from absl import app, flags, logging

from configs.lm import common as lm_common
from experiments.errors import UserError
from experiments.lra_leaderboard import read_records
from experiments.trainer import train_and_evaluate
from lion_jax import scaling

FLAGS = flags.FLAGS
PRESETS = {
    "default": dict(archs=("llama", "tnl", "hgrn2", "cosformer2"), widths=(64, 96, 128, 192),
                    head_dim=32, seq_len=256, batch=32, steps=400, log_every=10,
                    learning_rate=2e-3, num_train=20_000, vocab_size=8192),
    "smoke": dict(archs=("llama", "tnl"), widths=(16, 24, 32), head_dim=8, seq_len=32, batch=8,
                  steps=24, log_every=2, learning_rate=5e-3, num_train=60, vocab_size=300),
}
FLOPS_FORMS = ("table1", "full")


def define_flags():
    flags.DEFINE_string("out", None, "Output directory (runs, points, fits, table, figure).")
    flags.DEFINE_enum("preset", "default", list(PRESETS), "Sweep preset (module docstring).")
    flags.DEFINE_list("archs", None, "Architectures (default: the preset's).")
    flags.DEFINE_list("widths", None, "Model widths d (default: the preset's).")
    flags.DEFINE_integer("head_dim", None, "Head width (default: the preset's).")
    flags.DEFINE_integer("seq_len", None, "Tokens per row n (default: the preset's).")
    flags.DEFINE_integer("batch", None, "Rows per step b (default: the preset's).")
    flags.DEFINE_integer("steps", None, "Training steps per run (default: the preset's).")
    flags.DEFINE_integer("log_every", None, "Steps between logged losses (default: preset's).")
    flags.DEFINE_float("learning_rate", None, "Peak learning rate (default: the preset's).")
    flags.DEFINE_integer("chunk_size", None, "Chunk of the linear mixers' chunked forms "
                         "(default: 64, or the row when shorter).")
    flags.DEFINE_string("unit", scaling.PAPER_UNIT, "Compute unit of the fits.")
    flags.DEFINE_enum("flops", "table1", list(FLOPS_FORMS), "FLOPs per step: Table 1 or full.")
    flags.DEFINE_enum("convention", "non_embedding", list(scaling.CONVENTIONS),
                      "Parameter count N of the fits.")
    flags.DEFINE_bool("bracketed", False, "Envelope points bracketed by a smaller and a "
                      "larger run only (five or more widths).")
    flags.DEFINE_bool("fit_only", False, "Fit the runs already in DIR/runs (e.g. trained on "
                      "another machine), training nothing.")
    flags.DEFINE_string("cache_dir", "~/.cache/lion_jax/lm", "Tokenizer and token cache.")
    flags.DEFINE_string("data_dir", "", "Text files instead of the embedded corpus.")


def settings_from_flags():
    """The preset with the flags that were given over it; checks every value."""
    s = dict(PRESETS[FLAGS.preset])
    for key in ("head_dim", "seq_len", "batch", "steps", "log_every", "learning_rate",
                "chunk_size"):
        if getattr(FLAGS, key) is not None:
            s[key] = getattr(FLAGS, key)
    if FLAGS.archs:
        s["archs"] = tuple(FLAGS.archs)
    if FLAGS.widths:
        try:
            s["widths"] = tuple(int(w) for w in FLAGS.widths)
        except ValueError as e:
            raise UserError(f"--widths must be integers: {e}") from None
    bad = [a for a in s["archs"] if a not in scaling.ARCHS]
    if bad:
        raise UserError(f"unknown --archs {bad}; valid: {list(scaling.ARCHS)}")
    for w in s["widths"]:
        if w <= 0 or w % s["head_dim"]:
            raise UserError(f"width {w} must be a positive multiple of --head_dim="
                            f"{s['head_dim']}")
    if len(s["widths"]) < 2:
        raise UserError("--widths needs at least two widths (the envelope compares sizes)")
    s.setdefault("chunk_size", min(64, s["seq_len"]))
    for key in ("seq_len", "batch", "steps", "log_every", "chunk_size"):
        if s[key] <= 0:
            raise UserError(f"--{key} must be positive, got {s[key]}")
    if s["steps"] < 4 * s["log_every"]:
        raise UserError(f"--steps={s['steps']} gives fewer than 4 logged losses at "
                        f"--log_every={s['log_every']}")
    if FLAGS.unit not in scaling.UNITS:
        raise UserError(f"unknown --unit {FLAGS.unit!r}; valid: {list(scaling.UNITS)}")
    return s


def dims(width, head_dim):
    """``(layers, width, heads, glu)`` of the sweep's model of ``width``."""
    return max(1, width // 32), width, width // head_dim, 16 * -(-8 * width // (3 * 16))


def warmup_steps(s):
    """The runs' learning-rate warmup: the first 10% of the steps."""
    return max(1, s["steps"] // 10)


def run_config(arch, width, s):
    """The trainer config of one run: ``configs/lm/<arch>.py:small`` with the sweep's
    sizes, data, schedule and logging."""
    c = lm_common.make_config(arch, "small")
    layers, d, heads, glu = dims(width, s["head_dim"])
    c.model.update(size="", num_layers=layers, d_model=d, num_heads=heads, mlp_dim=glu)
    if "chunk_size" in c.model.mixer:
        c.model.mixer.chunk_size = s["chunk_size"]
    c.data.update(max_len=s["seq_len"], num_train=s["num_train"], num_val=max(4, s["batch"]),
                  vocab_size=s["vocab_size"], tokenizer_documents=min(20_000, s["num_train"]),
                  cache_dir=FLAGS.cache_dir)
    if FLAGS.data_dir:
        c.data.update(source="files", data_dir=FLAGS.data_dir)
    if FLAGS.preset == "smoke":
        c.data.update(min_chars=600, max_chars=900)
        c.model.dtype = "float32"
    c.batch_size = c.eval_batch_size = s["batch"]
    c.num_train_steps = s["steps"]
    c.optim.update(learning_rate=s["learning_rate"], schedule="cosine",
                   warmup_steps=warmup_steps(s), end_lr_factor=0.1)
    c.log_every = s["log_every"]
    c.eval_every = 0  # once, at the end
    c.checkpoint_every = s["steps"]
    c.keep_checkpoints = 1
    c.progress_bar = False
    c.label = f"{lm_common.ARCH_LABELS[arch]} d={width}"
    return c


def flops_per_step(arch, layers, d, heads, glu, s):
    b, n = s["batch"], s["seq_len"]
    if FLAGS.flops == "table1":
        return scaling.table1_flops_per_step(arch, layers, d, heads, b=b, n=n)
    return scaling.full_flops_per_step(arch, layers, d, heads, glu, b=b, n=n,
                                       v=s["vocab_size"])


def read_run(workdir):
    """``(steps, losses, devices)`` of ``workdir/metrics.jsonl``: the train records (a resumed
    run logs a step again: the last record wins) and the devices its starts ran on."""
    records = read_records(os.path.join(workdir, "metrics.jsonl"))
    losses = {r["step"]: r["metrics"]["loss"] for r in records
              if r["split"] == "train" and "loss" in r["metrics"]}
    devices = {r.get("info", {}).get("device", "?") for r in records if r["split"] == "run"}
    steps = np.array(sorted(losses))
    return steps, np.array([losses[k] for k in steps]), devices


def train_all(s, out):
    """Trains (or resumes, or skips) every run; ``{arch: [scaling.Run]}`` and the points."""
    runs_by_arch, points, devices = {}, [], set()
    total = len(s["archs"]) * len(s["widths"])
    for i, (arch, width) in enumerate(((a, w) for a in s["archs"] for w in s["widths"]), 1):
        layers, d, heads, glu = dims(width, s["head_dim"])
        workdir = os.path.join(out, "runs", f"{arch}_d{width}")
        n_params = scaling.model_params(arch, (layers, d, heads, glu), FLAGS.convention,
                                        v=s["vocab_size"])
        c_step = flops_per_step(arch, layers, d, heads, glu, s)
        print(f"[{i}/{total}] {arch} d={d} l={layers} h={heads} g={glu}: N = {n_params:,.0f}, "
              f"C = {c_step:.3e} FLOPs a step", flush=True)
        start = time.perf_counter()
        if not FLAGS.fit_only:
            train_and_evaluate(run_config(arch, width, s), workdir, devices=jax.devices()[:1],
                               config_name=f"experiments.scaling_sweep {arch} d={width}")
        elif not os.path.exists(os.path.join(workdir, "metrics.jsonl")):
            raise UserError(f"--fit_only: no run record {workdir}/metrics.jsonl; run without "
                            "--fit_only to train it, or leave its arch or width out")
        steps, losses, run_devices = read_run(workdir)
        devices |= run_devices
        keep = steps > warmup_steps(s)  # the warmup's plateau is no scaling regime
        steps, losses = steps[keep], losses[keep]
        print(f"[{i}/{total}] {arch} d={d}: final train loss {losses[-1]:.4f} "
              f"({time.perf_counter() - start:.0f} s)", flush=True)
        tokens = steps * s["batch"] * s["seq_len"]
        run = scaling.Run(f"{arch}-d{width}", arch, n_params, tokens, steps * c_step, losses)
        runs_by_arch.setdefault(arch, []).append(run)
        points += [dict(arch=arch, width=width, layers=layers, heads=heads, glu=glu,
                        params=n_params, step=int(k), tokens=int(t), flops=float(f),
                        loss=float(v))
                   for k, t, f, v in zip(steps, tokens, run.flops, losses)]
    return runs_by_arch, points, devices


def _law(p):
    return f"{p.beta:.4g} C^{p.alpha:+.4f}"


def report(fits, runs_by_arch, devices, s):
    """Markdown: our fits beside Table 3, and the equal-compute ordering."""
    unit = FLAGS.unit
    lines = [f"Scaling sweep (`{' '.join(sys.argv[1:]) or 'defaults'}`): runs trained on "
             f"{', '.join(sorted(devices))}, fitted with jax {jax.__version__}; widths "
             f"{list(s['widths'])}, rows of {s['seq_len']}, {s['batch']} rows a step, "
             f"{s['steps']} steps; C in {unit} ({FLAGS.flops} FLOPs), N {FLAGS.convention}, "
             f"envelope {'bracketed' if FLAGS.bracketed else 'over every covered C'}.", "",
             "| arch | L(C) ours | L(C) paper | a ours | a paper | b ours | b paper |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for arch, fit in fits.items():
        paper = scaling.PAPER_LAWS[arch]
        lines.append(f"| {arch} | {_law(fit.loss)} | {_law(paper.loss)} (PF-days) | "
                     f"{fit.params.alpha:.4f} | {paper.params.alpha:.4f} | "
                     f"{fit.tokens.alpha:.4f} | {paper.tokens.alpha:.4f} |")
    lo = max(min(r.flops.min() for r in runs) for runs in runs_by_arch.values())
    hi = min(max(r.flops.max() for r in runs) for runs in runs_by_arch.values())
    lines += ["", "Architectures by predicted loss (lowest first) at equal compute:", ""]
    for c in np.geomspace(lo, hi, 3):
        c_unit = c / scaling.unit_factor(unit)
        order = scaling.ordering(fits, c_unit, unit)
        losses = ", ".join(f"{a} {float(fits[a].predict(c_unit, unit)[0]):.4f}" for a in order)
        lines.append(f"- C = {c_unit:.3g} {unit}: {' < '.join(order)} ({losses})")
    lines += ["", "The paper's order (Table 3, every C from 1e-3 to 1e3 PF-days): "
              "hgrn2 < tnl < cosformer2 < llama."]
    return "\n".join(lines) + "\n"


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # orbax's per-save INFO lines, as experiments.train
    if not FLAGS.out:
        sys.exit("error: --out DIR is required")
    try:
        s = settings_from_flags()
        out = os.path.abspath(os.path.expanduser(FLAGS.out))
        os.makedirs(out, exist_ok=True)
        runs_by_arch, points, devices = train_all(s, out)
    except UserError as e:
        sys.exit(f"error: {e}")
    with open(os.path.join(out, "points.jsonl"), "w") as f:
        f.writelines(json.dumps(p) + "\n" for p in points)
    fits = {arch: scaling.fit_scaling_laws(runs, unit=FLAGS.unit, bracketed=FLAGS.bracketed)
            for arch, runs in runs_by_arch.items()}
    with open(os.path.join(out, "fits.json"), "w") as f:
        json.dump({arch: dict(unit=fit.unit, loss=fit.loss._asdict(),
                              params=fit.params._asdict(), tokens=fit.tokens._asdict())
                   for arch, fit in fits.items()}, f, indent=1)
    table = report(fits, runs_by_arch, devices, s)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(table)
    scaling.plot_figure1(fits, runs_by_arch, os.path.join(out, "figure1.png"))
    print(table)
    print(f"wrote {out}/table.md, figure1.png, fits.json, points.jsonl")


if __name__ == "__main__":
    define_flags()
    app.run(main)
