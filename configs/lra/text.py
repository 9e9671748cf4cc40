"""LION-S on LRA Text (IMDb sentiment, byte level, 4096 tokens), the paper's setting.

Run:  python -m experiments.train --config configs/lra/text.py[:variant] [--workdir DIR]
      [--config.data.source=files --config.data.data_dir=/path/to/aclImdb]

Data (experiments/data/text.py): IMDb reviews as UTF-8 bytes (ids byte + 2, EOS 1, padding
0), cut to 4095 bytes + EOS; 25k train, 25k test, and val = test as LRA and S5 evaluate.
Needs a download: tensorflow-datasets' ``imdb_reviews`` (``pip install -e '.[data]'`` then
``tfds build imdb_reviews``) or Stanford's ``aclImdb`` folder with ``--config.data.source=files
--config.data.data_dir=DIR``; without it the run stops with one line saying so.

Model and schedule: the LRA LION-S of configs/lra/listops.py at S5's IMDb sizes
(lindermanlab/S5 bin/run_experiments/run_lra_imdb.sh): d_model 256, 6 layers, batch 50,
35 epochs, dropout 0.1, weight decay 0.07, no warmup (S5's warmup_end=0); 8 heads of 32.
"""

import ml_collections

from configs import common

VARIANTS = {
    "tiny": "seconds-long run for tests: the first 64 bytes of each review, 1-layer width-16 "
            "model, 4 steps (needs the data like the default)",
    **common.LRA_VARIANTS,
}


def get_config(arg=None):
    variant = common.parse_variant(arg, VARIANTS)
    c = common.base_config()
    c.data = ml_collections.ConfigDict(dict(
        name="text", source="tfds", data_dir="", cache_dir="~/.cache/lion_jax/text",
        max_length=4096, val_fraction=0.0, seed=0))
    c.model = common.lra_model(d_model=256, num_layers=6, dropout=0.1, max_len=4096)
    common.lra_training(c, train_size=25_000, batch_size=50, epochs=35, weight_decay=0.07,
                        warmup_epochs=0, batch_length_multiple=512)
    if variant == "tiny":
        c.data.max_length = c.model.max_len = 64
    return common.lra_variant(c, variant, s5_channel_mixer="half_glu2")  # S5's IMDb layer
