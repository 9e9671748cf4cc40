"""The MLM task (experiments/tasks/mlm.py), its configs and experiments.eval_length."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs.mlm import c4
from experiments import eval_length
from experiments.errors import UserError
from experiments.tasks import get_task
from experiments.trainer import train_and_evaluate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny_config(cache_dir, variant=None):
    config = c4.tiny(c4.get_config(variant)) if variant else c4.get_config("tiny")
    config.data.cache_dir = str(cache_dir)
    return config


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("mlm_cache")


@pytest.fixture(scope="module")
def run(tmp_path_factory, cache_dir):
    """The tiny LION-S run (4 steps, evaluations at steps 2 and 4)."""
    workdir = str(tmp_path_factory.mktemp("mlm_run") / "w")
    summary = train_and_evaluate(tiny_config(cache_dir), workdir)
    return workdir, summary


@pytest.fixture(scope="module")
def task(cache_dir):
    return get_task(tiny_config(cache_dir))


def test_tiny_run_trains_and_evaluates(run):
    workdir, summary = run
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    val = {r["step"]: r["metrics"] for r in records if r["split"] == "val"}
    assert sorted(val) == [2, 4]
    assert val[4]["loss"] < val[2]["loss"]
    assert all(np.isfinite(m["loss"]) and 0 <= m["accuracy"] <= 1 for m in val.values())
    assert val[4]["masked"] > 0
    assert 0 < summary["val unigram masked accuracy"] < 1


def test_variants_make_the_papers_models(cache_dir):
    default, bert, lit, large = (c4.get_config(v) for v in (None, "bert", "lit", "large"))
    assert (default.model.mixer.variant, default.model.pos_emb) == ("s", "none")
    assert (bert.model.mixer_kind, bert.model.pos_emb) == ("softmax", "learned")
    assert lit.model.mixer.variant == "lit" and c4.get_config("retnet").model.mixer.variant == \
        "retnet"
    assert (default.model.size, large.model.size) == ("base", "large")
    assert (default.optim.learning_rate, large.optim.learning_rate) == (8e-4, 2e-4)
    o = default.optim
    assert (o.schedule, o.warmup_steps, o.end_lr_factor, o.b2, o.eps) == (
        "linear", 4200, 0.2, 0.98, 1e-6)
    assert o.weight_decay * o.learning_rate == pytest.approx(1e-5)
    assert (default.mask_prob, default.eval_mask_prob, default.data.max_len) == (0.3, 0.15, 128)
    assert default.model.mixer.impl == "auto"


def _batch(task, rows=8):
    ids = task.splits["val"]["ids"][:rows]
    return {"ids": jnp.asarray(ids), "index": jnp.arange(rows, dtype=jnp.int32),
            "mask": jnp.ones(rows)}


def test_eval_masks_depend_only_on_the_row(task):
    batch = _batch(task)
    a = task.mask(batch["ids"], jax.random.PRNGKey(1), train=False, index=batch["index"])
    b = task.mask(batch["ids"], jax.random.PRNGKey(2), train=False, index=batch["index"])
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    # The same row alone (another batch, another position in it) gets the same mask.
    c = task.mask(batch["ids"][5:7], None, train=False, index=batch["index"][5:7])
    for x, y in zip(a, c):
        np.testing.assert_array_equal(x[5:7], y)
    assert float(a[2].sum()) > 0
    # Training masks follow the key.
    t1 = task.mask(batch["ids"], jax.random.PRNGKey(1), train=True)
    t2 = task.mask(batch["ids"], jax.random.PRNGKey(2), train=True)
    assert not np.array_equal(t1[2], t2[2])


class _FixedLogits:
    """A stand-in model whose logits are given."""

    def __init__(self, logits):
        self.logits = logits

    def apply(self, variables, tokens, *, train, positions=None, rngs=None):
        if positions is None:
            return self.logits
        return jnp.take_along_axis(self.logits, positions[..., None], axis=1)


def test_loss_counts_selected_positions_only(task, rng):
    batch = _batch(task)
    B, L = batch["ids"].shape
    V = task.info["vocab_size"]
    inputs, targets, weights = task.mask(batch["ids"], None, train=False, index=batch["index"])
    assert float(weights.sum()) > 0
    logits = jnp.asarray(rng.normal(size=(B, L, V)), jnp.float32)
    model, original = _FixedLogits(logits), task.model
    task.model = model
    try:
        loss, metrics = task.loss(None, batch, jax.random.PRNGKey(0), train=False)
        unselected = (weights == 0)[..., None]
        model.logits = jnp.where(unselected, jnp.asarray(rng.normal(size=(B, L, V)) * 5,
                                                         jnp.float32), logits)
        loss2, metrics2 = task.loss(None, batch, jax.random.PRNGKey(0), train=False)
        np.testing.assert_allclose(loss2, loss, rtol=1e-6)
        np.testing.assert_allclose(metrics2["accuracy"], metrics["accuracy"])
        # Changing the labels of unselected tokens (the ids there) changes nothing either:
        # the loss reads targets at selected positions only.
        xent, correct, w = task.token_losses(None, inputs, targets, weights, None, train=False)
        other = jnp.where(weights == 0, (targets + 7) % V, targets)
        xent2, correct2, w2 = task.token_losses(None, inputs, other, weights, None, train=False)
        np.testing.assert_allclose(jnp.sum(xent * w, -1), jnp.sum(xent2 * w2, -1), rtol=1e-6)
        # The loss is the mean cross-entropy over each row's selected tokens.
        logp = jax.nn.log_softmax(logits)
        nll = -jnp.take_along_axis(logp, targets[..., None], -1)[..., 0]
        expected = jnp.sum(nll * weights, -1) / jnp.maximum(weights.sum(-1), 1)
        np.testing.assert_allclose(loss, expected, rtol=1e-5)
        # max_predictions >= the selected count gives the same loss from gathered positions.
        task.max_predictions = L
        loss3, _ = task.loss(None, batch, jax.random.PRNGKey(0), train=False)
        np.testing.assert_allclose(loss3, loss, rtol=1e-6)
    finally:
        task.model, task.max_predictions = original, 0


def test_bad_model_key_is_one_line(cache_dir):
    config = tiny_config(cache_dir)
    with config.model.unlocked():
        config.model.bogus = 1
    with pytest.raises(UserError, match="bad config.model: .*bogus"):
        get_task(config)


def test_eval_length_lion_s(run):
    workdir, summary = run
    rows, meta = eval_length.evaluate_lengths(workdir, [32, 64], batch_size=8, log=None)
    assert meta["train_length"] == 32 and meta["step"] == summary["best"]["step"]
    assert [r["length"] for r in rows] == [32, 64]
    for row in rows:
        assert "na" not in row and np.isfinite(row["loss"]) and 0 <= row["accuracy"] <= 1
        assert row["masked"] > 0


def test_eval_length_learned_positions_stop(cache_dir, tmp_path):
    config = tiny_config(cache_dir, "bert")
    assert config.model.max_len == 32
    params = get_task(config).init(jax.random.PRNGKey(0))["params"]
    rows, _ = eval_length.evaluate_lengths(str(tmp_path), [32, 64], batch_size=8,
                                           params=params, config=config, log=None)
    assert np.isfinite(rows[0]["accuracy"])
    assert rows[1] == {"length": 64, "na": "learned positions stop at 32"}
    assert "n/a (learned positions stop at 32)" in eval_length.table(
        rows, dict(workdir="w", step=0, train_length=32, split="val"))


def test_eval_length_cli(run, tmp_path):
    workdir, _ = run
    out = tmp_path / "lengths.json"
    result = subprocess.run(
        [sys.executable, "-m", "experiments.eval_length", "--workdir", workdir,
         "--lengths", "32,48", "--batch_size", "8", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "| 32 (training) |" in result.stdout and "| 48 |" in result.stdout
    results = json.loads(out.read_text())["results"]
    assert [r["length"] for r in results] == [32, 48]


def test_missing_corpus_is_one_error_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "experiments.train", "--config", "configs/mlm/c4.py:tiny",
         "--workdir", str(tmp_path / "w"), "--config.data.source=files",
         f"--config.data.data_dir={tmp_path / 'nope'}",
         f"--config.data.cache_dir={tmp_path / 'cache'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "nope" in lines[0]
