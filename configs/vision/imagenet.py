"""LION-S ViT-T/16 on ImageNet-1k at 224 px with DeiT's augmentation: LION paper Table 13.

Run:  python -m experiments.train --config configs/vision/imagenet.py[:variant] [--workdir DIR]
      [--config.data.source=folder --config.data.data_dir=/path/to/imagenet]
      [--config.grad_accum_steps=4]   # batch 3072 in 4 micro-batches when one device is short

Data: ``experiments/data/imagenet.py``: tensorflow-datasets' ``imagenet2012`` (a manual
download, built as ArrayRecord) or the extracted ``train/<wnid>/*.JPEG``, ``val/<wnid>/*.JPEG``
folders; images are decoded by the worker threads, never held in memory. 1% of the training
images (12,812) are held out as ``val`` for checkpoint selection; ``test`` is ImageNet's
validation set (50,000), the paper's top-1 numbers.

Recipe (Table 13, ImageNet column; the model, augmentation and optimisation helpers are
configs/vision/cifar100.py's): ViT-T/16 (196 tokens + CLS), AdamW, weight decay 0.3, batch
3072, 300 epochs, cosine to 1e-5 after the warmup, gradient clipping 1.0, dropout 0.1, drop
path 0.1, label smoothing 0.1, EMA 0.99996, DeiT's augmentation (random resized crop, flip,
RandAugment m9-mstd0.5, erasing 0.25, mixup 0.8 / cutmix 1.0; resize 256 + centre crop 224 for
evaluation). Per model: LION-S peak lr 2e-3 with 4 warmup epochs; LION-LIT 1e-3 and the ViT
3e-3, both with 3 warmup epochs; LION-D and LION-S (v2), without a column, take LION-S's.
Departures: the warmup rises from 0, where Table 13 starts it at 5e-4 (experiments/optim.py has
no warmup start); the others of configs/vision/cifar100.py (no colour jitter with RandAugment,
no repeated augmentation, EMA parameters evaluated, 1% of train held out).
"""

import ml_collections

from configs import common
from configs.vision import cifar100

VARIANTS = {
    "lit": "LION-LIT (no decay, elu+1 features) with learned positions; lr 1e-3, 3 warmup "
           "epochs",
    "d": "LION-D (a learned decay per head); LION-S's recipe",
    "s_v2": "LION-S (v2): masks of the row- and column-snake patch orders averaged; LION-S's "
            "recipe",
    "vit": "ViT-T baseline: softmax attention with learned positions; lr 3e-3, 3 warmup epochs",
    "tiny": "seconds-long CPU run for tests on a stand-in train/ val/ folder "
            "(--config.data.data_dir): 16 px, a 1-layer width-16 model, 4 steps of 8",
}

TRAIN_SIZE = 1_281_167  # ILSVRC 2012 training images
VAL_FRACTION = 0.01
BATCH_SIZE = 3072
EPOCHS = 300
# (peak learning rate, warmup epochs) per model (Table 13, ImageNet).
SCHEDULES = {None: (2e-3, 4), "d": (2e-3, 4), "s_v2": (2e-3, 4), "lit": (1e-3, 3),
             "vit": (3e-3, 3)}


def get_config(arg=None):
    variant = common.parse_variant(arg, VARIANTS)
    c = common.base_config()
    c.task = "vision"
    c.data = ml_collections.ConfigDict(dict(
        name="imagenet", source="tfds", data_dir="", val_fraction=VAL_FRACTION, seed=0,
        cache_dir="~/.cache/lion_jax/imagenet"))
    c.model = cifar100.vit_t16()
    c.augment = cifar100.deit_augment(224)
    learning_rate, warmup_epochs = SCHEDULES.get(variant, SCHEDULES[None])
    cifar100.table13_training(
        c, train_size=TRAIN_SIZE - round(VAL_FRACTION * TRAIN_SIZE), batch_size=BATCH_SIZE,
        epochs=EPOCHS, warmup_epochs=warmup_epochs, learning_rate=learning_rate,
        weight_decay=0.3, clip_norm=1.0, eval_every_epochs=5)
    c.checkpoint_every = 400  # about an epoch: long runs go in segments (max_run_seconds)
    if variant == "tiny":
        return tiny(c)
    return cifar100.apply_model_variant(c, variant)


def tiny(c):
    """The ``tiny`` setting applied to config ``c`` (in place): a ``folder`` source
    (``--config.data.data_dir``) with 20% of train held out, otherwise cifar100.py's tiny."""
    return cifar100.tiny(c, source="folder")
