"""The causal-LM configs' shared builder: ``configs/lm/<arch>.py`` is ``make_config(arch, arg)``.

Run:  python -m experiments.train --config configs/lm/<arch>.py[:variant] [--workdir DIR]
Then: python -m experiments.generate --workdir DIR --prompt "The harbor of"

Default: the scaling-laws paper's 160M size of the architecture (digest
``scaling-laws-linear-lms.md`` 1.6, :data:`lion_jax.models.lm.SIZES`: 12 layers of width 768,
6 heads of 128, GLU width 2048) with the paper's training recipe (digest 4) on the embedded
corpus (``experiments/data/mlm_corpus.py``; no download) with a byte-level BPE of 8192
entries trained on it:

* given by the paper: context 8192, batch 480 rows (3.9M tokens), 300B tokens = 76,294 steps,
  "Adam" with learning rate 3e-4 and weight decay 0.1 (decoupled: AdamW), bf16 compute;
* unspecified, our picks: beta1 0.9, beta2 0.95, eps 1e-8, gradient clipping at 1.0 (the usual
  LLM values, LLaMA's), 2000 warmup steps, then a **constant** learning rate (the paper's
  "fixed learning rate scheduler"; the digest reads it so, and one run per size then gives a
  curve whose checkpoints are the scaling-law points); weight decay on matrices only
  (experiments/optim.py); ``grad_accum_steps=60`` (micro-batches of 8 rows; a memory setting
  only: the trainer's update is the full-batch one, so lower it where memory allows).

The paper's corpus is private and its tokenizer (tiktoken, vocabulary 100,280) is not ours, so
the embedding (``vocab x d``) is smaller than Table 7's: the non-embedding sizes are the
paper's, the totals are not. ``--config.model.vocab_size=100280`` pads the embedding to the
paper's size; ``--config.data.tokenizer_file=<tokenizer.json>`` uses another tokenizer. Other
data: ``--config.data.source=tfds --config.data.tfds_name=lm1b|c4/en|wiki40b/en`` (prepared with
``tfds build``) or ``--config.data.source=files --config.data.data_dir=DIR``. The rows are
held in memory (2 bytes a token), so 300B tokens do not fit: the trainer repeats the training
rows (``num_train`` documents, 500k by default, about 250M tokens) for as many epochs as the
steps ask.

Variants (every architecture):

* ``70m`` ... ``7b``: the paper's sizes (``lm_size``: the digest's reconciled Table 7 dims;
  410M has 25 layers for TNL and cosFormer2, 1B 12 heads and GLU width 4096) with the recipe
  above; ``3b`` and ``7b`` shard parameters and optimizer state over all devices (``fsdp``).
* ``small``: the GPU comparison run, about 100M parameters (the 160M dims with the corpus's
  8192-entry vocabulary: 91M for LLaMA, 94M for TNL), rows of 1024, 1500 steps of 32 rows
  (49M tokens, about one epoch of 100k documents); the same tokens in the same order for every
  architecture. Peak learning rate 6e-4 with cosine decay to 10% after 150 warmup steps (a
  short run ends annealed, so the final losses compare), AdamW as above.
* ``tiny``: seconds on a CPU (tests): 2 layers of width 32, rows of 32, 4 steps of 8 rows,
  the linear mixers in the chunked XLA form with chunks of 8.

TNL only: ``tnl_385m`` and ``tnl_1b``, the TNL paper's released models (digest
``lightning-attention-tnl.md`` 2.7: 1024 x 24 layers x 8 heads, GLU 2816; 2048 x 16 x 16, GLU
5632; vocabulary 64,000, the Baichuan tokenizer's, so the embedding has 64,000 rows whatever
tokenizer is used; the full linear output gate ``gate="linear"``; about 399M and 1.02B
parameters). The paper gives no training hyper-parameters beyond 100K updates (its ablations)
and pretraining length 2048; our picks: rows of 2048, 128 rows a step (262k tokens; 100K
updates then see 26B tokens, near the 30B-token corpus of its Fig. 1), the scaling-laws
paper's AdamW (same group) with cosine decay to 10% after 2000 warmup steps.
"""

import ml_collections

from configs import common

ARCH_LABELS = {"llama": "LLaMA", "tnl": "TNL", "hgrn2": "HGRN2", "cosformer2": "cosFormer2",
               "lion_s": "LION-S", "lightnet": "LightNet"}
SIZES = ("70m", "160m", "410m", "1b", "3b", "7b")  # lion_jax.models.lm.SIZES (no jax import)
FSDP_SIZES = ("3b", "7b")

# The scaling-laws paper's recipe (digest 4).
CONTEXT = 8192
BATCH_ROWS = 480
TOTAL_STEPS = 76_294  # 300B tokens / (480 * 8192)
PEAK_LR = 3e-4
WEIGHT_DECAY = 0.1
# Not in the paper: our picks (module docstring).
BETAS = (0.9, 0.95)
EPS = 1e-8
CLIP_NORM = 1.0
WARMUP_STEPS = 2000
GRAD_ACCUM = 60  # micro-batches of 8 rows (memory only)
NUM_TRAIN_DOCUMENTS = 500_000  # embedded corpus: about 250M tokens

