"""experiments/lra_leaderboard.py on fake workdirs (config.json + metrics.jsonl, no training)."""

import datetime
import json
import os
import re
import subprocess
import sys

import pytest

from experiments import lra_leaderboard as lb

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
H100 = "NVIDIA H100 80GB HBM3"
H200 = "NVIDIA H200"


def make_config(data="listops", steps=100, resolution=None, mixer_kind=None, variant="s",
                label=None):
    """A config.json dict; optional keys are left out unless given (to test the defaults)."""
    config = {"data": {"name": data}, "model": {"mixer": {"variant": variant}},
              "num_train_steps": steps}
    if resolution is not None:
        config["data"]["resolution"] = resolution
    if mixer_kind is not None:
        config["model"]["mixer_kind"] = mixer_kind
    if label is not None:
        config["label"] = label
    return config


def run_record(step, time, device=H100, num_devices=1):
    return {"step": step, "split": "run", "metrics": {}, "time": time,
            "info": {"device": device, "platform": "gpu", "num_devices": num_devices,
                     "jax": "0.11.2", "config": "configs/lra/listops.py"}}


def train(step, time):
    return {"step": step, "split": "train", "time": time,
            "metrics": {"loss": 1.0, "accuracy": 0.5, "steps_per_sec": 7.0,
                        "learning_rate": 1e-4, "grad_norm": 1.0}}


def evals(step, time, val, test):
    return [{"step": step, "split": split, "metrics": {"loss": 1.0, "accuracy": acc},
             "time": time} for split, acc in (("val", val), ("test", test))]


def write_workdir(name, config, records, tail=""):
    """Writes ``runs/name`` in the current directory; returns its relative path."""
    path = os.path.join("runs", name)
    os.makedirs(path)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
        f.write(tail)
    return path


def done_run(name, val, test, **config):
    return write_workdir(name, make_config(**config),
                         [run_record(0, 0.0), train(100, 50.0), *evals(100, 60.0, val, test)])


@pytest.fixture
def workdirs(tmp_path, monkeypatch):
    """The fake runs, as relative paths from ``tmp_path`` (the current directory)."""
    monkeypatch.chdir(tmp_path)
    return [
        # resumed at step 400 on other devices; val 0.50 at 400 and 600: the earliest counts
        write_workdir("listops_s_resumed", make_config(steps=1000), [
            run_record(0, 1000.0), train(100, 1100.0), *evals(200, 1200.0, 0.40, 0.38),
            *evals(400, 1400.0, 0.50, 0.47), run_record(400, 5000.0, H200, 2),
            *evals(600, 5600.0, 0.50, 0.52), *evals(800, 5800.0, 0.45, 0.55),
            train(1000, 6000.0), *evals(1000, 6000.0, 0.49, 0.49)]),
        # unfinished, better val than the resumed one; its last line is being written
        write_workdir("listops_s_unfinished", make_config(steps=1000), [
            run_record(0, 0.0), *evals(250, 1800.0, 0.60, 0.58), train(500, 3900.0)],
            tail='{"step": 50'),
        write_workdir("text_s_noeval", make_config("text", steps=5000),
                      [run_record(0, 0.0), train(100, 100.0)]),
        done_run("text_s", 0.70, 0.65, data="text"),
        done_run("retrieval_s", 0.80, 0.81, data="retrieval"),
        done_run("image_s", 0.60, 0.62, data="image"),
        done_run("pathfinder_s", 0.88, 0.87, data="pathfinder"),
        done_run("pathx_s", 0.90, 0.91, data="pathfinder", resolution=128),
        done_run("listops_transformer", 0.30, 0.35, mixer_kind="softmax"),
        done_run("listops_ablation", 0.20, 0.25, label="LION-S (no decay)"),
        done_run("listops_lit", 0.15, 0.17, variant="lit", mixer_kind="lion"),
    ]


def table_lines(report, first_cell, columns=None):
    """The Markdown table rows of ``report`` whose first cell starts with ``first_cell`` (and
    that have ``columns`` cells, when given)."""
    return [line for line in report.splitlines() if line.startswith(f"| {first_cell}")
            and (columns is None or line.count(" | ") == columns - 1)]


