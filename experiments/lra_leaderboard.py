"""Our Long Range Arena accuracies beside the LION paper's Table 2, read from training workdirs.

    python -m experiments.lra_leaderboard RUN_DIR [RUN_DIR ...] [--output FILE.md]
        [--curve_points N]

Prints a Markdown report (and writes it to ``--output`` when given) with three tables:

* per model, the test accuracy on each LRA task and their average (only when all six tasks
  have a number), beside the paper rows: LION-S, LION-LIT and Transformer from the LION paper
  (Table 2, arXiv 2502.16249) and S5 from the S5 paper (Table 1, arXiv 2208.04933). Where
  several runs share a model and task, the one with the best validation accuracy is shown;
* per run: best validation accuracy, test accuracy at that step, steps done, status, wall
  time, device(s) and the ``--config`` argument;
* per run, its learning curve: validation (test) accuracy at up to ``--curve_points``
  evaluations (default 8; 0 leaves the table out) spread evenly over the run's, with the best
  validation and the last evaluation always among them.

A Pathfinder or Path-X run on another set than LRA's (an easier ``data.difficulty`` such as
``curv_baseline``, or a generated set of other than LRA's 200,000 images) is not comparable
with the paper: its task reads e.g. ``Pathfinder (curv_baseline)``, and it appears in the run
table only. The same holds for a run started from another run's weights (``config.init_from``,
e.g. a curriculum; the paper trains from scratch): ``Pathfinder (warm start from pf_easy)``.

Every number in our rows comes from the workdirs (``config.json`` and ``metrics.jsonl``, see
experiments/progress.py). As LRA and S5 report, a run's accuracy is the test accuracy at the
evaluation step of its best validation accuracy (ties: the earliest). Workdirs of runs still
going can be read: a torn last line of ``metrics.jsonl`` is ignored. In Python::

    from experiments import lra_leaderboard
    print(lra_leaderboard.render(lra_leaderboard.collect(["workdir/lra_listops"])))
"""

import argparse
import datetime
import json
import os
import sys

from experiments.data.pathfinder import DEFAULT_DIFFICULTY as LRA_DIFFICULTY
from experiments.errors import UserError

TASKS = ("ListOps", "Text", "Retrieval", "Image", "Pathfinder", "Path-X")
DATA_TASKS = {"listops": "ListOps", "text": "Text", "retrieval": "Retrieval", "image": "Image"}
PATHFINDER_TASKS = {32: "Pathfinder", 128: "Path-X"}
LRA_PATHFINDER_IMAGES = 200_000  # LRA's Pathfinder and Path-X sets (generated ones compared)
VARIANT_NAMES = {"s": "S", "d": "D", "lit": "LIT", "retnet": "RETNET"}

# (row label, accuracies in TASKS order with "fail" where the paper prints it, average as
# printed; the paper averages rows with a failed Path-X over the other five tasks).
PAPER_ROWS = (
    ("LION paper: LION-S", (62.25, 88.10, 90.35, 86.14, 91.30, 97.99), 86.07),
    ("LION paper: LION-LIT", (16.78, 65.21, 54.00, 43.29, 72.78, "fail"), 50.41),
    ("LION paper: Transformer", (36.37, 64.27, 57.46, 42.44, 71.40, "fail"), 54.39),
    ("S5 paper: S5", (62.15, 89.31, 91.40, 88.00, 95.33, 98.58), 87.46),
)
SOURCES = ("Paper rows: LION-S, LION-LIT and Transformer from the LION paper, Table 2 "
           "(arXiv 2502.16249); S5 from the S5 paper, Table 1 (arXiv 2208.04933). "
           "\"fail\" as printed there (LRA's mark for no better than chance); the paper's Avg of "
           "those rows is over the other five tasks.")
DETAIL_COLUMNS = ("workdir", "task", "model", "best val acc", "test acc at best val",
                  "step of best", "steps", "status", "wall time (h:mm)", "device", "config")