# The TNL paper's models (TNL digest 2.7): (layers, width, heads, GLU width).
TNL_MODELS = {"tnl_385m": (24, 1024, 8, 2816), "tnl_1b": (16, 2048, 16, 5632)}
TNL_VOCAB = 64_000
TNL_CONTEXT = 2048
TNL_BATCH_ROWS = 128
TNL_STEPS = 100_000

# The LightNet paper's LLMs (LightNet digest 4.2, Table 10): (layers, width, heads, GLU width),
# rows per step (batch per GPU x GPUs). Heads are not printed: ours are width / 128; the GLU
# width is 8/3 of the width (the digest's reading of the parameter counts).
LIGHTNET_MODELS = {"lightnet_150m": (15, 768, 6, 2048, 26 * 8),
                   "lightnet_385m": (26, 1024, 8, 2730, 15 * 8),
                   "lightnet_1b": (18, 2048, 16, 5461, 10 * 16),
                   "lightnet_3b": (36, 2560, 20, 6826, 36 * 48)}
LIGHTNET_CONTEXT = 2048
LIGHTNET_TOKENS = 100e9  # 100B Pile tokens
LIGHTNET_VOCAB = 50_265  # the paper's BPE (Table 9, ALM)


def variants(arch):
    """``{variant: description}`` of ``configs/lm/<arch>.py``."""
    name = ARCH_LABELS[arch]
    out = {size: f"{name}-{size.upper()} (the scaling-laws paper's dims and recipe)"
           for size in SIZES}
    out["160m"] += "; the same as the default"
    for size in FSDP_SIZES:
        out[size] += "; parameters sharded over all devices (fsdp)"
    if arch == "tnl":
        out["tnl_385m"] = ("the TNL paper's TNL-385M: 1024 x 24 layers, 8 heads, GLU 2816, "
                           "vocabulary 64,000, linear output gate; rows of 2048, 100K updates")
        out["tnl_1b"] = ("the TNL paper's TNL-1B: 2048 x 16 layers, 16 heads, GLU 5632, "
                         "vocabulary 64,000, linear output gate; rows of 2048, 100K updates")
    if arch == "lightnet":
        for name, (layers, width, heads, glu, rows) in LIGHTNET_MODELS.items():
            out[name] = (f"the LightNet paper's {name[9:].upper()} LLM (Table 10): {width} x "
                         f"{layers} layers, {heads} heads, GLU {glu}, vocabulary "
                         f"{LIGHTNET_VOCAB:,}; rows of 2048, {rows} a step, 100B tokens")
    out["small"] = (f"GPU comparison run: {name} of about 100M parameters (160M dims, the "
                    "corpus's 8192-entry vocabulary), rows of 1024, 1500 steps of 32 rows")
    out["tiny"] = "seconds-long run for tests: 2 layers of width 32, rows of 32, 4 steps"
    return out


def mixer(arch):
    """The token mixer's settings as config keys (over CausalLM's defaults): ``impl="auto"``
    (the Pallas kernels on a GPU where they apply), chunks of 64 for the XLA form; TNL's
    low-rank sigmoid output gate (the scaling-laws paper's)."""
    if arch == "llama":
        return dict(impl="auto")
    settings = dict(impl="auto", chunk_size=64)
    if arch == "tnl":
        settings["gate"] = "lowrank_sigmoid"
    return settings


def base_config(arch):
    """The default setting (module docstring): 160M, the paper's recipe, the embedded corpus."""
    c = common.base_config()
    c.task = "lm"
    c.data = ml_collections.ConfigDict(dict(
        name="lm", source="embedded", data_dir="", max_len=CONTEXT, tokenizer_file="",
        eod_token="<|endoftext|>", vocab_size=8192, min_frequency=2, tokenizer_documents=20_000,
        seed=0, num_train=NUM_TRAIN_DOCUMENTS, num_val=1000, num_test=0, val_fraction=0.01,
        test_fraction=0.0, doc_boundary="line", tfds_name="lm1b", min_chars=1000,
        max_chars=3000, cache_dir="~/.cache/lion_jax/lm"))
    c.model = ml_collections.ConfigDict(dict(
        arch=arch, size="160m", vocab_size=0, num_layers=0, d_model=0, num_heads=0, mlp_dim=0,
        max_len=0, mixer=mixer(arch), norm="", embed_init_std=0.02, remat=False,
        dtype="bfloat16", param_dtype="float32"))
    c.batch_size = BATCH_ROWS
    c.grad_accum_steps = GRAD_ACCUM
    c.eval_batch_size = 16
    c.num_train_steps = TOTAL_STEPS
    c.optim.update(learning_rate=PEAK_LR, schedule="constant", warmup_steps=WARMUP_STEPS,
                   end_lr_factor=0.0, b1=BETAS[0], b2=BETAS[1], eps=EPS,
                   weight_decay=WEIGHT_DECAY, clip_norm=CLIP_NORM)
    c.log_every = 100
    c.eval_every = c.checkpoint_every = 2000
    c.eval_splits = ("val",)
    c.best_metric = "val/log_likelihood"  # higher is better: the lowest loss / perplexity
    c.label = f"{ARCH_LABELS[arch]}-160M"
    return c


