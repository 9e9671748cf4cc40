"""experiments.mixer_impulse: a config's mixer's impulse response at init against its Jacobian
taken whole, and its command line."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs.lra import pathfinder
from experiments import mixer_impulse
from lion_jax.layers import LionAttention
from lion_jax.layers.s5 import S5Mixer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("variant", ["tiny", "s5"])
def test_response_is_the_jacobians_block_norm(variant, rng):
    """At an odd length, every lag's number is the Frobenius norm of ``d y_t / d x_{t+d}``
    (the whole Jacobian by ``jax.jacrev``) over the largest, for the config's own mixer."""
    config = pathfinder.get_config(variant)
    config.model.update(d_model=8, num_heads=2)
    mixer, d_model = mixer_impulse.mixer_of(config.model)
    assert isinstance(mixer, S5Mixer if variant == "s5" else LionAttention) and d_model == 8
    length, token, seed = 13, 5, int(rng.integers(1000))
    lags = list(range(-token, length - token))
    response, rms = mixer_impulse.impulse(mixer, d_model, length, token, lags, seed)

    keys = jax.random.split(jax.random.key(seed), 3)
    x = jax.random.normal(keys[0], (1, length, d_model))
    params = mixer.init(keys[1], x)
    direction = jax.random.normal(keys[2], (d_model,))
    jacobian = jax.jacrev(lambda x: mixer.apply(params, x)[0, token])(x)[:, 0]  # [D, L, D]
    norms = np.linalg.norm(np.einsum("e,eld->ld", direction / jnp.linalg.norm(direction),
                                     jacobian), axis=-1)
    np.testing.assert_allclose(response, norms / norms.max(), rtol=1e-4, atol=1e-7)
    assert response.max() == 1.0 and np.all(np.isfinite(response))
    y = mixer.apply(params, x)
    np.testing.assert_allclose(rms, float(jnp.sqrt(jnp.mean(y ** 2))), rtol=1e-6)


def test_command_line_prints_the_table():
    result = subprocess.run(
        [sys.executable, "-m", "experiments.mixer_impulse", "--config",
         "configs/lra/pathfinder.py:tiny", "--length", "21", "--lags", "-3,0,3", "--seeds", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[1].split() == ["lag", "-3", "0", "3"]
    values = [float(v) for v in lines[2].split()[1:]]
    assert len(values) == 3 and max(values) <= 1.0 and all(v > 0 for v in values)
    assert lines[3].startswith("output RMS ")


@pytest.mark.parametrize("args,message", [
    (["--lags", "1,x"], "--lags must be comma-separated integers"),
    (["--length", "10", "--lags", "-6,0"], "reaches outside the 10 tokens"),
    (["--config.model.mixer.variant=bogus"], "unknown variant 'bogus'"),
    (["--config", "configs/mlm/c4.py"], "d_model and num_heads must be set"),
])
def test_bad_arguments_are_one_error_line(args, message):
    result = subprocess.run(
        [sys.executable, "-m", "experiments.mixer_impulse", "--config",
         "configs/lra/pathfinder.py:tiny", *args], cwd=ROOT, capture_output=True, text=True,
        timeout=300)
    assert result.returncode == 1, result.stderr[-2000:]
    assert result.stderr.strip().count("\n") == 0 and message in result.stderr


def test_importing_defines_no_flags():
    """Importing the module (as this test file does) leaves the flags to the programs that
    define the same names (``--config``: experiments.train)."""
    from absl import flags
    assert "lags" not in flags.FLAGS and "seeds" not in flags.FLAGS
