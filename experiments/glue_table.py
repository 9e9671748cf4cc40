"""Our GLUE scores beside the LION paper's Table 3, read from fine-tuning workdirs.

    python -m experiments.glue_table RUN_DIR [RUN_DIR ...] [--pick best|last] [--output F.md]

Prints a Markdown report (and writes it to ``--output`` when given) with two tables:

* per model: MLM accuracy, the paper's number on each of the eight GLUE tasks and their
  average (only when all eight have a number), beside the paper's rows (LION paper, arXiv
  2502.16249: the LARGE rows of Table 3, and the BASE rows of Table 10 with the M2-BASE
  recipe, the one Appendix D.6 selects for BASE; see :data:`SOURCES`);
* per run: the eval step picked, its score and metrics, steps done, status, wall time,
  device(s) and the ``--config`` argument.

Every number in our rows comes from the workdirs; the only numbers typed here are the
paper's rows. In Python::

    from experiments import glue_table
    print(glue_table.render(glue_table.collect(["workdir/glue_rte"])))

**What a GLUE fine-tuning run must write** (the contract for the GLUE task of
experiments/tasks; ``config.json`` and ``metrics.jsonl`` as experiments/trainer.py and
experiments/progress.py write them):

* ``config.json``: ``data.name == "glue"`` and ``data.task`` the task ("mnli", "rte", "qqp",
  "qnli", "sst2", "stsb", "mrpc", "cola"; "SST-2", "STS-B", "CoLA" ... also accepted);
  ``num_train_steps``; ``label``, the row name (e.g. "LION-S LARGE"); when empty the name
  comes from ``model``: "BERT" if ``model.mixer_kind == "softmax"``, else "LION-" + LIT,
  RETNET (``model.mixer.variant`` "retnet" or "d": the paper's GLUE tables call LION-D
  LION-RETNET) or S. Set ``label`` to tell sizes and recipes apart.
* ``metrics.jsonl``: at each evaluation, one record per eval split, ``"split": "val"`` (the
  GLUE dev set; MNLI: matched) and, MNLI only, ``"split": "val_mismatched"``, whose
  ``metrics`` hold, as fractions computed over the whole split (``glue_metrics.task_metrics``
  does it), the keys of ``experiments.data.glue.TASKS[task].metrics``:

  ========================= ==================================================
  task                      keys per eval split (``split/key`` in best_metric)
  ========================= ==================================================
  MNLI                      ``val/accuracy``, ``val_mismatched/accuracy``
  RTE, QNLI, SST-2          ``val/accuracy``
  QQP, MRPC                 ``val/accuracy``, ``val/f1``
  STS-B                     ``val/pearson``, ``val/spearman``
  CoLA                      ``val/matthews``, ``val/accuracy``
  ========================= ==================================================

  Other keys (``loss``) may be there too. The score of an evaluation is
  ``glue_metrics.score_from_metrics`` (MNLI: mean of matched and mismatched accuracy; QQP:
  mean of accuracy and F1; MRPC: F1; STS-B: Spearman; CoLA: Matthews; others: accuracy; why in
  experiments/glue_metrics.py); an evaluation missing one of its pairs is skipped.
* Optionally, MLM pretraining workdirs (``config.task == "mlm"``, eval records ``"split":
  "val"`` with ``accuracy``, the masked-token accuracy) fill the MLM Acc. column of the model
  of the same name.

Which evaluation counts: ``--pick best`` (default) takes each run's evaluation with the best
score (the earliest on ties); ``--pick last`` its last complete one, which is what the paper's
script reports (Composer's metrics after the final evaluation). Where several runs share a
model and task (seeds), the cell is the mean of their scores, as the paper's script averages
its seeds (5 for RTE, MRPC, STS-B; 4 CoLA; 3 SST-2; 1 MNLI, QQP, QNLI), with ``(n=K)``.
``*`` marks a number from a run not finished. Workdirs of runs still going can be read.
"""

import argparse
import datetime
import os
import sys

import numpy as np

