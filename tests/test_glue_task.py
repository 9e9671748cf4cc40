"""The GLUE fine-tuning task (experiments/tasks/glue.py) and configs/glue/glue.py: a tiny MLM
run, then fine-tuning from it on stand-in SST-2 and STS-B files."""

import json
import os
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest

from configs.glue import glue as glue_config
from configs.mlm import c4
from experiments import glue_metrics
from experiments.checkpointing import load_best_run
from experiments.tasks import get_task
from experiments.trainer import evaluate_split, make_eval_step, train_and_evaluate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POS = ["the results were good and clear", "a great and useful method", "good work overall",
       "the model is clear and great"]
NEG = ["the results were bad and poor", "a poor and useless method", "bad work overall",
       "the model is poor and bad"]


def write_stand_ins(root, seed=0):
    """SST-2 and STS-B folders in GLUE's layout (header row, tab-separated)."""
    rng = np.random.default_rng(seed)
    for split, n in (("train", 96), ("dev", 24)):
        os.makedirs(os.path.join(root, "SST-2"), exist_ok=True)
        rows = []
        for _ in range(n):
            label = int(rng.integers(2))
            rows.append(f"{rng.choice(POS if label else NEG)}\t{label}")
        with open(os.path.join(root, "SST-2", f"{split}.tsv"), "w") as f:
            f.write("sentence\tlabel\n" + "".join(r + "\n" for r in rows))
        os.makedirs(os.path.join(root, "STS-B"), exist_ok=True)
        rows = []
        for _ in range(n):
            a = rng.choice(POS + NEG)
            same = rng.random() < 0.5
            b = a if same else rng.choice(POS + NEG)
            score = 5.0 if same else round(float(rng.uniform(0, 2)), 1)
            rows.append(f"{a}\t{b}\t{score}")
        with open(os.path.join(root, "STS-B", f"{split}.tsv"), "w") as f:
            f.write("sentence1\tsentence2\tscore\n" + "".join(r + "\n" for r in rows))


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    base = tmp_path_factory.mktemp("glue_task")
    cache = str(base / "cache")
    mlm = c4.get_config("tiny")
    mlm.data.cache_dir = cache
    mlm_dir = str(base / "mlm")
    train_and_evaluate(mlm, mlm_dir)
    data_dir = str(base / "glue_data")
    write_stand_ins(data_dir)
    return dict(base=base, cache=cache, mlm=mlm_dir, data=data_dir)


def glue_tiny(dirs, variant="tiny", init_from=None):
    c = glue_config.get_config(variant)
    c.init_from = dirs["mlm"] if init_from is None else init_from
    c.data.source, c.data.data_dir = "files", dirs["data"]
    c.data.cache_dir = dirs["cache"]
    return c


