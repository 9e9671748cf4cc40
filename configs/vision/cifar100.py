"""LION-S ViT-T/16 on CIFAR-100 at 224 px with DeiT's augmentation: LION paper Table 13.

Run:  python -m experiments.train --config configs/vision/cifar100.py[:variant] [--workdir DIR]
      [--config.data.source=files --config.data.data_dir=/path/to/cifar-100-python]

Data: ``experiments/data/cifar.py`` (tensorflow-datasets' ``cifar100`` by default, or the python
pickles with ``source=files``); 1,000 training images (2%) are held out as ``val`` for
checkpoint selection (the paper trains on all 50,000 and reports the test set), ``test`` is
the 10,000 test images.

Resolution: the paper fixes 224 x 224 for every dataset (Sec. 5.2, "For each dataset, the
resolution is fixed to 224x224"), so the 32 px images are upsampled, as DeiT's pipeline does
for CIFAR at ``input_size=224``: the training crop (random resized crop of the 32 px image,
bicubic) goes straight to 224, and evaluation resizes to 256 and centre-crops 224. ViT-T/16
then sees 14 x 14 patches (196 tokens + CLS).

Recipe (Table 13, CIFAR-100 column, with DeiT's augmentation of :func:`deit_augment`): AdamW
(b2 0.999, eps 1e-8), weight decay 0.05, batch 128, 1000 epochs, 5 warmup epochs then cosine
to 1e-5, gradient clipping 1.0, dropout 0.1, drop path 0.1, label smoothing 0.1, parameter EMA
0.99996, bicubic interpolation, RandAugment m9-mstd0.5, random erasing 0.25, mixup 0.8 /
cutmix 1.0. Peak learning rates: LION-S 1e-2, LION-LIT and the ViT 1e-3. LION-D and LION-S
(v2) have no column of their own and take LION-S's (App. D.12 trains the other LION mappings,
LION-RETNET included, "maintaining the same training recipes as LION-S").

Departures: the warmup rises from 0, not from Table 13's 1e-6 (experiments/optim.py has no
warmup start; negligible here); the colour jitter of 0.3 is not applied, because RandAugment
is on (DeiT's pipeline does the same: timm applies the jitter only without RandAugment);
repeated augmentation is off (DeiT's code turns it on by default; ``augment.repeated_aug=3``);
the trainer evaluates the EMA parameters (DeiT evaluates the raw ones and keeps the EMA aside;
``optim.ema_decay=0`` evaluates the raw ones); 2% of train is held out.
"""

import ml_collections

from configs import common
from lion_jax.models.vit import vit_size

VARIANTS = {
    "lit": "LION-LIT (no decay, elu+1 features) with learned positions; peak lr 1e-3",
    "d": "LION-D (a learned decay per head); LION-S's recipe",
    "s_v2": "LION-S (v2): masks of the row- and column-snake patch orders averaged; LION-S's "
            "recipe",
    "vit": "ViT-T baseline: softmax attention (cuDNN on GPU) with learned positions; peak lr "
           "1e-3",
    "tiny": "seconds-long CPU run for tests on stand-in pickles (--config.data.data_dir): "
            "16 px, a 1-layer width-16 model, 4 steps of 8 with the whole DeiT pipeline",
}

TRAIN_SIZE = 50_000
VAL_FRACTION = 0.02
BATCH_SIZE = 128
EPOCHS = 1000
WARMUP_EPOCHS = 5
MIN_LR = 1e-5
# Peak learning rate per model (Table 13, CIFAR-100).
LEARNING_RATES = {None: 1e-2, "d": 1e-2, "s_v2": 1e-2, "lit": 1e-3, "vit": 1e-3}


def vit_t16():
    """ViT-T/16 with the LION-S mixer (one selective decay per head, the paper's image models),
    no positional embedding, CLS pooling, dropout and drop path 0.1, bf16 compute (the decay
    gate's products too, ``gate_products="compute"``, as every other projection); the 197
    tokens padded with masked ones to 200 (``token_multiple=8``: exact, and the Mosaic GPU
    ``lion_dense`` takes 200 rows without copies; the train step 18.57 ms against 19.11 on one
    H200, docs/benchmarks.md)."""
    return ml_collections.ConfigDict(dict(
        patch_size=16, **vit_size("tiny"), mixer_kind="lion",
        mixer=dict(variant="s", impl="auto", chunk_size=64, gate_products="compute"),
        orders=("raster",),
        pos_emb="none", image_size=0, pooling="cls", dropout=0.1, drop_path=0.1,
        norm="layernorm", token_multiple=8, dtype="bfloat16", param_dtype="float32"))


