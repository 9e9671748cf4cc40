"""Sequence classification (the Long Range Arena): token ids -> one of ``num_classes`` labels.

Data: ``config.data.name`` picks a dataset of :data:`DATASETS` (the six LRA tasks); the other
keys of ``config.data`` are its loader's arguments (``~`` expanded in directories). Every
dataset gives ``{split: arrays}`` with ``labels [N]`` and either ``tokens [N, L]`` or, for the
pair task (Retrieval), ``tokens1, tokens2 [N, L]``.

Model: ``lion_jax.models.SequenceClassifier`` with ``config.model`` (``dtype`` /
``param_dtype`` given as names, e.g. "bfloat16"); vocabulary size, class count and padding id
come from the dataset. Pair data gets a ``DualEncoderClassifier`` around that encoder
(``config.model.pair_mlp_dim``: the width of its head). A bad model key or value stops with one
line naming it, before anything is compiled.

Warm start (:meth:`ClassificationTask.warm_start`, the trainer's hook before a new run's first
step): with ``config.init_from`` set to another classification run's workdir, that run's best
checkpoint replaces the fresh parameters and model state (BatchNorm statistics), leaf by leaf;
the shapes must match (else one ``error:`` line naming the first that differs). The optimizer
state, step and schedule start fresh; a resumed run reads its own checkpoint instead. A
curriculum: Pathfinder's easiest set, then LRA's (docs/pathfinder.md).

Loss: softmax cross-entropy; metrics: loss, accuracy.
"""

import os

import jax.numpy as jnp
import numpy as np
import optax

from experiments.checkpointing import fit_params, load_best_run
from experiments.data.listops import majority_class_rate
from experiments.data.pipeline import BatchIterator, LengthBucketIterator
from experiments.errors import UserError
from experiments.progress import echo
from experiments.tasks import load_dataset

SPLITS = ("train", "val", "test")


def _listops(source, data_dir, **kwargs):
    from experiments.data import listops

    if source == "tsv":
        splits = {s: listops.load_listops_tsv(s, data_dir=data_dir,
                                              max_length=kwargs["max_length"]) for s in SPLITS}
    elif source == "generate":
        splits = {s: listops.load_listops(s, **kwargs) for s in SPLITS}
    else:
        raise ValueError(f"unknown config.data.source={source!r} (valid: generate, tsv)")
    return splits, dict(vocab_size=listops.VOCAB_SIZE, num_classes=listops.NUM_CLASSES,
                        pad_id=listops.PAD_ID)


def _text(**kwargs):
    from experiments.data import text

    return ({s: text.load_text(s, **kwargs) for s in SPLITS},
            dict(vocab_size=text.VOCAB_SIZE, num_classes=text.NUM_CLASSES, pad_id=text.PAD_ID))


def _retrieval(**kwargs):
    from experiments.data import retrieval

    return ({s: retrieval.load_retrieval(s, **kwargs) for s in SPLITS},
            dict(vocab_size=retrieval.VOCAB_SIZE, num_classes=retrieval.NUM_CLASSES,
                 pad_id=retrieval.PAD_ID))


def _image(**kwargs):
    from experiments.data import image

    return ({s: image.load_image(s, **kwargs) for s in SPLITS},
            dict(vocab_size=256, num_classes=image.NUM_CLASSES, pad_id=None))


def _pathfinder(source, data_dir, **kwargs):
    from experiments.data import pathfinder

    if source == "generate":
        kwargs["num_workers"] = kwargs.get("num_workers") or None  # 0: one per CPU
        splits = {s: pathfinder.load_pathfinder(s, **kwargs) for s in SPLITS}
    elif source == "files":
        kept = {k: kwargs[k] for k in ("resolution", "val_fraction", "test_fraction", "seed",
                                       "difficulty")}
        splits = {s: pathfinder.load_pathfinder_images(s, data_dir=data_dir, **kept)
                  for s in SPLITS}
    else:
        raise ValueError(f"unknown config.data.source={source!r} (valid: generate, files)")
    return splits, dict(vocab_size=256, num_classes=pathfinder.NUM_CLASSES, pad_id=None)


# name -> loader(**config.data without "name") -> ({split: arrays}, info); a dataset that must
# be downloaded raises FileNotFoundError saying how to get it, reported as one error line.
DATASETS = {"listops": _listops, "text": _text, "retrieval": _retrieval, "image": _image,
            "pathfinder": _pathfinder}


def real_lengths(tokens, pad_id, rows=4096):
    """``[N]`` int: the position after each row's last non-padding token of ``tokens [N, L]``
    (padding at the end; L for data without a padding id), ``rows`` rows at a time."""
    if pad_id is None:
        return np.full(tokens.shape[0], tokens.shape[1])
    out = np.empty(tokens.shape[0], np.int64)
    for start in range(0, tokens.shape[0], rows):
        real = tokens[start:start + rows] != pad_id
        last = real.shape[1] - np.argmax(real[:, ::-1], axis=1)
        out[start:start + rows] = np.where(real.any(axis=1), last, 0)
    return out


