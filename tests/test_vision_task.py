"""The vision task (experiments/tasks/vision.py) and configs/vision/shapes.py: every mixer
variant trains and evaluates through the trainer on the embedded images, augmentation and
normalisation, and bad settings stop with one `error:` line."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs.vision import shapes
from experiments.tasks.vision import normalise, random_flip
from experiments.trainer import train_and_evaluate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("variant", [None, "lit", "d", "s_v2", "vit"])
def test_every_mixer_trains_tiny(variant, tmp_path):
    config = shapes.tiny(shapes.get_config(variant))
    config.data.cache_dir = str(tmp_path / "cache")
    summary = train_and_evaluate(config, str(tmp_path / "w"))
    assert summary["final"]["step"] == 4
    assert all(np.isfinite(v) for v in summary["final"].values())


def test_quick_variant_is_a_short_cpu_run():
    config = shapes.get_config("quick")
    assert config.num_train_steps * config.batch_size <= 40_000
    assert config.model.dtype == "float32" and config.data.resolution % config.model.patch_size == 0


def test_normalise_and_flip(rng):
    images = jnp.asarray(rng.integers(0, 256, (64, 5, 6, 3)), jnp.uint8)
    x = normalise(images)
    assert x.dtype == jnp.float32 and float(x.min()) >= -1.0 and float(x.max()) <= 1.0
    flipped = random_flip(x, jax.random.key(int(rng.integers(2**31))))
    same = np.all(np.asarray(flipped == x), axis=(1, 2, 3))
    mirrored = np.all(np.asarray(flipped == x[:, :, ::-1]), axis=(1, 2, 3))
    assert np.all(same | mirrored) and 10 < same.sum() < 54


def run_cli(tmp_path, *flags):
    return subprocess.run(
        [sys.executable, "-m", "experiments.train", "--config", "configs/vision/shapes.py:tiny",
         "--workdir", str(tmp_path / "w"), f"--config.data.cache_dir={tmp_path / 'cache'}",
         *flags], cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("flag,message", [
    ("--config.model.patch_size=5", "not a multiple of config.model.patch_size=5"),
    ("--config.model.mixer.impl=bogus", "bad config.model.mixer: unknown impl 'bogus'"),
    ("--config.label_smoothing=1.5", "config.label_smoothing must be in [0, 1)"),
    ("--config.data.resolution=4", "bad shapes settings in config.data"),
])
def test_bad_settings_are_one_error_line(tmp_path, flag, message):
    result = run_cli(tmp_path, flag)
    assert result.returncode == 1, result.stderr[-2000:]
    assert result.stderr.strip().count("\n") == 0 and result.stderr.startswith("error: ")
    assert message in result.stderr and "Traceback" not in result.stderr
