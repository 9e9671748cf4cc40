"""Loss curves of training runs from their ``metrics.jsonl``: a Markdown table and a plot.

    python -m experiments.loss_curves RUN_DIR [RUN_DIR ...] [--out DIR] [--every 250]

For each run (a ``--workdir`` of ``experiments.train``, or a copy holding its ``config.json``
and ``metrics.jsonl``), the train loss at every ``--every`` steps and the validation loss at
every evaluation, against steps and, for token-level tasks (``config.data.max_len``), training
tokens (``step x batch_size x grad_accum_steps x max_len``). Prints the table; with ``--out``
writes ``table.md`` and ``plot.png`` (train loss against tokens or steps on the left, validation
loss on the right). Runs are named by their config's ``label``, else their directory.
"""

import argparse
import json
import os
import sys

from experiments.compare_runs import read_split_metrics


def read_run(workdir):
    """``(name, tokens_per_step or None, {step: train loss}, {step: val loss})``."""
    path = os.path.join(workdir, "config.json")
    if not os.path.isfile(path):
        raise SystemExit(f"error: {path} not found (is {workdir!r} a training workdir?)")
    with open(path) as f:
        config = json.load(f)
    max_len = (config.get("data") or {}).get("max_len")
    tokens = (config["batch_size"] * config.get("grad_accum_steps", 1) * max_len
              if max_len else None)
    name = config.get("label") or os.path.basename(os.path.normpath(workdir))
    losses = [{step: m["loss"] for step, m in read_split_metrics(workdir, split).items()
               if "loss" in m} for split in ("train", "val")]
    return name, tokens, *losses


def markdown(runs, every):
    """The table: one row per step (train every ``every`` steps, and every evaluation)."""
    steps = sorted({s for _, _, train, val in runs for s in train if s % every == 0}
                   | {s for _, _, _, val in runs for s in val})
    tokens = runs[0][1] if all(r[1] == runs[0][1] for r in runs) else None
    head = ["step"] + (["tokens (M)"] if tokens else [])
    for name, _, _, _ in runs:
        head += [f"{name} train", f"{name} val"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for step in steps:
        cells = [f"{step:,}"] + ([f"{step * tokens / 1e6:,.1f}"] if tokens else [])
        for _, _, train, val in runs:
            cells += [f"{train[step]:.4f}" if step in train else "",
                      f"{val[step]:.4f}" if step in val else ""]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(path, runs):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for (name, tokens, train, val), color in zip(runs, plt.rcParams["axes.prop_cycle"]):
        scale = (lambda s, t=tokens: s * t / 1e6) if tokens else (lambda s: s)
        for ax, curve, style in ((axes[0], train, "-"), (axes[1], val, "o-")):
            steps = sorted(curve)
            ax.plot([scale(s) for s in steps], [curve[s] for s in steps], style, label=name,
                    color=color["color"])
    unit = "training tokens (M)" if all(r[1] for r in runs) else "step"
    for ax, title in zip(axes, ("train loss", "validation loss")):
        ax.set_xlabel(unit)
        ax.set_ylabel(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdirs", nargs="+")
    parser.add_argument("--out", default=None, help="directory for table.md and plot.png")
    parser.add_argument("--every", type=int, default=250, help="train-loss rows every N steps")
    args = parser.parse_args(argv)
    if args.every < 1:
        sys.exit(f"error: --every must be at least 1, got {args.every}")
    runs = [read_run(w) for w in args.workdirs]
    table = markdown(runs, args.every)
    print(table, end="")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "table.md"), "w") as f:
            f.write(table)
        plot(os.path.join(args.out, "plot.png"), runs)


if __name__ == "__main__":
    main()
