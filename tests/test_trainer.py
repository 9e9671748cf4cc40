"""The generic trainer with a toy task defined here: sharding equivalence, gradient
accumulation, resume after a kill, NaN stop, device checks, optimizer pieces."""

import json
import math
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from jax.sharding import PartitionSpec as P

from configs import common
from experiments import optim, sharding
from experiments.data.pipeline import BatchIterator
from experiments.errors import UserError
from experiments.trainer import host_variables, split_variables, train_and_evaluate

SEQ, VOCAB, CLASSES = 8, 16, 4


class ToyModel(nn.Module):
    """Embed -> mean -> Dense -> (BatchNorm) -> relu -> Dropout -> Dense, with logical-axis
    annotations."""

    dropout: float = 0.0
    batchnorm: bool = False

    @nn.compact
    def __call__(self, tokens, scale, *, train):
        x = nn.Embed(VOCAB, 12, embedding_init=nn.with_logical_partitioning(
            nn.initializers.normal(1.0), ("vocab", "embed")))(tokens)
        x = x.mean(axis=1) * scale[:, None]
        x = nn.Dense(32, kernel_init=nn.with_logical_partitioning(
            nn.initializers.lecun_normal(), ("embed", "mlp")),
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("mlp",)))(x)
        if self.batchnorm:
            x = nn.BatchNorm(use_running_average=not train, momentum=0.8)(x)
        x = nn.Dropout(self.dropout, deterministic=not train)(nn.relu(x))
        return nn.Dense(CLASSES, kernel_init=nn.with_logical_partitioning(
            nn.initializers.lecun_normal(), ("mlp", "classes")))(x)


