"""experiments/scaling_sweep.py on CPU: the smoke preset trains its grid with the library's
trainer, fits every architecture and writes the table, the figure and the points; a second call
resumes (skips the finished runs); bad flags stop with one `error:` line."""

import json
import math
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _sweep(*args):
    return subprocess.run([sys.executable, "-m", "experiments.scaling_sweep", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


def test_smoke_sweep_fits_and_resumes(tmp_path):
    out = tmp_path / "sweep"
    args = ("--out", str(out), "--preset", "smoke", "--cache_dir", str(tmp_path / "cache"),
            "--chunk_size", "16")
    result = _sweep(*args)
    assert result.returncode == 0, result.stderr[-3000:]
    for name in ("table.md", "figure1.png", "fits.json", "points.jsonl"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "figure1.png").stat().st_size > 10_000
    fits = json.loads((out / "fits.json").read_text())
    assert sorted(fits) == ["llama", "tnl"]
    for fit in fits.values():
        assert fit["unit"] == "pf-days"
        values = [fit[k][p] for k in ("loss", "params", "tokens") for p in ("beta", "alpha")]
        assert all(math.isfinite(v) for v in values)
        assert fit["loss"]["alpha"] < 0 < fit["params"]["alpha"]  # loss falls, N_opt grows
    points = [json.loads(line) for line in (out / "points.jsonl").read_text().splitlines()]
    assert len(points) == 2 * 3 * 11  # archs x widths x logged steps 4, 6, ..., 24 (after warmup)
    for p in points:
        assert p["tokens"] == p["step"] * 8 * 32 and p["flops"] > 0 and p["loss"] > 0
    run_config = json.loads((out / "runs" / "tnl_d16" / "config.json").read_text())
    assert run_config["model"]["mixer"]["chunk_size"] == 16
    table = (out / "table.md").read_text()
    assert "| llama |" in table and "| tnl |" in table and "equal compute" in table
    # the same command again: every run is finished, nothing retrains, same fits
    again = _sweep(*args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((out / "fits.json").read_text()) == fits


def test_bad_flags_one_error_line(tmp_path):
    for flags, message in ((["--archs", "gpt"], "unknown --archs ['gpt']"),
                           (["--widths", "20"], "width 20 must be a positive multiple"),
                           (["--unit", "tflops"], "unknown --unit 'tflops'"),
                           (["--steps", "4"], "fewer than 4 logged losses"),
                           (["--chunk_size", "0"], "--chunk_size must be positive")):
        result = _sweep("--out", str(tmp_path / "x"), "--preset", "smoke", *flags)
        assert result.returncode != 0
        lines = result.stderr.strip().splitlines()
        assert lines[-1].startswith("error: ") and message in lines[-1], (flags, lines[-3:])