def make_config(arch, arg=None):
    """The config of ``configs/lm/<arch>.py[:arg]`` (module docstring)."""
    variant = common.parse_variant(arg, variants(arch))
    c = base_config(arch)
    if variant in SIZES:
        c.model.size = variant
        c.label = f"{ARCH_LABELS[arch]}-{variant.upper()}"
        if variant in FSDP_SIZES:
            c.mesh.update(data=1, fsdp=-1)
    elif variant in TNL_MODELS:
        tnl_paper(c, variant)
    elif variant in LIGHTNET_MODELS:
        lightnet_paper(c, variant)
    elif variant == "small":
        small(c)
    elif variant == "tiny":
        tiny(c)
    return c


def tnl_paper(c, variant):
    """The TNL paper's ``tnl_385m`` / ``tnl_1b`` applied to ``c`` (in place; module
    docstring)."""
    layers, width, heads, glu = TNL_MODELS[variant]
    c.model.update(size="", num_layers=layers, d_model=width, num_heads=heads, mlp_dim=glu,
                   vocab_size=TNL_VOCAB)
    c.model.mixer.gate = "linear"
    c.data.update(max_len=TNL_CONTEXT, vocab_size=TNL_VOCAB)
    c.batch_size = TNL_BATCH_ROWS
    c.grad_accum_steps = 8  # micro-batches of 16 rows (memory only)
    c.num_train_steps = TNL_STEPS
    c.optim.update(schedule="cosine", end_lr_factor=0.1)
    c.label = "TNL-385M (TNL paper)" if variant == "tnl_385m" else "TNL-1B (TNL paper)"
    return c


def lightnet_paper(c, variant):
    """The LightNet paper's Table 10 LLM ``variant`` applied to ``c`` (in place): its dims,
    rows of 2048, its batch and 100B tokens, peak learning rate 3e-4; optimiser and schedule
    are not printed: the scaling-laws recipe's AdamW with cosine decay to 10% after 2000
    warmup steps (as for the TNL paper's models)."""
    layers, width, heads, glu, rows = LIGHTNET_MODELS[variant]
    c.model.update(size="", num_layers=layers, d_model=width, num_heads=heads, mlp_dim=glu,
                   vocab_size=LIGHTNET_VOCAB)
    c.data.update(max_len=LIGHTNET_CONTEXT, vocab_size=LIGHTNET_VOCAB)
    c.batch_size = rows
    c.grad_accum_steps = next(n for n in range(1, rows + 1) if rows % n == 0 and rows // n <= 16)
    c.num_train_steps = round(LIGHTNET_TOKENS / (rows * LIGHTNET_CONTEXT))
    c.optim.update(learning_rate=3e-4, schedule="cosine", end_lr_factor=0.1)
    c.label = f"LightNet-{variant[9:].upper()} (LightNet paper)"
    if variant == "lightnet_3b":
        c.mesh.update(data=1, fsdp=-1)
    return c


def small(c):
    """The ``small`` GPU comparison run applied to ``c`` (in place; module docstring)."""
    c.data.update(max_len=1024, num_train=100_000, num_val=500)
    c.model.size = "160m"
    c.batch_size = c.eval_batch_size = 32
    c.grad_accum_steps = 1
    c.num_train_steps = 1500
    c.optim.update(learning_rate=6e-4, schedule="cosine", warmup_steps=150, end_lr_factor=0.1)
    c.log_every = 50
    c.eval_every = c.checkpoint_every = 500
    c.label = f"{ARCH_LABELS[c.model.arch]} small"
    return c


def tiny(c):
    """The ``tiny`` setting applied to ``c`` (in place): rows of 32 tokens of a few embedded
    documents (a 300-entry BPE), 2 layers of width 32, 4 steps of 8 rows."""
    c.data.update(num_train=12, num_val=4, max_len=32, vocab_size=300, tokenizer_documents=12,
                  min_chars=600, max_chars=900)
    c.model.update(size="", num_layers=2, d_model=32, num_heads=2, mlp_dim=64, dtype="float32")
    if "chunk_size" in c.model.mixer:
        c.model.mixer.update(impl="chunk", chunk_size=8)
    c.grad_accum_steps = 1
    c.optim.update(learning_rate=1e-2, schedule="constant")
    c.label = f"{ARCH_LABELS[c.model.arch]} tiny"
    return common.tiny_training(c)
