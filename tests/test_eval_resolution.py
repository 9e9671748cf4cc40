"""experiments.eval_resolution: a trained vision checkpoint evaluated at other resolutions."""

import os
import subprocess
import sys

import numpy as np
import pytest

from configs.vision import shapes
from experiments import eval_resolution
from experiments.trainer import train_and_evaluate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module", params=[None, "vit"], ids=["lion_s", "vit"])
def run(request, tmp_path_factory):
    """A tiny Shapes run (16 px) of LION-S or the ViT baseline (learned positions)."""
    tmp = tmp_path_factory.mktemp("run")
    config = shapes.tiny(shapes.get_config(request.param))
    config.data.cache_dir = str(tmp / "cache")
    summary = train_and_evaluate(config, str(tmp / "w"))
    return str(tmp / "w"), summary


def test_training_resolution_reproduces_the_best_eval(run):
    workdir, summary = run
    config, step, params = eval_resolution.load_run(workdir)
    assert step == summary["best"]["step"]
    metrics = eval_resolution.evaluate(config, params, 16, "test", 8)
    np.testing.assert_allclose(metrics["accuracy"], summary["best"]["test/accuracy"])
    np.testing.assert_allclose(metrics["loss"], summary["best"]["test/loss"], rtol=1e-5)


def test_other_resolutions_through_the_cli(run, tmp_path):
    workdir, _ = run
    output = tmp_path / "table.md"
    result = subprocess.run(
        [sys.executable, "-m", "experiments.eval_resolution", "--workdir", workdir,
         "--resolutions", "16,24,32", "--batch_size", "8", "--output", str(output)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [line for line in output.read_text().splitlines() if line.startswith("| ")]
    assert [line.split(" | ")[0] for line in lines[2:]] == ["| 16 (training)", "| 24", "| 32"]
    for line in lines[2:]:
        accuracy, loss = (float(x) for x in line.strip(" |").split(" | ")[2:])
        assert 0.0 <= accuracy <= 100.0 and np.isfinite(loss)


@pytest.mark.parametrize("args,message", [
    (["--resolutions", "16,18"], "resolutions [18] are not multiples of the patch size 4"),
    (["--resolutions", "16,x"], "--resolutions must be integers"),
    ([], "give --workdir and --resolutions"),
])
def test_bad_arguments_are_one_error_line(run, args, message):
    workdir, _ = run
    result = subprocess.run(
        [sys.executable, "-m", "experiments.eval_resolution", "--workdir", workdir, *args],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0 and message in result.stderr


def test_not_a_run(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "experiments.eval_resolution", "--workdir", str(tmp_path),
         "--resolutions", "16"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and "config.json not found" in result.stderr


@pytest.mark.parametrize("variant", [None, "vit"], ids=["lion_s", "vit"])
def test_cifar_run_with_deit_pipeline(variant, tmp_path, rng):
    """A CIFAR-10 run (DeiT's pipeline, stand-in pickles) evaluates at its training size as
    its own best evaluation did, and at a larger one through the evaluation transform."""
    from configs.vision import cifar10
    from tests.test_image_data import write_cifar

    folder = tmp_path / "cifar-10-batches-py"
    write_cifar(folder, "cifar10", rng, sizes=dict(train=50, test=14))
    config = cifar10.get_config("tiny" if variant is None else None)
    if variant is not None:  # the vit variant made tiny
        config = cifar10.cifar100.tiny(cifar10.get_config(variant))
    config.data.update(data_dir=str(folder), cache_dir=str(tmp_path / "cache"))
    summary = train_and_evaluate(config, str(tmp_path / "w"))
    loaded, step, params = eval_resolution.load_run(str(tmp_path / "w"))
    assert eval_resolution.training_resolution(loaded) == 16
    split = loaded.eval_splits[-1]
    same = eval_resolution.evaluate(loaded, params, 16, split, 8)
    np.testing.assert_allclose(same["loss"], summary["best"][f"{split}/loss"], rtol=1e-5)
    larger = eval_resolution.evaluate(loaded, params, 24, split, 8)
    assert np.isfinite(larger["loss"]) and 0.0 <= larger["accuracy"] <= 1.0