class ClassificationTask:
    """The classification task (see the module docstring and experiments/tasks/__init__.py)."""

    def __init__(self, config):
        from lion_jax.models import DualEncoderClassifier, SequenceClassifier

        self.eval_splits = tuple(config.eval_splits)
        self.splits, info = load_dataset(DATASETS, config.data, self.eval_splits)
        self._pad_id = info["pad_id"]
        # 0 for runs recorded before the key existed (configs/recorded.py)
        self._length_multiple = config.get("batch_length_multiple", 0)
        if not isinstance(self._length_multiple, int) or self._length_multiple < 0:
            raise UserError("config.batch_length_multiple must be an int >= 0 (0: every batch "
                            f"padded to the full length); got {self._length_multiple!r}")
        self.pair = "tokens1" in self.splits["train"]
        self._inputs_keys = ("tokens1", "tokens2") if self.pair else ("tokens",)
        model_kwargs = config.model.to_dict()
        pair_mlp_dim = model_kwargs.pop("pair_mlp_dim", None)
        for key in ("dtype", "param_dtype"):
            model_kwargs[key] = jnp.dtype(model_kwargs[key])
        model_kwargs.update(vocab_size=info["vocab_size"], pad_id=info["pad_id"])
        try:
            if self.pair:
                self.model = DualEncoderClassifier(num_classes=info["num_classes"],
                                                   encoder=model_kwargs, mlp_dim=pair_mlp_dim)
            else:
                self.model = SequenceClassifier(num_classes=info["num_classes"], **model_kwargs)
        except (TypeError, ValueError) as e:
            key, _, message = str(e).partition(": ") if str(e).startswith("mixer: ") else (
                "", "", str(e))
            raise UserError(f"bad config.model{'.' + key if key else ''}: {message}") from e
        self._seq_len = self.splits["train"][self._inputs_keys[0]].shape[1]
        self.state_collections = ("batch_stats",) if config.model.norm == "batchnorm" else ()
        self._init_from = str(config.get("init_from") or "")

    def init(self, rng):
        tokens = [jnp.zeros((1, self._seq_len), jnp.int32)] * len(self._inputs_keys)
        return self.model.init({"params": rng}, *tokens, train=False)

    def warm_start(self, params, model_state):
        """The best checkpoint of ``config.init_from`` in place of the fresh ``params`` and
        ``model_state`` (host arrays; module docstring); unchanged when it is empty."""
        if not self._init_from:
            return params, model_state
        source = f"config.init_from={self._init_from!r}"
        _, step, saved, saved_state = load_best_run(
            os.path.expanduser(self._init_from), "classification", source, model_state=True)
        if (saved_state is None) != (model_state is None):
            raise UserError(f"{source}: one of the two models has BatchNorm statistics and the "
                            "other not (config.model.norm differs); use the same model")
        echo(f"Warm start from {self._init_from}: its best checkpoint, step {step}")
        return (fit_params(params, saved, f"the best checkpoint of {source}"),
                None if model_state is None else fit_params(model_state, saved_state, source))

    def loss(self, params, batch, rng, *, train, model_state=None):
        """Per-example cross-entropy and accuracy; with BatchNorm (``state_collections``) also
        the running statistics, updated in training (see experiments/tasks/__init__.py)."""
        inputs = [batch[k] for k in self._inputs_keys]
        mutable = list(self.state_collections) if train and self.state_collections else False
        out = self.model.apply({"params": params, **(model_state or {})}, *inputs, train=train,
                               rngs={"dropout": rng}, mutable=mutable)
        logits, new_state = out if mutable else (out, model_state)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"])
        accuracy = (jnp.argmax(logits, -1) == batch["labels"]).astype(jnp.float32)
        if self.state_collections:
            return loss, {"accuracy": accuracy}, new_state
        return loss, {"accuracy": accuracy}

    def train_batches(self, batch_size, seed):
        """Shuffled full batches; with ``config.batch_length_multiple`` > 0, batches of similar
        lengths cut to their longest example rounded up to that multiple (``pipeline.
        LengthBucketIterator``; pairs: the longer document of each pair)."""
        inputs = self._inputs("train")
        if not self._length_multiple:
            return BatchIterator(inputs, batch_size, shuffle=True, seed=seed,
                                 drop_remainder=True)
        lengths = [real_lengths(inputs[k], self._pad_id) for k in self._inputs_keys]
        return LengthBucketIterator(inputs, batch_size, lengths=np.maximum.reduce(lengths),
                                    multiple=self._length_multiple, crop=self._inputs_keys,
                                    seed=seed)

    def eval_batches(self, split, batch_size):
        return BatchIterator(self._inputs(split), batch_size, shuffle=False, seed=0,
                             drop_remainder=False, num_epochs=1)

    def summary(self):
        rate = majority_class_rate(self.splits["test"]["labels"])
        return {"test majority-class rate": float(rate)}

    def _inputs(self, split):
        """The arrays the model and loss read (no `lengths`: the model masks padding itself)."""
        return {k: self.splits[split][k] for k in (*self._inputs_keys, "labels")}