def task_name(config):
    """The LRA column of a run from ``config["data"]`` (``name``, ``resolution``; for
    Pathfinder also ``difficulty``, ``source`` and ``num_examples``) and ``init_from``. A run
    not comparable with the paper's protocol is named with the difference in parentheses,
    which no column of the summary takes (module docstring): a Pathfinder set other than
    LRA's, or a start from another run's weights (``init_from``, "warm start from <its
    directory's name>")."""
    data = config["data"]
    name = data["name"]
    other = []
    if name == "pathfinder":
        resolution = data.get("resolution", 32)
        if resolution not in PATHFINDER_TASKS:
            raise UserError(f"data.resolution={resolution} is not an LRA Pathfinder size "
                            f"({', '.join(map(str, PATHFINDER_TASKS))})")
        if data.get("difficulty", LRA_DIFFICULTY) != LRA_DIFFICULTY:
            other.append(data["difficulty"])
        if data.get("source", "generate") == "generate" and data.get(
                "num_examples", LRA_PATHFINDER_IMAGES) != LRA_PATHFINDER_IMAGES:
            other.append(f"{data['num_examples']:,} images")
        task = PATHFINDER_TASKS[resolution]
    elif name in DATA_TASKS:
        task = DATA_TASKS[name]
    else:
        raise UserError(f"data.name={name!r} is not an LRA task "
                        f"({', '.join([*DATA_TASKS, 'pathfinder'])})")
    if config.get("init_from"):
        other.append("warm start from "
                     + os.path.basename(os.path.normpath(config["init_from"])))
    return f"{task} ({', '.join(other)})" if other else task


def model_name(config):
    """``config["label"]`` when set, else "Transformer" or "LION-" + the mixer variant, with
    " scalar_decay" (the config variant's name) for a LION-S whose decay is one per head
    (Table 6 [3]; the paper's LRA LION-S has one per value feature), and
    ", <channel_mixer> blocks" for blocks other than the config's MLP."""
    if config.get("label"):
        return config["label"]
    model = config["model"]
    if model.get("mixer_kind", "lion") == "softmax":
        return "Transformer"
    mixer = model.get("mixer", {})
    variant = mixer.get("variant", "s")
    name = "LION-" + VARIANT_NAMES.get(variant, variant.upper())
    if variant == "s" and mixer.get("decay_shape") == "scalar":
        name += " scalar_decay"
    if model.get("channel_mixer", "mlp") != "mlp":
        name += f", {model['channel_mixer']} blocks"
    return name


def read_records(path):
    """The records of a ``metrics.jsonl``; a torn last line (a run writing it) is skipped."""
    with open(path) as f:
        lines = f.readlines()
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines) and not line.endswith("\n"):
                break
            raise UserError(f"{path} line {number} is not JSON") from None
    return records


def read_workdir(workdir):
    """``(config, records)`` of a workdir; UserError naming the missing file."""
    if not os.path.isdir(workdir):
        raise UserError(f"{workdir}: no such directory")
    paths = [os.path.join(workdir, name) for name in ("config.json", "metrics.jsonl")]
    for path in paths:
        if not os.path.isfile(path):
            raise UserError(f"{path} is missing (is {workdir} a training workdir?)")
    with open(paths[0]) as f:
        config = json.load(f)
    return config, read_records(paths[1])


def accuracies(records, split):
    """``{step: accuracy}`` of the ``split`` ("val" or "test") evaluation records."""
    return {r["step"]: r["metrics"]["accuracy"] for r in records if r["split"] == split}


def best_eval(records):
    """``(step, val accuracy, test accuracy or None)`` at the best val accuracy (earliest on
    ties), or None before the first evaluation."""
    val, test = accuracies(records, "val"), accuracies(records, "test")
    if not val:
        return None
    step = max(sorted(val), key=lambda s: val[s])  # max keeps the first of equal values
    return step, val[step], test.get(step)