def test_collect_numbers(workdirs):
    rows = {os.path.basename(r["workdir"]): r for r in lb.collect(workdirs)}
    resumed = rows["listops_s_resumed"]
    assert (resumed["best_step"], resumed["best_val"], resumed["test"]) == (400, 0.50, 0.47)
    assert (resumed["last_step"], resumed["total_steps"], resumed["status"]) == (
        1000, 1000, "done")
    assert resumed["wall_time_s"] == (1400.0 - 1000.0) + (6000.0 - 5000.0)
    assert resumed["devices"] == [f"1x {H100}", f"2x {H200}"]
    assert resumed["configs"] == ["configs/lra/listops.py"]
    unfinished = rows["listops_s_unfinished"]
    assert (unfinished["best_step"], unfinished["test"], unfinished["last_step"],
            unfinished["status"], unfinished["wall_time_s"]) == (250, 0.58, 500, "unfinished",
                                                                 3900.0)
    noeval = rows["text_s_noeval"]
    assert (noeval["best_step"], noeval["best_val"], noeval["test"], noeval["last_step"],
            noeval["status"]) == (None, None, None, 100, "unfinished")
    assert [(r["task"], r["model"]) for r in rows.values()] == [
        ("ListOps", "LION-S"), ("ListOps", "LION-S"), ("Text", "LION-S"), ("Text", "LION-S"),
        ("Retrieval", "LION-S"), ("Image", "LION-S"), ("Pathfinder", "LION-S"),
        ("Path-X", "LION-S"), ("ListOps", "Transformer"), ("ListOps", "LION-S (no decay)"),
        ("ListOps", "LION-LIT")]


def test_summary_table(workdirs):
    report = lb.render(lb.collect(workdirs))
    assert table_lines(report, "model") == [
        "| model | ListOps | Text | Retrieval | Image | Pathfinder | Path-X | Avg |"]
    # LION-S: ListOps from the unfinished run (best val 0.60 > 0.50), Text from the run with
    # an evaluation; (58 + 65 + 81 + 62 + 87 + 91) / 6 = 74
    assert table_lines(report, "ours") == [
        "| ours: LION-S | 58.00* | 65.00 | 81.00 | 62.00 | 87.00 | 91.00 | 74.00* |",
        "| ours: Transformer | 35.00 |  |  |  |  |  |  |",
        "| ours: LION-S (no decay) | 25.00 |  |  |  |  |  |  |",
        "| ours: LION-LIT | 17.00 |  |  |  |  |  |  |"]
    assert table_lines(report, "LION paper") + table_lines(report, "S5 paper") == [
        "| LION paper: LION-S | 62.25 | 88.10 | 90.35 | 86.14 | 91.30 | 97.99 | 86.07 |",
        "| LION paper: LION-LIT | 16.78 | 65.21 | 54.00 | 43.29 | 72.78 | fail | 50.41 |",
        "| LION paper: Transformer | 36.37 | 64.27 | 57.46 | 42.44 | 71.40 | fail | 54.39 |",
        "| S5 paper: S5 | 62.15 | 89.31 | 91.40 | 88.00 | 95.33 | 98.58 | 87.46 |"]
    assert "LION paper, Table 2 (arXiv 2502.16249)" in report
    assert "S5 paper, Table 1" in report


def test_average_needs_all_six_tasks(workdirs):
    rows = [r for r in lb.collect(workdirs) if not r["workdir"].endswith("pathx_s")]
    (line,) = table_lines(lb.render(rows), "ours: LION-S |")
    assert line == "| ours: LION-S | 58.00* | 65.00 | 81.00 | 62.00 | 87.00 |  |  |"


@pytest.mark.parametrize("data,task", [
    (dict(difficulty="curv_baseline"), "Pathfinder (curv_baseline)"),
    (dict(num_examples=2500), "Pathfinder (2,500 images)"),
    (dict(difficulty="curv_contour_length_9", num_examples=2500),
     "Pathfinder (curv_contour_length_9, 2,500 images)"),
    (dict(resolution=128, difficulty="curv_baseline"), "Path-X (curv_baseline)"),
    (dict(difficulty="curv_contour_length_14", num_examples=200_000), "Pathfinder"),
    (dict(source="files", num_examples=64), "Pathfinder"),  # LRA's release: no generated size
    (dict(init_from="workdir/lra/pf_easy/"), "Pathfinder (warm start from pf_easy)"),
    (dict(difficulty="curv_baseline", init_from="runs/a"),
     "Pathfinder (curv_baseline, warm start from a)"),
    (dict(init_from=""), "Pathfinder"),  # every LRA config has the key, empty
])
def test_runs_not_comparable_with_the_paper_are_named_and_kept_out_of_the_summary(
        tmp_path, monkeypatch, data, task):
    monkeypatch.chdir(tmp_path)
    config = make_config("pathfinder", steps=100, label="S5")
    data = dict(data)
    if "init_from" in data:
        config["init_from"] = data.pop("init_from")
    config["data"].update(data)
    path = write_workdir("pf", config, [run_record(0, 0.0), *evals(100, 10.0, 0.94, 0.93)])
    (row,) = lb.collect([path])
    assert row["task"] == task
    report = lb.render([row])
    assert (table_lines(report, "ours: S5") != []) == (task in lb.TASKS)
    (line,) = table_lines(report, "runs/pf", len(lb.DETAIL_COLUMNS))
    assert line.startswith(f"| runs/pf | {task} | S5 | 94.00 | 93.00 |")


