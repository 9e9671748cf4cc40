"""LION-S BERT-BASE, MLM pre-training with the M2 recipe (rows of 128, 30% masked); embedded corpus.

Run:  python -m experiments.train --config configs/mlm/c4.py[:variant] [--workdir DIR]
Then: python -m experiments.eval_length --workdir DIR --lengths 128,256,448,512

The model and recipe are the LION paper's (Sec. 5.2, App. D.5): BERT-BASE (or LARGE, variants
``large``, ``*_large``) with its self-attention replaced by LION-S (default; no positional
embedding: the selective decay orders the tokens), LION-LIT (``lit``; learned positions and the
LayerNorm after the mixer) or LION-RETNET (``retnet``; learned positions), against BERT
(``bert``: softmax attention, learned positions, 512 of them as BERT's). Everything else is
BERT's: post-norm, GELU MLP, dropout 0.1, tied MLM head.

Pre-training follows M2 (Fu et al. 2023) as the paper does: rows of 128 tokens, masking 0.3 in
training and 0.15 in evaluation, batch 4096 for 70k steps, decoupled AdamW with peak learning
rate 8e-4 (2e-4 for LARGE), betas 0.9 / 0.98, eps 1e-6, weight decay 1e-5, linear warmup over
6% of the steps, then linear decay to 20% of the peak. Weight decay: M2 uses Composer's
``DecoupledAdamW``, whose step is ``p -= (lr / peak_lr) * 1e-5 * p`` (Composer's API reference:
every weight is multiplied by ``1 - weight_decay_t``, which follows the learning-rate schedule
but is not scaled by the learning rate); optax's AdamW (here) does
``p -= lr * weight_decay * p``, so ``weight_decay = 1e-5 / peak_lr`` (0.0125 BASE, 0.05 LARGE)
gives the same decay at every step. Departures: the project's decay mask (no decay on biases,
norms, embeddings; Composer decays every parameter) and gradient clipping at norm 1.0.

Data: the default source is the embedded corpus (``experiments/data/mlm_corpus.py``, no
download; vocabulary of 8192 trained on it). For C4 as the paper (M2 truncates each document
to one 128-token row and uses BERT's uncased vocabulary):

    --config.data.source=tfds [--config.data.data_dir=DIR]          (tfds build c4/en first)
    --config.data.source=files --config.data.data_dir=<c4 en/*.json.gz shards>
    --config.data.vocab_file=<bert-base-uncased vocab.txt> --config.data.cross_document=False
    --config.data.truncate=True --config.data.num_train=<documents>

70k steps of 4096 rows need about 287M rows (C4 en has 365M documents); the defaults
(20k training documents) suit the embedded corpus only.
"""

import ml_collections

from configs import common
from experiments.data.mlm import EVAL_MASK_PROB, MAX_LEN, TRAIN_MASK_PROB

VARIANTS = {
    "bert": "BERT-BASE baseline: softmax attention, 512 learned positions",
    "lit": "LION-LIT BERT-BASE: no decay, elu+1, LayerNorm after the mixer, learned positions",
    "retnet": "LION-RETNET BERT-BASE: fixed per-head decay, learned positions",
    "large": "LION-S BERT-LARGE (peak learning rate 2e-4, as the paper for LARGE)",
    "bert_large": "BERT-LARGE baseline (peak learning rate 2e-4)",
    "lit_large": "LION-LIT BERT-LARGE (peak learning rate 2e-4)",
    "retnet_large": "LION-RETNET BERT-LARGE (peak learning rate 2e-4)",
    "small": "a short GPU run (untimed): LION-S, 4 layers of width 256, 128-token rows of the "
             "embedded corpus, 3000 steps of 128 (for the length check: eval_length at 128..512)",
    "small_bert": "the small run with softmax attention and BERT's 512 learned positions "
                  "(those past the 128 of training stay untrained, as in the paper's BERT)",
    "tiny": "seconds-long run for tests: 1-layer width-16 LION-S on 32-token rows, 4 steps",
}

TOTAL_STEPS = 70_000
BATCH_SIZE = 4096
PEAK_LR = {"base": 8e-4, "large": 2e-4}
M2_WEIGHT_DECAY = 1e-5  # Composer DecoupledAdamW: decay per step at the peak learning rate


def mixer_setting(c, kind):
    """Sets config ``c``'s mixer to ``kind`` (``s``, ``lit``, ``retnet`` or ``bert``) and its
    positions as the paper pairs them."""
    if kind == "bert":
        c.model.mixer_kind = "softmax"
        c.model.mixer = ml_collections.ConfigDict(dict(impl="auto"))
        c.model.pos_emb = "learned"
        c.model.max_len = 512  # BERT's; positions past the 128 of training stay untrained
    else:
        c.model.mixer_kind = "lion"
        c.model.mixer = ml_collections.ConfigDict(dict(variant=kind, impl="auto",
                                                       chunk_size=64))
        c.model.pos_emb = "none" if kind == "s" else "learned"
        c.model.max_len = 512 if kind != "s" else 0
    return c