def curve(records, points):
    """``[(step, val accuracy, test accuracy or None)]`` at up to ``points`` evaluations spread
    evenly over the run's (all when it has that few), plus the best validation (as
    :func:`best_eval`) and the last; ``[]`` before the first evaluation or for ``points`` 0."""
    val, test = accuracies(records, "val"), accuracies(records, "test")
    steps = sorted(val)
    if not steps or points <= 0:
        return []
    points = min(points, len(steps))
    picked = {steps[round(i * (len(steps) - 1) / max(points - 1, 1))] for i in range(points)}
    picked |= {best_eval(records)[0], steps[-1]}
    return [(step, val[step], test.get(step)) for step in sorted(picked)]


def segments(records):
    """The records split at each ``run`` record (start or resume), in file order."""
    parts = []
    for record in records:
        if record["split"] == "run" or not parts:
            parts.append([])
        parts[-1].append(record)
    return parts


def wall_time(records):
    """Seconds summed over segments, each from its first record to its last."""
    return sum(part[-1]["time"] - part[0]["time"] for part in segments(records))


def config_args(records):
    """The distinct non-empty ``--config`` arguments of the ``run`` records, in order."""
    values = [r["info"].get("config") for r in records if r["split"] == "run"]
    return list(dict.fromkeys(v for v in values if v))


def devices(records):
    """The distinct devices of the ``run`` records, e.g. ``["1x NVIDIA H100 80GB HBM3"]``."""
    found = [f"{r['info'].get('num_devices', 1)}x {r['info'].get('device', '?')}"
             for r in records if r["split"] == "run"]
    return list(dict.fromkeys(found))


def run_row(workdir, curve_points=8):
    """The report's dict of one workdir (see :func:`collect`)."""
    config, records = read_workdir(workdir)
    try:
        task, model, total = task_name(config), model_name(config), config["num_train_steps"]
    except (KeyError, UserError) as e:
        detail = f"no key {e}" if isinstance(e, KeyError) else str(e)
        raise UserError(f"{os.path.join(workdir, 'config.json')}: {detail}") from None
    best = best_eval(records)
    last_step = max((r["step"] for r in records), default=0)
    return {
        "workdir": workdir, "task": task, "model": model,
        "best_step": best[0] if best else None, "best_val": best[1] if best else None,
        "test": best[2] if best else None, "last_step": last_step, "total_steps": total,
        "status": "done" if last_step >= total else "unfinished",
        "wall_time_s": wall_time(records), "devices": devices(records),
        "configs": config_args(records), "curve": curve(records, curve_points)}


def collect(workdirs, curve_points=8):
    """One dict per workdir: ``workdir``, ``task``, ``model``, ``best_step``, ``best_val``,
    ``test`` (test accuracy at ``best_step``; the three None before the first evaluation),
    ``last_step``, ``total_steps``, ``status`` ("done", or "unfinished": still going on or
    stopped), ``wall_time_s``, ``devices``, ``configs`` (the ``--config`` arguments of its
    starts) and ``curve`` (:func:`curve` with ``curve_points``).

    Raises:
      UserError: a workdir lacks config.json or metrics.jsonl, or is not an LRA run.
    """
    return [run_row(workdir, curve_points) for workdir in workdirs]


def _val(row):
    """A row's best val accuracy, -1 before the first evaluation (for comparisons)."""
    return -1.0 if row["best_val"] is None else row["best_val"]


def best_runs(rows):
    """``{(model, task): row}``, the row with the best val accuracy (first on ties)."""
    best = {}
    for row in rows:
        key = row["model"], row["task"]
        if key not in best or _val(row) > _val(best[key]):
            best[key] = row
    return best


def percent(value):
    """A fraction as a percentage with 2 decimals, "-" for None."""
    return "-" if value is None else f"{100 * value:.2f}"


def hours_minutes(seconds):
    """Seconds as ``h:mm`` (rounded to the minute)."""
    minutes = round(seconds / 60)
    return f"{minutes // 60}:{minutes % 60:02d}"


def markdown_table(header, rows):
    """A GitHub Markdown table (``|`` in cells escaped)."""
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(str(c).replace("|", r"\|") for c in line) + " |"
                     for line in lines)