class FaultyIterator(BatchIterator):
    """A BatchIterator that raises when fetching batch ``fail_at`` (a simulated kill) or
    returns batch ``nan_at`` with NaN in ``scale`` (1-based counts since creation)."""

    def __init__(self, *args, fail_at=None, nan_at=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.fail_at, self.nan_at, self.count = fail_at, nan_at, 0

    def __next__(self):
        self.count += 1
        if self.count == self.fail_at:
            raise RuntimeError("simulated kill")
        batch = super().__next__()
        if self.count == self.nan_at:
            batch["scale"] = np.full_like(batch["scale"], np.nan)
        return batch


class ToyTask:
    """Label = first token mod 4; 256 train, 48 val and test examples. ``batchnorm=True``: a
    model with running statistics (``state_collections``, experiments/tasks/__init__.py)."""

    eval_splits = ("val", "test")

    def __init__(self, dropout=0.0, fail_at=None, nan_at=None, batchnorm=False):
        data_rng = np.random.default_rng(0)
        self.splits = {}
        for split, n in (("train", 256), ("val", 48), ("test", 48)):
            tokens = data_rng.integers(0, VOCAB, (n, SEQ)).astype(np.int32)
            self.splits[split] = dict(tokens=tokens, labels=tokens[:, 0] % CLASSES,
                                      scale=np.ones(n, np.float32))
        self.model = ToyModel(dropout, batchnorm)
        self.fail_at, self.nan_at = fail_at, nan_at
        self.state_collections = ("batch_stats",) if batchnorm else ()

    def init(self, rng):
        return self.model.init({"params": rng}, jnp.zeros((1, SEQ), jnp.int32), jnp.ones(1),
                               train=False)

    def loss(self, params, batch, rng, *, train, model_state=None):
        mutable = ["batch_stats"] if train and self.state_collections else False
        out = self.model.apply({"params": params, **(model_state or {})}, batch["tokens"],
                               batch["scale"], train=train, rngs={"dropout": rng},
                               mutable=mutable)
        logits, new_state = out if mutable else (out, model_state)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"])
        metrics = {"accuracy": (jnp.argmax(logits, -1) == batch["labels"]).astype(jnp.float32)}
        return (loss, metrics, new_state) if self.state_collections else (loss, metrics)

    def train_batches(self, batch_size, seed):
        return FaultyIterator(self.splits["train"], batch_size, shuffle=True, seed=seed,
                              drop_remainder=True, fail_at=self.fail_at, nan_at=self.nan_at)

    def eval_batches(self, split, batch_size):
        return BatchIterator(self.splits[split], batch_size, shuffle=False, seed=0,
                             drop_remainder=False, num_epochs=1)

    def summary(self):
        return {"chance": 1 / CLASSES}


def toy_config(**overrides):
    c = common.base_config()
    c.batch_size = 16
    c.eval_batch_size = 16  # val/test: 48 = 3 batches
    c.num_train_steps = 5
    c.log_every = 1
    c.eval_every = 0
    c.checkpoint_every = 5
    c.progress_bar = False
    c.optim.learning_rate = 3e-2
    c.optim.warmup_steps = 2
    c.optim.weight_decay = 0.01
    for key, value in overrides.items():
        *path, leaf = key.split(".")
        target = c
        for name in path:
            target = target[name]
        target[leaf] = value
    return c


def records(workdir, split=None):
    """metrics.jsonl records without wall-clock fields and without the (re)start records."""
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        out = [json.loads(line) for line in f]
    for r in out:
        r.pop("time")
        r["metrics"].pop("steps_per_sec", None)
    return [r for r in out if r["split"] != "run" and (split is None or r["split"] == split)]


def train_losses(workdir):
    return np.array([r["metrics"]["loss"] for r in records(workdir, "train")])


MESHES = {
    "data8": dict(data=8, fsdp=1, model=1),
    "fsdp": dict(data=2, fsdp=4, model=1),
    "fsdp+model": dict(data=2, fsdp=2, model=2),
}


def test_meshes_match_one_device(tmp_path):
    assert jax.device_count() == 8
    one = str(tmp_path / "one")
    train_and_evaluate(toy_config(**{"mesh.data": 1}), one, task=ToyTask(),
                       devices=jax.devices()[:1])
    reference = train_losses(one)
    assert reference.shape == (5,) and np.all(np.isfinite(reference))
    assert reference[-1] < reference[0]
    for name, mesh in MESHES.items():
        workdir = str(tmp_path / name)
        config = toy_config(**{f"mesh.{axis}": size for axis, size in mesh.items()})
        train_and_evaluate(config, workdir, task=ToyTask())
        np.testing.assert_allclose(train_losses(workdir), reference, rtol=1e-5, err_msg=name)


def test_param_shardings_follow_logical_rules():
    config = toy_config(**{"mesh.data": 2, "mesh.fsdp": 2, "mesh.model": 2})
    mesh = sharding.make_mesh(config.mesh)
    task = ToyTask()
    shardings = sharding.param_shardings(jax.eval_shape(task.init, jax.random.PRNGKey(0)), mesh,
                                         sharding.axis_rules(config))["params"]
    assert shardings["Embed_0"]["embedding"].spec == P(None, "fsdp")
    assert shardings["Dense_0"]["kernel"].spec == P("fsdp", "model")
    assert shardings["Dense_0"]["bias"].spec == P("model")
    assert shardings["Dense_1"]["kernel"].spec == P("model", None)
    # A dimension its mesh axes do not divide (embed = 12, fsdp = 8) is replicated.
    odd = sharding.param_shardings(jax.eval_shape(task.init, jax.random.PRNGKey(0)),
                                   sharding.make_mesh(dict(data=1, fsdp=8, model=1)),
                                   sharding.axis_rules(config))["params"]
    assert odd["Embed_0"]["embedding"].spec == P(None, None)
    assert odd["Dense_0"]["kernel"].spec == P(None, "model")


@pytest.mark.parametrize("batchnorm", [False, True])
def test_host_variables_equal_an_init_on_the_mesh(batchnorm):
    """The trainer's CPU-compiled init gives numpy arrays equal, bit for bit, to the task's init
    compiled with the sharded mesh's constraints (the program it replaces)."""
    config = toy_config(**{"mesh.data": 2, "mesh.fsdp": 2, "mesh.model": 2})
    mesh, rules = sharding.make_mesh(config.mesh), sharding.axis_rules(config)
    task, rng = ToyTask(batchnorm=batchnorm), jax.random.PRNGKey(np.random.randint(1 << 30))
    params, model_state = host_variables(task, rng)
    assert all(isinstance(x, np.ndarray) for x in jax.tree.leaves((params, model_state)))
    assert (model_state is None) == (not batchnorm)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        shardings = sharding.param_shardings(jax.eval_shape(task.init, rng), mesh, rules)
        on_mesh = jax.jit(lambda: split_variables(task, nn.meta.unbox(task.init(rng))),
                          out_shardings=(shardings["params"], None if not batchnorm else
                                         sharding.replicated(mesh)))()
    jax.tree.map(np.testing.assert_array_equal, (params, model_state), jax.device_get(on_mesh))


def test_grad_accumulation_matches_full_batch(tmp_path):
    full, accum = str(tmp_path / "full"), str(tmp_path / "accum")
    train_and_evaluate(toy_config(), full, task=ToyTask())
    train_and_evaluate(toy_config(grad_accum_steps=2), accum, task=ToyTask())
    np.testing.assert_allclose(train_losses(accum), train_losses(full), rtol=1e-5)


def test_batchnorm_statistics_train_and_evaluate(tmp_path):
    """A task with model state: the running statistics move with every micro-batch, in order
    (with grad_accum_steps=2 a step moves them twice) and are saved in the checkpoint (that
    evaluation reads them is the BatchNorm case of the resume test below)."""

    def stats(workdir):  # the last checkpoint's running statistics, read on the host
        with ocp.CheckpointManager(os.path.join(workdir, "checkpoints"),
                                   item_handlers={"state": ocp.StandardCheckpointHandler()}) as m:
            step = m.latest_step()
            target = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype),
                                  m.item_metadata(step)["state"])
            state = m.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(target))).state
        return state["model_state"]["batch_stats"]["BatchNorm_0"]

    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    train_and_evaluate(toy_config(), one, task=ToyTask(batchnorm=True))
    train_and_evaluate(toy_config(grad_accum_steps=2), two, task=ToyTask(batchnorm=True))
    moved_once, moved_twice = stats(one), stats(two)
    assert np.abs(moved_once["mean"]).max() > 1e-3  # from zeros
    assert not np.allclose(moved_once["mean"], moved_twice["mean"])
    assert np.all(np.isfinite(train_losses(one))) and np.all(np.isfinite(train_losses(two)))


