r"""Evaluate a run's checkpoint on its task's splits, optionally on other data.

    python -m experiments.evaluate --workdir W [--checkpoint best|latest] [--splits val,test] \
        [--set data.seed=1 --set data.num_test=20000 ...] [--batch_size N] [--output F.md]

Reads ``W/config.json`` and the parameters of the best checkpoint (``W/best``; ``latest``: the
newest in ``W/checkpoints``), the ones the trainer evaluates (EMA parameters when the run keeps
them), and prints each split's metrics as the trainer computes them. ``--set key=value``
changes a key of the run's config before the task is built, e.g. a generated task drawn with
another seed and more examples::

    --set data.seed=1 --set data.num_train=1 --set data.num_val=1 --set data.num_test=20000

gives a test split of 20,000 examples that no run has seen (standard error of an accuracy
near 60 %: 0.35 points, against 1.1 for LRA's 2,000). Values are read as Python literals
(``1``, ``2e-3``, ``True``, ``(1, 2)``), otherwise as text; the key must exist in the run's
config. Model keys cannot be changed: the checkpoint fixes the model.
"""

import ast
import json

import jax
import ml_collections
from absl import flags, logging

from experiments.checkpointing import load_best_run
from experiments.errors import UserError, run_program
from experiments.tasks import get_task
from experiments.trainer import evaluate_split, make_eval_step

FLAGS = flags.FLAGS


def define_flags():
    """The command line's flags (defined only when run as a program: see eval_resolution)."""
    flags.DEFINE_string("workdir", None, "Workdir of a finished or running training run.")
    flags.DEFINE_enum("checkpoint", "best", ["best", "latest"], "Which checkpoint to load.")
    flags.DEFINE_list("splits", None, "Splits to evaluate; default the run's eval_splits.")
    flags.DEFINE_multi_string("set", [], "key=value: change a key of the run's config "
                              "(e.g. data.seed=1); repeat for several.")
    flags.DEFINE_integer("batch_size", None, "Evaluation batch size; default the run's.")
    flags.DEFINE_string("output", None, "Also write the table as Markdown to this file.")


def with_settings(config, settings):
    """A copy of ``config`` with each ``"key=value"`` of ``settings`` applied (module
    docstring). UserError (one line) for a malformed setting, an unknown key, a model key or
    a value of the wrong type."""
    config = ml_collections.ConfigDict(config.to_dict())
    for setting in settings:
        key, sep, text = setting.partition("=")
        if not sep or not key:
            raise UserError(f"--set {setting!r}: write key=value, e.g. --set data.seed=1")
        if key.split(".")[0] == "model":
            raise UserError(f"--set {key}: the checkpoint fixes the model; only data and "
                            "evaluation keys can change")
        *parents, leaf = key.split(".")
        node = config
        for part in parents:
            node = node.get(part)
            if not isinstance(node, ml_collections.ConfigDict):
                break
        if not isinstance(node, ml_collections.ConfigDict) or leaf not in node:
            raise UserError(f"--set {key}: the run's config has no such key")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text
        old = node[leaf]
        if isinstance(old, float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if isinstance(old, list) and isinstance(value, tuple):  # JSON's sequences are lists
            value = list(value)
        if old is not None and type(value) is not type(old):
            raise UserError(f"--set {key}={text}: the run has a {type(old).__name__} there "
                            f"({old!r}), got a {type(value).__name__}")
        node[leaf] = value
    return config


def evaluate(config, params, model_state, splits, batch_size):
    """``{split: {metric: value}}`` of ``params`` on ``splits`` of the task ``config`` builds."""
    config = ml_collections.ConfigDict(config.to_dict())
    config.eval_splits = tuple(splits)
    task = get_task(config)
    eval_step = jax.jit(make_eval_step(task))
    params, model_state = jax.device_put((params, model_state))
    return {split: evaluate_split(task, eval_step, params, split, batch_size,
                                  model_state=model_state)
            for split in splits}


def table(results, workdir, which, step, settings):
    """The Markdown table of ``results`` (``{split: {metric: value}}``)."""
    metrics = sorted({m for r in results.values() for m in r if isinstance(r[m], float)})
    changed = f"; with {', '.join(f'`{s}`' for s in settings)}" if settings else ""
    lines = [f"Checkpoint: {which} of `{workdir}` (step {step}){changed}.", "",
             "| split | " + " | ".join(metrics) + " |",
             "| --- |" + " --- |" * len(metrics)]
    for split, r in results.items():
        lines.append(f"| {split} | " + " | ".join(
            f"{100 * r[m]:.2f} %" if m == "accuracy" else f"{r[m]:.4f}" for m in metrics) + " |")
    return "\n".join(lines)


def run():
    logging.set_verbosity(logging.WARNING)
    if not FLAGS.workdir:
        raise UserError("--workdir is required: the workdir of a training run")
    config, step, params, model_state = load_best_run(
        FLAGS.workdir, None, "experiments.evaluate", model_state=True, which=FLAGS.checkpoint)
    config = with_settings(config, FLAGS.set)
    splits = FLAGS.splits or list(config.eval_splits)
    results = evaluate(config, params, model_state, splits,
                       FLAGS.batch_size or config.eval_batch_size)
    text = table(results, FLAGS.workdir, FLAGS.checkpoint, step, FLAGS.set)
    print(text)
    print(json.dumps({"step": step, **results}, default=lambda x: x.tolist()))
    if FLAGS.output:
        with open(FLAGS.output, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    run_program(define_flags, run)
