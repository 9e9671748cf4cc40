"""Causal language modelling: LLaMA, TNL, HGRN2, cosFormer2 and causal LION-S
(:class:`lion_jax.models.lm.CausalLM`) trained on next-token prediction.

Data: ``config.data.name`` picks a dataset of :data:`DATASETS` (``"lm"``: the rows of
:func:`experiments.data.lm.load_lm`, from the embedded corpus, the user's text files or tfds'
lm1b / C4 / wiki40b); the other keys of ``config.data`` are its loader's arguments (``~``
expanded in ``data_dir`` and ``cache_dir``). Missing data or tokenizer file stops with one
``error:`` line. Batches hold ``tokens [B, L]`` and ``targets [B, L]`` (int32; the targets are
the tokens shifted by one) and the pipeline's ``mask [B]``.

Loss: the mean next-token cross-entropy (nats) over a row's ``L`` targets, per row; every row
is full (the packer drops the tail), so the trainer's average over rows is the token average.
It is computed in slices of the sequence (:func:`lion_jax.models.lm.next_token_losses`), so the
``B x L x vocab`` logits are never held at once.
Metrics: ``accuracy`` (next-token top-1 accuracy, per row) and, in evaluation only,
``log_likelihood`` (minus the loss: the mean log-probability per token) and ``perplexity``,
both over the whole split (the ``split_metrics`` hook): ``perplexity = exp(loss)`` with the
token-level mean loss of the split, so ``val/perplexity`` is ``exp(val/loss)``, in
``metrics.jsonl`` beside it and in the summary's ``best`` / ``final`` lines. The trainer keeps
the checkpoint with the highest ``best_metric``, so the configs pick
``val/log_likelihood`` (= the lowest validation loss and perplexity). :meth:`LMTask.summary`
adds the perplexity of the training set's unigram distribution on the validation targets: the
number a model must beat.

Model: :class:`~lion_jax.models.lm.CausalLM` from ``config.model`` (:data:`MODEL_KEYS`):
``arch``; ``size`` (``"70m"`` ... ``"7b"``, :func:`lion_jax.models.lm.lm_size`) fills
``num_layers``, ``d_model``, ``num_heads`` and ``mlp_dim`` where they are 0 (explicit non-zero
values win; ``size=""`` needs all four); ``vocab_size`` 0 = the tokenizer's (a larger value
pads the embedding, e.g. to a paper's vocabulary; a smaller one is an error); ``max_len`` 0 =
the data's row length (LLaMA's KV-cache capacity, the longest prompt + generation);
``mixer`` (token-mixer keyword arguments over :data:`lion_jax.models.lm.DEFAULT_MIXER`),
``norm``, ``embed_init_std``, ``remat`` (recompute each block in the backward pass: long
contexts and big models in less memory); ``dtype`` / ``param_dtype`` are names ("bfloat16").
A bad key or value stops with one line naming it, before anything is compiled.
"""

import jax
import jax.numpy as jnp
import numpy as np

from experiments.data import lm as lm_data
from experiments.data.pipeline import BatchIterator
from experiments.errors import UserError
from experiments.tasks import load_dataset, model_size_and_dtypes

DATASETS = {"lm": lm_data.load_lm}
SIZE_KEYS = ("num_layers", "d_model", "num_heads", "mlp_dim")
MODEL_KEYS = ("arch", "size", "vocab_size", *SIZE_KEYS, "max_len", "mixer", "norm",
              "embed_init_std", "remat", "dtype", "param_dtype")
CHECK_LEN = 16  # tokens of the shape-only forward that checks a model config


def model_kwargs(model_config, *, vocab_size, max_len):
    """``CausalLM`` keyword arguments of ``config.model`` (module docstring).

    Args:
      model_config: ``config.model`` (ConfigDict or dict).
      vocab_size: the tokenizer's vocabulary (``model.vocab_size`` 0 takes it).
      max_len: the data's row length (``model.max_len`` 0 takes it).

    Raises:
      UserError: an unknown key, arch, size or dtype, a dimension neither given nor implied by
        a size, or a vocabulary smaller than the tokenizer's.
    """
    from lion_jax.models.lm import ARCHS, lm_size

    kwargs = model_config.to_dict() if hasattr(model_config, "to_dict") else dict(model_config)
    unknown = sorted(set(kwargs) - set(MODEL_KEYS))
    if unknown:
        raise UserError(f"bad config.model: unknown key {unknown[0]!r} (known: "
                        f"{', '.join(MODEL_KEYS)})")
    arch = kwargs.get("arch")
    if arch not in ARCHS:
        raise UserError(f"bad config.model.arch: {arch!r} is not one of {', '.join(ARCHS)}")
    model_size_and_dtypes(kwargs, lambda size: lm_size(size, arch), SIZE_KEYS,
                          "70m, 160m, 410m, 1b, 3b, 7b")
    if not kwargs.get("vocab_size"):
        kwargs["vocab_size"] = int(vocab_size)
    elif kwargs["vocab_size"] < vocab_size:
        raise UserError(f"config.model.vocab_size={kwargs['vocab_size']} is smaller than the "
                        f"tokenizer's {vocab_size} entries (0 takes the tokenizer's)")
    if not kwargs.get("max_len"):
        kwargs["max_len"] = int(max_len)
    kwargs["mixer"] = dict(kwargs.get("mixer") or {})
    return kwargs