@pytest.mark.parametrize("batchnorm", [False, True])
def test_resume_after_kill_reproduces_uninterrupted_run(tmp_path, batchnorm):
    """Also with BatchNorm: its running statistics are checkpointed with the state (the evals,
    which use them, come out bit-identical)."""
    overrides = {"num_train_steps": 8, "checkpoint_every": 2, "eval_every": 4,
                 "optim.ema_decay": 0.9, "mesh.data": 2, "mesh.fsdp": 4}
    straight, killed = str(tmp_path / "straight"), str(tmp_path / "killed")
    expected = train_and_evaluate(toy_config(**overrides), straight,
                                  task=ToyTask(dropout=0.2, batchnorm=batchnorm))

    with pytest.raises(RuntimeError, match="simulated kill"):  # dies fetching step 6's batch
        train_and_evaluate(toy_config(**overrides), killed,
                           task=ToyTask(dropout=0.2, fail_at=6, batchnorm=batchnorm))
    assert sorted(os.listdir(os.path.join(killed, "checkpoints"))) == ["2", "4"]
    assert records(killed)[-1]["step"] == 5
    resumed = train_and_evaluate(toy_config(**overrides), killed,
                                 task=ToyTask(dropout=0.2, batchnorm=batchnorm))

    assert records(killed) == records(straight)  # bit-identical, evals included
    assert resumed["best"] == expected["best"] and resumed["final"] == expected["final"]
    assert sorted(os.listdir(os.path.join(killed, "checkpoints"))) == ["6", "8"]
    assert os.listdir(os.path.join(killed, "best")) == [str(expected["best"]["step"])]


def test_max_run_seconds_stops_at_a_checkpoint_and_resumes(tmp_path):
    """Segments: each run stops at its first checkpoint past the time limit (here at once), and
    the segments together compute what one run computes."""
    overrides = {"num_train_steps": 6, "checkpoint_every": 2, "eval_every": 2}
    straight, segmented = str(tmp_path / "straight"), str(tmp_path / "segmented")
    expected = train_and_evaluate(toy_config(**overrides), straight, task=ToyTask())
    for stop in (2, 4):
        train_and_evaluate(toy_config(max_run_seconds=1e-9, **overrides), segmented,
                           task=ToyTask())
        assert sorted(os.listdir(os.path.join(segmented, "checkpoints")))[-1] == str(stop)
    resumed = train_and_evaluate(toy_config(max_run_seconds=1e-9, **overrides), segmented,
                                 task=ToyTask())
    assert records(segmented) == records(straight)
    assert resumed["final"] == expected["final"]


@pytest.mark.parametrize("saved_on, resumed_on", [
    ("fsdp", "one"), ("fsdp", "fsdp4"), ("one", "fsdp+model"), ("data8", "fsdp4")])
