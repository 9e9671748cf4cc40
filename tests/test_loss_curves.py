"""experiments.loss_curves and experiments.compare_runs on run directories written here."""

import json
import os

import pytest

from experiments import compare_runs, loss_curves


def _run(root, name, label, losses, val, max_len=128):
    workdir = os.path.join(root, name)
    os.makedirs(workdir)
    config = {"label": label, "batch_size": 4, "grad_accum_steps": 2,
              "data": {"max_len": max_len} if max_len else {}}
    with open(os.path.join(workdir, "config.json"), "w") as f:
        json.dump(config, f)
    records = [{"step": 0, "split": "run", "metrics": {}}]
    records += [{"step": s, "split": "train", "metrics": {"loss": l, "steps_per_sec": 2.0}}
                for s, l in losses.items()]
    records += [{"step": s, "split": "val", "metrics": {"loss": l}} for s, l in val.items()]
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
        f.write("\n".join(json.dumps(r) for r in records) + "\n")
    return workdir


def test_table_and_plot(tmp_path, rng):
    train_a = {s: float(rng.uniform(1, 5)) for s in range(10, 101, 10)}
    train_b = {s: float(rng.uniform(1, 5)) for s in range(10, 61, 10)}
    a = _run(tmp_path, "a", "TNL small", train_a, {50: 2.5, 100: 2.0})
    b = _run(tmp_path, "b", "", train_b, {50: 1.5})
    out = tmp_path / "out"
    loss_curves.main([a, b, "--out", str(out), "--every", "20"])
    table = (out / "table.md").read_text()
    lines = table.splitlines()
    assert lines[0] == ("| step | tokens (M) | TNL small train | TNL small val | b train | "
                        "b val |")
    steps = [line.split(" | ")[0].strip("| ") for line in lines[2:]]
    assert steps == ["20", "40", "50", "60", "80", "100"]  # every 20, plus the evaluations
    row_50 = lines[2 + steps.index("50")].split(" | ")
    assert row_50[1] == f"{50 * 4 * 2 * 128 / 1e6:,.1f}"
    assert row_50[3] == "2.5000" and row_50[5].rstrip(" |") == "1.5000"
    row_100 = lines[2 + steps.index("100")].split(" | ")
    assert row_100[2] == f"{train_a[100]:.4f}" and row_100[4] == ""  # b ended at 60
    assert (out / "plot.png").stat().st_size > 1000


def test_steps_without_tokens_and_errors(tmp_path, capsys):
    a = _run(tmp_path, "a", "x", {5: 1.0}, {}, max_len=None)
    loss_curves.main([a, "--every", "5"])
    assert capsys.readouterr().out.splitlines()[0] == "| step | x train | x val |"
    with pytest.raises(SystemExit, match="config.json not found"):
        loss_curves.main([str(tmp_path / "none")])
    with pytest.raises(SystemExit, match="--every must be at least 1"):
        loss_curves.main([a, "--every", "0"])
    assert compare_runs.read_split_metrics(a, "val") == {}
    assert compare_runs.read_split_metrics(a) == {5: {"loss": 1.0, "steps_per_sec": 2.0}}
