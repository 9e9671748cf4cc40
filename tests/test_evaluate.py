"""experiments.evaluate: a run's checkpoint evaluated again, on its own splits or a new draw."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from configs.lra import listops
from experiments import evaluate
from experiments.checkpointing import load_best_run
from experiments.errors import UserError
from experiments.trainer import train_and_evaluate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module", params=[0.0, 0.9], ids=["params", "ema"])
def run(request, tmp_path_factory):
    """A tiny ListOps run (evaluated twice), with and without EMA parameters."""
    tmp = tmp_path_factory.mktemp("run")
    config = listops.get_config("tiny")
    config.data.cache_dir = str(tmp / "cache")
    config.num_train_steps, config.eval_every, config.checkpoint_every = 6, 3, 3
    config.optim.ema_decay = request.param
    summary = train_and_evaluate(config, str(tmp / "w"))
    return str(tmp / "w"), summary


def _evaluated(workdir, which, settings=()):
    config, step, params, state = load_best_run(workdir, None, "test", model_state=True,
                                                which=which)
    config = evaluate.with_settings(config, settings)
    return step, evaluate.evaluate(config, params, state, ["val", "test"], 16)


def test_reproduces_the_trainers_evaluations(run):
    """The best checkpoint gives the best record's numbers, the latest the last evaluation's:
    the same parameters (EMA ones when kept) on the same splits."""
    workdir, summary = run
    for which, record in (("best", summary["best"]), ("latest", summary["final"])):
        step, results = _evaluated(workdir, which)
        assert step == record["step"]
        for split in ("val", "test"):
            np.testing.assert_allclose(results[split]["accuracy"], record[f"{split}/accuracy"])
            np.testing.assert_allclose(results[split]["loss"], record[f"{split}/loss"],
                                       rtol=1e-5)


def test_a_new_draw(run):
    workdir, _ = run
    _, base = _evaluated(workdir, "best")
    _, other = _evaluated(workdir, "best", ["data.seed=7", "data.num_test=100"])
    assert other["val"]["loss"] != base["val"]["loss"]  # other examples
    assert np.isfinite(other["test"]["loss"]) and 0.0 <= other["test"]["accuracy"] <= 1.0


def test_cli_writes_the_table(run, tmp_path):
    workdir, summary = run
    output = tmp_path / "table.md"
    result = subprocess.run(
        [sys.executable, "-m", "experiments.evaluate", "--workdir", workdir, "--splits", "test",
         "--set", f"data.cache_dir={tmp_path / 'cache'}", "--batch_size", "8", "--output",
         str(output)],  # the same data, generated again
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    printed = json.loads(result.stdout.strip().splitlines()[-1])
    assert printed["step"] == summary["best"]["step"]
    np.testing.assert_allclose(printed["test"]["accuracy"], summary["best"]["test/accuracy"])
    rows = [line for line in output.read_text().splitlines() if line.startswith("| test")]
    assert rows == [f"| test | {100 * printed['test']['accuracy']:.2f} % | "
                    f"{printed['test']['loss']:.4f} |"]


@pytest.mark.parametrize("setting,message", [
    ("data.seed", "write key=value"),
    ("data.colour=1", "the run's config has no such key"),
    ("model.d_model=32", "the checkpoint fixes the model"),
    ("data.seed=one", "the run has a int there"),
])
def test_bad_settings(run, setting, message):
    config, *_ = load_best_run(run[0], None, "test")
    with pytest.raises(UserError, match=message):
        evaluate.with_settings(config, [setting])


@pytest.mark.parametrize("args,message", [
    ([], "--workdir is required"),
    (["--workdir", "nowhere"], "nowhere/config.json not found"),
])
def test_bad_arguments_are_one_error_line(args, message):
    result = subprocess.run([sys.executable, "-m", "experiments.evaluate", *args], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