def test_checkpoint_resumes_on_another_mesh(tmp_path, saved_on, resumed_on):
    """A checkpoint saved on one mesh (8 -> 1, 8 -> 4 with FSDP, 1 -> 8) resumes on another:
    orbax restores each array into the new mesh's sharding, and the data iterator continues
    from the saved global step, so the metrics are the uninterrupted run's (to float32
    rounding: the reductions' order differs between meshes)."""
    meshes = dict(MESHES, one=dict(data=1, fsdp=1, model=1), fsdp4=dict(data=1, fsdp=4, model=1))
    count = {name: math.prod(mesh.values()) for name, mesh in meshes.items()}
    overrides = {"num_train_steps": 6, "checkpoint_every": 2, "eval_every": 2,
                 "optim.ema_decay": 0.9}

    def run(workdir, mesh, **more):
        config = toy_config(**overrides, **more,
                            **{f"mesh.{axis}": size for axis, size in meshes[mesh].items()})
        return train_and_evaluate(config, workdir, task=ToyTask(dropout=0.2),
                                  devices=jax.devices()[:count[mesh]])

    straight, moved = str(tmp_path / "straight"), str(tmp_path / "moved")
    expected = run(straight, saved_on)
    run(moved, saved_on, max_run_seconds=1e-9)  # stops at its first checkpoint, step 2
    assert sorted(os.listdir(os.path.join(moved, "checkpoints"))) == ["2"]
    resumed = run(moved, resumed_on)
    got, want = records(moved), records(straight)
    assert [(r["step"], r["split"]) for r in got] == [(r["step"], r["split"]) for r in want]
    for g, w in zip(got, want):
        assert g["metrics"].keys() == w["metrics"].keys()
        np.testing.assert_allclose([g["metrics"][k] for k in sorted(g["metrics"])],
                                   [w["metrics"][k] for k in sorted(w["metrics"])],
                                   rtol=1e-5, atol=1e-7, err_msg=f"step {g['step']}")
    assert resumed["final"]["step"] == expected["final"]["step"] == 6


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
    workdir = str(tmp_path / "nan")
    config = toy_config(num_train_steps=6, checkpoint_every=2)
    with pytest.raises(UserError, match=r"at step 3; stopped\. Last good checkpoint: step 2"):
        train_and_evaluate(config, workdir, task=ToyTask(nan_at=3))
    assert os.listdir(os.path.join(workdir, "checkpoints")) == ["2"]


def test_resume_with_a_different_model_is_a_user_error(tmp_path):
    train_and_evaluate(toy_config(num_train_steps=2, checkpoint_every=2), str(tmp_path),
                       task=ToyTask())
    with pytest.raises(UserError, match=r"checkpoint 2 in .* does not fit this config: "
                                        r"ema_params/Dense_0/bias has shape none there"):
        train_and_evaluate(toy_config(num_train_steps=4, **{"optim.ema_decay": 0.9}),
                           str(tmp_path), task=ToyTask())


def test_resume_with_other_model_settings_of_the_same_shapes_is_a_user_error(tmp_path):
    """config.model differs from the run's config.json (the parameters would fit: ToyTask
    ignores the key): one error line naming the key and both values; a key the run's
    config.json lacks (added since) is not compared, and the run resumes."""
    import ml_collections

    def config(steps, **model):
        c = toy_config(num_train_steps=steps, checkpoint_every=2)
        c.model = ml_collections.ConfigDict({"channel_mixer": "half_glu",
                                             "mixer": {"variant": "s"}, **model})
        return c

    workdir = str(tmp_path)
    train_and_evaluate(config(2), workdir, task=ToyTask())
    with pytest.raises(UserError, match=r"holds a run with model\.mixer\.variant='s', this "
                                        r"config has 'd': resume with the run's settings "
                                        r"\(--config\.model\.mixer\.variant='s'"):
        train_and_evaluate(config(4, mixer={"variant": "d"}), workdir, task=ToyTask())
    with pytest.raises(UserError, match=r"model\.channel_mixer='half_glu', this config has "
                                        r"'half_glu2'"):
        train_and_evaluate(config(4, channel_mixer="half_glu2"), workdir, task=ToyTask())
    result = train_and_evaluate(config(4, new_key=1), workdir, task=ToyTask())
    assert result["final"]["step"] == 4



def test_resume_with_other_learning_rate_factors(tmp_path):
    """Learning-rate factors add or drop optimizer steps that hold no arrays: a run resumes
    across such a change, with its Adam moments."""
    workdir = str(tmp_path)
    train_and_evaluate(toy_config(num_train_steps=2), workdir, task=ToyTask())
    factors = {"optim.lr_factors": "Dense_0=0.5", "optim.decay_lr_factor": 0.5}
    assert train_and_evaluate(toy_config(num_train_steps=4, **factors), workdir,
                              task=ToyTask())["final"]["step"] == 4
    assert train_and_evaluate(toy_config(num_train_steps=6), workdir,
                              task=ToyTask())["final"]["step"] == 6