def make_model(kwargs):
    """A ``CausalLM`` of :func:`model_kwargs`' arguments, checked by a shape-only
    initialisation (its mixer's settings included). Raises UserError (one line)."""
    from lion_jax.models.lm import CausalLM

    try:
        model = CausalLM(**kwargs)
    except (TypeError, ValueError) as e:
        raise UserError(f"bad config.model: {e}") from None
    tokens = jnp.zeros((1, min(CHECK_LEN, model.max_len)), jnp.int32)
    try:
        jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), tokens))
    except (TypeError, ValueError) as e:
        message = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UserError(f"bad config.model.mixer (or another model setting): {message}") \
            from None
    return model


class _Int32Batches(BatchIterator):
    """A BatchIterator whose token arrays come out as int32 (the rows are stored compactly)."""

    def __next__(self):
        batch = super().__next__()
        return {k: v if k == "mask" else v.astype(np.int32) for k, v in batch.items()}


class LMTask:
    """The causal-LM task (see the module docstring and experiments/tasks/__init__.py)."""

    gathered_metrics = ("log_likelihood",)
    split_metric_names = ("log_likelihood", "perplexity")

    def __init__(self, config):
        self.eval_splits = tuple(config.eval_splits)
        self.splits, self.info = load_dataset(DATASETS, config.data, self.eval_splits)
        self.seq_len = self.info["max_len"]
        self.model_kwargs = model_kwargs(config.model, vocab_size=self.info["vocab_size"],
                                         max_len=self.seq_len)
        self.model = make_model(self.model_kwargs)

    # ---------------------------------------------------------------------------------------

    def init(self, rng):
        # Parameter shapes do not depend on the length: a short forward is enough.
        tokens = jnp.zeros((1, min(self.seq_len, CHECK_LEN)), jnp.int32)
        return self.model.init({"params": rng}, tokens)

    def token_losses(self, params, tokens, targets):
        """Per token ``(cross-entropy [B, L], correct [B, L])``, float32."""
        from lion_jax.models.lm import next_token_losses
        features = self.model.apply({"params": params}, tokens, hidden=True)
        return next_token_losses(features, params["embed"]["embedding"], targets)

    def loss(self, params, batch, rng, *, train):
        del rng  # no dropout
        xent, correct = self.token_losses(params, batch["tokens"], batch["targets"])
        loss = jnp.mean(xent, axis=-1)
        metrics = {"accuracy": jnp.mean(correct, axis=-1)}
        if not train:
            metrics["log_likelihood"] = -loss
        return loss, metrics

    def split_metrics(self, split, gathered):
        """``{"log_likelihood", "perplexity"}`` of a split from its rows' log-likelihoods."""
        log_likelihood = float(np.mean(np.asarray(gathered["log_likelihood"], np.float64)))
        return {"log_likelihood": log_likelihood,
                "perplexity": float(np.exp(min(-log_likelihood, 700.0)))}

    def train_batches(self, batch_size, seed):
        rows = self.splits["train"]
        if batch_size > rows["tokens"].shape[0]:
            raise UserError(f"config.batch_size={batch_size} is more than the "
                            f"{rows['tokens'].shape[0]} training rows of "
                            f"{self.seq_len} tokens: give the train split more documents "
                            "(config.data.num_train) or lower the batch size")
        return _Int32Batches(dict(rows), batch_size, shuffle=True, seed=seed,
                             drop_remainder=True)

    def eval_batches(self, split, batch_size):
        return _Int32Batches(dict(self.splits[split]), batch_size, shuffle=False, seed=0,
                             drop_remainder=False, num_epochs=1)

    def summary(self):
        split = "val" if "val" in self.splits else self.eval_splits[0]
        return {f"{split} unigram perplexity": unigram_perplexity(
            self.splits["train"]["targets"], self.splits[split]["targets"],
            self.model_kwargs["vocab_size"])}


def unigram_perplexity(train_targets, eval_targets, vocab_size):
    """Perplexity on ``eval_targets`` of the unigram distribution of ``train_targets``
    (add-one smoothed over ``vocab_size`` ids): what a model that ignores the context gets."""
    counts = np.bincount(np.asarray(train_targets).ravel(), minlength=vocab_size)
    counts = counts[:vocab_size].astype(np.float64) + 1.0
    log_p = np.log(counts / counts.sum())
    return float(np.exp(-np.mean(log_p[np.asarray(eval_targets).ravel()])))
