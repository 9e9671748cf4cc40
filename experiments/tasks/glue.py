"""GLUE fine-tuning of a pre-trained BERT / LION encoder (LION paper Sec. 5.2, App. D.5, Table 8).

Data: :func:`experiments.data.glue.load_glue` (``config.data``: ``task``, ``source``
"tfds" | "files", ``data_dir``, ``max_len``), tokenised with the WordPiece vocabulary of the
pre-training run: ``config.data.vocab_file`` when set, else the vocabulary the run named by
``config.init_from`` used (its ``data.vocab_file``, or the vocabulary
:func:`experiments.data.mlm.load_tokenizer` trained and cached for its data settings). The
vocabulary used is written back into ``config.data.vocab_file`` (so ``config.json`` records
it, and RTE / STS-B / MRPC runs started from this run find it). Examples are
``[CLS] a [SEP]`` or ``[CLS] a [SEP] b [SEP]`` with token types 0 (``[CLS] a [SEP]``) and 1
(``b [SEP]``), truncated longest-first to ``max_len`` and padded. Batches hold ``tokens``,
``type_ids``, ``attention_mask`` (all ``[B, L]``) and ``labels [B]``.

Model: :class:`lion_jax.models.bert.BertForSequenceClassification` (``num_labels`` classes;
1 output for STS-B). The encoder's settings are the init run's ``model`` (its config.json),
with ``config.model``'s keys overriding (``config.model`` empty: all from the run; with
``init_from="none"``, ``config.model`` alone: random init, for tests). The resolved settings
are written back into ``config.model`` and, when ``config.label`` is empty, the init run's
label into ``config.label`` (experiments/glue_table.py names rows by them).

Warm start (:meth:`warm_start`, the trainer's hook before the first step): fresh parameters,
then ``params["encoder"]`` replaced by the best checkpoint's ``params["encoder"]`` of
``config.init_from`` (an MLM pre-training workdir, or for RTE, STS-B and MRPC, as Table 8, a
GLUE MNLI workdir; ``config.from_mnli`` asks for the latter). The pooler and classifier start
fresh. Shapes must match (else one ``error:`` line). The weights are read once, on the host,
in ``__init__``.

Loss: softmax cross-entropy (classes), squared error (STS-B). Epochs: with
``config.num_epochs > 0`` the task sets ``config.num_train_steps = ceil(epochs * N /
batch_size)``, ``config.optim.warmup_steps`` to ``config.warmup_fraction`` of them and, with
``config.evals_per_epoch > 0``, ``eval_every`` / ``checkpoint_every`` (before the trainer
reads them).

Metrics: ``accuracy`` (classification) and ``mse`` / ``neg_mse`` (STS-B; ``neg_mse`` is
higher-is-better, for ``best_metric``) averaged by the trainer; and from every prediction of
the split (the trainer gathers ``prediction`` and ``label`` per example and calls
:meth:`split_metrics`) GLUE's metrics of the task, ``glue_metrics.task_metrics``: F1 (QQP,
MRPC), Matthews (CoLA), Pearson and Spearman (STS-B), the keys experiments/glue_table.py reads.
"""

import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments import glue_metrics
from experiments.checkpointing import fit_params, load_best_run
from experiments.data import glue as glue_data
from experiments.data import mlm as mlm_data
from experiments.data.pipeline import BatchIterator
from experiments.errors import UserError

MLM_COMMAND = ("python -m experiments.train --config configs/mlm/c4.py[:variant] "
               "--workdir DIR")