def apply_model_variant(c, variant):
    """The mixer of ``variant`` (one of :data:`VARIANTS` but ``tiny``) on ``c.model``."""
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
        c.model.token_multiple = 1  # the padding is LION's mask; cuDNN pads on its own
        c.model.pos_emb = "learned"
    return c


def deit_augment(image_size=224):
    """``config.augment`` of DeiT's recipe (experiments/data/deit_augment.py documents each
    key): the host pipeline with random resized crop (0.08-1, 3/4-4/3, bicubic), flip,
    RandAugment ``rand-m9-mstd0.5-inc1``, random erasing 0.25, mixup 0.8 / cutmix 1.0 (switch
    0.5), repeated augmentation off (DeiT's default is 3 repeats: ``repeated_aug=3``), and the
    0.875 evaluation crop; one worker thread per CPU."""
    return ml_collections.ConfigDict(dict(
        pipeline="deit", image_size=image_size, crop_scale=(0.08, 1.0), crop_ratio=(3 / 4, 4 / 3),
        interpolation="bicubic", flip=True,
        randaugment=dict(num_ops=2, magnitude=9.0, magnitude_std=0.5, increasing=True),
        color_jitter=0.3, erase_prob=0.25, mixup_alpha=0.8, cutmix_alpha=1.0, mix_prob=1.0,
        switch_prob=0.5, repeated_aug=1, eval_crop_ratio=0.875, num_workers=-1, prefetch=4))


def table13_training(c, *, train_size, batch_size, epochs, warmup_epochs, learning_rate,
                     weight_decay, clip_norm, eval_every_epochs):
    """Table 13's optimisation on ``c``: AdamW, linear warmup then cosine to :data:`MIN_LR`,
    EMA 0.99996, label smoothing 0.1; evaluation and a checkpoint every ``eval_every_epochs``
    (rounded to a multiple of ``log_every``)."""
    steps_per_epoch = train_size // batch_size
    c.batch_size = batch_size
    c.eval_batch_size = 512
    c.num_train_steps = epochs * steps_per_epoch
    c.optim.learning_rate = learning_rate
    c.optim.schedule = "cosine"
    c.optim.end_lr_factor = MIN_LR / learning_rate
    c.optim.warmup_steps = warmup_epochs * steps_per_epoch
    c.optim.weight_decay = weight_decay
    c.optim.clip_norm = clip_norm
    c.optim.ema_decay = 0.99996
    c.label_smoothing = 0.1
    c.log_every = 100
    c.eval_every = c.checkpoint_every = max(
        c.log_every, round(eval_every_epochs * steps_per_epoch / c.log_every) * c.log_every)
    return c


def get_config(arg=None):
    variant = common.parse_variant(arg, VARIANTS)
    c = common.base_config()
    c.task = "vision"
    c.data = ml_collections.ConfigDict(dict(
        name="cifar100", source="tfds", data_dir="", val_fraction=VAL_FRACTION, seed=0,
        cache_dir="~/.cache/lion_jax/cifar"))
    c.model = vit_t16()
    c.augment = deit_augment(224)
    table13_training(c, train_size=TRAIN_SIZE - round(VAL_FRACTION * TRAIN_SIZE),
                     batch_size=BATCH_SIZE, epochs=EPOCHS, warmup_epochs=WARMUP_EPOCHS,
                     learning_rate=LEARNING_RATES.get(variant, LEARNING_RATES[None]),
                     weight_decay=0.05, clip_norm=1.0, eval_every_epochs=10)
    if variant == "tiny":
        return tiny(c)
    return apply_model_variant(c, variant)


def tiny(c, source="files"):
    """The ``tiny`` setting applied to config ``c`` (in place; any mixer): the data of
    ``source`` (``files``: the python pickles at ``--config.data.data_dir``) with 20% held out,
    16 px crops of a 1-layer width-16 model on 4 x 4 patches, two worker threads, no EMA, 4
    steps of 8 examples at peak learning rate 1e-2 (configs/common.py)."""
    c.data.update(source=source, val_fraction=0.2)
    c.model.update(patch_size=4, d_model=16, num_layers=1, num_heads=2, mlp_dim=32,
                   dtype="float32")
    c.augment.update(image_size=16, num_workers=2, prefetch=2)
    c.optim.ema_decay = 0.0
    c.optim.learning_rate = 1e-2  # a visible fall of the loss in 4 steps, for any mixer
    common.tiny_training(c)
    c.optim.end_lr_factor = 0.0
    return c
