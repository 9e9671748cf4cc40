"""experiments/pathfinder_cnn.py: a tiny run on generated Pathfinder writes its per-epoch table
and JSON; bad flags and a missing release folder stop with one `error:` line."""

import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*args):
    return subprocess.run([sys.executable, "-m", "experiments.pathfinder_cnn", *args], cwd=ROOT,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True,
                          text=True, timeout=600)


def test_tiny_run_writes_table_and_json(tmp_path):
    out = tmp_path / "out"
    result = _run("--out", str(out), "--difficulty", "curv_baseline", "--num_examples", "90",
                  "--epochs", "2", "--batch_size", "16", "--width", "4", "--seed", "3",
                  "--cache_dir", str(tmp_path / "cache"))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "pathfinder_cnn.json").read_text())
    assert report["settings"]["difficulty"] == "curv_baseline"
    assert [r["epoch"] for r in report["epochs"]] == [1, 2]
    for r in report["epochs"]:
        assert math.isfinite(r["train_loss"]) and 0 <= r["train_accuracy"] <= 1
        assert r["val_accuracy"] * 9 == round(r["val_accuracy"] * 9)  # 9 val images
    table = (out / "pathfinder_cnn.md").read_text()
    assert "curv_baseline" in table and table.count("\n| ") == 4  # header, rule, 2 epochs
    assert "epoch 2: train loss" in result.stdout


@pytest.mark.parametrize("args,message", [
    (("--epochs", "0"), "error: --epochs must be >= 1"),
    (("--batch_size", "500", "--num_examples", "20"), "error: --batch_size 500 exceeds"),
    (("--data_dir", "/nonexistent"), "error: /nonexistent/curv_contour_length_14/metadata not"),
])
def test_bad_flags_stop_with_one_line(tmp_path, args, message):
    result = _run("--out", str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache"), *args)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1].startswith(message), result.stderr[-2000:]
    assert "Traceback" not in result.stderr