def make_tokenize(tokenizer):
    """``tokenize(texts_a, texts_b, max_len) -> (ids, type_ids, mask)`` for
    :func:`experiments.data.glue.encode` (module docstring)."""

    def tokenize(texts_a, texts_b, max_len):
        n = len(texts_a)
        a_ids = tokenizer.encode_batch(texts_a)
        b_ids = tokenizer.encode_batch(texts_b) if texts_b is not None else [None] * n
        ids = np.full((n, max_len), tokenizer.pad_id, np.int32)
        types = np.zeros((n, max_len), np.int32)
        mask = np.zeros((n, max_len), np.int32)
        for i, (a, b) in enumerate(zip(a_ids, b_ids)):
            a = list(a)
            b = None if b is None else list(b)
            budget = max_len - (3 if b is not None else 2)
            if b is None:
                a = a[:max(budget, 0)]
            else:
                while len(a) + len(b) > budget:  # longest first
                    (a if len(a) >= len(b) else b).pop()
            row = [tokenizer.cls_id, *a, tokenizer.sep_id]
            seg = [0] * len(row)
            if b is not None:
                row += [*b, tokenizer.sep_id]
                seg += [1] * (len(b) + 1)
            row, seg = row[:max_len], seg[:max_len]
            ids[i, :len(row)] = row
            types[i, :len(seg)] = seg
            mask[i, :len(row)] = 1
        return ids, types, mask

    return tokenize


def _read_run_config(workdir):
    path = os.path.join(os.path.expanduser(workdir), "config.json")
    if not os.path.exists(path):
        raise UserError(f"config.init_from={workdir!r}: {path} not found; it must be the workdir "
                        f"of an MLM pre-training run ({MLM_COMMAND} first) or of a GLUE MNLI "
                        "run")
    with open(path) as f:
        return json.load(f)


def _run_tokenizer(run_config):
    """The WordPiece tokenizer of a run's config.json (MLM: its data settings; GLUE: the
    vocab_file it recorded)."""
    data = dict(run_config["data"])
    if data.get("name") == "glue":
        return mlm_data.WordPieceTokenizer(data["vocab_file"],
                                           lowercase=data.get("lowercase", True))
    keep = ("source", "data_dir", "seed", "num_train", "num_val", "num_test", "val_fraction",
            "test_fraction", "doc_boundary", "tfds_name", "min_chars", "max_chars",
            "vocab_file", "vocab_size", "lowercase", "min_frequency", "tokenizer_documents",
            "cache_dir")
    kwargs = {k: data[k] for k in keep if k in data}
    for key in ("data_dir", "cache_dir"):
        if kwargs.get(key):
            kwargs[key] = os.path.expanduser(kwargs[key])
    return mlm_data.load_tokenizer(**kwargs)