def test_a_warm_start_is_named_on_every_task():
    config = make_config("listops")
    config["init_from"] = "/runs/listops_short"
    assert lb.task_name(config) == "ListOps (warm start from listops_short)"


def test_detail_table(workdirs):
    report = lb.render(lb.collect(workdirs))
    assert table_lines(report, "workdir", len(lb.DETAIL_COLUMNS)) == [
        "| workdir | task | model | best val acc | test acc at best val | step of best | steps "
        "| status | wall time (h:mm) | device | config |"]
    lines = table_lines(report, "runs/", len(lb.DETAIL_COLUMNS))
    assert len(lines) == len(workdirs)
    assert lines[:4] == [
        f"| runs/listops_s_resumed | ListOps | LION-S | 50.00 | 47.00 | 400 | 1000/1000 | done "
        f"| 0:23 | 1x {H100}, 2x {H200} | configs/lra/listops.py |",
        f"| runs/listops_s_unfinished | ListOps | LION-S | 60.00 | 58.00 | 250 | 500/1000 "
        f"| unfinished | 1:05 | 1x {H100} | configs/lra/listops.py |",
        f"| runs/text_s_noeval | Text | LION-S | - | - | - | 100/5000 | unfinished | 0:02 "
        f"| 1x {H100} | configs/lra/listops.py |",
        f"| runs/text_s | Text | LION-S | 70.00 | 65.00 | 100 | 100/100 | done | 0:01 "
        f"| 1x {H100} | configs/lra/listops.py |"]
    assert lines[-1].startswith("| runs/listops_lit | ListOps | LION-LIT | 15.00 | 17.00 | 100 |")


def test_cli_prints_and_writes_markdown(workdirs, capsys):
    lb.main([*workdirs, "--output", "report.md"])
    printed = capsys.readouterr().out
    with open("report.md") as f:
        written = f.read()
    assert printed == written
    header = written.splitlines()[0]
    assert re.fullmatch(r"LRA leaderboard generated \d{4}-\d\d-\d\d \d\d:\d\d UTC by "
                        r"`python -m experiments\.lra_leaderboard` from (.*)\.", header)
    assert header.endswith("from " + ", ".join(f"`{w}`" for w in workdirs) + ".")
    tables = [line for line in written.splitlines() if line.startswith("|")]
    assert all(line.endswith("|") for line in tables)
    # headers and rules; 4 + 4 rows; runs; curves of the runs with an evaluation
    assert len(tables) == 2 + 8 + 2 + len(workdirs) + 2 + len(workdirs) - 1
    lb.main([*workdirs, "--output", "report.md", "--curve_points", "0"])
    assert "Learning curves" not in capsys.readouterr().out


def test_curve_points_must_not_be_negative(workdirs, capsys):
    with pytest.raises(SystemExit):
        lb.main([*workdirs, "--curve_points", "-1"])
    assert "--curve_points must be >= 0, got -1" in capsys.readouterr().err


def test_curve_spreads_its_points_and_keeps_the_best_and_the_last():
    vals = [0.1, 0.2, 0.9, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85]  # best at the 3rd evaluation
    records = [r for i, v in enumerate(vals) for r in evals(100 * (i + 1), 0.0, v, v / 2)]
    assert [p[0] for p in lb.curve(records, 4)] == [100, 300, 400, 700, 1000]
    assert lb.curve(records, 4)[1] == (300, 0.9, 0.45)
    assert [p[0] for p in lb.curve(records, 20)] == [100 * (i + 1) for i in range(10)]
    assert [p[0] for p in lb.curve(records, 1)] == [100, 300, 1000]
    assert lb.curve(records, 0) == []
    assert lb.curve([train(100, 0.0)], 8) == []


def test_curves_table(workdirs):
    report = lb.render(lb.collect(workdirs, curve_points=3))
    assert table_lines(report, "workdir | model") == ["| workdir | model | step: val (test) |"]
    lines = table_lines(report, "runs/", 3)
    assert lines[0] == ("| runs/listops_s_resumed | LION-S | 200: 40.00 (38.00), "
                        "**400: 50.00 (47.00)**, 600: 50.00 (52.00), 1000: 49.00 (49.00) |")
    assert not any(line.startswith("| runs/text_s_noeval") for line in lines)
    assert lines[1] == "| runs/listops_s_unfinished | LION-S | **250: 60.00 (58.00)** |"