@pytest.mark.parametrize("overrides, message", [
    ({"batch_size": 12}, "batch_size=12 is not divisible by the 8 data-parallel shards"),
    ({"eval_batch_size": 20}, "eval_batch_size=20 is not divisible"),
    ({"grad_accum_steps": 4}, "/ grad_accum_steps 4 is not divisible"),
    ({"mesh.data": 3}, r"mesh \(data=3, fsdp=1, model=1\) has 3 devices but 8 are available"),
    ({"mesh.fsdp": 3}, "cannot fill 8 devices"),
    ({"optim.schedule": "step"}, "schedule='step' is not one of"),
    ({"optim.decay_lr_factor": 0.0}, "decay_lr_factor must be > 0"),
    ({"optim.lr_factors": "Dense_0"}, "lr_factors entry 'Dense_0' is not NAME=FACTOR"),
    ({"optim.lr_factors": "Dense_0=0.1, kernel=-1"}, "entry 'kernel=-1' is not NAME=FACTOR"),
    ({"optim.lr_factors": "Dense_0=0.1,query=0.1"},
     "lr_factors names query, which no module or parameter of the model is called; the "
     "model's names: Dense_0, Dense_1, Embed_0, bias, embedding, kernel"),
    ({"best_metric": "train/loss"}, "best_metric='train/loss' must be"),
    ({"best_metric": "val/f1"}, "val has no metric 'f1' \\(it has accuracy, loss\\)"),
])
def test_config_errors(tmp_path, overrides, message):
    with pytest.raises(UserError, match=message):
        train_and_evaluate(toy_config(**overrides), str(tmp_path), task=ToyTask())


# ----------------------------------------------------------------------------- optimizer


def _optim_config(**kw):
    c = common.base_config().optim
    c.update(kw)
    return c


def test_schedules():
    peak, warmup, total = 1e-3, 10, 110
    at = lambda kind, t, **kw: float(optim.make_schedule(  # noqa: E731
        _optim_config(learning_rate=peak, warmup_steps=warmup, schedule=kind, **kw), total)(t))
    for kind in optim.SCHEDULES:  # linear warmup from 0, peak at the end of warmup
        assert at(kind, 0) == 0.0
        assert at(kind, 5) == pytest.approx(peak / 2)
        assert at(kind, warmup) == pytest.approx(peak)
    assert at("cosine", 60) == pytest.approx(peak / 2)
    assert at("cosine", total) == pytest.approx(0.0, abs=1e-12)
    assert at("cosine", total, end_lr_factor=0.1) == pytest.approx(peak * 0.1)
    assert at("linear", 60) == pytest.approx(peak / 2)
    assert at("linear", total, end_lr_factor=0.1) == pytest.approx(peak * 0.1)
    assert at("rsqrt", 40) == pytest.approx(peak * np.sqrt(warmup / 40))
    assert at("constant", total) == pytest.approx(peak)
    no_warmup = optim.make_schedule(_optim_config(learning_rate=peak, schedule="rsqrt"), total)
    assert float(no_warmup(0)) == pytest.approx(peak)
    assert float(no_warmup(3)) == pytest.approx(peak / 2)


def test_weight_decay_mask_and_decoupled_decay():
    params = {"embed": {"embedding": jnp.ones((5, 4))}, "pos_embedding": jnp.ones((7, 4)),
              "dense": {"kernel": jnp.ones((4, 3)), "bias": jnp.ones(3)},
              "norm": {"scale": jnp.ones(4)}, "decay_logits": jnp.ones(2),
              "conv": {"kernel": jnp.ones((3, 4, 4))}}
    mask = optim.weight_decay_mask(params)
    assert mask == {"embed": {"embedding": False}, "pos_embedding": False,
                    "dense": {"kernel": True, "bias": False}, "norm": {"scale": False},
                    "decay_logits": False, "conv": {"kernel": True}}
    # With zero gradients, AdamW moves exactly the decayed leaves by lr * wd * p.
    tx, _ = optim.make_optimizer(_optim_config(learning_rate=0.1, schedule="constant",
                                               weight_decay=0.5), 10)
    zeros = jax.tree.map(jnp.zeros_like, params)
    updates, _ = tx.update(zeros, tx.init(params), params)
    expected = jax.tree.map(lambda p, m: -0.05 * p if m else 0 * p, params, mask)
    jax.tree.map(np.testing.assert_allclose, updates, expected)


