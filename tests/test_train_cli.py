"""The entry point, run as a user would (subprocesses on the 8 forced CPU devices)."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = "configs/lra/listops.py:tiny"


def run(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "experiments.train", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """One ListOps cache for the module's runs."""
    return str(tmp_path_factory.mktemp("listops_cache"))


def test_list_shows_configs_and_variants():
    result = run("--list")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("configs/lra/listops.py  LION-S on LRA ListOps") for line in lines)
    for variant in ("quick", "tiny"):
        assert any(line.strip().startswith(f"configs/lra/listops.py:{variant}  ")
                   for line in lines)


def test_default_workdir():
    from experiments.train import default_workdir

    assert default_workdir("configs/lra/listops.py:quick") == os.path.join(
        "workdir", "lra_listops_quick")
    assert default_workdir("configs/lra/listops.py") == os.path.join("workdir", "lra_listops")
    for run_path in ("docs/lra_runs/lra_listops_lit", "docs/lra_runs/lra_listops_lit/",
                     "docs/lra_runs/lra_listops_lit/config.json"):
        assert default_workdir(f"configs/recorded.py:{run_path}") == os.path.join(
            "workdir", "recorded_lra_listops_lit")


def test_out_of_memory_is_one_line():
    """A device's RESOURCE_EXHAUSTED error (the message XLA's CPU client gave for a LION-S
    ListOps run restored on a 24 GiB CPU) becomes one line that says what to lower; other
    runtime errors pass through."""
    from jax.errors import JaxRuntimeError

    from experiments.train import out_of_memory_line

    error = JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 27222421776 bytes.")
    line = out_of_memory_line(error, "workdir/run")
    assert line == ("the device ran out of memory (Out of memory allocating 27222421776 "
                    "bytes.); lower --config.batch_size (with --config.grad_accum_steps to keep "
                    "the batch) or --config.eval_batch_size; workdir/run keeps its last "
                    "checkpoint")
    assert out_of_memory_line(JaxRuntimeError("INTERNAL: something else"), "w") is None


@pytest.mark.parametrize("args, message", [
    (["--config", f"{TINY}", "--config.nonexistent=1"],
     f"error: unknown config key 'nonexistent' (not in {TINY})"),
    (["--config", f"{TINY}", "--config.model.nonexistent=1"],
     f"error: unknown config key 'model.nonexistent' (not in {TINY})"),
    (["--config", "configs/lra/nope.py"], "error: config file 'configs/lra/nope.py' not found"),
    (["--config", "configs/lra/listops.py:huge"],
     "error: unknown config variant 'huge' (known variants: d, lit, no_selectivity, quick,"),
    (["--config", f"{TINY}", "--config.batch_size=abc"],
     "error: flag --config.batch_size=abc: invalid literal for int()"),
    ([], "error: --config is required"),
    (["--config", "configs/recorded.py"], "error: configs/recorded.py takes a run: --config "
     "configs/recorded.py:docs/lra_runs/<run>"),
    (["--config", "configs/recorded.py:docs/lra_runs/nope"],
     "error: configs/recorded.py: docs/lra_runs/nope not found; give a run's workdir"),
])
def test_flag_errors_are_one_line(args, message):
    result = run(*args)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [result.stderr.strip()], result.stderr
    assert result.stderr.startswith(message), result.stderr


def test_run_errors_are_one_line(tmp_path, cache_dir):
    common = ["--config", TINY, f"--config.data.cache_dir={cache_dir}"]
    result = run(*common, "--workdir", str(tmp_path / "a"), "--config.batch_size=12")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "error: config.batch_size=12 is not divisible by the 8 data-parallel shards "
        "(mesh data=8 x fsdp=1); use a multiple of 8")

    # A learning rate of 1e38 blows up at step 3 (step 1 has lr 0 in warmup).
    workdir = tmp_path / "nan"
    result = run(*common, "--workdir", str(workdir), "--config.optim.learning_rate=1e38")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: loss is nan") or last.startswith("error: loss is inf"), last
    assert "at step 3; stopped. Last good checkpoint: step 2 in" in last
    assert os.listdir(workdir / "checkpoints") == ["2"]


def test_eval_split_missing_from_the_data_is_one_line(tmp_path, cache_dir):
    result = run("--config", TINY, f"--config.data.cache_dir={cache_dir}",
                 "--config.eval_splits=('val','dev')", "--workdir", str(tmp_path / "run"))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "error: config.eval_splits has 'dev'; the dataset has train, val, test")


def test_missing_lra_files_are_one_line(tmp_path):
    result = run("--config", TINY, "--config.data.source=tsv",
                 f"--config.data.data_dir={tmp_path}", "--workdir", str(tmp_path / "run"))
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [result.stderr.strip().splitlines()[-1]], result.stderr
    assert "Traceback" not in result.stderr
    assert f"{tmp_path / 'basic_train.tsv'} not found" in errors[0]
    assert "lra_release" in errors[0]


def test_tiny_run_writes_metrics_and_checkpoints_then_resumes(tmp_path, cache_dir):
    workdir = tmp_path / "tiny"
    args = ["--config", TINY, "--workdir", str(workdir), f"--config.data.cache_dir={cache_dir}"]
    result = run(*args)
    assert result.returncode == 0, result.stderr
    assert "mesh {'data': 8, 'fsdp': 1, 'model': 1} over 8 cpu device(s)" in result.stdout
    assert "test majority-class rate" in result.stdout
    with open(workdir / "metrics.jsonl") as f:
        records = [json.loads(line) for line in f]
    assert {(r["step"], r["split"]) for r in records} == {(0, "run")} | {
        (s, split) for s in (2, 4) for split in ("train", "val", "test")}
    assert set(records[0]) == {"step", "split", "metrics", "info", "time"}
    assert records[0]["info"]["config"] == TINY and records[0]["info"]["num_devices"] == 8
    assert set(records[1]) == {"step", "split", "metrics", "time"}
    assert sorted(os.listdir(workdir / "checkpoints")) == ["2", "4"]
    assert len(os.listdir(workdir / "best")) == 1
    assert json.loads((workdir / "config.json").read_text())["num_train_steps"] == 4

    again = run(*args)  # finished run: restores step 4 and prints the same summary
    assert again.returncode == 0, again.stderr
    assert "Resuming from step 4" in again.stdout
    summary = lambda out: out[out.index("Summary"):out.index("wall time")]  # noqa: E731
    assert summary(again.stdout) == summary(result.stdout)
    with open(workdir / "metrics.jsonl") as f:
        resumed = [json.loads(line) for line in f]
    assert resumed[:-1] == records  # and the restart's run record
    assert (resumed[-1]["step"], resumed[-1]["split"]) == (4, "run")

    # the run's own config (configs/recorded.py) resumes it, with the loop's keys overridden
    config = json.loads((workdir / "config.json").read_text())
    longer = run("--config", f"configs/recorded.py:{workdir}", "--workdir", str(workdir),
                 "--config.num_train_steps=6")
    assert longer.returncode == 0, longer.stderr
    assert "Resuming from step 4" in longer.stdout
    assert sorted(os.listdir(workdir / "checkpoints")) == ["4", "6"]
    assert json.loads((workdir / "config.json").read_text()) == dict(config, num_train_steps=6)