class GlueTask:
    """GLUE fine-tuning (module docstring; interface in experiments/tasks/__init__.py)."""

    gathered_metrics = ("prediction", "label")  # per example, for split_metrics

    def __init__(self, config):
        import ml_collections

        from experiments.tasks.mlm import model_kwargs
        from lion_jax.models.bert import BertForSequenceClassification

        data = config.data
        try:
            self.glue = glue_data.get_task(data.task)
        except ValueError as e:
            raise UserError(f"config.data.task: {e}") from None
        self.name = self.glue.name
        recipe = str(config.get("recipe", "") or "")
        if recipe and glue_data.task_key(recipe.rpartition(":")[2]) != self.name:
            raise UserError(f"config.recipe={recipe!r} is for another task than "
                            f"config.data.task={data.task!r}: pick the task by the config "
                            f"variant (configs/glue/glue.py:{self.name}), not by "
                            "--config.data.task")
        self.eval_splits = tuple(config.eval_splits)
        self.split_metric_names = tuple(self.glue.metrics)
        for split in self.eval_splits:
            if split not in self.glue.eval_splits:
                raise UserError(f"config.eval_splits has {split!r}; GLUE {self.glue.title} has "
                                f"{', '.join(self.glue.eval_splits)}")
        self.max_len = int(data.max_len)

        # --- the init run, its encoder settings and vocabulary -----------------------------
        init_from = str(config.init_from or "")
        if not init_from:
            raise UserError(
                f"config.init_from is empty: GLUE fine-tunes a pre-trained encoder; pre-train "
                f"one with `{MLM_COMMAND}` and pass --config.init_from=DIR"
                + (" (Table 8: RTE, STS-B and MRPC start from the MNLI-fine-tuned run: "
                   "--config.init_from=<MNLI workdir>)" if self.name in ("rte", "stsb", "mrpc")
                   else "") + ", or --config.init_from=none for a random encoder (tests)")
        run_config, self.init_params = None, None
        own_model = {k: v for k, v in config.model.to_dict().items()}
        if init_from != "none":
            run_config = _read_run_config(init_from)
            run_kind = "glue" if run_config.get("data", {}).get("name") == "glue" else \
                run_config.get("task")
            if run_kind not in ("mlm", "glue"):
                raise UserError(f"config.init_from={init_from!r} is a {run_kind!r} run; it must "
                                "be an MLM pre-training run or a GLUE MNLI run")
            if run_kind == "glue" and glue_data.task_key(run_config["data"]["task"]) != "mnli":
                raise UserError(f"config.init_from={init_from!r} is a GLUE "
                                f"{run_config['data']['task']} run; start from an MLM run or "
                                "a GLUE MNLI run")
            if config.from_mnli and run_kind != "glue":
                raise UserError(
                    f"GLUE {self.glue.title} fine-tunes from the MNLI-fine-tuned weights "
                    f"(Table 8), but config.init_from={init_from!r} is an MLM run: fine-tune "
                    "MNLI from it first (configs/glue/glue.py with --config.data.task=mnli) and "
                    "pass that workdir, or pass --config.from_mnli=False")
            _, self.init_step, params = load_best_run(
                os.path.expanduser(init_from), run_config["task"], "GLUE fine-tuning")
            if "encoder" not in params:
                raise UserError(f"the best checkpoint of {init_from} has no params['encoder']")
            self.init_params = jax.tree.map(np.asarray, params["encoder"])
            model = dict(run_config["model"])
            model.update({k: v for k, v in own_model.items() if v not in ("", None)})
        else:
            model = own_model
        if not model:
            raise UserError("config.model is empty and config.init_from is 'none': give the "
                            "encoder settings (config.model) or an init run")

        try:
            if data.vocab_file:
                tokenizer = mlm_data.WordPieceTokenizer(data.vocab_file,
                                                        lowercase=data.lowercase)
            elif run_config is not None:
                tokenizer = _run_tokenizer(run_config)
            else:
                raise UserError("config.data.vocab_file is empty and config.init_from is "
                                "'none': give a vocab file")
        except (FileNotFoundError, ValueError) as e:
            raise UserError(f"GLUE tokenizer: {e}") from None
        self.tokenizer = tokenizer

        # --- data ----------------------------------------------------------------------------
        tokenize = make_tokenize(tokenizer)
        tokenizer_id = f"{tokenizer.vocab_hash} lowercase={tokenizer.lowercase} v1"
        self.splits = {}
        for split in ("train", *self.eval_splits):
            try:
                self.splits[split] = glue_data.load_glue_encoded(
                    self.name, split, tokenize, self.max_len, source=data.source,
                    data_dir=data.data_dir, tokenizer_id=tokenizer_id,
                    cache_dir=data.cache_dir or "~/.cache/lion_jax/glue")
            except glue_data.GlueDataMissing:
                raise
            except (FileNotFoundError, ValueError) as e:
                raise UserError(f"GLUE {self.glue.title} {split}: {e}") from None
        num_train = len(self.splits["train"]["labels"])

        # --- model -----------------------------------------------------------------------------
        kwargs = model_kwargs(ml_collections.ConfigDict(model), self.max_len)
        kwargs.update(vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id)
        if not kwargs.get("type_vocab_size"):
            raise UserError("the encoder has no token-type embedding (model.type_vocab_size=0); "
                            "GLUE sentence pairs need 2")
        if kwargs.get("pos_emb", "learned") == "learned" and self.max_len > kwargs["max_len"]:
            raise UserError(f"config.data.max_len={self.max_len} but the encoder's learned "
                            f"positions stop at {kwargs['max_len']}")
        self.num_outputs = 1 if self.glue.is_regression else self.glue.num_labels
        try:
            self.model = BertForSequenceClassification(num_labels=self.num_outputs,
                                                       encoder=kwargs)
        except (TypeError, ValueError) as e:
            raise UserError(f"bad config.model: {e}") from None

        # --- write back what the run used (config.json records it; trainer reads steps) ---------
        with config.unlocked():
            config.data.vocab_file = tokenizer.vocab_file
            config.data.lowercase = tokenizer.lowercase
            config.model = ml_collections.ConfigDict(model)
            if not config.label and run_config is not None and run_config.get("label"):
                config.label = run_config["label"]
            if config.num_epochs > 0:
                steps_per_epoch = max(1, math.ceil(num_train / config.batch_size))
                config.num_train_steps = max(1, math.ceil(config.num_epochs * num_train
                                                          / config.batch_size))
                config.optim.warmup_steps = int(round(config.warmup_fraction
                                                      * config.num_train_steps))
                if config.evals_per_epoch > 0:
                    every = max(1, steps_per_epoch // int(config.evals_per_epoch))
                    config.eval_every = config.checkpoint_every = every
        self.num_train = num_train

    # ---------------------------------------------------------------------------------------

    def init(self, rng):
        tokens = jnp.zeros((1, self.max_len), jnp.int32)
        return self.model.init({"params": rng}, tokens, train=False,
                               token_types=jnp.zeros_like(tokens))

    def warm_start(self, params, model_state):
        """``params`` (fresh, on the host) with ``params["encoder"]`` replaced by the init
        run's encoder (the trainer's hook, called once before the first step)."""
        if self.init_params is None:
            return params, model_state
        encoder = fit_params(params["encoder"], self.init_params,
                             "the encoder of config.init_from")
        return {**params, "encoder": encoder}, model_state

    def outputs(self, params, batch, rng=None, *, train=False):
        """``[B, num_labels]`` logits, or ``[B]`` scores (STS-B)."""
        rngs = {"dropout": rng if rng is not None else jax.random.PRNGKey(0)}
        out = self.model.apply({"params": params}, batch["tokens"], train=train,
                               mask=batch["attention_mask"] > 0,
                               token_types=batch["type_ids"], rngs=rngs)
        return out[:, 0] if self.glue.is_regression else out

    def loss(self, params, batch, rng, *, train):
        out = self.outputs(params, batch, rng, train=train)
        labels = batch["labels"]
        if self.glue.is_regression:
            target = labels.astype(jnp.float32)
            err = jnp.square(out - target)
            return err, {"mse": err, "neg_mse": -err, "prediction": out, "label": target}
        labels = labels.astype(jnp.int32)
        xent = optax.softmax_cross_entropy_with_integer_labels(out, labels)
        pred = jnp.argmax(out, -1)
        return xent, {"accuracy": (pred == labels).astype(jnp.float32), "prediction": pred,
                      "label": labels}

    def split_metrics(self, split, gathered):
        """GLUE's metrics of the task (``glue_metrics.task_metrics``: F1, Matthews, Pearson,
        Spearman, accuracy) from every prediction of ``split`` (the trainer's hook)."""
        return glue_metrics.task_metrics(self.name, gathered["prediction"], gathered["label"])

    def _arrays(self, split):
        s = self.splits[split]
        return {"tokens": s["tokens"], "type_ids": s["type_ids"],
                "attention_mask": s["attention_mask"], "labels": s["labels"]}

    def train_batches(self, batch_size, seed):
        return BatchIterator(self._arrays("train"), batch_size, shuffle=True, seed=seed,
                             drop_remainder=batch_size <= self.num_train)

    def eval_batches(self, split, batch_size):
        return BatchIterator(self._arrays(split), batch_size, shuffle=False, seed=0,
                             drop_remainder=False, num_epochs=1)

    def summary(self):
        labels = self.splits[self.eval_splits[0]]["labels"] if self.eval_splits else None
        if labels is None or self.glue.is_regression:
            return {}
        return {f"{self.eval_splits[0]} majority accuracy":
                float(np.bincount(labels).max() / len(labels))}
