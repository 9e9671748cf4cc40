"""Causal LMs in the trainer: the architectures test_lm_task.py does not train (a few
trainer steps each) and the configs' parameter counts (kept apart from test_lm_task.py so
that each file stays short on a 2-core CPU)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs.lm import common as lm_configs
from experiments import optim
from experiments.tasks import get_task
from experiments.trainer import TrainState, make_train_step


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("lm_cache")


@pytest.mark.parametrize("arch", ["hgrn2", "cosformer2", "lion_s"])
def test_other_archs_train_two_steps(cache_dir, arch):
    """The trainer's step (no evaluation or checkpoints: llama and tnl cover those)."""
    config = lm_configs.make_config(arch, "tiny")
    config.data.cache_dir = str(cache_dir)
    task = get_task(config)
    tx, schedule = optim.make_optimizer(config.optim, config.num_train_steps)
    params = nn.meta.unbox(jax.jit(task.init)(jax.random.PRNGKey(0)))["params"]
    state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                       ema_params=None, rng=jax.random.PRNGKey(1))
    step = jax.jit(make_train_step(task, tx, schedule, config))
    batches = task.train_batches(config.batch_size, seed=0)
    losses = []
    for _ in range(2):
        state, metrics = step(state, next(batches))
        losses.append(float(metrics["loss"]))
    assert int(state.step) == 2 and np.all(np.isfinite(losses)), losses


def _num_params(config, vocab_size):
    from experiments.tasks.lm import make_model, model_kwargs

    model = make_model(model_kwargs(config.model, vocab_size=vocab_size,
                                    max_len=config.data.max_len))
    shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0),
                                               jnp.zeros((1, 8), jnp.int32)))
    return sum(np.prod(x.shape) for x in jax.tree.leaves(shapes))


def test_small_is_about_100m_and_tnl_385m_is_the_papers():
    for arch in ("llama", "tnl"):
        assert 85e6 < _num_params(lm_configs.make_config(arch, "small"), 8192) < 105e6
    # TNL digest 2.7: 24 (4 d^2 + d^2 + 3 d g) + 64000 d = 399M with tied embeddings.
    n = _num_params(lm_configs.make_config("tnl", "tnl_385m"), 8192)
    assert abs(n - 399.0e6) < 1.5e6, n


def test_tnl_trains_on_a_sharded_mesh(cache_dir, tmp_path):
    """TNL's fused q|k|v|u projection under the trainer's logical-axis rules and an FSDP mesh
    (8 CPU devices: data 4 x fsdp 2)."""
    from experiments.trainer import train_and_evaluate

    config = lm_configs.make_config("tnl", "tiny")
    config.data.cache_dir = str(cache_dir)
    config.mesh.update(data=-1, fsdp=2)
    config.num_train_steps = 2
    summary = train_and_evaluate(config, str(tmp_path / "w"))
    assert summary["final"]["step"] == 2 and np.isfinite(summary["final"]["val/loss"])
