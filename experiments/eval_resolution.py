r"""Accuracy of a trained vision model at other resolutions than it was trained at (LION paper
Figure 8).

    python -m experiments.eval_resolution --workdir W --resolutions 32,48,64 \
        [--split test] [--batch_size 250] [--output table.md]

Reads ``W/config.json`` and the parameters of the best checkpoint (``W/best``), draws the
evaluation split at each resolution (Shapes draws the same scenes at any resolution, sharper),
and prints accuracy and loss per resolution. Nothing in the model changes: LION-S has no
positional embedding and its decays follow the patches, whatever their number; a ViT's learned
positions, stored for the training grid, are resized bilinearly to each new grid
(``lion_jax.models.vit``). Resolutions must be multiples of the patch size.
"""

import sys

import jax
import jax.numpy as jnp
import ml_collections
from absl import app, flags, logging

from experiments.checkpointing import load_best_run
from experiments.errors import UserError
from experiments.tasks import get_task
from experiments.trainer import _averages, make_eval_step

FLAGS = flags.FLAGS


def define_flags():
    """The command line's flags; defined only when run as a program, so that importing this
    module (tests, notebooks) does not clash with other programs' flags of the same name."""
    flags.DEFINE_string("workdir", None, "Workdir of a finished (or running) vision run.")
    flags.DEFINE_list("resolutions", None, "Image sides to evaluate at, e.g. 32,48,64.")
    flags.DEFINE_string("split", "test", "Split to evaluate.")
    flags.DEFINE_integer("batch_size", 250, "Evaluation batch size.")
    flags.DEFINE_string("output", None, "Also write the table as Markdown to this file.")


def load_run(workdir):
    """``(config, step, params)`` of ``workdir``'s config and best checkpoint."""
    return load_best_run(workdir, "vision", "eval_resolution")


def evaluate(config, params, resolution, split, batch_size):
    """``{"accuracy", "loss"}`` of ``params`` on ``split`` drawn at ``resolution``."""
    config = ml_collections.ConfigDict(config.to_dict())
    if not config.model.get("image_size"):  # learned positions keep the training grid
        config.model.image_size = config.data.resolution
    config.data.resolution = resolution
    for other in ("num_train", "num_val", "num_test"):
        if other != f"num_{split}":
            config.data[other] = 0
    config.eval_splits = (split,)
    task = get_task(config)
    eval_step = jax.jit(make_eval_step(task))
    sums = None
    for batch in task.eval_batches(split, batch_size):
        out = eval_step(params, batch)
        sums = out if sums is None else jax.tree.map(jnp.add, sums, out)
    return _averages(jax.device_get(sums))


def table(rows, workdir, step, train_resolution, split):
    """The Markdown table of ``rows`` (resolution, tokens, metrics)."""
    lines = [f"Checkpoint: best of `{workdir}` (step {step}), trained at {train_resolution} px; "
             f"split: {split}.", "", "| resolution | patches | accuracy | loss |",
             "| --- | --- | --- | --- |"]
    for resolution, patches, metrics in rows:
        mark = " (training)" if resolution == train_resolution else ""
        lines.append(f"| {resolution}{mark} | {patches} | {100 * metrics['accuracy']:.2f} | "
                     f"{metrics['loss']:.4f} |")
    return "\n".join(lines)


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # orbax logs every restore at INFO
    try:
        if not FLAGS.workdir or not FLAGS.resolutions:
            raise UserError("give --workdir and --resolutions (e.g. --resolutions 32,48,64)")
        try:
            resolutions = [int(r) for r in FLAGS.resolutions]
        except ValueError:
            raise UserError(f"--resolutions must be integers; got {FLAGS.resolutions}") from None
        config, step, params = load_run(FLAGS.workdir)
        patch = config.model.patch_size
        bad = [r for r in resolutions if r % patch or r < patch]
        if bad:
            raise UserError(f"resolutions {bad} are not multiples of the patch size {patch}")
        rows = []
        for resolution in resolutions:
            metrics = evaluate(config, params, resolution, FLAGS.split, FLAGS.batch_size)
            rows.append((resolution, (resolution // patch) ** 2, metrics))
            print(f"{resolution} px: accuracy {metrics['accuracy']:.4f}, loss "
                  f"{metrics['loss']:.4f}", flush=True)
        text = table(rows, FLAGS.workdir, step, config.data.resolution, FLAGS.split)
        print("\n" + text)
        if FLAGS.output:
            with open(FLAGS.output, "w") as f:
                f.write(text + "\n")
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    define_flags()
    app.run(main)
