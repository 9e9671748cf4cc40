r"""A convolutional baseline on Pathfinder: does a plain ResNet learn this data set?

    python -m experiments.pathfinder_cnn --out DIR [--difficulty curv_contour_length_14]
        [--resolution 32] [--num_examples 200000] [--epochs 14] [--batch_size 256]
        [--learning_rate 1e-3] [--width 64] [--seed 0] [--cache_dir DIR] [--data_dir DIR]

A check of the data, independent of the sequence models: the generated Pathfinder
(``experiments/data/pathfinder.py``; LRA's released images with ``--data_dir``) is split as the
LRA configs split it, and a ResNet-18-style network learns it as a 2-D image: a 3x3 stem, four
stages of two residual blocks (widths 1, 2, 4, 8 x ``--width``; stride 2 entering stages 2-4),
BatchNorm, global mean pool, a linear head; AdamW (weight decay 0.05), cosine schedule with
warmup, batch ``--batch_size``, pixels scaled to [-1, 1]. After every epoch it prints and
records the train loss and accuracy and the val accuracy (BatchNorm's running statistics).

Writes ``DIR/pathfinder_cnn.json`` (settings and per-epoch numbers) and
``DIR/pathfinder_cnn.md`` (the table). Runs on any backend; a GPU takes seconds per epoch.
"""

import json
import os
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags

from experiments.data import pathfinder

FLAGS = flags.FLAGS


class ResNet(nn.Module):
    """ResNet-18-style classifier of images ``[B, H, W, 1]`` -> logits ``[B, classes]``."""

    width: int = 64
    classes: int = pathfinder.NUM_CLASSES

    @nn.compact
    def __call__(self, x, train):
        def norm():
            return nn.BatchNorm(use_running_average=not train, momentum=0.9)

        x = nn.relu(norm()(nn.Conv(self.width, (3, 3))(x)))
        for stage in range(4):
            width = self.width * 2 ** stage
            for block in range(2):
                stride = 2 if stage > 0 and block == 0 else 1
                y = nn.relu(norm()(nn.Conv(width, (3, 3), strides=stride)(x)))
                y = norm()(nn.Conv(width, (3, 3))(y))
                if stride > 1 or x.shape[-1] != width:
                    x = norm()(nn.Conv(width, (1, 1), strides=stride)(x))
                x = nn.relu(x + y)
        return nn.Dense(self.classes)(x.mean((1, 2)))


def define_flags():
    flags.DEFINE_string("out", None, "Output directory.")
    flags.DEFINE_enum("difficulty", pathfinder.DEFAULT_DIFFICULTY, list(pathfinder.DIFFICULTIES),
                      "Pathfinder difficulty (LRA's is the default).")
    flags.DEFINE_enum("resolution", "32", [str(r) for r in pathfinder.RESOLUTIONS],
                      "Image side: 32 (Pathfinder) or 128 (Path-X).")
    flags.DEFINE_integer("num_examples", 200_000, "Generated images (80% train, 10% val).")
    flags.DEFINE_integer("epochs", 14, "Epochs over the train split.")
    flags.DEFINE_integer("batch_size", 256, "Batch size.")
    flags.DEFINE_float("learning_rate", 1e-3, "Peak learning rate.")
    flags.DEFINE_integer("width", 64, "Channels of the first stage.")
    flags.DEFINE_integer("seed", 0, "Data (generation) and initialisation seed.")
    flags.DEFINE_string("cache_dir", "~/.cache/lion_jax/pathfinder", "Generated data cache.")
    flags.DEFINE_string("data_dir", "", "LRA's released pathfinder<resolution> folder instead "
                        "of generated data.")


def load(split):
    resolution = int(FLAGS.resolution)
    if FLAGS.data_dir:
        return pathfinder.load_pathfinder_images(
            split, data_dir=FLAGS.data_dir, resolution=resolution, difficulty=FLAGS.difficulty,
            seed=FLAGS.seed, cache_dir=FLAGS.cache_dir)
    return pathfinder.load_pathfinder(
        split, resolution=resolution, num_examples=FLAGS.num_examples, seed=FLAGS.seed,
        cache_dir=FLAGS.cache_dir, difficulty=FLAGS.difficulty)


def images(tokens):
    """uint8 [n, side^2] -> float32 [n, side, side, 1] in [-1, 1]."""
    side = int(FLAGS.resolution)
    return tokens.reshape(-1, side, side, 1).astype(np.float32) / 127.5 - 1.0


