"""LION-S on LRA Image (CIFAR-10 as 1024-pixel grayscale sequences), the paper's setting.

Run:  python -m experiments.train --config configs/lra/image.py[:variant] [--workdir DIR]
      [--config.data.source=files --config.data.data_dir=/path/to/cifar-10-batches-py]

Data (experiments/data/image.py): CIFAR-10, grayscale as LRA computes it, flattened row-major;
45k train / 5k val (held out of train as S5 does) / 10k test. Needs a download:
tensorflow-datasets' ``cifar10`` (``tfds build cifar10``) or the python-version
``cifar-10-batches-py`` folder with ``--config.data.source=files``; without it the run stops
with one line saying so.

Model and schedule: the LRA LION-S with pixel intensities fed through a linear layer
(``input_encoding="pixels"``, S5's normalised real inputs) at S5's CIFAR sizes
(lindermanlab/S5 bin/run_experiments/run_lra_cifar.sh): d_model 512, 6 layers, batch 50,
250 epochs, dropout 0.1, weight decay 0.07, 1 epoch of warmup; 8 heads of 64.
"""

import ml_collections

from configs import common

VARIANTS = {
    "tiny": "seconds-long run for tests: 1-layer width-16 model, 4 steps (needs the data like "
            "the default)",
    **common.LRA_VARIANTS,
    **common.LRA_IMAGE_VARIANTS,
}


def get_config(arg=None):
    variant = common.parse_variant(arg, VARIANTS)
    c = common.base_config()
    c.data = ml_collections.ConfigDict(dict(
        name="image", source="tfds", data_dir="", cache_dir="~/.cache/lion_jax/image",
        val_fraction=0.1, seed=0))
    c.model = common.lra_model(d_model=512, num_layers=6, dropout=0.1, max_len=1024,
                               input_encoding="pixels", image_shape=(32, 32))
    common.lra_training(c, train_size=45_000, batch_size=50, epochs=250, weight_decay=0.07)
    return common.lra_variant(c, variant)
