r"""Masked-token accuracy of a trained MLM model at other row lengths than it was trained at
(LION paper Figure 3 left: LION-S keeps its accuracy up to 3.5x the training length).

    python -m experiments.eval_length --workdir W --lengths 128,256,512 \
        [--split val] [--batch_size 64] [--out lengths.json]

Reads ``W/config.json`` and the parameters of the best checkpoint (``W/best``), re-packs the
evaluation split into rows of each length with the run's own tokenizer (the vocabulary file
the run used; the token cache is shared, so only the packing is redone), masks 15% of the
tokens (``config.eval_mask_prob``, each row's mask fixed by its index as in training-time
evaluation) and prints a table of masked-token accuracy and loss per length. Accuracy and loss
here are token-level (totals over all masked tokens of the split divided by their number);
the trainer's ``val/accuracy`` averages rows instead (nearly equal on packed rows).

A model with learned positions cannot run past its ``max_len``: such lengths are reported as
``n/a (learned positions stop at N)``. LION-S (``pos_emb="none"``) runs at any length; its
mixer's ``impl="auto"`` picks the chunked or kernel form, so memory grows linearly.

The training set is not re-packed: the loader is called with one training document only (for
the embedded and tfds sources, where that does not move the evaluation split's documents).
"""

import json

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import flags, logging

from experiments.checkpointing import load_best_run
from experiments.errors import UserError, run_program
from experiments.tasks import get_task

FLAGS = flags.FLAGS


def define_flags():
    """The command line's flags; defined only when run as a program, so that importing this
    module (tests, notebooks) does not clash with other programs' flags of the same name."""
    flags.DEFINE_string("workdir", None, "Workdir of a finished (or running) MLM run.")
    flags.DEFINE_list("lengths", None, "Row lengths to evaluate at, e.g. 128,256,512.")
    flags.DEFINE_string("split", "val", "Split to evaluate.")
    flags.DEFINE_integer("batch_size", 64, "Evaluation batch size (rows).")
    flags.DEFINE_string("out", None, "Also write the results as JSON to this file.")


def load_run(workdir):
    """``(config, step, params)`` of ``workdir``'s config and best checkpoint."""
    return load_best_run(workdir, "mlm", "eval_length")


def _length_config(config, length, split, vocab_file, lowercase):
    config = ml_collections.ConfigDict(config.to_dict())
    data = config.data
    data.max_len = int(length)
    data.vocab_file, data.lowercase = vocab_file, lowercase
    if data.source in ("embedded", "tfds"):
        data.num_train = 1  # the evaluation splits' documents do not depend on it
    if split != "test" and data.source != "files":
        data.num_test = 0
    config.eval_splits = (split,)
    return config


def position_limit(config, train_len):
    """The longest row the model takes: ``max_len`` of learned positions, else None."""
    if config.model.get("pos_emb", "learned") != "learned":
        return None
    return int(config.model.get("max_len") or train_len)


def evaluate(task, params, split, batch_size):
    """Token-level ``{"accuracy", "loss", "masked", "rows"}`` of ``params`` on ``split``."""

    @jax.jit
    def step(params, batch):
        xent, correct, count = task.masked_stats(params, batch)
        mask = batch["mask"]
        return jnp.stack([jnp.sum(xent * mask), jnp.sum(correct * mask), jnp.sum(count * mask),
                          jnp.sum(mask)])

    totals = np.zeros(4)
    for batch in task.eval_batches(split, batch_size):
        totals += np.asarray(jax.device_get(step(params, batch)), np.float64)
    xent, correct, count, rows = totals
    count_ = max(count, 1.0)
    return {"accuracy": correct / count_, "loss": xent / count_, "masked": int(count),
            "rows": int(rows)}


def evaluate_lengths(workdir, lengths, split="val", batch_size=64, *, params=None, config=None,
                     log=print):
    """``(rows, meta)``: one dict per length (``length``, ``accuracy``, ``loss``, ``masked``,
    ``rows``; or ``na``, the reason it cannot run) and the run's facts (``step``,
    ``train_length``, ``split``)."""
    step = None
    if params is None or config is None:
        config, step, params = load_run(workdir)
    train_len = int(config.data.max_len)
    if config.model.pos_emb == "learned" and not config.model.get("max_len"):
        config = ml_collections.ConfigDict(config.to_dict())
        config.model.max_len = train_len  # what the task filled in at training time
    # The run's tokenizer (a trained vocabulary is cached under its settings' hash).
    base = ml_collections.ConfigDict(config.to_dict())
    base.eval_splits = (split,)
    info = get_task(base).info
    limit = position_limit(config, train_len)
    results = []
    for length in lengths:
        row = {"length": int(length)}
        if limit is not None and length > limit:
            row["na"] = f"learned positions stop at {limit}"
        else:
            task = get_task(_length_config(config, length, split, info["vocab_file"],
                                           info["lowercase"]))
            row.update(evaluate(task, params, split, batch_size))
        results.append(row)
        if log:
            log(_line(row, train_len))
    return results, {"workdir": workdir, "step": step, "train_length": train_len,
                     "split": split, "label": config.get("label", "")}


def _line(row, train_len):
    mark = " (training)" if row["length"] == train_len else ""
    if "na" in row:
        return f"| {row['length']}{mark} | n/a ({row['na']}) | | | |"
    return (f"| {row['length']}{mark} | {100 * row['accuracy']:.2f} | {row['loss']:.4f} | "
            f"{row['masked']} | {row['rows']} |")


def table(rows, meta):
    """The Markdown table of ``rows`` (see :func:`evaluate_lengths`)."""
    lines = [f"Checkpoint: best of `{meta['workdir']}` (step {meta['step']}), trained on rows "
             f"of {meta['train_length']}; split: {meta['split']}; masked-token accuracy at "
             "15% masking.", "", "| length | accuracy (%) | loss | masked tokens | rows |",
             "| --- | --- | --- | --- | --- |"]
    lines += [_line(row, meta["train_length"]) for row in rows]
    return "\n".join(lines)


def run():
    """Parses the flags, evaluates, prints (module docstring)."""
    logging.set_verbosity(logging.WARNING)  # orbax logs every restore at INFO
    if not FLAGS.workdir or not FLAGS.lengths:
        raise UserError("give --workdir and --lengths (e.g. --lengths 128,256,512)")
    try:
        lengths = [int(n) for n in FLAGS.lengths]
    except ValueError:
        raise UserError(f"--lengths must be integers; got {FLAGS.lengths}") from None
    if any(n < 3 for n in lengths):
        raise UserError(f"--lengths must be >= 3 ([CLS] and [SEP] included); got {lengths}")
    rows, meta = evaluate_lengths(FLAGS.workdir, lengths, FLAGS.split, FLAGS.batch_size,
                                  log=lambda line: print(line, flush=True))
    print("\n" + table(rows, meta))
    if FLAGS.out:
        with open(FLAGS.out, "w") as f:
            json.dump({**meta, "results": rows}, f, indent=1)


if __name__ == "__main__":
    run_program(define_flags, run)