def train(train_split, val_split):
    """Trains the ResNet; returns the per-epoch records."""
    n = train_split["labels"].size
    steps_per_epoch = n // FLAGS.batch_size
    if steps_per_epoch == 0:
        raise ValueError(f"--batch_size {FLAGS.batch_size} exceeds the {n} training images")
    total = FLAGS.epochs * steps_per_epoch
    model = ResNet(FLAGS.width)
    side = int(FLAGS.resolution)
    variables = model.init(jax.random.PRNGKey(FLAGS.seed), jnp.zeros((2, side, side, 1)), True)
    params, stats = variables["params"], variables["batch_stats"]
    tx = optax.adamw(optax.warmup_cosine_decay_schedule(
        0.0, FLAGS.learning_rate, max(1, min(1000, total // 4)), total), weight_decay=0.05)
    opt_state = tx.init(params)

    @jax.jit
    def step(params, stats, opt_state, x, y):
        def loss_fn(p):
            logits, new = model.apply({"params": p, "batch_stats": stats}, x, True,
                                      mutable=["batch_stats"])
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
            return loss, (logits, new["batch_stats"])

        (loss, (logits, stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), stats, opt_state, loss,
                jnp.mean(logits.argmax(-1) == y))

    @jax.jit
    def correct(params, stats, x, y):
        logits = model.apply({"params": params, "batch_stats": stats}, x, False)
        return jnp.sum(logits.argmax(-1) == y)

    val_x, val_y = images(val_split["tokens"]), val_split["labels"]
    rng, records, start = np.random.default_rng(FLAGS.seed), [], time.time()
    for epoch in range(1, FLAGS.epochs + 1):
        order = rng.permutation(n)
        losses, accuracies = [], []
        for i in range(steps_per_epoch):
            pick = order[i * FLAGS.batch_size:(i + 1) * FLAGS.batch_size]
            params, stats, opt_state, loss, accuracy = step(
                params, stats, opt_state, images(train_split["tokens"][pick]),
                train_split["labels"][pick])
            losses.append(loss)
            accuracies.append(accuracy)
        hits = sum(int(correct(params, stats, val_x[i:i + 1000], val_y[i:i + 1000]))
                   for i in range(0, val_y.size, 1000))
        record = dict(epoch=epoch, train_loss=float(np.mean(jax.device_get(losses))),
                      train_accuracy=float(np.mean(jax.device_get(accuracies))),
                      val_accuracy=hits / val_y.size, seconds=time.time() - start)
        records.append(record)
        print(f"epoch {epoch}: train loss {record['train_loss']:.4f}, train accuracy "
              f"{record['train_accuracy']:.4f}, val accuracy {record['val_accuracy']:.4f} "
              f"({record['seconds']:.0f} s)", flush=True)
    return records


def table(records):
    best = max(records, key=lambda r: r["val_accuracy"])
    data = (f"LRA's released images in {FLAGS.data_dir}" if FLAGS.data_dir else
            f"{FLAGS.num_examples:,} generated images (seed {FLAGS.seed})")
    lines = [f"ResNet-18-style baseline (width {FLAGS.width}) on Pathfinder-{FLAGS.resolution}, "
             f"{FLAGS.difficulty}, {data}; `python -m experiments.pathfinder_cnn "
             f"{' '.join(sys.argv[1:])}`; {jax.devices()[0].device_kind}, jax {jax.__version__}."
             f" Best val accuracy {100 * best['val_accuracy']:.2f} % (epoch {best['epoch']}).",
             "", "| epoch | train loss | train accuracy | val accuracy |",
             "| --- | --- | --- | --- |"]
    lines += [f"| {r['epoch']} | {r['train_loss']:.4f} | {100 * r['train_accuracy']:.2f} % | "
              f"{100 * r['val_accuracy']:.2f} % |" for r in records]
    return "\n".join(lines) + "\n"


def main(argv):
    del argv
    if not FLAGS.out:
        sys.exit("error: --out DIR is required")
    for name in ("num_examples", "epochs", "batch_size", "width"):
        if getattr(FLAGS, name) < 1:
            sys.exit(f"error: --{name} must be >= 1, got {getattr(FLAGS, name)}")
    try:
        train_split, val_split = load("train"), load("val")
        records = train(train_split, val_split)
    except (ValueError, FileNotFoundError) as e:
        sys.exit(f"error: {e}")
    os.makedirs(FLAGS.out, exist_ok=True)
    text = table(records)
    with open(os.path.join(FLAGS.out, "pathfinder_cnn.md"), "w") as f:
        f.write(text)
    settings = {k: getattr(FLAGS, k) for k in ("difficulty", "resolution", "num_examples",
                                               "epochs", "batch_size", "learning_rate", "width",
                                               "seed", "data_dir")}
    with open(os.path.join(FLAGS.out, "pathfinder_cnn.json"), "w") as f:
        json.dump(dict(settings=settings, epochs=records), f, indent=1)
    print(text)


if __name__ == "__main__":
    define_flags()
    app.run(main)
