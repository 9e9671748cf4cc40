"""LION-S ViT-T on the embedded shapes images (64 px, patch 8); not yet run on a GPU.

Run:  python -m experiments.train --config configs/vision/shapes.py[:variant] [--workdir DIR]

Data: ``experiments/data/shapes.py``, procedurally drawn images of 10 shape classes, generated
and cached on first use (no download), 20k/2k/2k at 64 x 64. Model: ViT-T's width, depth and
heads (192, 12, 3; lion_jax.models.vit.VIT_SIZES) on 8 x 8 patches (64 tokens + CLS), LION-S
with one selective decay per head (the paper's image models: Table 11 finds a decay per value
feature unnecessary for images) and no positional embedding. Training follows DeiT's choices
where they apply to a small dataset: AdamW (weight decay 0.05), warmup then cosine, label
smoothing 0.1, drop path 0.1, random flips; 30 epochs of batch 128 at peak learning rate 1e-3.
Variants swap the mixer: ``lit`` (LION-LIT, with learned positions: it has no decay to order
the patches), ``d`` (LION-D), ``s_v2`` (LION-S (v2), the masks of the row and column snake
orders averaged; paper C.8) and ``vit`` (softmax attention with learned positions).
"""

import ml_collections

from configs import common
from lion_jax.models.vit import vit_size

VARIANTS = {
    "lit": "LION-LIT (no decay, elu+1 features) with learned positions",
    "d": "LION-D (a learned decay per head)",
    "s_v2": "LION-S (v2): masks of the row- and column-snake patch orders averaged",
    "vit": "ViT baseline: softmax attention (cuDNN on GPU) with learned positions",
    "quick": "CPU run of under two minutes: 32 px (patch 4), 4 layers of width 64, 5k "
             "images, 600 steps (2 cores, 2026-11-25: 97 s, 0.37 test accuracy, chance 0.10; "
             "docs/benchmarks.md)",
    "tiny": "seconds-long run for tests: 40 images of 16 px, a 1-layer width-16 model, 4 steps",
}

TRAIN_SIZE = 20_000
BATCH_SIZE = 128


def get_config(arg=None):
    variant = common.parse_variant(arg, VARIANTS)
    c = common.base_config()
    c.task = "vision"
    c.data = ml_collections.ConfigDict(dict(
        name="shapes", num_train=TRAIN_SIZE, num_val=2000, num_test=2000, resolution=64, seed=0,
        cache_dir="~/.cache/lion_jax/shapes"))
    c.model = ml_collections.ConfigDict(dict(
        patch_size=8, **vit_size("tiny"), mixer_kind="lion",
        mixer=dict(variant="s", impl="auto", chunk_size=64, gate_products="compute"),
        orders=("raster",),
        pos_emb="none", image_size=0, pooling="cls", dropout=0.0, drop_path=0.1,
        norm="layernorm", token_multiple=1, dtype="bfloat16", param_dtype="float32"))
    c.augment = ml_collections.ConfigDict(dict(flip=True))
    c.label_smoothing = 0.1

    steps_per_epoch = TRAIN_SIZE // BATCH_SIZE
    c.batch_size = BATCH_SIZE
    c.eval_batch_size = 512
    c.num_train_steps = 30 * steps_per_epoch
    c.optim.learning_rate = 1e-3
    c.optim.warmup_steps = 2 * steps_per_epoch
    c.optim.weight_decay = 0.05
    c.log_every = 50
    c.eval_every = c.checkpoint_every = 5 * steps_per_epoch

    if variant == "lit":
        c.model.mixer = dict(variant="lit", impl="auto", chunk_size=64)
        c.model.pos_emb = "learned"
    elif variant == "d":
        c.model.mixer = dict(variant="d", impl="auto", chunk_size=64)
    elif variant == "s_v2":
        c.model.orders = ("row_snake", "col_snake")
    elif variant == "vit":
        c.model.mixer_kind = "softmax"
        c.model.mixer = dict(impl="auto")
        c.model.pos_emb = "learned"
    elif variant == "quick":
        c.data.update(num_train=5000, num_val=500, num_test=500, resolution=32)
        c.model.update(patch_size=4, d_model=64, num_layers=4, num_heads=2, mlp_dim=128,
                       dtype="float32")
        c.model.drop_path = 0.0
        c.label_smoothing = 0.0
        c.batch_size, c.eval_batch_size = 64, 256
        c.num_train_steps = 600
        c.optim.learning_rate = 2e-3
        c.optim.warmup_steps = 50
        c.eval_every = c.checkpoint_every = 200
        c.progress_bar = False
    elif variant == "tiny":
        tiny(c)
    return c


def tiny(c):
    """The ``tiny`` setting applied to config ``c`` (in place; any mixer): 40 images of 16 px,
    a 1-layer width-16 model on 4 x 4 patches, 4 steps of 8 examples, evaluation and a
    checkpoint every 2 steps."""
    c.data.update(num_train=40, num_val=10, num_test=10, resolution=16)
    c.model.update(patch_size=4, d_model=16, num_layers=1, num_heads=2, mlp_dim=32,
                   dtype="float32")
    return common.tiny_training(c)
