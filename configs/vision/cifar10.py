"""LION-S ViT-T/16 on CIFAR-10 at 224 px with DeiT's augmentation: LION paper Table 13.

Run:  python -m experiments.train --config configs/vision/cifar10.py[:variant] [--workdir DIR]
      [--config.data.source=files --config.data.data_dir=/path/to/cifar-10-batches-py]

Data: ``experiments/data/cifar.py`` (tensorflow-datasets' ``cifar10`` by default, or the python
pickles with ``source=files``), 2% of train held out as ``val``; the images upsampled to 224
as in configs/vision/cifar100.py, whose model, augmentation and optimisation helpers this file
uses.

Recipe (Table 13, CIFAR-10 column): the CIFAR-100 recipe with peak learning rate 5e-4 for every
model (ViT-T, LION-LIT, LION-S; LION-D and LION-S (v2) take LION-S's), no dropout and no
gradient clipping; 1000 epochs of batch 128, 5 warmup epochs, cosine to 1e-5, weight decay
0.05, drop path 0.1, EMA 0.99996. Departures: those of configs/vision/cifar100.py.
"""

from configs import common
from configs.vision import cifar100

VARIANTS = dict(cifar100.VARIANTS, lit="LION-LIT (no decay, elu+1 features) with learned "
                "positions", vit="ViT-T baseline: softmax attention (cuDNN on GPU) with "
                "learned positions")
LEARNING_RATE = 5e-4


def get_config(arg=None):
    variant = common.parse_variant(arg, VARIANTS)
    c = cifar100.get_config()
    c.data.name = "cifar10"
    c.model.dropout = 0.0
    cifar100.table13_training(
        c, train_size=cifar100.TRAIN_SIZE - round(cifar100.VAL_FRACTION * cifar100.TRAIN_SIZE),
        batch_size=cifar100.BATCH_SIZE, epochs=cifar100.EPOCHS,
        warmup_epochs=cifar100.WARMUP_EPOCHS, learning_rate=LEARNING_RATE, weight_decay=0.05,
        clip_norm=0.0, eval_every_epochs=10)
    if variant == "tiny":
        return cifar100.tiny(c)
    return cifar100.apply_model_variant(c, variant)
