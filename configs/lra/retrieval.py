"""LION-S on LRA Retrieval (AAN citation pairs, byte level, 4000 tokens each), the paper's
setting.

Run:  python -m experiments.train --config configs/lra/retrieval.py[:variant] \
          --config.data.data_dir=/path/to/lra_release/lra_release/tsv_data

Data (experiments/data/retrieval.py): pairs of papers from LRA's release
(``new_aan_pairs.{train,eval,test}.tsv``), each document's bytes cut to 3999 + EOS; label 1 if
one cites the other. Needs ``lra_release.gz`` (google-research/long-range-arena README), unpacked;
without it the run stops with one line saying so.

Model: a dual encoder (lion_jax.models.DualEncoderClassifier): both documents through one LRA
LION-S encoder, combined as ``[u, v, u * v, u - v]`` into a ``pair_mlp_dim`` ReLU layer.
Sizes and schedule from S5 (lindermanlab/S5 bin/run_experiments/run_lra_aan.sh): d_model 128,
6 layers, batch 32, 20 epochs, no dropout, weight decay 0.05, 1 epoch of warmup; 8 heads.
"""

import ml_collections

from configs import common

VARIANTS = {
    "tiny": "seconds-long run for tests: 40 bytes per document, 1-layer width-16 model, "
            "4 steps (needs the data like the default)",
    **common.LRA_VARIANTS,
}

TRAIN_SIZE = 147_086  # pairs in new_aan_pairs.train.tsv (S5's AAN dataloader)


def get_config(arg=None):
    variant = common.parse_variant(arg, VARIANTS)
    c = common.base_config()
    c.data = ml_collections.ConfigDict(dict(
        name="retrieval", data_dir="", cache_dir="~/.cache/lion_jax/retrieval", max_length=4000))
    c.model = common.lra_model(d_model=128, num_layers=6, max_len=4000)
    c.model.pair_mlp_dim = 128
    common.lra_training(c, train_size=TRAIN_SIZE, batch_size=32, epochs=20, weight_decay=0.05,
                        batch_length_multiple=512)
    if variant == "tiny":
        c.data.max_length = c.model.max_len = 40
        c.model.pair_mlp_dim = 16
    return common.lra_variant(c, variant)