def summary_rows(rows):
    """Our rows of the summary table: test accuracy per task, ``*`` from unfinished runs."""
    best = best_runs(rows)
    table = []
    for model in dict.fromkeys(row["model"] for row in rows if row["task"] in TASKS):
        picked = [best.get((model, task)) for task in TASKS]
        cells = ["" if r is None else percent(r["test"]) + ("*" if r["status"] == "unfinished"
                                                              else "") for r in picked]
        complete = all(r is not None and r["test"] is not None for r in picked)
        average = ""
        if complete:
            average = percent(sum(r["test"] for r in picked) / len(TASKS))
            average += "*" if any(r["status"] == "unfinished" for r in picked) else ""
        table.append([f"ours: {model}", *cells, average])
    return table


def detail_rows(rows):
    """The per-run table's rows."""
    return [[row["workdir"], row["task"], row["model"], percent(row["best_val"]),
             percent(row["test"]), "-" if row["best_step"] is None else row["best_step"],
             f"{row['last_step']}/{row['total_steps']}", row["status"],
             hours_minutes(row["wall_time_s"]), ", ".join(row["devices"]) or "-",
             ", ".join(row["configs"]) or "-"] for row in rows]


def curve_rows(rows):
    """The curves table's rows: ``step: val (test)`` per point, the best validation in bold;
    runs without an evaluation are left out."""
    table = []
    for row in rows:
        points = []
        for step, val, test in row["curve"]:
            point = f"{step}: {percent(val)} ({percent(test)})"
            points.append(f"**{point}**" if step == row["best_step"] else point)
        if points:
            table.append([row["workdir"], row["model"], ", ".join(points)])
    return table


def render(rows, now=None):
    """The Markdown report of ``collect``'s rows; ``now`` (UTC datetime) dates it."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    paper = [[label, *(f"{v:.2f}" if isinstance(v, float) else v for v in values),
              f"{average:.2f}"] for label, values, average in PAPER_ROWS]
    header = (f"LRA leaderboard generated {now:%Y-%m-%d %H:%M} UTC by "
              f"`python -m experiments.lra_leaderboard` from "
              + ", ".join(f"`{row['workdir']}`" for row in rows) + ".")
    curves = curve_rows(rows)
    return "\n\n".join([
        header,
        "Test accuracy (%) at the step of the best validation accuracy; for ours, the best "
        "run of each model and task (by validation accuracy). `*`: from a run not finished; "
        "Avg only when all six tasks have a number.",
        markdown_table(["model", *TASKS, "Avg"], summary_rows(rows) + paper),
        SOURCES,
        "Runs (accuracies in %; wall time summed over the run's starts and resumes; a task "
        "in parentheses is another set than LRA's or a start from another run's weights, "
        "left out of the table above):",
        markdown_table(list(DETAIL_COLUMNS), detail_rows(rows)),
        *(["Learning curves: validation accuracy (test accuracy), %, by step; the best "
           "validation in bold:",
           markdown_table(["workdir", "model", "step: val (test)"], curves)] if curves else []),
    ]) + "\n"


def main(argv=None):
    """The CLI: prints the report and writes it to ``--output``; ``error:`` line and exit 1
    on a bad workdir."""
    parser = argparse.ArgumentParser(prog="python -m experiments.lra_leaderboard",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("workdirs", nargs="+", metavar="RUN_DIR")
    parser.add_argument("--output", metavar="FILE.md",
                        help="also write the Markdown report to this file")
    parser.add_argument("--curve_points", type=int, default=8, metavar="N",
                        help="evaluations per run in the learning-curves table (0: no table)")
    args = parser.parse_args(argv)
    if args.curve_points < 0:
        parser.error(f"--curve_points must be >= 0, got {args.curve_points}")
    try:
        report = render(collect(args.workdirs, args.curve_points))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    print(report, end="")
    if args.output:
        with open(args.output, "w") as f:
            f.write(report)


if __name__ == "__main__":
    main()