def records(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.mark.parametrize("variant,keys", [
    ("tiny", ("accuracy", "loss")),
    ("tiny_stsb", ("mse", "neg_mse", "pearson", "spearman"))])
def test_fine_tuning_from_the_mlm_run(dirs, variant, keys):
    workdir = str(dirs["base"] / variant)
    config = glue_tiny(dirs, variant)
    train_and_evaluate(config, workdir)
    recs = records(workdir)
    train = [r["metrics"]["loss"] for r in recs if r["split"] == "train"]
    assert len(train) == 2 and train[-1] < train[0]
    val = {r["step"]: r["metrics"] for r in recs if r["split"] == "val"}
    assert sorted(val) == [8, 16]
    for metrics in val.values():
        assert set(keys) <= set(metrics)
    with open(os.path.join(workdir, "config.json")) as f:
        saved = json.load(f)
    assert saved["data"]["name"] == "glue" and saved["data"]["vocab_file"]
    assert saved["model"]["d_model"] == 16
    out = subprocess.run([sys.executable, "-m", "experiments.glue_table", workdir],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if "ours: LION-S tiny" in line)
    key = "spearman" if variant == "tiny_stsb" else "accuracy"  # the task's Table 3 number
    assert all(-1 <= m[key] <= 1 for m in val.values())
    assert f"{100 * max(m[key] for m in val.values()):.2f}" in row


def test_encoder_weights_come_from_the_mlm_run(dirs, tmp_path):
    _, _, mlm_params = load_best_run(dirs["mlm"], "mlm", "test")
    saved = jax.tree.leaves(mlm_params["encoder"])
    config = glue_tiny(dirs)
    task = get_task(config)
    fresh = nn.meta.unbox(task.init(jax.random.PRNGKey(7)))["params"]
    assert not all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(fresh["encoder"]), saved))
    params, _ = task.warm_start(jax.device_get(fresh), None)
    loaded = jax.tree.leaves(params["encoder"])
    assert len(saved) == len(loaded)
    for a, b in zip(saved, loaded):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert "pooler" in params and "classifier" in params

    # the trainer starts from them: one step at learning rate 0 keeps the encoder as loaded
    config.num_train_steps, config.optim.learning_rate, config.optim.warmup_steps = 1, 0.0, 0
    train_and_evaluate(config, str(tmp_path / "w"))
    _, _, trained = load_best_run(str(tmp_path / "w"), "glue", "test")
    for a, b in zip(saved, jax.tree.leaves(trained["encoder"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_mismatched_encoder_is_one_error(dirs):
    from experiments.errors import UserError

    config = glue_tiny(dirs)
    config.model.mlp_dim = 24  # the MLM run's is 32
    task = get_task(config)
    fresh = nn.meta.unbox(task.init(jax.random.PRNGKey(0)))["params"]
    with pytest.raises(UserError, match="does not fit this model"):
        task.warm_start(jax.device_get(fresh), None)


def _random_config(dirs, task):
    c = glue_tiny(dirs, init_from="none")
    c.data.vocab_file = task.tokenizer.vocab_file
    return c


@pytest.mark.parametrize("variant", ["tiny", "tiny_stsb"])
def test_split_metrics_use_every_prediction(dirs, variant):
    """The trainer's evaluation (padded batches, per-example values gathered) gives GLUE's
    metrics of the whole split, as glue_metrics computes them from the predictions."""
    task = get_task(glue_tiny(dirs, variant))
    params = nn.meta.unbox(task.init(jax.random.PRNGKey(1))["params"])
    results = evaluate_split(task, jax.jit(make_eval_step(task)), params, "val", 5)
    preds, labels = [], []
    for batch in task.eval_batches("val", 5):  # 24 rows: the last batch padded
        real = batch["mask"] > 0
        out = np.asarray(task.outputs(params, batch))
        preds.append((out if out.ndim == 1 else out.argmax(-1))[real])
        labels.append(batch["labels"][real])
    preds, labels = np.concatenate(preds), np.concatenate(labels)
    expected = glue_metrics.task_metrics(task.name, preds, labels)
    assert set(expected) <= set(results) and len(preds) == 24
    for key, value in expected.items():
        assert results[key] == pytest.approx(value, abs=1e-5), key


def test_missing_init_from_is_one_error_line():
    out = subprocess.run([sys.executable, "-m", "experiments.train", "--config",
                          "configs/glue/glue.py:tiny", "--workdir", "/tmp/unused_glue"],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode != 0
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: config.init_from is empty")
    assert "configs/mlm/c4.py" in lines[0]


def test_recipes_follow_table_8():
    mnli = glue_config.get_config(None)
    assert (mnli.data.task, mnli.optim.learning_rate, mnli.num_epochs, mnli.data.max_len) == (
        "mnli", 5e-5, 3, 128)
    assert mnli.optim.weight_decay * mnli.optim.learning_rate == pytest.approx(5e-6)
    stsb = glue_config.get_config("stsb")  # M2-BASE STS-B: plain AdamW
    assert stsb.optim.weight_decay == 3e-6 and stsb.from_mnli
    assert glue_config.get_config("rte_bert24").data.max_len == 256
    modified = glue_config.get_config("cola_modified")
    assert modified.optim.learning_rate == 1e-5 and modified.num_epochs == 10
    assert modified.optim.weight_decay * 1e-5 == pytest.approx(1e-6)
    assert glue_config.get_config("qqp").eval_splits == ("val",)
    assert glue_config.get_config("mnli").eval_splits == ("val", "val_mismatched")


def test_epochs_set_the_steps_and_mnli_start_is_checked(dirs):
    from experiments.errors import UserError

    c = glue_tiny(dirs)
    c.num_epochs, c.batch_size = 2, 8
    get_task(c)
    assert (c.num_train_steps, c.optim.warmup_steps, c.eval_every) == (24, 1, 12)
    c = glue_tiny(dirs, "tiny_stsb")
    c.from_mnli = True
    with pytest.raises(UserError, match="MNLI-fine-tuned weights"):
        get_task(c)


def test_glue_table_scores_the_records_metrics(rng):
    """glue_table scores a record by the paper's metric of the task (CoLA: Matthews, MRPC: F1,
    STS-B: Spearman) as the run wrote it."""
    from experiments.glue_table import scored_evals
    preds, labels = rng.integers(0, 2, 200), rng.integers(0, 2, 200)
    for task_name in ("cola", "mrpc"):
        metrics = glue_metrics.task_metrics(task_name, preds, labels)
        (step, score, _), = scored_evals(task_name, [{"step": 10, "split": "val",
                                                      "metrics": metrics}])
        ref = glue_metrics.matthews if task_name == "cola" else glue_metrics.f1
        assert step == 10 and score == pytest.approx(ref(preds, labels))
    x, y = rng.normal(size=50), rng.normal(size=50)
    (_, score, _), = scored_evals("stsb", [{"step": 3, "split": "val", "metrics":
                                            glue_metrics.task_metrics("stsb", x, y)}])
    assert score == pytest.approx(glue_metrics.spearman(x, y))