def m2_training(c, size):
    """The M2 pre-training recipe (module docstring) for ``size`` (``base`` or ``large``)."""
    peak = PEAK_LR[size]
    c.batch_size = BATCH_SIZE
    c.eval_batch_size = 1024
    c.num_train_steps = TOTAL_STEPS
    c.optim.learning_rate = peak
    c.optim.schedule = "linear"
    c.optim.warmup_steps = round(0.06 * TOTAL_STEPS)
    c.optim.end_lr_factor = 0.2
    c.optim.b1, c.optim.b2, c.optim.eps = 0.9, 0.98, 1e-6
    c.optim.weight_decay = M2_WEIGHT_DECAY / peak
    c.log_every = 100
    c.eval_every = c.checkpoint_every = 2000
    return c


def get_config(arg=None):
    variant = common.parse_variant(arg, VARIANTS)
    c = common.base_config()
    c.task = "mlm"
    c.data = ml_collections.ConfigDict(dict(
        name="mlm", source="embedded", data_dir="", max_len=MAX_LEN, cross_document=True,
        truncate=False, vocab_file="", vocab_size=8192, lowercase=True, min_frequency=2,
        tokenizer_documents=100_000, seed=0, num_train=20_000, num_val=1000, num_test=0,
        val_fraction=0.05, test_fraction=0.0, doc_boundary="line", tfds_name="c4/en",
        min_chars=1000, max_chars=3000, cache_dir="~/.cache/lion_jax/mlm"))
    c.mask_prob = TRAIN_MASK_PROB
    c.eval_mask_prob = EVAL_MASK_PROB
    c.max_predictions = 0  # 0: the MLM head at every position (experiments/tasks/mlm.py)
    c.model = ml_collections.ConfigDict(dict(
        size="base", d_model=0, num_layers=0, num_heads=0, mlp_dim=0, mixer_kind="lion",
        mixer=dict(variant="s", impl="auto", chunk_size=64), pos_emb="none", max_len=0,
        post_norm=True, type_vocab_size=2, dropout=0.1, norm="layernorm",
        dtype="bfloat16", param_dtype="float32"))
    c.eval_splits = ("val",)
    c.best_metric = "val/accuracy"

    size = "large" if variant and variant.endswith("large") else "base"
    kind = (variant or "s").removesuffix("_large").removesuffix("large") or "s"
    if variant in ("small", "small_bert", "tiny"):
        kind = "bert" if variant == "small_bert" else "s"
    mixer_setting(c, kind)
    c.model.size = size
    m2_training(c, size)
    c.label = f"{'BERT' if kind == 'bert' else 'LION-' + kind.upper()} {size.upper()}"

    if variant in ("small", "small_bert"):
        small(c)
    elif variant == "tiny":
        tiny(c)
    return c


def small(c):
    """The ``small`` setting applied to ``c`` (in place; any mixer): a 4-layer width-256 encoder
    on the embedded corpus, 3000 steps of 128 rows with the M2 schedule's shape."""
    c.data.update(num_train=6000, num_val=300)
    c.model.update(size="", d_model=256, num_layers=4, num_heads=4, mlp_dim=1024, dropout=0.0)
    c.batch_size, c.eval_batch_size = 128, 128
    c.num_train_steps = 3000
    c.optim.learning_rate = 1e-3
    c.optim.warmup_steps = 180
    c.optim.weight_decay = M2_WEIGHT_DECAY / c.optim.learning_rate
    c.log_every = 100
    c.eval_every = c.checkpoint_every = 1000
    c.label = c.label.rsplit(" ", 1)[0] + " small"
    return c


def tiny(c):
    """The ``tiny`` setting applied to ``c`` (in place; any mixer): 32-token rows of a few
    embedded documents (vocabulary 400), a 1-layer width-16 encoder, 4 steps of 8 rows."""
    c.data.update(num_train=12, num_val=4, max_len=32, vocab_size=400, tokenizer_documents=12,
                  min_chars=600, max_chars=900)
    c.model.update(size="", d_model=16, num_layers=1, num_heads=2, mlp_dim=32, dropout=0.0,
                   dtype="float32")
    if c.model.mixer_kind == "lion":
        c.model.mixer.chunk_size = 8
    if c.model.pos_emb == "learned":
        c.model.max_len = 32
    c.optim.learning_rate = 1e-2
    c.label = c.label.rsplit(" ", 1)[0] + " tiny"
    return common.tiny_training(c)
