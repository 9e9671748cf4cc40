"""experiments/scaling_check.py on 8 virtual CPU devices: the tiny preset measures throughput
and compares the first steps' losses of FSDP meshes with one device, writes the table, the
plot and the JSON, and skips finished runs when called again; bad flags stop with one
`error:` line."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _check(*args):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
               JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, "-m", "experiments.scaling_check", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)


def test_tiny_check_writes_table_and_resumes(tmp_path):
    out = tmp_path / "check"
    args = ("--out", str(out), "--preset", "tiny", "--models", "listops", "--devices", "1,4",
            "--modes", "fsdp", "--steps", "4", "--windows", "1", "--loss_steps", "3")
    result = _check(*args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "scaling_check.png").stat().st_size > 10_000
    rows = json.loads((out / "scaling_check.json").read_text())["rows"]
    assert [(r["mode"], r["devices"], r["batch"]) for r in rows] == [("dp", 1, 1), ("fsdp", 4, 4)]
    for r in rows:
        assert len(r["losses"]) == 3 and r["examples_per_s"] > 0
        assert r["loss_rel_diff"] < 1e-5  # float32 rounding: the same steps on another mesh
    assert rows[0]["speedup"] == 1.0 and rows[0]["loss_rel_diff"] == 0.0
    table = (out / "scaling_check.md").read_text()
    assert "| listops | 1 device | 1 | 1 |" in table and "| listops | fsdp=4 | 4 | 4 |" in table
    assert sorted(os.listdir(out / "runs")) == [
        "listops_dp_1_loss.jsonl", "listops_dp_1_speed.jsonl", "listops_fsdp_4_loss.jsonl",
        "listops_fsdp_4_speed.jsonl"]
    again = _check(*args)  # every run is there: nothing trains, the same rows
    assert again.returncode == 0 and "Starting in" not in again.stdout, again.stderr[-3000:]
    assert json.loads((out / "scaling_check.json").read_text())["rows"] == rows


def test_bad_flags_one_error_line(tmp_path):
    for flags, message in ((["--models", "gpt"], "--models: unknown ['gpt']"),
                           (["--modes", "tp"], "--modes: unknown ['tp']"),
                           (["--devices", "16"], "this process has 8 cpu device(s)"),
                           (["--loss_batch", "6"], "--loss_batch 6 must split over every"),
                           (["--steps", "2", "--windows", "2"], "--steps 2 must cover")):
        result = _check("--out", str(tmp_path / "x"), "--preset", "tiny", *flags)
        assert result.returncode != 0
        lines = result.stderr.strip().splitlines()
        assert lines[-1].startswith("error: ") and message in lines[-1], (flags, lines[-3:])
