"""Masked language modelling (BERT / M2 pre-training; LION paper Sec. 5.2 and Figure 3 left).

Data: ``config.data.name`` picks a dataset of :data:`DATASETS` (``"mlm"``: the rows of
:func:`experiments.data.mlm.load_mlm`, from the embedded corpus, the user's text files or
tfds' C4); the other keys of ``config.data`` are its loader's arguments (``~`` expanded in
``data_dir`` and ``cache_dir``). Missing data stops with one ``error:`` line saying how to get
it. Batches hold ``ids [B, L]`` and, for evaluation, ``index [B]`` (the row's index in its
split).

Masking (BERT's 80/10/10, :func:`experiments.data.mlm.mask_tokens`) runs on the device inside
:meth:`MLMTask.loss`:

* training: ``config.mask_prob`` (M2: 0.3) with a key drawn from the step's key, so every
  epoch sees new masks (dynamic masking, as M2's HuggingFace collator);
* evaluation: ``config.eval_mask_prob`` (M2: 0.15) with the key
  ``fold_in(PRNGKey(EVAL_MASK_SEED), index)`` of each row: the masks depend only on the row
  (its index and its ids), never on the batch it lands in, the batch size or the device count,
  so every evaluation of every checkpoint scores the same masked tokens.

Loss: softmax cross-entropy over the selected positions only, **averaged per row** (a row's
loss is the sum over its selected tokens divided by their number); the trainer then averages
the rows. Rows of one length hold nearly the same number of maskable tokens (only a split's
last row is short in the packed layouts), so this is within a hair of M2's token average.
A row with no selected token (short rows at 0.15) has loss and accuracy 0: the token-level
numbers of :meth:`MLMTask.masked_stats` (used by ``experiments/eval_length.py``) avoid even
that. Metrics: ``accuracy`` (masked-token accuracy per row, averaged) and ``masked`` (the
number of selected tokens per row).

``config.max_predictions`` (0 = off): runs the MLM head only at the first ``P`` selected
positions of each row (``BertForMaskedLM(positions=...)``), so the ``[B, L, vocab]`` logits
shrink to ``[B, P, vocab]``. Rows with more than ``P`` selected tokens drop the rest from the
loss (BERT's ``max_predictions_per_seq``); pick ``P`` well above ``mask_prob * L``.

Model: :class:`lion_jax.models.bert.BertForMaskedLM` with ``encoder=config.model``, the
vocabulary size and padding id from the data. ``config.model.size`` (``"tiny"``, ``"base"``,
``"large"``; :data:`lion_jax.models.bert.BERT_SIZES`) fills ``d_model``, ``num_layers``,
``num_heads`` and ``mlp_dim`` where they are 0; explicit non-zero values win. ``max_len`` 0
means the data's row length. ``dtype`` / ``param_dtype`` are names ("bfloat16"). A bad model
key or value stops with one line naming it, before anything is compiled.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments.data import mlm as mlm_data
from experiments.data.pipeline import BatchIterator
from experiments.errors import UserError
from experiments.tasks import load_dataset, model_size_and_dtypes

DATASETS = {"mlm": mlm_data.load_mlm}
EVAL_MASK_SEED = 20231  # base of the evaluation masks' keys (any fixed number)
SIZE_KEYS = ("d_model", "num_layers", "num_heads", "mlp_dim")


def model_kwargs(model_config, max_len):
    """``BertEncoder`` keyword arguments of ``config.model`` (see the module docstring).

    Raises:
      UserError: an unknown size, or a dimension neither given nor implied by a size.
    """
    from lion_jax.models.bert import bert_size

    kwargs = model_config.to_dict() if hasattr(model_config, "to_dict") else dict(model_config)
    model_size_and_dtypes(kwargs, bert_size, SIZE_KEYS, "tiny, base, large")
    if "mixer" in kwargs:
        kwargs["mixer"] = dict(kwargs["mixer"])
    if not kwargs.get("max_len"):
        kwargs["max_len"] = int(max_len)
    return kwargs


def unigram_accuracy(ids, special_ids):
    """Masked-token accuracy of always predicting the most frequent maskable token of ``ids``
    (masks pick maskable tokens uniformly, so this is that token's share of them)."""
    counts = np.bincount(np.asarray(ids).ravel())
    counts[[i for i in special_ids if i < counts.size]] = 0
    return float(counts.max() / max(counts.sum(), 1))


class MLMTask:
    """The masked-LM task (see the module docstring and experiments/tasks/__init__.py)."""

    def __init__(self, config):
        from lion_jax.models.bert import BertForMaskedLM

        self.eval_splits = tuple(config.eval_splits)
        self.mask_prob = float(config.mask_prob)
        self.eval_mask_prob = float(config.eval_mask_prob)
        for key, value in (("mask_prob", self.mask_prob),
                           ("eval_mask_prob", self.eval_mask_prob)):
            if not 0.0 < value <= 1.0:
                raise UserError(f"config.{key} must be in (0, 1]; got {value}")
        self.max_predictions = int(config.max_predictions)
        if self.max_predictions < 0:
            raise UserError(f"config.max_predictions must be >= 0 (0: all positions); got "
                            f"{self.max_predictions}")
        self.splits, self.info = load_dataset(DATASETS, config.data, self.eval_splits)
        self.seq_len = self.splits["train"]["ids"].shape[1]
        kwargs = model_kwargs(config.model, self.seq_len)
        kwargs.update(vocab_size=self.info["vocab_size"], pad_id=self.info["pad_id"])
        self.encoder_kwargs = kwargs
        try:
            self.model = BertForMaskedLM(encoder=kwargs)
        except (TypeError, ValueError) as e:
            message = str(e).removeprefix("BertForMaskedLM encoder: ")
            key, _, rest = message.partition(": ") if message.startswith("mixer: ") else (
                "", "", message)
            raise UserError(f"bad config.model{'.' + key if key else ''}: {rest}") from None
        if kwargs.get("pos_emb", "learned") == "learned" and self.seq_len > kwargs["max_len"]:
            raise UserError(f"the rows have {self.seq_len} tokens (config.data.max_len) but the "
                            f"learned positions stop at config.model.max_len="
                            f"{kwargs['max_len']}")
        self._mask_kwargs = dict(mask_id=self.info["mask_id"],
                                 vocab_size=self.info["vocab_size"],
                                 special_ids=tuple(self.info["special_ids"]))

    # ---------------------------------------------------------------------------------------

    def init(self, rng):
        tokens = jnp.zeros((1, self.seq_len), jnp.int32)
        return self.model.init({"params": rng}, tokens, train=False)

    def mask(self, ids, rng, *, train, index=None):
        """``(inputs, targets, weights)`` of a batch ``ids [B, L]`` (module docstring):
        training masks from ``rng``; evaluation from each row's ``index [B]``."""
        if train:
            return mlm_data.mask_tokens(ids, rng, mask_prob=self.mask_prob, **self._mask_kwargs)
        if index is None:
            raise ValueError("evaluation masking needs the rows' index")
        base = jax.random.PRNGKey(EVAL_MASK_SEED)

        def one(row, i):
            return mlm_data.mask_tokens(row, jax.random.fold_in(base, i),
                                        mask_prob=self.eval_mask_prob, **self._mask_kwargs)

        return jax.vmap(one)(ids, index.astype(jnp.uint32))

    def token_losses(self, params, inputs, targets, weights, rng, *, train):
        """Per-token ``(xent [B, P], correct [B, P], weights [B, P])`` at the positions the
        head runs on (all ``L``, or the first ``max_predictions`` selected ones)."""
        positions = None
        if self.max_predictions:
            P = min(self.max_predictions, inputs.shape[1])
            # Selected positions first, in order (stable sort on 0 / 1 keys).
            positions = jnp.argsort(-weights, axis=1, stable=True)[:, :P].astype(jnp.int32)
            targets = jnp.take_along_axis(targets, positions, axis=1)
            weights = jnp.take_along_axis(weights, positions, axis=1)
        logits = self.model.apply({"params": params}, inputs, train=train, positions=positions,
                                  rngs={"dropout": rng})
        xent = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
        correct = (jnp.argmax(logits, -1) == targets).astype(jnp.float32)
        return xent, correct, weights

    def masked_stats(self, params, batch, rng=None, *, train=False):
        """Per row: ``(sum of xent, number correct, number selected)`` over its selected
        tokens, each ``[B]`` float32 (token-level totals for exact averages)."""
        if rng is None:
            rng = jax.random.PRNGKey(0)
        mask_key, dropout_key = jax.random.split(rng)
        inputs, targets, weights = self.mask(batch["ids"], mask_key, train=train,
                                             index=batch.get("index"))
        xent, correct, weights = self.token_losses(params, inputs, targets, weights,
                                                   dropout_key, train=train)
        return (jnp.sum(xent * weights, -1), jnp.sum(correct * weights, -1),
                jnp.sum(weights, -1))

    def loss(self, params, batch, rng, *, train):
        xent, correct, count = self.masked_stats(params, batch, rng, train=train)
        denom = jnp.maximum(count, 1.0)
        return xent / denom, {"accuracy": correct / denom, "masked": count}

    def train_batches(self, batch_size, seed):
        return BatchIterator({"ids": self.splits["train"]["ids"]}, batch_size, shuffle=True,
                             seed=seed, drop_remainder=True)

    def eval_batches(self, split, batch_size):
        ids = self.splits[split]["ids"]
        return BatchIterator({"ids": ids, "index": np.arange(ids.shape[0], dtype=np.int32)},
                             batch_size, shuffle=False, seed=0, drop_remainder=False,
                             num_epochs=1)

    def summary(self):
        split = "val" if "val" in self.splits else self.eval_splits[0]
        return {f"{split} unigram masked accuracy": unigram_accuracy(
            self.splits[split]["ids"], self.info["special_ids"])}
