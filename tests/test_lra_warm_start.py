"""config.init_from for the LRA classification task: a run starts from another run's best
checkpoint (weights and BatchNorm statistics), e.g. Pathfinder's easiest set before LRA's."""

import shutil

import jax
import numpy as np
import pytest

from configs.lra import pathfinder
from experiments.checkpointing import load_best_run
from experiments.errors import UserError
from experiments.tasks import get_task
from experiments.trainer import host_variables, train_and_evaluate


def _config(tmp_path, difficulty, **model):
    c = pathfinder.get_config("tiny")
    c.data.update(difficulty=difficulty, cache_dir=str(tmp_path / "cache"), num_workers=1,
                  seed=int(np.random.default_rng().integers(1 << 30)))
    c.model.update({"norm": "batchnorm", **model})
    return c


@pytest.fixture(scope="module")
def easy_run(tmp_path_factory):
    """A tiny LION-S with BatchNorm trained on the easiest Pathfinder set."""
    tmp = tmp_path_factory.mktemp("warm")
    workdir = str(tmp / "easy")
    train_and_evaluate(_config(tmp, "curv_baseline"), workdir)
    return tmp, workdir


def _leaves_equal(a, b):
    a, b = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(a) == len(b) and all(np.array_equal(np.asarray(x), np.asarray(y))
                                    for x, y in zip(a, b))


def test_the_run_starts_from_the_init_runs_best_checkpoint(easy_run):
    tmp, easy = easy_run
    _, _, params, state = load_best_run(easy, "classification", "test", model_state=True)
    config = _config(tmp, "curv_contour_length_14")
    config.init_from = easy
    task = get_task(config)
    fresh, fresh_state = host_variables(task, jax.random.PRNGKey(3))
    assert not _leaves_equal(fresh, params)
    warm, warm_state = task.warm_start(fresh, fresh_state)
    assert _leaves_equal(warm, params) and _leaves_equal(warm_state, state)
    assert all(np.asarray(w).dtype == np.asarray(f).dtype
               for w, f in zip(jax.tree.leaves(warm), jax.tree.leaves(fresh)))

    # through the trainer: at learning rate 0 the weights stay those of the init run, and a
    # resumed run reads its own checkpoint, not init_from (gone by then)
    config.optim.learning_rate, config.optim.warmup_steps = 0.0, 0
    summary = train_and_evaluate(config, str(tmp / "hard"))
    assert np.isfinite(summary["final"]["val/loss"])
    _, _, trained = load_best_run(str(tmp / "hard"), "classification", "test")
    assert _leaves_equal(trained, params)
    moved = str(tmp / "easy_moved")
    shutil.copytree(easy, moved)
    config.init_from = moved
    config.num_train_steps = 6
    shutil.rmtree(moved)
    train_and_evaluate(config, str(tmp / "hard"))


def test_without_init_from_the_fresh_weights_stay(easy_run):
    tmp, _ = easy_run
    task = get_task(_config(tmp, "curv_baseline"))
    fresh, state = host_variables(task, jax.random.PRNGKey(0))
    warm, warm_state = task.warm_start(fresh, state)
    assert warm is fresh and warm_state is state


@pytest.mark.parametrize("change, message", [
    (dict(model=dict(d_model=24)), "does not fit this model: .* has shape"),
    (dict(model=dict(norm="layernorm")), "BatchNorm statistics"),
    (dict(init_from="missing"), "config.json not found: config.init_from='.*missing' needs"),
])
def test_a_mismatched_init_run_is_one_error(easy_run, change, message):
    tmp, easy = easy_run
    config = _config(tmp, "curv_baseline", **change.get("model", {}))
    config.init_from = str(tmp / change["init_from"]) if "init_from" in change else easy
    task = get_task(config)
    fresh, state = host_variables(task, jax.random.PRNGKey(0))
    with pytest.raises(UserError, match=message):
        task.warm_start(fresh, state)
