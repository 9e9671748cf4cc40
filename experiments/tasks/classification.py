"""Sequence classification (LRA): token ids -> one of ``num_classes`` labels.

Data: ``config.data.name`` picks a loader; its other keys are the loader's arguments
(``cache_dir`` has ``~`` expanded). Model: ``lion_jax.models.SequenceClassifier`` with
``config.model`` (``dtype`` / ``param_dtype`` given as names, e.g. "bfloat16"), vocabulary
size and class count from the dataset. Loss: softmax cross-entropy; metrics: loss, accuracy.
"""

import os

import jax.numpy as jnp
import optax

from experiments.data.listops import majority_class_rate
from experiments.data.pipeline import BatchIterator
from experiments.errors import UserError

SPLITS = ("train", "val", "test")


def _load_listops(data_config):
    """{split: arrays}, vocabulary size, number of classes.

    ``data_config.source`` is "generate" (generated on first use and cached; the other keys are
    `load_listops`'s arguments) or "tsv" (LRA's official files in ``data_dir``, padded to
    ``max_length``).
    """
    from experiments.data import listops

    kwargs = data_config.to_dict()
    kwargs.pop("name")
    source, data_dir = kwargs.pop("source"), os.path.expanduser(kwargs.pop("data_dir"))
    if source == "tsv":
        try:
            splits = {split: listops.load_listops_tsv(split, data_dir=data_dir,
                                                      max_length=kwargs["max_length"])
                      for split in SPLITS}
        except (FileNotFoundError, ValueError) as e:
            raise UserError(str(e)) from e
    elif source == "generate":
        kwargs["cache_dir"] = os.path.expanduser(kwargs["cache_dir"])
        try:
            splits = {split: listops.load_listops(split, **kwargs) for split in SPLITS}
        except (TypeError, ValueError) as e:
            raise UserError(f"bad ListOps settings in config.data: {e}") from e
    else:
        raise UserError(f"unknown config.data.source={source!r} (valid: generate, tsv)")
    return splits, listops.VOCAB_SIZE, listops.NUM_CLASSES


# A dataset that must be downloaded raises UserError saying how to get it when its files are
# missing (ListOps with source "tsv"); ListOps is generated locally by default.
DATASETS = {"listops": _load_listops}


class ClassificationTask:
    """The classification task (see the module docstring and experiments/tasks/__init__.py)."""

    def __init__(self, config):
        from lion_jax.models import SequenceClassifier

        if config.data.name not in DATASETS:
            raise UserError(f"unknown dataset config.data.name={config.data.name!r} "
                            f"(known: {', '.join(DATASETS)})")
        self.splits, vocab_size, num_classes = DATASETS[config.data.name](config.data)
        self.eval_splits = tuple(config.eval_splits)
        for split in self.eval_splits:
            if split not in self.splits:
                raise UserError(f"config.eval_splits has {split!r}; the dataset has "
                                f"{', '.join(self.splits)}")
        model_kwargs = config.model.to_dict()
        for key in ("dtype", "param_dtype"):
            model_kwargs[key] = jnp.dtype(model_kwargs[key])
        try:
            self.model = SequenceClassifier(vocab_size=vocab_size, num_classes=num_classes,
                                            **model_kwargs)
        except (TypeError, ValueError) as e:
            raise UserError(f"bad config.model: {e}") from e
        self._seq_len = self.splits["train"]["tokens"].shape[1]

    def init(self, rng):
        tokens = jnp.zeros((1, self._seq_len), jnp.int32)
        return self.model.init({"params": rng}, tokens, train=False)

    def loss(self, params, batch, rng, *, train):
        logits = self.model.apply({"params": params}, batch["tokens"], train=train,
                                  rngs={"dropout": rng})
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"])
        accuracy = (jnp.argmax(logits, -1) == batch["labels"]).astype(jnp.float32)
        return loss, {"accuracy": accuracy}

    def train_batches(self, batch_size, seed):
        return BatchIterator(self._inputs("train"), batch_size, shuffle=True, seed=seed,
                             drop_remainder=True)

    def eval_batches(self, split, batch_size):
        return BatchIterator(self._inputs(split), batch_size, shuffle=False, seed=0,
                             drop_remainder=False, num_epochs=1)

    def summary(self):
        rate = majority_class_rate(self.splits["test"]["labels"])
        return {"test majority-class rate": float(rate)}

    def _inputs(self, split):
        """The arrays the model and loss read (no `lengths`: the model masks padding itself)."""
        return {k: self.splits[split][k] for k in ("tokens", "labels")}
