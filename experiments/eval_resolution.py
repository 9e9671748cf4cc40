r"""Accuracy of a trained vision model at other resolutions than it was trained at (LION paper
Figure 8).

    python -m experiments.eval_resolution --workdir W --resolutions 32,48,64 \
        [--split test] [--batch_size 250] [--output table.md]

Reads ``W/config.json`` and the parameters of the best checkpoint (``W/best``), draws the
evaluation split at each resolution (Shapes draws the same scenes at any resolution, sharper;
CIFAR and ImageNet runs, with DeiT's pipeline, take its evaluation transform at that size:
shorter side resized to ``resolution / eval_crop_ratio``, centre crop), and prints accuracy and
loss per resolution. Nothing in the model changes: LION-S has no
positional embedding and its decays follow the patches, whatever their number; a ViT's learned
positions, stored for the training grid, are resized bilinearly to each new grid
(``lion_jax.models.vit``). Resolutions must be multiples of the patch size.
"""

import jax
import ml_collections
from absl import flags, logging

from experiments.checkpointing import load_best_run
from experiments.errors import UserError, run_program
from experiments.tasks import get_task
from experiments.trainer import evaluate_split, make_eval_step

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


def uses_deit(config):
    return config.get("augment", {}).get("pipeline", "device") == "deit"


def training_resolution(config):
    """The image side a run trained at: ``augment.image_size`` with DeiT's pipeline (CIFAR,
    ImageNet), else the dataset's ``data.resolution`` (Shapes)."""
    return int(config.augment.image_size if uses_deit(config) else config.data.resolution)


def evaluate(config, params, resolution, split, batch_size):
    """``{"accuracy", "loss"}`` of ``params`` on ``split`` at ``resolution``: Shapes drawn at
    that size; with DeiT's pipeline the evaluation transform (shorter side resized to
    ``resolution / eval_crop_ratio``, centre crop) at that size."""
    config = ml_collections.ConfigDict(config.to_dict())
    if not config.model.get("image_size"):  # learned positions keep the training grid
        config.model.image_size = training_resolution(config)
    if uses_deit(config):
        config.augment.image_size = resolution
    else:
        config.data.resolution = resolution
    for other in ("num_train", "num_val", "num_test"):  # Shapes: draw only the split
        if other in config.data and other != f"num_{split}":
            config.data[other] = 0
    config.eval_splits = (split,)
    task = get_task(config)
    return evaluate_split(task, jax.jit(make_eval_step(task)), params, split, batch_size)


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


def run():
    """Parses the flags, evaluates, prints (module docstring)."""
    logging.set_verbosity(logging.WARNING)  # orbax logs every restore at INFO
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
    text = table(rows, FLAGS.workdir, step, training_resolution(config), FLAGS.split)
    print("\n" + text)
    if FLAGS.output:
        with open(FLAGS.output, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    run_program(define_flags, run)