def test_render_dates_the_report(workdirs):
    now = datetime.datetime(2025, 3, 4, 5, 6, tzinfo=datetime.timezone.utc)
    report = lb.render(lb.collect(workdirs[:1]), now=now)
    assert report.startswith("LRA leaderboard generated 2025-03-04 05:06 UTC by "
                             "`python -m experiments.lra_leaderboard` from "
                             "`runs/listops_s_resumed`.\n\n")


def test_best_eval_takes_the_earliest_of_equal_val():
    records = [*evals(1, 0.0, 0.3, 0.1), *evals(2, 0.0, 0.7, 0.2), *evals(3, 0.0, 0.7, 0.9)]
    assert lb.best_eval(records) == (2, 0.7, 0.2)
    assert lb.best_eval([train(1, 0.0)]) is None


@pytest.mark.parametrize("model, name", [
    ({"mixer": {"variant": "d"}}, "LION-D"),
    ({"mixer": {"variant": "retnet"}}, "LION-RETNET"),
    ({"mixer": {"variant": "xlstm"}}, "LION-XLSTM"),
    ({"mixer_kind": "softmax"}, "Transformer"),
    ({"mixer": {"variant": "s", "decay_shape": "vector"}}, "LION-S"),
    ({"mixer": {"variant": "s", "decay_shape": "scalar"}}, "LION-S scalar_decay"),
    ({"mixer": {"variant": "d", "decay_shape": "scalar"}}, "LION-D"),
    ({"mixer": {"variant": "s"}, "channel_mixer": "half_glu"}, "LION-S, half_glu blocks"),
    ({"mixer_kind": "softmax", "channel_mixer": "mlp"}, "Transformer"),
])
def test_model_names(model, name):
    assert lb.model_name({"model": model, "label": ""}) == name


def test_missing_config_is_one_error_line(tmp_path):
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "metrics.jsonl").write_text("")
    result = subprocess.run([sys.executable, "-m", "experiments.lra_leaderboard", str(workdir)],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr == (f"error: {workdir}/config.json is missing "
                             f"(is {workdir} a training workdir?)\n")


@pytest.mark.parametrize("files, message", [
    ({"config.json": "{}"}, "error: run/metrics.jsonl is missing (is run a training workdir?)"),
    (None, "error: run: no such directory"),
    ({"config.json": json.dumps(make_config("cifar")), "metrics.jsonl": ""},
     "error: run/config.json: data.name='cifar' is not an LRA task "
     "(listops, text, retrieval, image, pathfinder)"),
    ({"config.json": json.dumps(make_config("pathfinder", resolution=64)),
      "metrics.jsonl": ""},
     "error: run/config.json: data.resolution=64 is not an LRA Pathfinder size (32, 128)"),
    ({"config.json": json.dumps({"data": {"name": "text"}}), "metrics.jsonl": ""},
     "error: run/config.json: no key 'model'"),
    ({"config.json": "{}", "metrics.jsonl": "{\n{}\n"},
     "error: run/metrics.jsonl line 1 is not JSON"),
])
def test_bad_workdir_errors(tmp_path, monkeypatch, capsys, files, message):
    monkeypatch.chdir(tmp_path)
    if files is not None:
        os.mkdir("run")
        for name, text in files.items():
            with open(os.path.join("run", name), "w") as f:
                f.write(text)
    with pytest.raises(SystemExit) as exit_info:
        lb.main(["run"])
    assert exit_info.value.code == 1
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", message + "\n")


def test_docs_tables_are_the_leaderboards_output(monkeypatch):
    """docs/benchmarks.md's LRA tables are the output of the command it quotes, run on the run
    records in docs/lra_runs: every table row that command prints is in the file (so no number
    there is typed by hand, and a changed record shows up here)."""
    with open(os.path.join(REPO, "docs", "benchmarks.md")) as f:
        docs = f.read()
    (command,) = re.findall(r"`python -m experiments\.lra_leaderboard ([^`]+)`", docs)
    args = command.split()
    points = int(args[args.index("--curve_points") + 1]) if "--curve_points" in args else 8
    workdirs = [a for a in args if a.startswith("docs/lra_runs/")]
    assert workdirs, command
    monkeypatch.chdir(REPO)
    report = lb.render(lb.collect(workdirs, points))
    rows = [line for line in report.splitlines() if line.startswith("|")]
    assert len(rows) > 3 * 2 + len(workdirs)
    missing = [row for row in rows if row not in docs.splitlines()]
    assert not missing, f"rows of `{command}` not in docs/benchmarks.md: {missing[:3]}"