from experiments import glue_metrics
from experiments.data import glue
from experiments.errors import UserError
from experiments.lra_leaderboard import (config_args, devices, hours_minutes, markdown_table,
                                         read_workdir, wall_time)

TASKS = glue.TASK_NAMES  # Table 3's column order
COLUMNS = ("model", "MLM Acc.", *(glue.TASKS[t].title for t in TASKS), "Avg")
PICKS = ("best", "last")
VARIANT_NAMES = {"lit": "LIT", "retnet": "RETNET", "d": "RETNET", "s": "S"}

# (row label, MLM accuracy, scores in TASKS order, Avg as printed in the paper). Typed from
# the LION paper (arXiv 2502.16249).
PAPER_ROWS = (
    ("LION paper: BERT LARGE", 69.88,
     (85.68, 67.44, 89.90, 91.89, 93.04, 88.63, 90.89, 56.14), 82.95),
    ("LION paper: LION-LIT LARGE", 67.11,
     (83.73, 57.18, 89.85, 89.93, 91.86, 88.02, 90.18, 55.36), 80.76),
    ("LION paper: LION-RETNET LARGE", 68.64,
     (83.82, 60.72, 89.72, 89.79, 92.93, 87.29, 89.66, 56.83), 81.34),
    ("LION paper: LION-S LARGE", 69.16,
     (84.38, 57.69, 89.57, 90.30, 92.93, 87.68, 90.57, 59.54), 81.58),
    ("LION paper: BERT BASE", 67.70,
     (84.63, 64.33, 89.99, 89.80, 92.51, 86.69, 89.62, 60.42), 82.25),
    ("LION paper: LION-LIT BASE", 65.47,
     (82.50, 63.47, 89.72, 89.27, 91.74, 87.18, 89.37, 49.22), 80.31),
    ("LION paper: LION-RETNET BASE", 66.62,
     (82.85, 52.49, 89.63, 88.43, 91.86, 85.96, 83.94, 53.58), 78.59),
    ("LION paper: LION-S BASE", 67.05,
     (83.17, 53.50, 89.35, 88.89, 93.00, 37.73, 77.87, 53.18), 72.09),
)
SOURCES = (
    "Paper rows: LION paper (arXiv 2502.16249). LARGE: Table 3 (C4 MLM accuracy and GLUE dev, "
    "fine-tuned with the \"Modified\" recipe of Table 8, all learning rates 1e-5). BASE: "
    "Table 10, the rows of the M2-BASE recipe (the recipe Appendix D.6 selects for BASE; the "
    "text of Table 3 we have holds only the LARGE rows); their Avg as printed in Appendix D.6 "
    "(BERT 82.25, LION-LIT 80.31) and Table 9 (LION-RETNET 78.59, LION-S 72.09, rows without "
    "positional embeddings). In every paper row, Avg is the mean of the eight GLUE columns. "
    "Per task the paper's script reports: MNLI the mean of matched and mismatched accuracy, "
    "QQP the mean of accuracy and F1, MRPC F1, STSB Spearman, COLA Matthews correlation, the "
    "others accuracy (experiments/glue_metrics.py); ours are computed the same way.")
DETAIL_COLUMNS = ("workdir", "task", "model", "step picked", "score", "metrics there", "steps",
                  "status", "wall time (h:mm)", "device", "config")


def model_name(config):
    """``config["label"]`` when set, else "BERT" (softmax mixer) or "LION-" + the variant."""
    if config.get("label"):
        return config["label"]
    model = config.get("model", {})
    if model.get("mixer_kind", "lion") == "softmax":
        return "BERT"
    variant = model.get("mixer", {}).get("variant", "s")
    return "LION-" + VARIANT_NAMES.get(variant, variant.upper())