def test_decay_lr_factor_scales_only_the_decay_parameters():
    """optim.decay_lr_factor: the leaves of optim.DECAY_PARAMS move by that factor times their
    update at the common rate; every other leaf as without it."""
    rng = np.random.default_rng()
    params = {"mixer": {"decay_log_rate": jnp.ones(6), "decay_gate": {"kernel": jnp.ones((4, 6)),
                                                                       "bias": jnp.ones(6)},
                        "rope_freq": jnp.ones(4)},
              "md_tpe": {"decay_logit": jnp.ones((2, 3))}, "dense": {"kernel": jnp.ones((4, 3))}}
    assert optim.decay_param_mask(params) == {
        "mixer": {"decay_log_rate": True, "decay_gate": {"kernel": False, "bias": False},
                  "rope_freq": True},
        "md_tpe": {"decay_logit": True}, "dense": {"kernel": False}}
    grads = jax.tree.map(lambda p: jnp.asarray(rng.standard_normal(p.shape), p.dtype), params)
    factor = rng.uniform(0.1, 0.5)
    updates = {}
    for f in (1.0, factor):
        tx, _ = optim.make_optimizer(_optim_config(learning_rate=0.01, schedule="constant",
                                                   weight_decay=0.1, decay_lr_factor=f), 10)
        updates[f], _ = tx.update(grads, tx.init(params), params)
    mask = optim.decay_param_mask(params)
    jax.tree.map(lambda a, b, m: np.testing.assert_allclose(b, a * factor if m else a,
                                                            rtol=1e-6),
                 updates[1.0], updates[factor], mask)



def test_lr_factors_scale_the_named_leaves():
    """optim.lr_factors: every leaf under a named module or parameter moves by its factor
    (the product where two names hold it) times its update at the common rate, weight decay
    included; the other leaves as without it."""
    rng = np.random.default_rng()
    params = {"block": {"query": {"kernel": jnp.ones((4, 6)), "bias": jnp.ones(6)},
                        "key": {"kernel": jnp.ones((4, 6))}, "out": {"kernel": jnp.ones((6, 4))}},
              "head": {"kernel": jnp.ones((4, 3))}}
    assert optim.param_names(params) == ["bias", "block", "head", "kernel", "key", "out",
                                         "query"]
    grads = jax.tree.map(lambda p: jnp.asarray(rng.standard_normal(p.shape), p.dtype), params)
    f_query, f_kernel = rng.uniform(0.1, 0.5, 2)
    updates = {}
    for text in ("", f" query={f_query} , kernel={f_kernel}"):
        tx, _ = optim.make_optimizer(_optim_config(learning_rate=0.01, schedule="constant",
                                                   weight_decay=0.1, lr_factors=text), 10)
        updates[text], _ = tx.update(grads, tx.init(params), params)
    factors = {"block": {"query": {"kernel": f_query * f_kernel, "bias": f_query},
                         "key": {"kernel": f_kernel}, "out": {"kernel": f_kernel}},
               "head": {"kernel": f_kernel}}
    jax.tree.map(lambda a, b, f: np.testing.assert_allclose(b, a * f, rtol=1e-6),
                 updates[""], updates[f" query={f_query} , kernel={f_kernel}"], factors)

def test_clipping_and_ema():
    tx, _ = optim.make_optimizer(_optim_config(learning_rate=1.0, schedule="constant",
                                               clip_norm=1.0, b1=0.0, b2=0.0, eps=0.0), 10)
    params = {"w": jnp.zeros((2, 2))}
    grads = {"w": jnp.full((2, 2), 10.0)}  # norm 20, clipped to 1; Adam(b=0) -> sign
    updates, _ = tx.update(grads, tx.init(params), params)
    np.testing.assert_allclose(updates["w"], -np.ones((2, 2)), rtol=1e-6)
    ema = optim.ema_update({"w": jnp.zeros(2)}, {"w": jnp.ones(2)}, 0.99, step=0)
    np.testing.assert_allclose(ema["w"], 0.9)  # warm-up: d = min(0.99, 1/10)
    ema = optim.ema_update({"w": jnp.zeros(2)}, {"w": jnp.ones(2)}, 0.99, step=10**6)
    np.testing.assert_allclose(ema["w"], 0.01, rtol=1e-5)