def run_task(config):
    """A run's column: a GLUE task key ("mnli", ...) or "mlm" (a pretraining run).

    Raises:
      UserError: neither a GLUE fine-tuning run nor an MLM run, or an unknown GLUE task.
    """
    if config.get("task") == "mlm":
        return "mlm"
    data = config["data"]
    if data.get("name") != "glue":
        raise UserError(f"data.name={data.get('name')!r} is not a GLUE run (data.name='glue' "
                        f"with data.task one of {', '.join(TASKS)}) and task="
                        f"{config.get('task')!r} is not 'mlm'")
    try:
        return glue.task_key(data["task"])
    except ValueError as e:
        raise UserError(f"data.task: {e}") from None


def evals_by_step(records):
    """``{step: {split: metrics}}`` of the eval records (not ``train`` or ``run``)."""
    steps = {}
    for r in records:
        if r["split"] not in ("train", "run"):
            steps.setdefault(r["step"], {})[r["split"]] = r["metrics"]
    return dict(sorted(steps.items()))


def scored_evals(task, records):
    """``[(step, score, {split: metrics})]`` of the complete evaluations with a finite score,
    by step; the score is the paper's number for a GLUE task (a fraction), the val accuracy
    for "mlm"."""
    scored = []
    for step, metrics in evals_by_step(records).items():
        try:
            if task == "mlm":
                score = float(metrics["val"]["accuracy"])
            else:
                score = glue_metrics.score_from_metrics(task, metrics)
        except KeyError:
            continue
        if np.isfinite(score):
            scored.append((step, score, metrics))
    return scored


def pick_eval(scored, pick="best"):
    """The ``(step, score, metrics)`` picked: the best score (earliest on ties) or the last;
    None when there is no complete evaluation."""
    if not scored:
        return None
    if pick == "last":
        return scored[-1]
    return max(scored, key=lambda s: s[1])  # max keeps the first of equal scores


def metrics_text(task, metrics):
    """The metrics of a picked evaluation as ``key value`` (x100), ``split key value`` for a
    task with several eval splits (MNLI)."""
    if task == "mlm":
        keys = [("val", "accuracy")]
    else:
        t = glue.TASKS[task]
        keys = [(split, key) for split in t.eval_splits for key in t.metrics]
    several = len({split for split, _ in keys}) > 1
    return ", ".join(f"{split + ' ' if several else ''}{key} {100 * metrics[split][key]:.2f}"
                     for split, key in keys if key in metrics.get(split, {}))


def run_row(workdir, pick="best"):
    """The report's dict of one workdir (see :func:`collect`)."""
    config, records = read_workdir(workdir)
    try:
        task, model, total = run_task(config), model_name(config), config["num_train_steps"]
    except (KeyError, UserError) as e:
        detail = f"no key {e}" if isinstance(e, KeyError) else str(e)
        raise UserError(f"{os.path.join(workdir, 'config.json')}: {detail}") from None
    picked = pick_eval(scored_evals(task, records), pick)
    last_step = max((r["step"] for r in records), default=0)
    return {
        "workdir": workdir, "task": task, "model": model, "pick": pick,
        "step": picked[0] if picked else None, "score": picked[1] if picked else None,
        "metrics": metrics_text(task, picked[2]) if picked else "",
        "last_step": last_step, "total_steps": total,
        "status": "done" if last_step >= total else "running",
        "wall_time_s": wall_time(records), "devices": devices(records),
        "configs": config_args(records)}


def collect(workdirs, pick="best"):
    """One dict per workdir: ``workdir``, ``task`` (a GLUE task key or "mlm"), ``model``,
    ``pick``, ``step`` and ``score`` (the picked evaluation; a fraction; None before the first
    complete one), ``metrics`` (text), ``last_step``, ``total_steps``, ``status`` ("done" or
    "running"), ``wall_time_s``, ``devices`` and ``configs``.

    Raises:
      UserError: a workdir lacks config.json or metrics.jsonl, or is neither a GLUE nor an MLM
        run; ``pick`` not one of PICKS.
    """
    if pick not in PICKS:
        raise UserError(f"pick must be one of {', '.join(PICKS)}, got {pick!r}")
    return [run_row(workdir, pick) for workdir in workdirs]


def cell(rows):
    """``(text, mean score or None, unfinished)`` of the runs of one model and column."""
    scored = [r for r in rows if r["score"] is not None]
    if not scored:
        return "", None, False
    mean = float(np.mean([r["score"] for r in scored]))
    running = any(r["status"] == "running" for r in scored)
    text = f"{100 * mean:.2f}" + ("*" if running else "")
    if len(scored) > 1:
        text += f" (n={len(scored)})"
    return text, mean, running


def summary_rows(rows):
    """Our rows of the summary table."""
    table = []
    for model in dict.fromkeys(row["model"] for row in rows):
        mine = [r for r in rows if r["model"] == model]
        mlm = cell([r for r in mine if r["task"] == "mlm"])[0]
        cells = [cell([r for r in mine if r["task"] == task]) for task in TASKS]
        average = ""
        if all(mean is not None for _, mean, _ in cells):
            average = f"{100 * np.mean([mean for _, mean, _ in cells]):.2f}"
            average += "*" if any(running for _, _, running in cells) else ""
        table.append([f"ours: {model}", mlm, *(text for text, _, _ in cells), average])
    return table


def paper_rows():
    """The paper's rows of the summary table, numbers as printed (2 decimals)."""
    return [[label, f"{mlm:.2f}", *(f"{v:.2f}" for v in scores), f"{average:.2f}"]
            for label, mlm, scores, average in PAPER_ROWS]


def detail_rows(rows):
    """The per-run table's rows."""
    return [[row["workdir"], "MLM" if row["task"] == "mlm" else glue.TASKS[row["task"]].title,
             row["model"], "-" if row["step"] is None else row["step"],
             "-" if row["score"] is None else f"{100 * row['score']:.2f}",
             row["metrics"] or "-", f"{row['last_step']}/{row['total_steps']}", row["status"],
             hours_minutes(row["wall_time_s"]), ", ".join(row["devices"]) or "-",
             ", ".join(row["configs"]) or "-"] for row in rows]


def render(rows, now=None):
    """The Markdown report of ``collect``'s rows; ``now`` (UTC datetime) dates it."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    pick = rows[0]["pick"] if rows else "best"
    which = ("its evaluation with the best score (earliest on ties)" if pick == "best" else
             "its last complete evaluation (the paper's protocol)")
    header = (f"GLUE table generated {now:%Y-%m-%d %H:%M} UTC by "
              f"`python -m experiments.glue_table` from "
              + ", ".join(f"`{row['workdir']}`" for row in rows) + ".")
    return "\n\n".join([
        header,
        f"GLUE dev scores (x100) and MLM accuracy (%). For ours, each run counts {which}; "
        "several runs of one model and task (seeds) are averaged, `(n=K)`. `*`: from a run "
        "not finished. Avg: the mean of the eight GLUE columns (not MLM Acc.), only when all "
        "eight have a number.",
        markdown_table(list(COLUMNS), summary_rows(rows) + paper_rows()),
        SOURCES,
        f"Runs (scores x100; `--pick {pick}`; wall time summed over the run's starts and "
        "resumes):",
        markdown_table(list(DETAIL_COLUMNS), detail_rows(rows)),
    ]) + "\n"


def main(argv=None):
    """The CLI: prints the report and writes it to ``--output``; ``error:`` line and exit 1
    on a bad workdir."""
    parser = argparse.ArgumentParser(prog="python -m experiments.glue_table",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("workdirs", nargs="+", metavar="RUN_DIR")
    parser.add_argument("--pick", choices=PICKS, default="best",
                        help="per run, the evaluation with the best score (default) or the "
                             "last one (the paper's protocol)")
    parser.add_argument("--output", metavar="FILE.md",
                        help="also write the Markdown report to this file")
    args = parser.parse_args(argv)
    try:
        report = render(collect(args.workdirs, args.pick))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    print(report, end="")
    if args.output:
        with open(args.output, "w") as f:
            f.write(report)


if __name__ == "__main__":
    main()
